package io.kdq.spark.classify;

import java.util.regex.Pattern;
import java.util.regex.PatternSyntaxException;

import com.networknt.schema.regex.RegularExpression;
import com.networknt.schema.regex.RegularExpressionFactory;
import com.networknt.schema.regex.RegularExpressions;

/**
 * Java regular expressions (as networknt's JDK factory: ECMA-262 {@code $} and long-form
 * {@code \p{...}} rewritten) whose work is bounded deterministically, for {@code pattern},
 * {@code patternProperties}, {@code propertyNames} and {@code format: regex}.
 *
 * <p><b>Time.</b> While a record is evaluated ({@link Evaluation}), every match reads the input
 * through a CharSequence that counts {@code charAt} calls against <em>one budget for the whole
 * record</em> ({@link #BASE_BUDGET} plus {@link #PER_BYTE_BUDGET} per byte of the value): many
 * strings each just under a per-match budget cannot add up to unbounded time. Past it the record
 * is {@code pattern_budget:<pointer>} (the keyword whose match ran out).
 *
 * <p><b>Stack.</b> Java's matcher recurses once per repetition of a group or an alternation
 * ({@code ^([a-z]+\.)*[a-z]+$} on a 5,000-character string overflows a 1 MB stack), and
 * {@code Pattern.compile} once per nesting level. How much stack that takes depends on the pattern
 * and the input, never on the thread, so it is decided from them: a match costs
 * {@code pattern length × input length} work units when the pattern has a group or an alternation
 * (0 otherwise: a quantified character class is matched iteratively), a compile the number of
 * {@code (} and {@code [} in the text. Up to {@link #INLINE_UNITS} / {@link #INLINE_NESTING} it
 * runs where it is; above, the record's evaluation moves to a {@link DeepStack} thread; above
 * {@link #MAX_UNITS} / {@link #MAX_NESTING} the record is {@code pattern_budget:<pointer>} without
 * running it (at ~64 bytes of stack per unit, interpreted, the limit stays far inside the deep
 * stack).
 */
final class BudgetRegexFactory implements RegularExpressionFactory {
    static final BudgetRegexFactory INSTANCE = new BudgetRegexFactory();

    /** Reads allowed per record: a base plus a multiple of the value's size in bytes. */
    static final long BASE_BUDGET = 1_000_000L;
    static final long PER_BYTE_BUDGET = 100L;

    /** Stack work units (pattern length × input length) matched on the calling thread. */
    static final long INLINE_UNITS = 4_096L;
    /** Stack work units of one match beyond which the record is pattern_budget. */
    static final long MAX_UNITS = 4_000_000L;
    /** Nesting (count of '(' and '[') of a value compiled by format: regex on the calling thread. */
    static final int INLINE_NESTING = 64;
    /** Nesting beyond which a format: regex value is pattern_budget. */
    static final int MAX_NESTING = 100_000;

    private BudgetRegexFactory() {
    }

    @Override
    public RegularExpression getRegularExpression(String regex) {
        Evaluation evaluation = Evaluation.current();
        if (evaluation != null) {
            // format: regex on a record's value (a rule's own patterns compile when the rules do).
            int nesting = nesting(regex);
            if (nesting > MAX_NESTING) {
                throw evaluation.patternBudgetExceeded();
            }
            if (nesting > INLINE_NESTING && !DeepStack.onDeepStack()) {
                throw evaluation.needsDeepStack();
            }
        }
        Pattern pattern;
        try {
            pattern = Pattern.compile(RegularExpressions
                    .replaceLongformCharacterProperties(RegularExpressions.replaceDollarAnchors(regex)));
        } catch (PatternSyntaxException e) {
            // Pattern.compile reports its own stack overflow as a syntax error: that is the JVM's
            // condition, not the text's, so it stays an Error (the decision above keeps it from happening).
            if (String.valueOf(e.getDescription()).startsWith("Stack overflow")) {
                throw new StackOverflowError("Pattern.compile: " + e.getDescription());
            }
            throw e;
        }
        boolean recursive = pattern.pattern().indexOf('(') >= 0 || pattern.pattern().indexOf('|') >= 0;
        long unitsPerChar = recursive ? Math.max(1, pattern.pattern().length()) : 0;
        return value -> matches(pattern, unitsPerChar, value);
    }

    private static boolean matches(Pattern pattern, long unitsPerChar, String value) {
        Evaluation evaluation = Evaluation.current();
        if (evaluation == null) { // not a record's evaluation: a budget for this match alone
            return pattern.matcher(new Budgeted(value, BASE_BUDGET + PER_BYTE_BUDGET * value.length())).find();
        }
        long units = unitsPerChar * value.length();
        if (units > MAX_UNITS) {
            throw evaluation.patternBudgetExceeded();
        }
        if (units > INLINE_UNITS && !DeepStack.onDeepStack()) {
            throw evaluation.needsDeepStack();
        }
        return pattern.matcher(new Budgeted(value, evaluation)).find();
    }

    /** Count of '(' and '[' (an upper bound of the nesting of groups and classes). */
    static int nesting(String regex) {
        int n = 0;
        for (int i = 0; i < regex.length(); i++) {
            char c = regex.charAt(i);
            if (c == '(' || c == '[') {
                n++;
            }
        }
        return n;
    }

    /**
     * A String view that counts reads against a budget and aborts past it: the record's (its
     * {@link Evaluation}'s, shared by every match of the record) or, outside an evaluation, one
     * match's own.
     */
    static final class Budgeted implements CharSequence {
        private final String s;
        /** Null outside an evaluation: then {@link #left} is the budget. */
        private final Evaluation evaluation;
        private long left;

        /** Reads count against the record's budget. */
        Budgeted(String s, Evaluation evaluation) {
            this.s = s;
            this.evaluation = evaluation;
        }

        /** Outside an evaluation: a budget for one match. */
        Budgeted(String s, long budget) {
            this.s = s;
            this.evaluation = null;
            this.left = budget;
        }

        @Override
        public char charAt(int index) {
            if (evaluation != null) {
                if (--evaluation.patternBudget < 0) {
                    throw evaluation.patternBudgetExceeded();
                }
            } else if (--left < 0) {
                throw new PatternBudgetExceeded("");
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
