package io.kdq.spark.classify;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.ArrayList;
import java.util.Base64;
import java.util.List;

import org.junit.jupiter.api.Test;

import tools.jackson.databind.JsonNode;

/**
 * Every row of tests/unit/test_classifier.py's CASES table (exported to
 * rule_compiler_cases.json by scripts/export_rule_compiler_cases.py) gives the same reason here.
 */
class RuleCompilerCasesTest {
    @Test
    void everyCaseOfThePythonTableGivesItsReason() {
        JsonNode data = TestSupport.json(TestSupport.resource("/rule_compiler_cases.json"));
        String config = data.get("config").toString();
        Classifier.check(config);
        Classifier classifier = new Classifier(config);
        List<String> mismatches = new ArrayList<>();
        int n = 0;
        for (JsonNode c : data.get("cases")) {
            String topic = c.get("topic").asString();
            byte[] value = c.get("value").isNull() ? null : Base64.getDecoder().decode(c.get("value").asString());
            String expected = c.get("expected").isNull() ? null : c.get("expected").asString();
            String got = TestSupport.problem(classifier, topic, value);
            if (!java.util.Objects.equals(expected, got)) {
                String shown = value == null ? "null" : new String(value, java.nio.charset.StandardCharsets.UTF_8);
                if (shown.length() > 80) {
                    shown = shown.substring(0, 80) + "...";
                }
                mismatches.add(topic + " " + shown + ": expected " + expected + ", got " + got);
            }
            n++;
        }
        System.out.println("rule_compiler CASES: " + (n - mismatches.size()) + "/" + n + " reasons as expected");
        assertEquals(List.of(), mismatches);
    }
}
