package io.kdq.spark;

import java.util.regex.Pattern;

import com.networknt.schema.regex.RegularExpression;
import com.networknt.schema.regex.RegularExpressionFactory;
import com.networknt.schema.regex.RegularExpressions;

/**
 * Java regular expressions (as networknt's JDK factory: ECMA-262 {@code $} and long-form
 * {@code \p{...}} rewritten) whose matching is bounded: the input is read through a CharSequence
 * that counts {@code charAt} calls and throws {@link PatternBudgetExceeded} past a budget
 * proportional to the input length, so catastrophic backtracking ({@code ^(a+)+$}) cannot hang a
 * task. Used for {@code pattern}, {@code patternProperties} and {@code propertyNames}.
 */
final class BudgetRegexFactory implements RegularExpressionFactory {
    static final BudgetRegexFactory INSTANCE = new BudgetRegexFactory();

    /** Reads allowed per match: a base plus a multiple of the input length. */
    static final long BASE_BUDGET = 1_000_000L;
    static final long PER_CHAR_BUDGET = 100L;

    private BudgetRegexFactory() {
    }

    @Override
    public RegularExpression getRegularExpression(String regex) {
        Pattern pattern = Pattern.compile(RegularExpressions
                .replaceLongformCharacterProperties(RegularExpressions.replaceDollarAnchors(regex)));
        return value -> pattern.matcher(new Budgeted(value, BASE_BUDGET + PER_CHAR_BUDGET * value.length())).find();
    }

    /** A String view that counts reads and aborts the match past its budget. */
    static final class Budgeted implements CharSequence {
        private final String s;
        private long left;

        Budgeted(String s, long budget) {
            this.s = s;
            this.left = budget;
        }

        @Override
        public char charAt(int index) {
            if (--left < 0) {
                throw new PatternBudgetExceeded(Evaluation.currentPointer());
            }
            return s.charAt(index);
        }

        @Override
        public int length() {
            return s.length();
        }

        @Override
        public CharSequence subSequence(int start, int end) {
            return s.subSequence(start, end);
        }

        @Override
        public String toString() {
            return s;
        }
    }
}
