package io.kdq.spark.classify;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.IntSupplier;
import java.util.stream.Stream;

import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import com.networknt.schema.ExecutionConfig;
import com.networknt.schema.SchemaRegistry;
import com.networknt.schema.format.Format;
import com.networknt.schema.format.Formats;

import tools.jackson.databind.JsonNode;
import tools.jackson.databind.node.ObjectNode;
import tools.jackson.databind.node.StringNode;

/**
 * {@link FastCheck.FormatCheck}: the direct call of networknt's format gives, for every string, the answer of the
 * whole evaluation of {@code {"$schema": <dialect>, "format": <name>}} (the route it replaces where it can): for
 * every format networknt knows ({@link Formats#DEFAULT}, the formats of each of its dialects), unknown names, each
 * dialect the one-pass check supports (and none: the registry's default), with and without format assertion, on
 * every string of the JSON-Schema-Test-Suite's format tests (optional/format and format.json) and a few more.
 */
class FastCheckFormatTest {
    /** The dialects of {@link FastCheck}; null: no $schema (the registry's default, 2020-12). */
    private static final String[] DIALECTS = {"http://json-schema.org/draft-06/schema#",
            "http://json-schema.org/draft-07/schema#", "https://json-schema.org/draft/2019-09/schema",
            "https://json-schema.org/draft/2020-12/schema", null};
    /** Names networknt does not know, in any dialect (a case or spelling away from known ones included). */
    private static final List<String> UNKNOWN =
            List.of("unknown", "int32", "EMAIL", "e-mail", "date_time", "", " email");

    private static List<String> strings;

    @BeforeAll
    static void loadStrings() throws IOException, URISyntaxException {
        Path tests = Path.of(
                FastCheckFormatTest.class.getResource("/json-schema-test-suite/tests/draft2020-12").toURI());
        List<Path> files = new ArrayList<>();
        files.add(tests.resolve("format.json"));
        try (Stream<Path> s = Files.list(tests.resolve("optional/format"))) {
            s.filter(p -> p.toString().endsWith(".json")).sorted().forEach(files::add);
        }
        Set<String> out = new LinkedHashSet<>();
        for (Path f : files) {
            for (JsonNode group : TestSupport.MAPPER.readTree(f.toFile())) {
                for (JsonNode test : group.get("tests")) {
                    if (test.get("data").isString()) {
                        out.add(test.get("data").asString());
                    }
                }
            }
        }
        // The benchmark's emails, whitespace the email check refuses, and the odd ones.
        out.addAll(List.of("user414002@example.com", "ada@example.com", "a@b", "ada\u00a0@example.com",
                "ada@example.com ", "", " ", "\u0000", "\uD83D\uDE00@example.com", "P1D", "-P1D", "p1d", "2024-02-30",
                "((a)",
                // Long, not too long: uri-template's pattern recurses once per character in Java's matcher, and a
                // few thousand characters overflow a 1 MB stack on either route (an Error: the task fails, as before).
                "x".repeat(300), "a".repeat(64) + "@" + "b".repeat(63) + ".com"));
        strings = List.copyOf(out);
        assertTrue(strings.size() > 500, "the suite's format strings were not found");
    }

    private static List<String> knownNames() {
        return Formats.DEFAULT.stream().map(Format::getName).toList();
    }

    /** The answer, or the exception's class (the route must throw the same where the evaluation throws). */
    private static String outcome(IntSupplier check) {
        try {
            int r = check.getAsInt();
            return r == FastCheck.VALID ? "valid" : r == FastCheck.UNKNOWN ? "unknown" : "invalid?" + r;
        } catch (RuntimeException e) {
            return e.getClass().getName();
        }
    }

    private static long budget(String s) {
        return BudgetRegexFactory.BASE_BUDGET
                + BudgetRegexFactory.PER_BYTE_BUDGET * (s.getBytes(StandardCharsets.UTF_8).length + 2L);
    }

    private static JsonNode dialect(String id) {
        return id == null ? null : StringNode.valueOf(id);
    }

    /** Compares both routes on every string; returns how many strings the evaluation does not pass. */
    private static int compare(FastCheck.FormatCheck f, String what, ExecutionConfig inline, ExecutionConfig full) {
        int notValid = 0;
        for (String s : strings) {
            String evaluation = outcome(() -> f.viaEvaluation(s, inline, full, budget(s)));
            String check = outcome(() -> f.check(s, inline, full, budget(s)));
            assertEquals(evaluation, check, () -> what + " on " + TestSupport.MAPPER.writeValueAsString(s));
            if (!evaluation.equals("valid")) {
                notValid++;
            }
        }
        return notValid;
    }

    /** With the classifier's own configurations (CompiledConfig's registry and execution configurations). */
    @Test
    void everyFormatInEveryDialectGivesTheEvaluationsAnswer() {
        int maxNestingDepth = 500; // TestSupport.config's and the product's default
        int compiled = 0;
        for (boolean assertFormat : new boolean[] {true, false}) {
            SchemaRegistry registry = CompiledConfig.registry(assertFormat, Map.of());
            ExecutionConfig full = CompiledConfig.executionConfig(assertFormat, 4 * maxNestingDepth + 100);
            ExecutionConfig inline = CompiledConfig.executionConfig(assertFormat,
                    Math.min(Evaluation.INLINE_EVALUATION_DEPTH, 4 * maxNestingDepth + 100));
            for (String d : DIALECTS) {
                List<String> names = new ArrayList<>(knownNames());
                names.addAll(UNKNOWN);
                for (String name : names) {
                    FastCheck.FormatCheck f = FastCheck.FormatCheck.compile(registry,
                            "kdq:/test/format-" + compiled++ + ".json", dialect(d), name);
                    String what = "format '" + name + "' in " + d + " (assert_format=" + assertFormat + ")";
                    int notValid = compare(f, what, inline, full);
                    boolean known = knownNames().contains(name);
                    if (known && !name.equals("regex")) {
                        // The direct call is what the classifier uses for these (else this test would prove little).
                        Format expected = Formats.DEFAULT.stream().filter(x -> x.getName().equals(name)).findFirst()
                                .orElseThrow();
                        assertSame(expected, f.direct, what + ": no direct call");
                    } else {
                        assertNull(f.direct, what + ": unknown and regex formats go the whole evaluation");
                    }
                    if (!assertFormat) {
                        assertEquals(0, notValid, what + ": format asserts nothing with assert_format=false");
                    } else if (known) {
                        assertTrue(notValid > 0, what + ": no string fails it, the comparison proves little");
                    }
                }
            }
        }
    }

    /**
     * Execution configurations the direct call cannot mirror (format assertion not said, or said differently by
     * the two; fail fast; a step limit the schema reaches): the evaluation decides, with its answer or exception.
     */
    @Test
    void configurationsTheDirectCallCannotMirrorGoTheWholeEvaluation() {
        SchemaRegistry registry = CompiledConfig.registry(true, Map.of());
        ExecutionConfig asserting = CompiledConfig.executionConfig(true, 128);
        ExecutionConfig notSaid = ExecutionConfig.builder().failFast(false).build();
        ExecutionConfig failFast = ExecutionConfig.builder().formatAssertionsEnabled(true).failFast(true).build();
        ExecutionConfig oneStep = ExecutionConfig.builder().formatAssertionsEnabled(true).maxEvaluationSteps(1).build();
        ExecutionConfig notAsserting = CompiledConfig.executionConfig(false, 128);
        int i = 0;
        for (String d : DIALECTS) {
            for (String name : List.of("email", "date-time", "duration", "ipv4", "uuid")) {
                FastCheck.FormatCheck f = FastCheck.FormatCheck.compile(registry, "kdq:/test/config-" + i++ + ".json",
                        dialect(d), name);
                assertNotNull(f.direct);
                String what = "format '" + name + "' in " + d;
                compare(f, what + ", assertion not said (the dialect's default)", notSaid, notSaid);
                compare(f, what + ", fail fast", failFast, failFast);
                compare(f, what + ", one step", oneStep, oneStep);
                compare(f, what + ", inline asserts, full does not", asserting, notAsserting);
                compare(f, what + ", inline does not, full does", notAsserting, asserting);
            }
        }
    }

    /** The rule's format through the classifier: the one-pass check's rows are the full way's in every dialect. */
    @Test
    void theClassifierAgreesWithAndWithoutTheOnePassCheck() {
        for (String d : DIALECTS) {
            for (String name : List.of("email", "idn-email", "date-time", "date", "time", "duration", "uri", "ipv6",
                    "hostname", "unknown")) {
                ObjectNode schema = TestSupport.MAPPER.createObjectNode();
                if (d != null) {
                    schema.put("$schema", d);
                }
                schema.put("type", "object");
                schema.putObject("properties").putObject("v").put("type", "string").put("format", name);
                ObjectNode cfg = TestSupport.config(1 << 20, true);
                TestSupport.rule(cfg, "t", schema.toString());
                Classifier c = new Classifier(cfg.toString());
                boolean before = CompiledConfig.fastChecks;
                int decided = 0;
                try {
                    for (String s : strings) {
                        ObjectNode doc = TestSupport.MAPPER.createObjectNode();
                        doc.put("v", s);
                        byte[] value = TestSupport.utf8(doc.toString());
                        CompiledConfig.fastChecks = true;
                        List<Object> withFast = TestSupport.fields(c.call("t", value));
                        CompiledConfig.fastChecks = false;
                        List<Object> fullWay = TestSupport.fields(c.call("t", value));
                        assertEquals(fullWay, withFast, () -> "format '" + name + "' in " + d + " on " + doc);
                        if (c.compiled().decidedFast("t", value)) {
                            decided++;
                            assertEquals("null", fullWay.get(0), "decided valid, the full way says otherwise");
                        }
                    }
                } finally {
                    CompiledConfig.fastChecks = before;
                }
                assertTrue(decided > 0, "format '" + name + "' in " + d + ": the one-pass check decided nothing");
            }
        }
    }
}
