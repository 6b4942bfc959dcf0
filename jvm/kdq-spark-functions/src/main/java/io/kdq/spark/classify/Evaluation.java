package io.kdq.spark.classify;

import java.util.ArrayList;
import java.util.IdentityHashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;

import com.networknt.schema.Error;
import com.networknt.schema.ExecutionConfig;
import com.networknt.schema.ExecutionContext;
import com.networknt.schema.Schema;
import com.networknt.schema.ValidationLimitExceededException;
import com.networknt.schema.path.NodePath;

import tools.jackson.databind.JsonNode;

/**
 * One validation of one value: networknt's execution context that also remembers, for every
 * error, the chain of schemas being evaluated when it was raised (root first, through every
 * {@code $ref} hop). From that chain and the error's evaluation path, {@link #reason()} picks the
 * error that comes first in schema document order, depth first, as the Python fallback does.
 */
final class Evaluation extends ExecutionContext {
    private static final Schema[] NO_SCHEMAS = new Schema[0];
    private static final ThreadLocal<Evaluation> CURRENT = new ThreadLocal<>();
    /** Rank of a keyword not found where expected: after every keyword that is. */
    private static final int UNKNOWN = Integer.MAX_VALUE / 2;

    /** Applicators reported as themselves, never through their alternatives. */
    private static final java.util.Set<String> GROUP_KEYWORDS = java.util.Set.of("anyOf", "oneOf");

    /** Evaluation depth allowed on the calling thread; deeper, the record is evaluated on a {@link DeepStack}. */
    static final int INLINE_EVALUATION_DEPTH = 128;
    /** Nesting depth of the document up to which the evaluation starts on the calling thread. */
    static final int INLINE_DOCUMENT_DEPTH = 64;

    private Map<Error, Schema[]> chains;
    /** charAt reads left for every pattern match of this record ({@link BudgetRegexFactory}). */
    long patternBudget;
    /** Where the record's pattern budget ran out (the first time), or null. */
    private String budgetPointer;
    /** A match or compile was too large for the calling thread's stack: evaluate again on a deep stack. */
    private boolean needsDeepStack;

    Evaluation(ExecutionConfig config, long patternBudget) {
        super(config);
        this.patternBudget = patternBudget;
    }

    /**
     * Validates {@code doc}; null when valid, else {@code schema:<pointer>}, {@code pattern_budget:<pointer>}
     * or {@code too_complex} (an evaluation limit of {@code full}). The same on every thread: a document
     * deeper than {@link #INLINE_DOCUMENT_DEPTH}, an evaluation reaching the depth limit of {@code inline}
     * (the limits of {@code full}, but {@link #INLINE_EVALUATION_DEPTH} deep) or a pattern too large for the
     * calling thread ({@link BudgetRegexFactory}) makes it evaluate from the start on a {@link DeepStack}
     * thread with {@code full}; an inline result is used only when none of these happened, so it is what the
     * deep stack would have found.
     */
    static String validate(Schema schema, ExecutionConfig inline, ExecutionConfig full, JsonNode doc,
            long patternBudget, int documentDepth) {
        if (documentDepth <= INLINE_DOCUMENT_DEPTH && !DeepStack.onDeepStack()) {
            Evaluation here = new Evaluation(inline, patternBudget);
            String verdict = here.run(schema, doc, true);
            if (!here.needsDeepStack) {
                return verdict;
            }
        }
        return DeepStack.call(() -> new Evaluation(full, patternBudget).run(schema, doc, false));
    }

    private String run(Schema schema, JsonNode doc, boolean inline) {
        Evaluation previous = CURRENT.get();
        CURRENT.set(this);
        ValidationLimitExceededException limit = null;
        try {
            schema.validate(this, doc);
        } catch (PatternBudgetExceeded | NeedsDeepStack e) {
            // recorded on this evaluation: decided below
        } catch (ValidationLimitExceededException e) {
            limit = e;
        } finally {
            if (previous == null) {
                CURRENT.remove();
            } else {
                CURRENT.set(previous);
            }
        }
        if (limit == null) {
            limit = getEvaluationAbort();
        }
        if (inline && limit != null && limit.getLimitKind() == ValidationLimitExceededException.LimitKind.EVALUATION_DEPTH) {
            needsDeepStack = true;
        }
        if (needsDeepStack) {
            if (!inline) {
                throw new IllegalStateException("kdq classifier: an evaluation on a deep stack asked for a deep stack");
            }
            return null; // validate() evaluates again on a deep stack
        }
        if (budgetPointer != null) {
            return Reasons.PATTERN_BUDGET_PREFIX + budgetPointer;
        }
        if (limit != null) {
            return Reasons.TOO_COMPLEX;
        }
        return reason();
    }

    /** The evaluation running on this thread, or null (outside one: the rules' own regexes compiling). */
    static Evaluation current() {
        return CURRENT.get();
    }

    /** Records (the first time) where the record's pattern budget ran out; returns the exception to throw. */
    PatternBudgetExceeded patternBudgetExceeded() {
        patternBudget = -1;
        if (budgetPointer == null) {
            budgetPointer = pointer(getEvaluationPath(), false);
        }
        return new PatternBudgetExceeded(budgetPointer);
    }

    /** Records that this record must be evaluated on a deep stack; returns the exception that stops this evaluation. */
    NeedsDeepStack needsDeepStack() {
        needsDeepStack = true;
        return new NeedsDeepStack();
    }

    /** Stops an inline evaluation (a SchemaException: networknt's validators rethrow those as they are). */
    static final class NeedsDeepStack extends com.networknt.schema.SchemaException {
        private static final long serialVersionUID = 1L;

        NeedsDeepStack() {
            super("needs a deep stack");
        }

        @Override
        public synchronized Throwable fillInStackTrace() {
            return this;
        }
    }

    @Override
    public void addError(Error error) {
        super.addError(error);
        if (chains == null) {
            chains = new IdentityHashMap<>();
        }
        chains.put(error, getEvaluationSchema().toArray(NO_SCHEMAS));
    }

    String reason() {
        List<Error> errors = getErrors();
        if (errors.isEmpty()) {
            return null;
        }
        int[] bestRank = null;
        String best = null;
        for (Error error : errors) {
            Schema[] chain = chains == null ? null : chains.get(error);
            List<Integer> rank = new ArrayList<>();
            String pointer = locate(error, chain == null ? NO_SCHEMAS : chain, rank);
            int[] r = rank.stream().mapToInt(Integer::intValue).toArray();
            if (bestRank == null || compare(r, bestRank) < 0) {
                bestRank = r;
                best = pointer;
            }
        }
        return Reasons.SCHEMA_PREFIX + best;
    }

    private static int compare(int[] a, int[] b) {
        int n = Math.min(a.length, b.length);
        for (int i = 0; i < n; i++) {
            if (a[i] != b[i]) {
                return Integer.compare(a[i], b[i]);
            }
        }
        return Integer.compare(a.length, b.length);
    }

    /**
     * The error's keyword location (its evaluation path, with the missing element's index for
     * {@code required}) and, into {@code rank}, the position of every step in the schema
     * documents: the keyword's position in its schema object, the member's position in a
     * {@code properties}-like object, the index in an {@code allOf}-like array.
     */
    static String locate(Error error, Schema[] chain, List<Integer> rank) {
        NodePath path = error.getEvaluationPath();
        int count = path == null ? 0 : path.getNameCount();
        String keyword = error.getKeyword();
        // A false subschema reports through a pseudo keyword "false": the location is the subschema.
        if (count > 0 && "false".equals(keyword) && "false".equals(String.valueOf(path.getElement(count - 1)))) {
            count--;
        }
        int si = 0;
        JsonNode node = chain.length > 0 ? chain[0].getSchemaNode() : null;
        StringBuilder pointer = new StringBuilder();
        for (int p = 0; p < count;) {
            Object element = path.getElement(p);
            String segment = String.valueOf(element);
            JsonPointer.appendToken(pointer, segment);
            rank.add(indexOf(node, segment));
            p++;
            if (GROUP_KEYWORDS.contains(segment) && node != null && node.isObject()
                    && node.path(segment).isArray()) {
                // anyOf/oneOf fail as a whole: reported as the keyword itself (as jsonschema does),
                // whatever networknt reports from inside the alternatives.
                return pointer.toString();
            }
            if (si + 1 >= chain.length || node == null) {
                node = node != null && node.isObject() ? node.get(segment) : null;
                continue; // within the schema that raised the error
            }
            JsonNode next = chain[si + 1].getSchemaNode();
            JsonNode value = node.isObject() ? node.get(segment) : null;
            if (value != null && value == next) { // items, not, additionalProperties, if/then/else, ...
                si++;
                node = next;
                continue;
            }
            if (value != null && (value.isObject() || value.isArray()) && p < count) {
                Object element2 = path.getElement(p);
                JsonNode child = null;
                int position = UNKNOWN;
                if (value.isObject()) { // properties, patternProperties, dependentSchemas, $defs
                    child = value.get(String.valueOf(element2));
                    position = indexOf(value, String.valueOf(element2));
                } else if (element2 instanceof Integer) { // allOf, anyOf, oneOf, prefixItems
                    position = (Integer) element2;
                    child = value.get(position);
                }
                if (child != null && child == next) {
                    JsonPointer.appendToken(pointer, String.valueOf(element2));
                    rank.add(position);
                    p++;
                    si++;
                    node = next;
                    continue;
                }
            }
            // $ref, $dynamicRef, $recursiveRef: the next steps are in the referenced schema.
            si++;
            node = next;
        }
        if ("required".equals(keyword) && error.getProperty() != null && node != null && node.isArray()) {
            int i = 0;
            for (JsonNode name : node) {
                if (name.isString() && name.asString().equals(error.getProperty())) {
                    pointer.append('/').append(i);
                    rank.add(i);
                    break;
                }
                i++;
            }
        }
        return pointer.toString();
    }

    private static int indexOf(JsonNode node, String name) {
        if (node == null || !node.isObject()) {
            return 0;
        }
        int i = 0;
        for (Iterator<String> it = node.propertyNames().iterator(); it.hasNext(); i++) {
            if (it.next().equals(name)) {
                return i;
            }
        }
        return UNKNOWN;
    }

    static String pointer(NodePath path, boolean unused) {
        StringBuilder sb = new StringBuilder();
        if (path != null) {
            for (int i = 0; i < path.getNameCount(); i++) {
                JsonPointer.appendToken(sb, String.valueOf(path.getElement(i)));
            }
        }
        return sb.toString();
    }
}
