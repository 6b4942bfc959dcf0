package io.kdq.spark.classify;

import static io.kdq.spark.classify.TestSupport.config;
import static io.kdq.spark.classify.TestSupport.eventTime;
import static io.kdq.spark.classify.TestSupport.problem;
import static io.kdq.spark.classify.TestSupport.rule;
import static io.kdq.spark.classify.TestSupport.utf8;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.types.StructType;
import org.junit.jupiter.api.Test;

import tools.jackson.databind.node.ObjectNode;

class ClassifierTest {

    private static Classifier classifier(ObjectNode cfg) {
        String json = cfg.toString();
        Classifier.check(json);
        return new Classifier(json);
    }

    // ------------------------------------------------------------------ envelope reasons

    @Test
    void reasonsInPriorityOrder() {
        ObjectNode cfg = config(20, true);
        rule(cfg, "t", "{\"type\":\"object\"}");
        Classifier c = classifier(cfg);
        byte[] bigNotUtf8 = new byte[21];
        Arrays.fill(bigNotUtf8, (byte) 0xff);
        assertEquals("too_large", problem(c, "t", bigNotUtf8));
        assertEquals("null_value", problem(c, "t", (byte[]) null));
        assertEquals("not_utf8", problem(c, "t", new byte[] {(byte) 0xc3, 0x28}));
        assertEquals("not_json", problem(c, "t", "{"));
        assertEquals("schema:/type", problem(c, "t", "[]"));
        assertNull(problem(c, "t", "{}"));
        assertEquals(20, utf8("{\"a\":\"0123456789ab\"}").length);
        assertNull(problem(c, "t", "{\"a\":\"0123456789ab\"}")); // exactly max_value_bytes
    }

    @Test
    void notJson() {
        ObjectNode cfg = config(1 << 20, true);
        Classifier c = classifier(cfg);
        for (String v : List.of("", "   ", "x", "{", "{} {}", "[1] 2", "NaN", "Infinity", "-Infinity", "{\"a\":NaN}",
                "{\"a\":1,\"a\":2}", "{\"a\":{\"b\":1,\"b\":1}}", "'x'", "[1,]", "{\"a\":1,}", "01",
                "\"\\ud800\"", "\"\\udc00x\"", "{\"\\ud800\":1}", "\"\\ud800\\u0041\"")) {
            assertEquals("not_json", problem(c, "any", v), v);
        }
        for (String v : List.of("5", "\"x\"", "null", "true", "[]", " {} ", "-0", "1e400", "-1e400",
                "123456789012345678901234567890", "\"\\ud83d\\ude00\"", "\"\\u00e9\"", "{\"a\":1,\"b\":{\"a\":2}}")) {
            assertNull(problem(c, "any", v), v);
        }
    }

    @Test
    void invalidUtf8() {
        Classifier c = classifier(config(1 << 20, true));
        byte[][] bad = {
            {'"', (byte) 0xed, (byte) 0xa0, (byte) 0x80, '"'}, // encoded surrogate U+D800
            {'"', (byte) 0xc0, (byte) 0xaf, '"'}, // overlong '/'
            {'"', (byte) 0xf4, (byte) 0x90, (byte) 0x80, (byte) 0x80, '"'}, // beyond U+10FFFF
            {'"', (byte) 0xe2, (byte) 0x82, '"'}, // truncated sequence
            {(byte) 0xff, (byte) 0xfe},
        };
        for (byte[] b : bad) {
            assertEquals("not_utf8", problem(c, "any", b), Arrays.toString(b));
        }
        assertNull(problem(c, "any", "\"é€😀\""));
    }

    @Test
    void tooComplex() {
        Classifier c = classifier(config(10_000_000, true));
        assertEquals("too_complex", problem(c, "any", "[".repeat(100_000)));
        assertEquals("too_complex", problem(c, "any", "[".repeat(100_000) + "]".repeat(100_000)));
        assertEquals("too_complex", problem(c, "any", "{\"a\":".repeat(600) + "1" + "}".repeat(600)));
        assertNull(problem(c, "any", "[".repeat(500) + "]".repeat(500)));
        assertEquals("too_complex", problem(c, "any", "9".repeat(10_000)));
        assertEquals("too_complex", problem(c, "any", "[" + "9".repeat(1001) + "]"));
        assertEquals("too_complex", problem(c, "any", "1e999999999"));
        assertEquals("too_complex", problem(c, "any", "1e-999999999"));
        assertNull(problem(c, "any", "9".repeat(1000)));
        assertNull(problem(c, "any", "1e400"));
    }

    @Test
    void bigNumbersAreOrdinaryNumbers() {
        ObjectNode cfg = config(1 << 20, true);
        rule(cfg, "int", "{\"type\":\"integer\"}");
        rule(cfg, "num", "{\"type\":\"number\",\"maximum\":10}");
        rule(cfg, "mul", "{\"multipleOf\":0.01}");
        Classifier c = classifier(cfg);
        assertNull(problem(c, "int", "123456789012345678901234567890"));
        assertNull(problem(c, "int", "1e400"));
        assertEquals("schema:/type", problem(c, "int", "1.5"));
        assertNull(problem(c, "num", "-1e400"));
        assertEquals("schema:/maximum", problem(c, "num", "1e400"));
        assertEquals("schema:/maximum", problem(c, "num", "123456789012345678901234567890"));
        assertNull(problem(c, "mul", "1e400"));
        assertNull(problem(c, "mul", "0.07"));
        assertEquals("schema:/multipleOf", problem(c, "mul", "0.075"));
    }

    // ------------------------------------------------------------------ schema reasons

    @Test
    void keywordLocations() {
        ObjectNode cfg = config(1 << 20, true);
        rule(cfg, "ref", "{\"$defs\":{\"pos\":{\"type\":\"integer\",\"minimum\":1}},"
                + "\"properties\":{\"n\":{\"$ref\":\"#/$defs/pos\"}}}");
        rule(cfg, "esc", "{\"properties\":{\"a/b~c\":{\"type\":\"string\"}}}");
        rule(cfg, "req", "{\"required\":[\"a\",\"b\",\"c\"]}");
        rule(cfg, "false", "{\"properties\":{\"x\":false}}");
        rule(cfg, "allof", "{\"allOf\":[{\"type\":\"object\"},{\"required\":[\"z\"]}]}");
        rule(cfg, "pp", "{\"patternProperties\":{\"^s_\":{\"type\":\"string\"}}}");
        rule(cfg, "unevaluated", "{\"properties\":{\"a\":true},\"unevaluatedProperties\":false}");
        Classifier c = classifier(cfg);
        assertEquals("schema:/properties/n/$ref/minimum", problem(c, "ref", "{\"n\":0}"));
        assertEquals("schema:/properties/n/$ref/type", problem(c, "ref", "{\"n\":\"1\"}"));
        assertEquals("schema:/properties/a~1b~0c/type", problem(c, "esc", "{\"a/b~c\":1}"));
        assertEquals("schema:/required/1", problem(c, "req", "{\"a\":1}"));
        assertEquals("schema:/required/0", problem(c, "req", "{\"c\":1}"));
        assertEquals("schema:/properties/x", problem(c, "false", "{\"x\":1}"));
        assertEquals("schema:/allOf/1/required/0", problem(c, "allof", "{}"));
        assertEquals("schema:/allOf/0/type", problem(c, "allof", "[]"));
        assertEquals("schema:/patternProperties/^s_/type", problem(c, "pp", "{\"s_1\":1}"));
        assertEquals("schema:/unevaluatedProperties", problem(c, "unevaluated", "{\"a\":1,\"b\":2}"));
    }

    @Test
    void refToResourceAndDynamicRef() {
        ObjectNode cfg = config(1 << 20, true);
        cfg.withObjectProperty("resources").set("kdq:/rules/common.schema.json",
                TestSupport.json("{\"$defs\":{\"id\":{\"type\":\"string\",\"minLength\":3}}}"));
        cfg.withObjectProperty("resources").set("https://example.com/person.json",
                TestSupport.json("{\"$id\":\"https://example.com/person.json\",\"required\":[\"name\"]}"));
        rule(cfg, "orders", "{\"properties\":{\"id\":{\"$ref\":\"common.schema.json#/$defs/id\"},"
                + "\"who\":{\"$ref\":\"https://example.com/person.json\"}}}");
        rule(cfg, "tree", "{\"$dynamicAnchor\":\"node\",\"type\":\"object\","
                + "\"properties\":{\"kids\":{\"type\":\"array\",\"items\":{\"$dynamicRef\":\"#node\"}}}}");
        Classifier c = classifier(cfg);
        assertNull(problem(c, "orders", "{\"id\":\"abc\",\"who\":{\"name\":\"x\"}}"));
        assertEquals("schema:/properties/id/$ref/minLength", problem(c, "orders", "{\"id\":\"ab\"}"));
        assertEquals("schema:/properties/who/$ref/required/0", problem(c, "orders", "{\"who\":{}}"));
        assertNull(problem(c, "tree", "{\"kids\":[{\"kids\":[]}]}"));
        assertEquals("schema:/properties/kids/items/$dynamicRef/type", problem(c, "tree", "{\"kids\":[1]}"));
        assertEquals("schema:/properties/kids/items/$dynamicRef/properties/kids/items/$dynamicRef/type",
                problem(c, "tree", "{\"kids\":[{\"kids\":[1]}]}"));
    }

    @Test
    void checkRefusesBrokenRules() {
        ObjectNode cfg = config(1 << 20, true);
        rule(cfg, "a", "{\"properties\":{\"x\":{\"$ref\":\"missing.schema.json\"}}}");
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Classifier.check(cfg.toString()));
        assertTrue(e.getMessage().contains("rule 'a' (test/a.schema.json)"), e.getMessage());
        assertTrue(e.getMessage().contains("missing.schema.json"), e.getMessage());

        ObjectNode local = config(1 << 20, true);
        rule(local, "b", "{\"properties\":{\"x\":{\"$ref\":\"#/$defs/nowhere\"}}}");
        e = assertThrows(IllegalArgumentException.class, () -> Classifier.check(local.toString()));
        assertTrue(e.getMessage().contains("rule 'b'"), e.getMessage());

        ObjectNode remote = config(1 << 20, true);
        rule(remote, "r", "{\"$ref\":\"https://example.com/not-supplied.json\"}");
        e = assertThrows(IllegalArgumentException.class, () -> Classifier.check(remote.toString()));
        assertTrue(e.getMessage().contains("rule 'r'") && e.getMessage().contains("not-supplied")
                && e.getMessage().contains("never fetched"), e.getMessage());

        ObjectNode dyn = config(1 << 20, true);
        rule(dyn, "d", "{\"items\":{\"$dynamicRef\":\"other.json#meta\"}}");
        e = assertThrows(IllegalArgumentException.class, () -> Classifier.check(dyn.toString()));
        assertTrue(e.getMessage().contains("rule 'd'"), e.getMessage());

        ObjectNode regex = config(1 << 20, true);
        rule(regex, "p", "{\"properties\":{\"s\":{\"pattern\":\"(?P<x>a)\"}}}");
        e = assertThrows(IllegalArgumentException.class, () -> Classifier.check(regex.toString()));
        assertTrue(e.getMessage().contains("rule 'p'") && e.getMessage().contains("(?P<x>a)"), e.getMessage());

        ObjectNode dialect = config(1 << 20, true);
        rule(dialect, "s", "{\"$schema\":\"https://example.com/my-dialect\",\"type\":\"object\"}");
        e = assertThrows(IllegalArgumentException.class, () -> Classifier.check(dialect.toString()));
        assertTrue(e.getMessage().contains("rule 's'") && e.getMessage().contains("unknown $schema"), e.getMessage());

        ObjectNode topic = config(1 << 20, true);
        rule(topic, "a{", null).put("is_pattern", true);
        e = assertThrows(IllegalArgumentException.class, () -> Classifier.check(topic.toString()));
        assertTrue(e.getMessage().contains("topic pattern"), e.getMessage());

        ObjectNode ok = config(1 << 20, true);
        ok.withObjectProperty("resources").set("kdq:/rules/common.schema.json", TestSupport.json("{\"type\":\"string\"}"));
        rule(ok, "x", "{\"$ref\":\"common.schema.json\"}");
        rule(ok, "y", "{\"$schema\":\"http://json-schema.org/draft-04/schema#\",\"type\":\"integer\"}");
        rule(ok, "z", null);
        assertTrue(Classifier.check(ok.toString()).startsWith("3 rules compiled"), Classifier.check(ok.toString()));
    }

    @Test
    void brokenConfigurationNeverThrowsFromCall() {
        Classifier broken = new Classifier("{\"rules\":[{\"match\":\"t\",\"schema\":{\"$ref\":\"nope.json\"}}]}");
        Row row = broken.call("t", utf8("{}"));
        assertTrue(((String) row.get(0)).startsWith("internal_error:"), String.valueOf(row.get(0)));
        Row row2 = new Classifier("not json").call("t", null);
        assertTrue(((String) row2.get(0)).startsWith("internal_error:"));
    }

    @Test
    void catastrophicPatternIsBudgeted() {
        ObjectNode cfg = config(1 << 20, true);
        // JDK 9+ memoizes simple nested quantifiers (^(a+)+$ is linear there); a counted group of
        // greedy wildcards still backtracks exponentially.
        rule(cfg, "p", "{\"properties\":{\"s\":{\"pattern\":\"^(.*a){20}$\"}}}");
        rule(cfg, "pp", "{\"patternProperties\":{\"^(.*a){20}$\":{}}}");
        rule(cfg, "names", "{\"propertyNames\":{\"pattern\":\"^(.*a){20}$\"}}");
        rule(cfg, "classic", "{\"pattern\":\"^(a+)+$\"}");
        Classifier c = classifier(cfg);
        String evil = "a".repeat(40) + "b";
        assertTimeoutPreemptively(Duration.ofSeconds(5), () -> {
            assertEquals("pattern_budget:/properties/s/pattern", problem(c, "p", "{\"s\":\"" + evil + "\"}"));
            assertEquals("pattern_budget:/patternProperties", problem(c, "pp", "{\"" + evil + "\":1}"));
            assertEquals("pattern_budget:/propertyNames/pattern", problem(c, "names", "{\"" + evil + "\":1}"));
            assertEquals("schema:/pattern", problem(c, "classic", "\"" + evil + "\""));
        });
        assertNull(problem(c, "classic", "\"" + "a".repeat(10_000) + "\""));
        assertEquals("schema:/properties/s/pattern", problem(c, "p", "{\"s\":\"aab\"}"));
    }

    @Test
    void runawayRecursionIsTooComplex() {
        // A schema recursing without consuming the instance: networknt's evaluation depth limit stops
        // it, on a deep-stack thread (DeepStack), so the verdict never depends on the caller's stack.
        ObjectNode cfg = config(1 << 20, true);
        rule(cfg, "loop", "{\"$defs\":{\"a\":{\"allOf\":[{\"$ref\":\"#/$defs/a\"}]}},\"$ref\":\"#/$defs/a\"}");
        Classifier c = new Classifier(cfg.toString());
        assertEquals("too_complex", problem(c, "loop", "{}"));
    }

    @Test
    void deepRecursiveSchemaOnDeepDocument() {
        ObjectNode cfg = config(10_000_000, true);
        rule(cfg, "tree", "{\"$defs\":{\"n\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}},"
                + "\"$ref\":\"#/$defs/n\"}");
        Classifier c = classifier(cfg);
        assertNull(problem(c, "tree", "[".repeat(499) + "]".repeat(499)));
        assertEquals("schema:/$ref/items/$ref/items/$ref/type", problem(c, "tree", "[[1]]"));
    }

    // ------------------------------------------------------------------ event time

    private static Row evt(Classifier c, String value) {
        return c.call("evt", utf8(value));
    }

    @Test
    void eventTimeEpochMillis() {
        ObjectNode cfg = config(1 << 20, true);
        eventTime(rule(cfg, "evt", null), "epoch_millis", "meta", "event_time");
        Classifier c = classifier(cfg);
        assertEquals(List.of("null", "1700000000123", "false", "v-evt"),
                TestSupport.fields(evt(c, "{\"meta\":{\"event_time\":1700000000123}}")));
        assertEquals(1700000000123L, evt(c, "{\"meta\":{\"event_time\":\"1700000000123\"}}").get(1));
        assertEquals(0L, evt(c, "{\"meta\":{\"event_time\":0}}").get(1));
        assertEquals(EventTime.MAX_MS, evt(c, "{\"meta\":{\"event_time\":253402300799999}}").get(1));
        for (String bad : List.of("1700000000000000000", "1700000000000000", "-1", "\"-1\"", "253402300800000",
                "1.7e12", "1.5", "1700000000123.0", "\"1.7e12\"", "\"1700000000000000\"", "\"\"", "\"NaN\"",
                "\"2023-11-14T22:13:20Z\"", "true", "false", "null", "{}", "[]",
                "123456789012345678901234567890", "-123456789012345678901234567890", "1e400")) {
            Row row = evt(c, "{\"meta\":{\"event_time\":" + bad + "}}");
            assertNull(row.get(1), bad);
            assertEquals(true, row.get(2), bad);
            assertNull(row.get(0), bad);
        }
        Row missing = evt(c, "{\"meta\":{}}");
        assertEquals(Arrays.asList(null, null, true, "v-evt"), Arrays.asList(missing.get(0), missing.get(1),
                missing.get(2), missing.get(3)));
        assertEquals(true, evt(c, "{\"meta\":5}").get(2));
        assertEquals(true, evt(c, "[1]").get(2));
        assertEquals(true, evt(c, "{\"meta.event_time\":1}").get(2)); // no dotted-string parsing
        Row notJson = evt(c, "{");
        assertEquals(Arrays.asList("not_json", null, true), Arrays.asList(notJson.get(0), notJson.get(1),
                notJson.get(2)));
        assertEquals(true, c.call("evt", null).get(2));
    }

    @Test
    void eventTimeIso8601() {
        ObjectNode cfg = config(1 << 20, true);
        eventTime(rule(cfg, "evt", null), "iso8601", "ts");
        Classifier c = classifier(cfg);
        long base = 1700000000000L; // 2023-11-14T22:13:20Z
        Object[][] good = {
            {"2023-11-14T22:13:20.123Z", base + 123},
            {"2023-11-14T22:13:20Z", base},
            {"2023-11-14t22:13:20z", base},
            {"2023-11-14T22:13:20+01:00", base - 3_600_000},
            {"2023-11-14T22:13:20-0130", base + 5_400_000},
            {"2023-11-14T22:13:20+01", base - 3_600_000},
            {"2023-11-14 22:13:20", base},
            {"2023-11-14T22:13:20", base},
            {"2023-11-14T22:13", base - 20_000},
            {"2023-11-14T22:13:20.123456789Z", base + 123},
            {"2023-11-14T22:13:20.1Z", base + 100},
            {"2023-11-14", base - (22 * 3600 + 13 * 60 + 20) * 1000L},
            {"1970-01-01T00:00:00Z", 0L},
            {"9999-12-31T23:59:59.999Z", EventTime.MAX_MS},
            {"2024-02-29", 1709164800000L},
        };
        for (Object[] g : good) {
            assertEquals(g[1], evt(c, "{\"ts\":\"" + g[0] + "\"}").get(1), (String) g[0]);
        }
        for (String bad : List.of("0000-01-01T00:00:00Z", "10000-01-01T00:00:00Z", "9999-12-31T23:59:59.999-01:00",
                "1969-12-31T23:59:59.999Z", "2023-02-29", "2023-13-01", "2023-11-14T24:00:00Z", "2023-11-14T22:60Z",
                "2023-11-14T22:13:20.Z", "2023-11-14T22:13:20Q", "2023-11-14X22:13:20", "NaN", "", "1700000000123",
                "2023-11-14T22:13:20+1", "x".repeat(100_000), " 2023-11-14")) {
            Row row = evt(c, "{\"ts\":\"" + bad + "\"}");
            assertNull(row.get(1), bad.length() > 40 ? "long string" : bad);
            assertEquals(true, row.get(2));
        }
        assertEquals(true, evt(c, "{\"ts\":1700000000123}").get(2)); // iso8601 takes strings only
    }

    @Test
    void eventTimeAuto() {
        ObjectNode cfg = config(1 << 20, true);
        eventTime(rule(cfg, "evt", "{\"type\":\"object\"}"), "auto", "a", "b");
        Classifier c = classifier(cfg);
        assertEquals(1700000000123L, evt(c, "{\"a\":{\"b\":1700000000123}}").get(1));
        assertEquals(1700000000123L, evt(c, "{\"a\":{\"b\":\"1700000000123\"}}").get(1));
        assertEquals(1700000000123L, evt(c, "{\"a\":{\"b\":\"2023-11-14T22:13:20.123Z\"}}").get(1));
        for (String bad : List.of("1700000000000000000", "1700000000000000", "-5", "\"-5\"", "1.5", "\"NaN\"",
                "true", "null", "{}", "\"" + "9".repeat(100_000) + "\"")) {
            assertEquals(true, evt(c, "{\"a\":{\"b\":" + bad + "}}").get(2), bad.length() > 40 ? "long" : bad);
        }
        // The schema result and the event time are independent.
        Row row = c.call("evt", utf8("[]"));
        assertEquals(Arrays.asList("schema:/type", null, true), Arrays.asList(row.get(0), row.get(1), row.get(2)));
    }

    @Test
    void noEventTimeField() {
        ObjectNode cfg = config(1 << 20, true);
        rule(cfg, "t", null);
        Classifier c = classifier(cfg);
        assertEquals(List.of("null", "null", "false", "v-t"), TestSupport.fields(c.call("t", utf8("{}"))));
        assertEquals(List.of("not_json", "null", "false", "v-t"), TestSupport.fields(c.call("t", utf8("{"))));
        assertEquals(List.of("null", "null", "false", "none"), TestSupport.fields(c.call("other", utf8("{}"))));
        assertEquals(List.of("null", "null", "false", "none"), TestSupport.fields(c.call(null, utf8("{}"))));
    }

    // ------------------------------------------------------------------ dispatch

    @Test
    void dispatchFirstMatchWinsAndPatternsMatchWholeNames() {
        ObjectNode cfg = config(1 << 20, true);
        rule(cfg, "pat.free", null);
        ObjectNode p = rule(cfg, "pat\\..*", "{\"required\":[\"id\"]}");
        p.put("is_pattern", true);
        p.put("version", "v-pattern");
        rule(cfg, "pat.late", "{\"type\":\"string\"}"); // shadowed by the pattern before it
        rule(cfg, "exact", "{\"type\":\"array\"}");
        Classifier c = classifier(cfg);
        assertEquals(List.of("null", "null", "false", "v-pat.free"), TestSupport.fields(c.call("pat.free", utf8("{}"))));
        assertEquals("schema:/required/0", problem(c, "pat.new", "{}"));
        assertEquals("v-pattern", c.call("pat.late", utf8("{}")).get(3));
        assertEquals("none", c.call("xpat.a", utf8("{}")).get(3)); // whole name, not a search
        assertEquals("none", c.call("patX", utf8("{}")).get(3));
        assertEquals("schema:/type", problem(c, "exact", "{}"));
    }

    @Test
    void thousandExactRules() {
        ObjectNode cfg = config(1 << 20, true);
        for (int i = 0; i < 1000; i++) {
            rule(cfg, "topic-" + i, "{\"type\":\"object\",\"properties\":{\"n\":{\"const\":" + i + "}}}");
        }
        Classifier c = classifier(cfg);
        for (int i = 0; i < 1000; i++) {
            assertNull(problem(c, "topic-" + i, "{\"n\":" + i + "}"));
            assertEquals("schema:/properties/n/const", problem(c, "topic-" + i, "{\"n\":" + (i + 1) + "}"));
            assertEquals("v-topic-" + i, c.call("topic-" + i, utf8("{}")).get(3));
        }
        assertEquals("none", c.call("topic-1000", utf8("{}")).get(3));
    }

    // ------------------------------------------------------------------ API

    @Test
    void returnTypeMatchesTheDdl() {
        assertEquals("problem STRING, event_ms BIGINT, event_time_bad BOOLEAN, rules_version STRING",
                Classifier.RETURN_DDL);
        // Spark's StringType needs spark-unsafe, Kryo and ICU (14 MB), which this module's test
        // classpath leaves out to keep the build quick: checked where they are (pyspark's jars).
        org.junit.jupiter.api.Assumptions.assumeTrue(onClasspath("com.ibm.icu.util.VersionInfo")
                && onClasspath("org.apache.spark.sql.catalyst.util.CollationFactory"));
        StructType t = Classifier.returnType();
        assertEquals(List.of("problem", "event_ms", "event_time_bad", "rules_version"), Arrays.asList(t.fieldNames()));
        assertEquals("struct<problem:string,event_ms:bigint,event_time_bad:boolean,rules_version:string>",
                t.simpleString());
    }

    private static boolean onClasspath(String name) {
        try {
            Class.forName(name, false, ClassifierTest.class.getClassLoader());
            return true;
        } catch (ClassNotFoundException e) {
            return false;
        }
    }

    @Test
    void serializesAsItsConfigurationOnly() throws Exception {
        ObjectNode cfg = config(1 << 20, true);
        rule(cfg, "t", "{\"type\":\"object\"}");
        Classifier c = classifier(cfg);
        assertEquals("schema:/type", problem(c, "t", "[]")); // compiled state exists now
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        try (ObjectOutputStream out = new ObjectOutputStream(bytes)) {
            out.writeObject(c);
        }
        assertTrue(bytes.size() < 2000, "serialized size " + bytes.size());
        Classifier copy;
        try (ObjectInputStream in = new ObjectInputStream(new ByteArrayInputStream(bytes.toByteArray()))) {
            copy = (Classifier) in.readObject();
        }
        assertEquals("schema:/type", problem(copy, "t", "[]"));
        assertTrueSame(c, copy);
    }

    private static void assertTrueSame(Classifier a, Classifier b) {
        assertTrue(a.compiled() == b.compiled(), "one compiled rule set per JVM");
    }

    @Test
    void concurrentCallsAgree() throws Exception {
        ObjectNode cfg = config(1 << 20, true);
        rule(cfg, "t", "{\"properties\":{\"n\":{\"minimum\":0}},\"required\":[\"n\"]}");
        Classifier c = new Classifier(cfg.toString());
        List<Thread> threads = new java.util.ArrayList<>();
        java.util.concurrent.atomic.AtomicInteger wrong = new java.util.concurrent.atomic.AtomicInteger();
        for (int t = 0; t < 8; t++) {
            Thread th = new Thread(() -> {
                for (int i = 0; i < 2000; i++) {
                    String expected = i % 3 == 0 ? "schema:/properties/n/minimum" : i % 3 == 1 ? null : "schema:/required/0";
                    String v = i % 3 == 0 ? "{\"n\":-1}" : i % 3 == 1 ? "{\"n\":1}" : "{}";
                    if (!java.util.Objects.equals(expected, problem(c, "t", v))) {
                        wrong.incrementAndGet();
                    }
                }
            });
            threads.add(th);
            th.start();
        }
        for (Thread th : threads) {
            th.join();
        }
        assertEquals(0, wrong.get());
        assertFalse(Thread.currentThread().isInterrupted());
    }
}
