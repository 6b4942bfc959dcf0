package io.kdq.spark.summary;

import java.io.Serializable;
import java.math.BigDecimal;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import io.kdq.spark.classify.Classifier;
import io.kdq.spark.classify.Json;

import tools.jackson.core.JsonParser;
import tools.jackson.core.JsonToken;
import tools.jackson.core.ObjectReadContext;
import tools.jackson.core.io.JsonStringEncoder;
import tools.jackson.core.json.JsonFactory;
import tools.jackson.databind.JsonNode;

/**
 * Spark UDF reading the streaming summaries' inputs from a record value, in one streaming pass
 * over its bytes: for every configured summary (in order) the value {@code x}, its histogram
 * {@code bucket}, or the {@code reject} reason ({@code missing}, {@code not_numeric},
 * {@code out_of_range}), and the text of each group field ({@code groups}, null when missing).
 *
 * <p>The semantics are those of the definitions in {@code kdq/summaries.py} and of Spark's
 * VARIANT functions the SQL path used before (the tests compare both): a number is any JSON
 * number (its double as Spark's {@code try_variant_get(..., 'double')} reads it), {@code null} or
 * an absent path is missing, anything else is not numeric; a group value is the text Spark's
 * {@code try_variant_get(..., 'string')} gives (strings as they are, numbers as Spark's variant
 * stores them — integers and decimals without trailing zeros, other numbers as Java doubles —,
 * booleans, objects with sorted keys and arrays as compact JSON). The bucket is computed exactly as
 * {@code kdq.summaries.bucket}: an estimate corrected by comparisons with correctly rounded
 * decimal parses, so the result does not depend on how {@code log10} rounds.
 *
 * <p>Only valid records (one JSON document, no duplicate keys: the classifier checked them)
 * reach this function, which stops reading once it has every field; it never throws: a value it
 * cannot read gives every field as missing.
 */
public class SummaryValues implements UDF1<byte[], List<Row>>, Serializable {
    private static final long serialVersionUID = 1L;

    static final String MISSING = "missing";
    static final String NOT_NUMERIC = "not_numeric";
    static final String OUT_OF_RANGE = "out_of_range";
    static final double MAX_ABS = 1e150;
    static final double TINY = 1e-300;
    static final double MAX_STEPS = 1e12;
    /** Spark's variant keeps a decimal of at most this precision and scale (else a double). */
    private static final int MAX_DECIMAL_PRECISION = 38;

    private static final ConcurrentHashMap<String, Compiled> CACHE = new ConcurrentHashMap<>();

    private final String configJson;
    private transient volatile Compiled compiled;

    public SummaryValues(String configJson) {
        this.configJson = configJson;
    }

    /** array&lt;struct&lt;x double, bucket double, reject string, groups array&lt;string&gt;&gt;&gt;, one per summary. */
    public static ArrayType returnType() {
        StructType entry = DataTypes.createStructType(new StructField[] {
            DataTypes.createStructField("x", DataTypes.DoubleType, true),
            DataTypes.createStructField("bucket", DataTypes.DoubleType, true),
            DataTypes.createStructField("reject", DataTypes.StringType, true),
            DataTypes.createStructField("groups", DataTypes.createArrayType(DataTypes.StringType, true), true),
        });
        return DataTypes.createArrayType(entry, false);
    }

    /** Compiles the configuration now (the driver, at start): an exception names the problem. */
    public static String check(String configJson) {
        Compiled c = Compiled.parse(configJson);
        CACHE.putIfAbsent(Classifier.sha256(configJson), c);
        return c.summaries.length + " summaries";
    }

    /** The compiled configuration of {@code configJson} (compiled and cached now if it was not). */
    static Compiled compiledFor(String configJson) {
        return CACHE.computeIfAbsent(Classifier.sha256(configJson), k -> Compiled.parse(configJson));
    }

    @Override
    public List<Row> call(byte[] value) {
        Compiled c = compiled;
        if (c == null) {
            c = CACHE.computeIfAbsent(Classifier.sha256(configJson), k -> Compiled.parse(configJson));
            compiled = c;
        }
        return c.extract(value);
    }

    // -- configuration ----------------------------------------------------------------------------

    /** One summary: where its value and groups are, and how its buckets are cut. */
    static final class Summary {
        final int valueSlot;
        final int[] groupSlots;
        final int digits;
        /** Step mode when {@code step > 0}: the step's decimal value is stepMantissa·10^stepExponent. */
        final double step;
        final long stepMantissa;
        final int stepExponent;

        Summary(int valueSlot, int[] groupSlots, int digits, double step, long stepMantissa, int stepExponent) {
            this.valueSlot = valueSlot;
            this.groupSlots = groupSlots;
            this.digits = digits;
            this.step = step;
            this.stepMantissa = stepMantissa;
            this.stepExponent = stepExponent;
        }
    }

    /** A node of the path trie: the slots whose path ends here, the fields below. */
    static final class Node {
        final Map<String, Node> children = new HashMap<>();
        final List<Integer> slots = new ArrayList<>();
    }

    static final class Compiled {
        final Summary[] summaries;
        final Node root = new Node();
        final int slotCount;
        /** Each slot's path (value or group field), for records decoded through the registry. */
        String[][] slotPaths = new String[0][];
        private final JsonFactory factory;

        private Compiled(Summary[] summaries, int slotCount, int maxNestingDepth) {
            this.summaries = summaries;
            this.slotCount = slotCount;
            this.factory = Json.recordFactory(maxNestingDepth);
        }

        /**
         * {@code {"max_nesting_depth": n, "summaries": [{"value": [segments], "group_by": [[segments], ...],
         * "digits": 3, "step": 0.5, "step_mantissa": 5, "step_exponent": -1}, ...]}} (step fields null in
         * significant-digits mode).
         */
        static Compiled parse(String configJson) {
            JsonNode doc = Json.configMapper().readTree(configJson);
            JsonNode list = doc.get("summaries");
            if (list == null || !list.isArray()) {
                throw new IllegalArgumentException("summary configuration: \"summaries\" must be a list");
            }
            List<String[]> paths = new ArrayList<>();
            Summary[] summaries = new Summary[list.size()];
            for (int i = 0; i < summaries.length; i++) {
                JsonNode s = list.get(i);
                int valueSlot = paths.size();
                paths.add(segments(s.get("value"), "value of summary " + i));
                JsonNode groups = s.get("group_by");
                int[] groupSlots = new int[groups == null ? 0 : groups.size()];
                for (int g = 0; g < groupSlots.length; g++) {
                    groupSlots[g] = paths.size();
                    paths.add(segments(groups.get(g), "group_by of summary " + i));
                }
                JsonNode step = s.get("step");
                boolean stepMode = step != null && !step.isNull();
                summaries[i] = new Summary(
                        valueSlot,
                        groupSlots,
                        s.path("digits").asInt(3),
                        stepMode ? step.asDouble() : 0.0,
                        stepMode ? s.get("step_mantissa").asLong() : 0L,
                        stepMode ? s.get("step_exponent").asInt() : 0);
            }
            Compiled c = new Compiled(summaries, paths.size(), doc.path("max_nesting_depth").asInt(500));
            c.slotPaths = paths.toArray(new String[0][]);
            for (int slot = 0; slot < paths.size(); slot++) {
                Node node = c.root;
                for (String segment : paths.get(slot)) {
                    node = node.children.computeIfAbsent(segment, k -> new Node());
                }
                node.slots.add(slot);
            }
            return c;
        }

        private static String[] segments(JsonNode node, String what) {
            if (node == null || !node.isArray() || node.isEmpty()) {
                throw new IllegalArgumentException("summary configuration: the " + what + " must be a non-empty list of field names");
            }
            String[] out = new String[node.size()];
            for (int i = 0; i < out.length; i++) {
                out[i] = node.get(i).asString();
            }
            return out;
        }

        List<Row> extract(byte[] value) {
            Object[] found = read(value);
            List<Row> out = new ArrayList<>(summaries.length);
            for (Summary s : summaries) {
                out.add(entry(s, found));
            }
            return out;
        }

        /** Every slot's value in {@code value} (null: missing), in one streaming pass. */
        Object[] read(byte[] value) {
            Object[] found = new Object[slotCount];
            if (value != null) {
                try (JsonParser p = factory.createParser(ObjectReadContext.empty(), value)) {
                    if (p.nextToken() == JsonToken.START_OBJECT) {
                        walk(p, root, found, new int[] {slotCount});
                    }
                } catch (RuntimeException e) {
                    Arrays.fill(found, null); // not one readable document: every field missing
                }
            }
            return found;
        }
    }

    /**
     * The summaries' fields of a record decoded through the Schema Registry: each path read with
     * {@link io.kdq.spark.registry.DecodedRecord#get} (record fields, map keys, array indexes), each value taken as
     * the JSON path takes its JSON counterpart: strings and enum symbols as text, integers and decimals as
     * numbers, floats by their shortest decimal text, booleans, a timestamp as its epoch milliseconds, a date as
     * its ISO text, bytes as base64; a record, array or map (a group value only) as the decoding library's text.
     */
    static List<Row> extractDecoded(Compiled c, io.kdq.spark.registry.DecodedRecord record) {
        Object[] found = new Object[c.slotCount];
        for (int slot = 0; slot < found.length; slot++) {
            found[slot] = decodedValue(record.get(c.slotPaths[slot]));
        }
        List<Row> out = new ArrayList<>(c.summaries.length);
        for (Summary s : c.summaries) {
            out.add(entry(s, found));
        }
        return out;
    }

    static Object decodedValue(Object v) {
        if (v == null) {
            return null;
        }
        if (v instanceof CharSequence || v instanceof Boolean) {
            return v instanceof Boolean ? v : v.toString();
        }
        if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) {
            return number(v.toString(), true);
        }
        if (v instanceof Double || v instanceof Float) {
            double d = ((Number) v).doubleValue();
            return Double.isFinite(d) ? number(Double.toString(d), false) : "NaN"; // no JSON number: not numeric
        }
        if (v instanceof BigDecimal d) {
            return number(d.toPlainString(), false);
        }
        if (v instanceof java.math.BigInteger i) {
            return number(i.toString(), true);
        }
        if (v instanceof java.time.Instant instant) {
            return number(Long.toString(instant.toEpochMilli()), true);
        }
        if (v instanceof byte[] bytes) {
            return java.util.Base64.getEncoder().encodeToString(bytes);
        }
        return v.toString();
    }

    // -- one pass over the document ---------------------------------------------------------------

    /** A JSON number as Spark's variant holds it: its double, and its text as a group value. */
    record Num(double value, String text) {}

    /** JSON null (distinct from an absent field only inside containers' text). */
    private static final Object NULL = new Object();

    /**
     * {@code p} is at the START_OBJECT of {@code node}'s value: fill the slots of the paths below. Returns true as soon
     * as every slot is filled ({@code remaining[0]} is the number still empty): the rest of the document is not read.
     * Why that is exact: only valid records come here, one JSON document without duplicate keys, so a field's first
     * occurrence is its only one and nothing later can make the document unreadable. In the benchmark's orders the
     * summaries' fields come before the order lines, most of the bytes (benchmarks/PERF_NOTES.md, twenty-first pass).
     */
    private static boolean walk(JsonParser p, Node node, Object[] found, int[] remaining) {
        String name;
        while ((name = p.nextName()) != null) {
            Node child = node.children.get(name);
            JsonToken t = p.nextToken();
            if (child == null) {
                p.skipChildren();
                continue;
            } else if (!child.slots.isEmpty() && (t == JsonToken.START_OBJECT || t == JsonToken.START_ARRAY)) {
                // A container wanted whole (a group value as JSON text), maybe with paths below it too.
                Object v = read(p, t);
                fill(child.slots, v, found, remaining);
                if (v instanceof Map<?, ?> map) {
                    fillFrom(map, child, found, remaining);
                }
            } else if (t == JsonToken.START_OBJECT) {
                if (walk(p, child, found, remaining)) {
                    return true;
                }
            } else {
                fill(child.slots, scalar(p, t), found, remaining);
                p.skipChildren();
            }
            if (remaining[0] == 0) {
                return true;
            }
        }
        return false;
    }

    private static void fill(List<Integer> slots, Object v, Object[] found, int[] remaining) {
        for (int slot : slots) {
            if (found[slot] == null) {
                remaining[0]--;
            }
            found[slot] = v;
        }
    }

    private static void fillFrom(Map<?, ?> map, Node node, Object[] found, int[] remaining) {
        for (Map.Entry<String, Node> e : node.children.entrySet()) {
            Object v = map.get(e.getKey());
            if (v == null) {
                continue;
            }
            fill(e.getValue().slots, v, found, remaining);
            if (v instanceof Map<?, ?> inner) {
                fillFrom(inner, e.getValue(), found, remaining);
            }
        }
    }

    /** The value at the current token: a (sorted) map, a list, or a scalar. */
    private static Object read(JsonParser p, JsonToken t) {
        if (t == JsonToken.START_OBJECT) {
            TreeMap<String, Object> map = new TreeMap<>();
            String name;
            while ((name = p.nextName()) != null) {
                map.put(name, read(p, p.nextToken()));
            }
            return map;
        }
        if (t == JsonToken.START_ARRAY) {
            List<Object> list = new ArrayList<>();
            JsonToken next;
            while ((next = p.nextToken()) != JsonToken.END_ARRAY) {
                list.add(read(p, next));
            }
            return list;
        }
        return scalar(p, t);
    }

    private static Object scalar(JsonParser p, JsonToken t) {
        switch (t) {
            case VALUE_STRING:
                return p.getString();
            case VALUE_NUMBER_INT:
            case VALUE_NUMBER_FLOAT:
                return number(p.getString(), t == JsonToken.VALUE_NUMBER_INT);
            case VALUE_TRUE:
                return Boolean.TRUE;
            case VALUE_FALSE:
                return Boolean.FALSE;
            default:
                return NULL;
        }
    }

    /**
     * A number as Spark's {@code parse_json} stores it: a long when an integer fits; a decimal when
     * the text has no exponent and fits 38 digits (trailing zeros dropped); else a double.
     */
    static Num number(String text, boolean integer) {
        if (integer) {
            try {
                long l = Long.parseLong(text);
                return new Num((double) l, Long.toString(l));
            } catch (NumberFormatException e) {
                // beyond a long: a decimal or a double, below
            }
        }
        boolean plain = true;
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            if (c != '-' && c != '.' && (c < '0' || c > '9')) {
                plain = false;
                break;
            }
        }
        if (plain) {
            BigDecimal d = new BigDecimal(text);
            if (d.scale() <= MAX_DECIMAL_PRECISION && d.precision() <= MAX_DECIMAL_PRECISION) {
                BigDecimal stripped = d.stripTrailingZeros();
                if (stripped.scale() < 0) {
                    stripped = stripped.setScale(0);
                }
                return new Num(stripped.doubleValue(), stripped.toPlainString());
            }
        }
        double v = Double.parseDouble(text);
        return new Num(v, Double.toString(v));
    }

    // -- one summary's entry ----------------------------------------------------------------------

    /** A summary's reading of one record: its value and bucket, or why it has none. */
    record Measure(Double x, Double bucket, String reject) {}

    private static Row entry(Summary s, Object[] found) {
        Measure m = measure(s, found);
        List<String> groups = new ArrayList<>(s.groupSlots.length);
        for (int slot : s.groupSlots) {
            groups.add(text(found[slot]));
        }
        return RowFactory.create(m.x(), m.bucket(), m.reject(), groups);
    }

    static Measure measure(Summary s, Object[] found) {
        Object v = found[s.valueSlot];
        Double x = null;
        Double bucket = null;
        String reject;
        if (v == null || v == NULL) {
            reject = MISSING;
        } else if (!(v instanceof Num n)) {
            reject = NOT_NUMERIC;
        } else if (!(Math.abs(n.value()) <= MAX_ABS) || (s.step > 0 && Math.abs(n.value()) / s.step >= MAX_STEPS)) {
            reject = OUT_OF_RANGE; // also infinities and NaN
        } else {
            reject = null;
            x = n.value();
            bucket = s.step > 0 ? stepBucket(x, s.stepMantissa, s.stepExponent) : bucket(x, s.digits);
        }
        return new Measure(x, bucket, reject);
    }

    /** A group value's text (null for missing or JSON null). */
    static String text(Object v) {
        if (v == null || v == NULL) {
            return null;
        }
        if (v instanceof String s) {
            return s;
        }
        if (v instanceof Num n) {
            return n.text();
        }
        StringBuilder out = new StringBuilder();
        appendJson(out, v);
        return out.toString();
    }

    private static void appendJson(StringBuilder out, Object v) {
        if (v == null || v == NULL) {
            out.append("null");
        } else if (v instanceof String s) {
            out.append('"');
            JsonStringEncoder.getInstance().quoteAsString(s, out);
            out.append('"');
        } else if (v instanceof Num n) {
            // Spark's to_json writes a non-finite double as a string ("Infinity").
            boolean finite = Double.isFinite(n.value());
            out.append(finite ? "" : "\"").append(n.text()).append(finite ? "" : "\"");
        } else if (v instanceof Boolean b) {
            out.append(b.booleanValue() ? "true" : "false");
        } else if (v instanceof Map<?, ?> map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : map.entrySet()) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                appendJson(out, e.getKey());
                out.append(':');
                appendJson(out, e.getValue());
            }
            out.append('}');
        } else if (v instanceof List<?> list) {
            out.append('[');
            for (int i = 0; i < list.size(); i++) {
                if (i > 0) {
                    out.append(',');
                }
                appendJson(out, list.get(i));
            }
            out.append(']');
        }
    }

    // -- buckets: kdq.summaries.bucket, operation for operation ------------------------------------

    /** The nearest double of the decimal mantissa·10^exponent (Java's parse is correctly rounded). */
    private static double dec(long mantissa, long exponent) {
        return Double.parseDouble(mantissa + "e" + exponent);
    }

    /** The bucket of x in significant-digits mode: the largest {@code digits}-digit decimal ≤ |x|, signed. */
    static double bucket(double x, int digits) {
        double a = Math.abs(x);
        if (a < TINY) {
            return 0.0;
        }
        long e = (long) Math.floor(Math.log10(a));
        if (dec(1, e) > a) {
            e -= 1;
        } else if (dec(1, e + 1) <= a) {
            e += 1;
        }
        long k = e - digits + 1;
        // An estimate within ±1, scaled by 1e50 so neither factor leaves the normal double range.
        long m = (long) Math.floor((a * 1e50) / dec(1, k + 50));
        if (dec(m + 1, k) <= a) {
            m += 1;
        } else if (dec(m, k) > a) {
            m -= 1;
        }
        long lo = pow10(digits - 1);
        m = Math.min(Math.max(m, lo), pow10(digits) - 1);
        double b = dec(m, k);
        return x < 0 ? -b : b;
    }

    /** The bucket of x in step mode: the largest multiple k·step (as the nearest double of its decimal) ≤ x. */
    static double stepBucket(double x, long mantissa, int exponent) {
        long k = (long) Math.floor(x / dec(mantissa, exponent));
        if (dec((k + 1) * mantissa, exponent) <= x) {
            k += 1;
        } else if (dec(k * mantissa, exponent) > x) {
            k -= 1;
        }
        return dec(k * mantissa, exponent);
    }

    private static long pow10(int n) {
        long r = 1;
        for (int i = 0; i < n; i++) {
            r *= 10;
        }
        return r;
    }
}
