package io.kdq.spark.classify;

import static io.kdq.spark.classify.TestSupport.config;
import static io.kdq.spark.classify.TestSupport.problem;
import static io.kdq.spark.classify.TestSupport.rule;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicBoolean;

import org.junit.jupiter.api.Test;

import tools.jackson.databind.node.ObjectNode;

/**
 * A verdict is a function of the record and the rules only. Not of the stack the
 * calling thread happens to have (a replay on another executor, or the same one after the JIT
 * compiled other frames, must judge the same), and never of the JVM's health: an Error
 * (StackOverflowError, OutOfMemoryError) propagates instead of becoming {@code internal_error}.
 * The pattern budget is one budget per record, not per match.
 */
class DeterminismTest {

    private static Classifier classifier(ObjectNode cfg) {
        String json = cfg.toString();
        Classifier.check(json);
        return new Classifier(json);
    }

    /** The verdict of {@code c} on a fresh thread with {@code stackBytes} of stack (or the Error it threw). */
    private static String onStack(Classifier c, String topic, String value, long stackBytes) throws InterruptedException {
        String[] out = new String[1];
        Thread t = new Thread(null, () -> {
            try {
                out[0] = String.valueOf(problem(c, topic, value));
            } catch (Throwable e) {
                out[0] = "THROWN " + e.getClass().getSimpleName();
            }
        }, "kdq-test-stack", stackBytes);
        t.start();
        t.join();
        return out[0];
    }

    private static final String LOOP = "{\"$defs\":{\"a\":{\"allOf\":[{\"$ref\":\"#/$defs/a\"}]}},\"$ref\":\"#/$defs/a\"}";
    private static final String TREE = "{\"$defs\":{\"n\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}},"
            + "\"$ref\":\"#/$defs/n\"}";
    /** A hostname-like pattern: Java's regex recurses once per character on it (no catastrophic backtracking). */
    private static final String HOSTNAME = "{\"pattern\":\"^([a-z]+\\\\.)*[a-z]+$\"}";
    private static final String ALTERNATION = "{\"pattern\":\"^(a|b|\\\\.)*x$\"}";

    @Test
    void verdictsDoNotDependOnTheCallersStack() throws Exception {
        ObjectNode cfg = config(10_000_000, true);
        rule(cfg, "loop", LOOP);
        rule(cfg, "anyloop", "{\"$defs\":{\"a\":{\"allOf\":[{\"$ref\":\"#/$defs/a\"}]}},"
                + "\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"object\"}]}");
        rule(cfg, "tree", TREE);
        rule(cfg, "host", HOSTNAME);
        rule(cfg, "alt", ALTERNATION);
        rule(cfg, "const", "{\"const\":" + "[".repeat(490) + "1" + "]".repeat(490) + "}");
        rule(cfg, "fmt", "{\"format\":\"regex\"}");
        Classifier c = classifier(cfg);

        Map<String, String[]> cases = new LinkedHashMap<>();
        cases.put("loop on {}", new String[] {"loop", "{}", "too_complex"});
        cases.put("loop in anyOf", new String[] {"anyloop", "{}", "too_complex"});
        cases.put("tree, depth 499", new String[] {"tree", "[".repeat(499) + "]".repeat(499), "null"});
        cases.put("tree, depth 499, bad leaf",
                new String[] {"tree", "[".repeat(498) + "1" + "]".repeat(498), "schema:" + "/$ref/items".repeat(498) + "/$ref/type"});
        cases.put("hostname, 6 KB", new String[] {"host", "\"" + "ab.".repeat(2000) + "x\"", "null"});
        cases.put("hostname, 6 KB, no match", new String[] {"host", "\"" + "ab.".repeat(2000) + "\"", "schema:/pattern"});
        cases.put("alternation, 300 K chars", new String[] {"alt", "\"" + "ab.".repeat(100_000) + "x\"", "null"});
        cases.put("const, depth 490", new String[] {"const", "[".repeat(490) + "1" + "]".repeat(490), "null"});
        cases.put("format regex, 20000 nested groups",
                new String[] {"fmt", "\"" + "(".repeat(20_000) + ")".repeat(20_000) + "\"", "null"});
        cases.put("format regex, 2 MB nested groups: over the budget",
                new String[] {"fmt", "\"" + "(".repeat(1_000_000) + ")".repeat(1_000_000) + "\"", "pattern_budget:/format"});
        cases.put("alternation, 4 M chars: over the budget",
                new String[] {"alt", "\"" + "ab.".repeat(1_400_000) + "x\"", "pattern_budget:/pattern"});

        List<String> wrong = new ArrayList<>();
        for (long stack : new long[] {256L << 10, 1L << 20, 64L << 20}) {
            for (Map.Entry<String, String[]> e : cases.entrySet()) {
                String[] k = e.getValue();
                String got = onStack(c, k[0], k[1], stack);
                if (!k[2].equals(got)) {
                    wrong.add(e.getKey() + " on a " + (stack >> 10) + " KB stack: " + got);
                }
            }
        }
        assertTrue(wrong.isEmpty(), String.join("\n", wrong));
    }

    /** Recurses {@code depth} frames, then classifies: less and less stack is left for the classifier. */
    private static String probe(Classifier c, String topic, String value, int depth, AtomicBoolean classifierThrew) {
        if (depth > 0) {
            return probe(c, topic, value, depth - 1, classifierThrew);
        }
        try {
            return problem(c, topic, value);
        } catch (StackOverflowError e) {
            classifierThrew.set(true);
            throw e;
        }
    }

    @Test
    void aStackOverflowPropagatesInsteadOfBecomingAVerdict() throws Exception {
        ObjectNode cfg = config(1 << 20, true);
        rule(cfg, "host", HOSTNAME);
        rule(cfg, "tree", TREE);
        Classifier c = classifier(cfg);
        String host = "\"" + "ab.".repeat(60) + "x\"";
        String tree = "[".repeat(40) + "]".repeat(40);
        assertNull(problem(c, "host", host));
        assertNull(problem(c, "tree", tree));
        // The closer the call is to the end of the stack, the sooner something overflows: either the
        // probe's own frames or the classifier's. Whatever returns is the right verdict; and a
        // StackOverflowError inside the classifier reaches the caller.
        for (String[] k : List.of(new String[] {"host", host}, new String[] {"tree", tree})) {
            AtomicBoolean classifierThrew = new AtomicBoolean();
            List<String> verdicts = new ArrayList<>();
            for (int depth = 0; depth <= 20_000 && !classifierThrew.get(); depth += 25) {
                int d = depth;
                String[] out = new String[1];
                Thread t = new Thread(null, () -> {
                    try {
                        out[0] = String.valueOf(probe(c, k[0], k[1], d, classifierThrew));
                    } catch (StackOverflowError e) {
                        out[0] = "overflow";
                    }
                }, "kdq-test-probe", 256L << 10);
                t.start();
                t.join();
                verdicts.add(out[0]);
            }
            for (String v : verdicts) {
                assertTrue(v.equals("null") || v.equals("overflow"), k[0] + ": " + v);
            }
            assertTrue(classifierThrew.get(), k[0] + ": the classifier never overflowed (" + verdicts.size() + " probes)");
        }
    }

    // ------------------------------------------------------------------ item 8 (b): one budget per record

    /** {@code ^(.*a){4}$} reads ~852,000 characters of "a"×50 + "b" before it fails: under a per-match budget. */
    private static final String SLOW = "{\"items\":{\"pattern\":\"^(.*a){4}$\"}}";

    private static String manyNearBudget(int n) {
        StringBuilder sb = new StringBuilder("[");
        for (int i = 0; i < n; i++) {
            sb.append(i == 0 ? "" : ",").append('"').append("a".repeat(50)).append("b\"");
        }
        return sb.append(']').toString();
    }

    @Test
    void thePatternBudgetIsPerRecord() {
        ObjectNode cfg = config(1 << 20, true);
        rule(cfg, "slow", SLOW);
        Classifier c = classifier(cfg);
        // One such string is within the record's budget: an ordinary schema verdict.
        assertEquals("schema:/items/pattern", problem(c, "slow", manyNearBudget(1)));
        // A hundred of them (85 M reads, each match under the old per-match budget) is not.
        assertEquals("pattern_budget:/items/pattern", problem(c, "slow", manyNearBudget(100)));
    }

    @Test
    void ordinaryRecordsStayWithinTheBudget() throws Exception {
        ObjectNode cfg = config(1 << 20, true);
        rule(cfg, "names", "{\"type\":\"object\",\"propertyNames\":{\"pattern\":\"^[a-z][a-z0-9_]*$\"},"
                + "\"additionalProperties\":{\"type\":\"string\",\"pattern\":\"^([a-z0-9]+-)*[a-z0-9]+$\"}}");
        Classifier c = classifier(cfg);
        StringBuilder sb = new StringBuilder("{");
        for (int i = 0; i < 5000; i++) {
            sb.append(i == 0 ? "" : ",").append("\"field_").append(i).append("\":\"value-").append(i).append("-ok\"");
        }
        String big = sb.append('}').toString();
        assertNull(problem(c, "names", big));
        assertEquals("schema:/additionalProperties/pattern", problem(c, "names", big.replace("value-17-ok", "value--17")));
        // The orders example of the timing test: a ~1 KB record with patterns, valid.
        Classifier orders = new Classifier(TimingTest.ordersConfig(0));
        assertNull(orders.call("orders", TimingTest.order()).get(0));
    }
}
