package io.kdq.spark.classify;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;

import org.junit.jupiter.api.Test;

import tools.jackson.databind.JsonNode;
import tools.jackson.databind.node.ArrayNode;
import tools.jackson.databind.node.ObjectNode;

/**
 * {@link FastCheck}, the one-pass check of valid records, against the full way (Json.parse + networknt): every
 * record gets the same row (problem, event time, its badness, rules version) with and without it. The
 * JSON-Schema-Test-Suite makes the same comparison in {@link ConformanceTest}; here the documents the
 * benchmark and real topics send, the edges the check declines, and random schemas of its subset.
 */
class FastCheckTest {
    /** The schema of each classifier made here (for the failure messages). */
    private static final java.util.Map<Classifier, String> SCHEMAS = new java.util.IdentityHashMap<>();

    /** Rows of {@code values} with the one-pass check and without; counts the values it decided alone. */
    private static int compare(Classifier c, String topic, List<byte[]> values) {
        int fast = 0;
        boolean before = CompiledConfig.fastChecks;
        try {
            for (byte[] v : values) {
                CompiledConfig.fastChecks = true;
                List<Object> withFast = TestSupport.fields(c.call(topic, v));
                CompiledConfig.fastChecks = false;
                List<Object> full = TestSupport.fields(c.call(topic, v));
                assertEquals(full, withFast, () -> "differs on " + new String(v, StandardCharsets.UTF_8) + " under "
                        + c.compiled().rules.get(0).label + " " + SCHEMAS.get(c));
                if (c.compiled().decidedFast(topic, v)) {
                    fast++;
                    assertEquals("null", full.get(0), "decided valid but the full way says otherwise");
                }
            }
        } finally {
            CompiledConfig.fastChecks = before;
        }
        return fast;
    }

    private static List<byte[]> utf8(String... values) {
        List<byte[]> out = new ArrayList<>();
        for (String v : values) {
            out.add(v.getBytes(StandardCharsets.UTF_8));
        }
        return out;
    }

    private static Classifier classifier(String schema, String... eventTimeField) {
        ObjectNode cfg = TestSupport.config(1 << 20, true);
        ObjectNode rule = TestSupport.rule(cfg, "t", schema);
        if (eventTimeField.length > 0) {
            TestSupport.eventTime(rule, "auto", eventTimeField);
        }
        String json = cfg.toString();
        Classifier.check(json);
        Classifier c = new Classifier(json);
        SCHEMAS.put(c, schema);
        return c;
    }

    private static final String ORDER = "{\"order_id\":\"o-1\",\"amount\":5.05,\"currency\":\"EUR\","
            + "\"customer\":{\"id\":\"c-1\",\"name\":\"Ada\",\"email\":\"ada@example.com\"},\"channel\":\"web\","
            + "\"lines\":[{\"sku\":\"SKU-1\",\"qty\":1,\"price\":1.5,\"note\":\"\"},{\"sku\":\"SKU-2\",\"qty\":3}],"
            + "\"meta\":{\"ts\":1700000000123}}";

    @Test
    void theOrdersRulesDecideTheBenchmarksValidOrdersAndAgreeOnTheRest() throws Exception {
        String orders = Files.readString(Path.of("../../config/rules/orders.schema.json"));
        String refs = Files.readString(Path.of("../../benchmarks/rules/orders_refs.schema.json"));
        List<byte[]> values = utf8(
                ORDER,
                ORDER.replace("\"amount\":5.05", "\"amount\":0"), // at the bound, exactly
                ORDER.replace("\"amount\":5.05", "\"amount\":0.0"), // a float at the bound: the full way
                ORDER.replace("\"amount\":5.05", "\"amount\":5.00"), // integer-valued float: the full way
                ORDER.replace("\"amount\":5.05", "\"amount\":-0.01"),
                ORDER.replace("\"amount\":5.05", "\"amount\":\"5\""),
                ORDER.replace("\"amount\":5.05", "\"amount\":5e2"),
                ORDER.replace("\"amount\":5.05", "\"amount\":1e999999"),
                ORDER.replace("\"price\":1.5", "\"price\":1E400"), // an exponent nobody constrains
                ORDER.replace("\"qty\":1", "\"qty\":0"),
                ORDER.replace("\"qty\":1", "\"qty\":1.0"),
                ORDER.replace("\"qty\":1", "\"qty\":1.5"),
                ORDER.replace("\"qty\":1", "\"qty\":99999999999999999999999"),
                ORDER.replace("\"currency\":\"EUR\"", "\"currency\":\"CHF\""),
                ORDER.replace("\"currency\":\"EUR\"", "\"currency\":1"),
                ORDER.replace("\"order_id\":\"o-1\"", "\"order_id\":\"\""),
                ORDER.replace("\"order_id\":\"o-1\"", "\"order_id\":\"é\""), // non-ASCII under minLength
                ORDER.replace("\"order_id\":\"o-1\",", ""),
                ORDER.replace("\"id\":\"c-1\",", ""),
                ORDER.replace("\"sku\":\"SKU-2\",", ""),
                ORDER.replace("\"channel\":\"web\"", "\"channel\":\"web\",\"channel\":\"app\""), // duplicate key
                ORDER.replace("\"name\":\"Ada\"", "\"name\":\"Ada\",\"name\":\"Ada\""), // duplicate, nested
                ORDER.replace("\"note\":\"\"", "\"note\":\"\\ud800\""), // lone surrogate escape
                ORDER.replace("\"note\":\"\"", "\"note\":\"\\ud83d\\ude00\""), // a pair: fine, the full way
                ORDER.replace("\"customer\":{", "\"customer\":[{").replace(",\"channel\"", "],\"channel\""),
                ORDER.replace("\"lines\":[", "\"lines\":{\"a\":[").replace("],\"meta\"", "]},\"meta\""),
                ORDER.replace("\"email\":\"ada@example.com\"", "\"email\":\"not an email\""),
                ORDER.replace("\"email\":\"ada@example.com\"", "\"email\":5"),
                ORDER + " ",
                ORDER + " {}",
                ORDER + "x",
                ORDER.substring(0, ORDER.length() - 1),
                "",
                "   ",
                "null",
                "[]",
                "{}",
                "{\"order_id\":\"o\",\"amount\":1,\"currency\":\"USD\",\"customer\":{\"id\":\"c\"}}",
                "{\"order_id\":\"o\",\"amount\":1,\"currency\":\"USD\",\"customer\":{\"id\":\"c\"},\"x\":NaN}",
                "{\"order_id\":\"o\",\"amount\":01,\"currency\":\"USD\",\"customer\":{\"id\":\"c\"}}",
                "{\"order_id\":\"o\",\"amount\":1,\"currency\":\"USD\",\"customer\":{\"id\":\"c\"}} // c");
        for (String schema : List.of(orders, refs)) {
            Classifier c = classifier(schema);
            assertTrue(c.compiled().decidedFast("t", values.get(0)), "the benchmark's order is not decided alone");
            int fast = compare(c, "t", values);
            assertTrue(fast >= 4, "the one-pass check decided " + fast + " of the orders");
            assertEquals(0, compare(classifier(schema), "t", utf8(ORDER.replace("\"qty\":1", "\"qty\":0"))));
        }
    }

    @Test
    void theEventTimeIsTheFullWaysWherePresentMissingOrUnusable() {
        Classifier c = classifier("{\"type\":\"object\"}", "meta", "ts");
        List<byte[]> values = utf8(
                ORDER,
                ORDER.replace("1700000000123", "\"2023-11-14T22:13:20.123Z\""),
                ORDER.replace("1700000000123", "\"1700000000123\""),
                ORDER.replace("1700000000123", "1700000000123.5"),
                ORDER.replace("1700000000123", "-5"),
                ORDER.replace("1700000000123", "true"),
                ORDER.replace("1700000000123", "null"),
                ORDER.replace("1700000000123", "{\"x\":1}"),
                ORDER.replace("1700000000123", "99999999999999999999999"),
                ORDER.replace("\"meta\":{\"ts\":1700000000123}", "\"meta\":[{\"ts\":1700000000123}]"),
                ORDER.replace("\"meta\":{\"ts\":1700000000123}", "\"meta\":5"),
                ORDER.replace(",\"meta\":{\"ts\":1700000000123}", ""),
                ORDER.replace("\"ts\":1700000000123", "\"tz\":{\"ts\":1700000000123}"));
        int fast = compare(c, "t", values);
        assertTrue(fast >= 8, "decided " + fast);
        assertEquals(List.of("null", "1700000000123", "false", "v-t"), TestSupport.fields(c.call("t", values.get(0))));
    }

    @Test
    void schemasOutsideTheSubsetHaveNoOnePassCheck() {
        for (String schema : List.of(
                "{\"$schema\":\"http://json-schema.org/draft-04/schema#\",\"type\":\"object\"}",
                "{\"type\":\"object\",\"patternProperties\":{\"^a\":{\"type\":\"string\"}}}",
                "{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/a\",\"type\":\"string\"}},"
                        + "\"$defs\":{\"a\":{\"minLength\":2}}}",
                "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#/$defs/n\"}}}},"
                        + "\"$ref\":\"#/$defs/n\"}",
                "{\"type\":\"object\",\"unevaluatedProperties\":false}",
                "{\"properties\":{\"a\":{\"$id\":\"http://x/a\",\"type\":\"string\"}}}")) {
            Classifier c = classifier(schema);
            // The rule has no fast check, or its opaque part sends every record that reaches it the full way.
            assertFalse(c.compiled().decidedFast("t", TestSupport.utf8("{\"a\":\"xy\",\"next\":{\"next\":{}}}")),
                    schema);
        }
        assertNotNull(FastCheck.compile(TestSupport.json("{\"type\":\"object\"}"), "kdq:/x.json",
                CompiledConfig.registry(true, java.util.Map.of())));
        assertNull(FastCheck.compile(TestSupport.json("{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}}}"),
                "kdq:/x.json", CompiledConfig.registry(true, java.util.Map.of())));
    }

    @Test
    void aTopicWithoutARuleOrSchemaOnlyNeedsJson() {
        ObjectNode cfg = TestSupport.config(1 << 20, true);
        TestSupport.rule(cfg, "plain", null);
        Classifier c = new Classifier(cfg.toString());
        List<byte[]> values = utf8(ORDER, "{\"a\":1,\"a\":2}", "1e999999", "[1,2", "\"\\udc00\"", "tru", "  7  ",
                // strings nothing looks at are skipped by the parser, not read: their escapes and control
                // characters must still make the record not JSON
                "{\"a\":\"x\\qy\"}", "[\"\\u12\"]", "{\"a\":\"tab\there\"}", "{\"a\":[\"ok\\n\",\"\\/\"]}");
        assertTrue(compare(c, "plain", values) >= 2);
        assertTrue(compare(c, "no-rule", values) >= 2);
    }

    // ------------------------------------------------------------------ random schemas of the subset

    private static final String[] NAMES = {"a", "b", "c"};
    private static final String[] STRINGS = {"", "x", "xy", "xyz", "é", "éé", "ab\u0301", "ada@example.com", "no"};

    /** What a random schema's $ref points to (the root's definitions), or null. */
    private static String refTarget;

    private static JsonNode randomSchema(Random r, int depth) {
        ObjectNode s = TestSupport.MAPPER.createObjectNode();
        if (depth > 2 || r.nextInt(6) == 0) {
            return r.nextInt(5) == 0 ? TestSupport.MAPPER.getNodeFactory().booleanNode(r.nextBoolean()) : s;
        }
        int keywords = 1 + r.nextInt(3);
        for (int k = 0; k < keywords; k++) {
            switch (r.nextInt(15)) {
                case 0: {
                    String[] types = {"null", "boolean", "object", "array", "number", "string", "integer"};
                    if (r.nextBoolean()) {
                        s.put("type", types[r.nextInt(types.length)]);
                    } else {
                        s.putArray("type").add(types[r.nextInt(types.length)]).add(types[r.nextInt(3) + 4]);
                    }
                    break;
                }
                case 1: {
                    ArrayNode e = s.putArray("enum");
                    e.add(STRINGS[r.nextInt(STRINGS.length)]);
                    if (r.nextBoolean()) {
                        e.add(r.nextInt(3));
                    }
                    if (r.nextBoolean()) {
                        e.addNull();
                    }
                    break;
                }
                case 2: {
                    ArrayNode req = s.putArray("required");
                    req.add(NAMES[r.nextInt(NAMES.length)]);
                    break;
                }
                case 3: {
                    ObjectNode props = s.putObject("properties");
                    for (String n : NAMES) {
                        if (r.nextBoolean()) {
                            props.set(n, randomSchema(r, depth + 1));
                        }
                    }
                    break;
                }
                case 4:
                    s.set("additionalProperties", randomSchema(r, depth + 1));
                    break;
                case 5:
                    s.set("items", randomSchema(r, depth + 1));
                    break;
                case 6:
                    s.put(r.nextBoolean() ? "minLength" : "maxLength", r.nextInt(3));
                    break;
                case 7: {
                    String[] bounds = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
                    String b = bounds[r.nextInt(bounds.length)];
                    if (r.nextBoolean()) {
                        s.put(b, r.nextInt(3) - 1);
                    } else {
                        s.put(b, (r.nextInt(5) - 2) / 2.0 + 0.1);
                    }
                    break;
                }
                case 8:
                    s.put(r.nextBoolean() ? "minItems" : "maxProperties", r.nextInt(3));
                    break;
                case 9:
                case 10: {
                    String[] groups = {"allOf", "anyOf", "oneOf"};
                    ArrayNode g = s.putArray(groups[r.nextInt(groups.length)]);
                    for (int i = 0; i < 1 + r.nextInt(3); i++) {
                        g.add(randomSchema(r, depth + 1));
                    }
                    break;
                }
                case 11:
                    s.set("not", randomSchema(r, depth + 1));
                    break;
                case 12:
                    s.put("format", r.nextBoolean() ? "email" : "date");
                    break;
                case 13:
                    if (refTarget != null && r.nextBoolean()) {
                        s.put("$ref", refTarget); // with siblings now and then: the full way decides those
                        break;
                    }
                    s.put("const", STRINGS[r.nextInt(STRINGS.length)]);
                    break;
                default:
                    s.put("const", STRINGS[r.nextInt(STRINGS.length)]);
                    break;
            }
        }
        return s;
    }

    private static String randomValue(Random r, int depth) {
        int kind = depth > 2 ? 3 + r.nextInt(5) : r.nextInt(8);
        switch (kind) {
            case 0:
            case 1: {
                StringBuilder b = new StringBuilder("{");
                int n = r.nextInt(4);
                for (int i = 0; i < n; i++) {
                    if (i > 0) {
                        b.append(',');
                    }
                    b.append('"').append(NAMES[r.nextInt(NAMES.length)]).append("\":").append(randomValue(r, depth + 1));
                }
                return b.append('}').toString();
            }
            case 2: {
                StringBuilder b = new StringBuilder("[");
                int n = r.nextInt(4);
                for (int i = 0; i < n; i++) {
                    if (i > 0) {
                        b.append(',');
                    }
                    b.append(randomValue(r, depth + 1));
                }
                return b.append(']').toString();
            }
            case 3: {
                String[] numbers = {"0", "1", "-1", "2", "0.0", "1.0", "0.1", "-0.9", "0.6", "1.5", "-0", "1e0",
                        "9007199254740993", "0.30000000000000004"};
                return numbers[r.nextInt(numbers.length)];
            }
            case 4:
            case 5:
                return "\"" + STRINGS[r.nextInt(STRINGS.length)] + "\"";
            case 6:
                return r.nextBoolean() ? "true" : "false";
            default:
                return "null";
        }
    }

    @Test
    void randomSchemasOfTheSubsetGetTheFullWaysVerdicts() {
        // -Dkdq.fastcheck.seed / .schemas: a longer search than the build's
        Random r = new Random(Long.getLong("kdq.fastcheck.seed", 20261130L));
        int schemas = Integer.getInteger("kdq.fastcheck.schemas", 400);
        int decided = 0;
        int compiled = 0;
        for (int i = 0; i < schemas; i++) {
            ObjectNode schema = (ObjectNode) TestSupport.MAPPER.createObjectNode();
            schema.put("$schema", i % 2 == 0 ? "https://json-schema.org/draft/2020-12/schema"
                    : "http://json-schema.org/draft-07/schema#");
            String defs = i % 2 == 0 ? "$defs" : "definitions";
            refTarget = null;
            JsonNode target = randomSchema(r, 1);
            refTarget = "#/" + defs + "/d";
            JsonNode body = randomSchema(r, 0);
            if (body.isObject()) {
                schema.setAll((ObjectNode) body);
            }
            schema.putObject(defs).set("d", target);
            Classifier c = classifier(schema.toString());
            if (c.compiled().rules.get(0).fast != null) {
                compiled++;
            }
            List<byte[]> values = new ArrayList<>();
            for (int j = 0; j < 40; j++) {
                values.add(randomValue(r, 0).getBytes(StandardCharsets.UTF_8));
            }
            decided += compare(c, "t", values);
        }
        assertTrue(compiled > schemas * 3 / 4, "compiled " + compiled);
        assertTrue(decided > schemas * 5, "decided " + decided);
        System.out.println("FastCheck random schemas: " + compiled + " of " + schemas + " compiled, " + decided
                + " of " + schemas * 40 + " values decided alone, every row the full way's");
    }
}
