package io.kdq.spark.classify;

import java.math.BigDecimal;

import tools.jackson.core.JacksonException;
import tools.jackson.core.StreamReadConstraints;
import tools.jackson.core.exc.StreamConstraintsException;
import tools.jackson.core.json.JsonFactory;
import tools.jackson.databind.DeserializationFeature;
import tools.jackson.databind.JsonNode;
import tools.jackson.databind.json.JsonMapper;
import tools.jackson.databind.node.DecimalNode;
import tools.jackson.databind.node.DoubleNode;
import tools.jackson.databind.node.JsonNodeFactory;
import tools.jackson.databind.node.ValueNode;

/**
 * Strict parsing of record values: exactly one JSON document (any value at top level), no
 * duplicate object keys, no NaN/Infinity, no trailing tokens, no lone surrogate escapes; within
 * the parser limits (nesting depth, number length), else {@link TooComplex}.
 *
 * <p>Numbers: integers are int/long/BigInteger nodes. A number with a fraction or exponent is a
 * double when it fits one (as networknt's own parser and the Python path compare numbers), and a
 * BigDecimal when a double would overflow ({@code 1e400} is an ordinary number, not infinity). A
 * number whose decimal expansion would exceed {@value #MAX_NUMBER_LENGTH} digits
 * ({@code 1e999999999}) is {@link TooComplex}, like a literal longer than that: arithmetic on it
 * ({@code multipleOf}) could otherwise take unbounded time.
 */
public final class Json {
    public static final int MAX_NUMBER_LENGTH = 1000;

    /** The document exceeds a parser limit. */
    static final class TooComplex extends Exception {
        private static final long serialVersionUID = 1L;

        TooComplex() {
            super(null, null, false, false);
        }
    }

    /** The value is not exactly one JSON document. */
    static final class NotJson extends Exception {
        private static final long serialVersionUID = 1L;

        NotJson() {
            super(null, null, false, false);
        }
    }

    /** Floats as doubles: the fast path, for documents without exponents or very long numbers. */
    private final JsonMapper fast;
    /** Floats as BigDecimal, kept as doubles when finite (see {@link NumberNodes}). */
    private final JsonMapper exact;
    private final JsonFactory factory;

    Json(int maxNestingDepth) {
        // Duplicate keys: FAIL_ON_READING_DUP_TREE_KEY (the tree builder sees the clash) does what
        // the parser's STRICT_DUPLICATE_DETECTION does at a fraction of its cost.
        JsonFactory factory = recordFactory(maxNestingDepth);
        this.factory = factory;
        this.fast = JsonMapper.builder(factory)
                .enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS)
                .enable(DeserializationFeature.FAIL_ON_READING_DUP_TREE_KEY)
                .disable(DeserializationFeature.USE_BIG_DECIMAL_FOR_FLOATS)
                .build();
        this.exact = JsonMapper.builder(factory)
                .enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS)
                .enable(DeserializationFeature.FAIL_ON_READING_DUP_TREE_KEY)
                .enable(DeserializationFeature.USE_BIG_DECIMAL_FOR_FLOATS)
                .nodeFactory(new NumberNodes())
                .build();
    }

    /** Thrown by {@link NumberNodes} for a number too large to compute with. */
    private static final class HugeNumber extends RuntimeException {
        private static final long serialVersionUID = 1L;

        HugeNumber() {
            super(null, null, false, false);
        }
    }

    /** Floats arrive as BigDecimal (exact text): kept as a double when finite, else as BigDecimal. */
    private static final class NumberNodes extends JsonNodeFactory {
        private static final long serialVersionUID = 1L;

        @Override
        public ValueNode numberNode(BigDecimal v) {
            if (v == null) {
                return nullNode();
            }
            if (v.signum() != 0) {
                long exponent = (long) v.precision() - v.scale() - 1; // v = d.ddd x 10^exponent
                if (exponent > MAX_NUMBER_LENGTH || exponent < -MAX_NUMBER_LENGTH) {
                    throw new HugeNumber();
                }
            }
            double d = v.doubleValue();
            if (Double.isFinite(d)) {
                return DoubleNode.valueOf(d);
            }
            return DecimalNode.valueOf(v);
        }
    }

    /**
     * The parser limits of a record value: nesting depth (the rules' {@code max_nesting_depth}) and number
     * length ({@value #MAX_NUMBER_LENGTH}). The classifier's mappers and the streaming summaries' reader
     * ({@code io.kdq.spark.summary.SummaryValues}) parse the same values with the same limits.
     */
    public static JsonFactory recordFactory(int maxNestingDepth) {
        return JsonFactory.builder()
                .streamReadConstraints(StreamReadConstraints.builder()
                        .maxNestingDepth(maxNestingDepth)
                        .maxNumberLength(MAX_NUMBER_LENGTH)
                        .build())
                .build();
    }

    /** A lenient mapper for the configuration itself (produced by Python's json.dumps). */
    public static JsonMapper configMapper() {
        JsonFactory factory = JsonFactory.builder()
                .streamReadConstraints(StreamReadConstraints.builder()
                        .maxNestingDepth(10_000)
                        .maxStringLength(Integer.MAX_VALUE)
                        .maxDocumentLength(-1)
                        .build())
                .build();
        return JsonMapper.builder(factory).build();
    }

    /** A streaming parser over a record value, with the same limits as {@link #parse}'s (its factory). */
    tools.jackson.core.JsonParser parser(byte[] utf8) {
        return factory.createParser(tools.jackson.core.ObjectReadContext.empty(), utf8);
    }

    JsonNode parse(byte[] utf8) throws NotJson, TooComplex {
        JsonNode node;
        try {
            // Only a number with an exponent or with more than 300 digits can overflow a double (or
            // be too large to compute with): those documents take the exact path.
            node = (mayOverflowDouble(utf8) ? exact : fast).readTree(utf8);
        } catch (StreamConstraintsException e) {
            throw new TooComplex();
        } catch (JacksonException e) {
            if (causedBy(e, HugeNumber.class)) {
                throw new TooComplex();
            }
            throw new NotJson();
        } catch (HugeNumber e) {
            throw new TooComplex();
        }
        if (node == null || node.isMissingNode()) {
            throw new NotJson(); // empty or whitespace only
        }
        if (mayHaveSurrogateEscape(utf8) && hasLoneSurrogate(node)) {
            throw new NotJson();
        }
        return node;
    }

    /** The nesting depth of a value that parsed as JSON (0 for a scalar): one pass over the bytes. */
    static int depth(byte[] utf8) {
        int depth = 0;
        int max = 0;
        boolean inString = false;
        for (int i = 0; i < utf8.length; i++) {
            byte c = utf8[i];
            if (inString) {
                if (c == '\\') {
                    i++;
                } else if (c == '"') {
                    inString = false;
                }
            } else if (c == '"') {
                inString = true;
            } else if (c == '[' || c == '{') {
                if (++depth > max) {
                    max = depth;
                }
            } else if (c == ']' || c == '}') {
                depth--;
            }
        }
        return max;
    }

    /** Whether the text has a digit followed by e/E, or a run of more than 300 digits (a cheap superset). */
    static boolean mayOverflowDouble(byte[] b) {
        int run = 0;
        for (int i = 0; i < b.length; i++) {
            byte c = b[i];
            if (c >= '0' && c <= '9') {
                if (++run > 300) {
                    return true;
                }
            } else {
                if ((c == 'e' || c == 'E') && run > 0) {
                    return true;
                }
                if (c != '.') {
                    run = 0;
                }
            }
        }
        return false;
    }

    private static boolean causedBy(Throwable t, Class<?> type) {
        for (int i = 0; t != null && i < 10; i++, t = t.getCause()) {
            if (type.isInstance(t)) {
                return true;
            }
        }
        return false;
    }

    /** Whether the text has a backslash-u escape of a surrogate (\\uD800-\\uDFFF). */
    static boolean mayHaveSurrogateEscape(byte[] b) {
        for (int i = 0; i + 3 < b.length; i++) {
            if (b[i] == '\\' && b[i + 1] == 'u' && (b[i + 2] == 'd' || b[i + 2] == 'D')) {
                byte c = b[i + 3];
                if ((c >= '8' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')) {
                    return true;
                }
            }
        }
        return false;
    }

    private static boolean hasLoneSurrogate(JsonNode root) {
        java.util.ArrayDeque<JsonNode> todo = new java.util.ArrayDeque<>();
        todo.push(root);
        while (!todo.isEmpty()) {
            JsonNode node = todo.pop();
            if (node.isString()) {
                if (loneSurrogate(node.asString())) {
                    return true;
                }
            } else if (node.isObject()) {
                for (var e : node.properties()) {
                    if (loneSurrogate(e.getKey())) {
                        return true;
                    }
                    todo.push(e.getValue());
                }
            } else if (node.isArray()) {
                for (JsonNode child : node) {
                    todo.push(child);
                }
            }
        }
        return false;
    }

    private static boolean loneSurrogate(String s) {
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (Character.isHighSurrogate(c)) {
                if (i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))) {
                    i++;
                } else {
                    return true;
                }
            } else if (Character.isLowSurrogate(c)) {
                return true;
            }
        }
        return false;
    }
}
