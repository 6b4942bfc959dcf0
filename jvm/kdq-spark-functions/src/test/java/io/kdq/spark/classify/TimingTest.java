package io.kdq.spark.classify;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;

import org.junit.jupiter.api.Test;

import tools.jackson.databind.node.ArrayNode;
import tools.jackson.databind.node.ObjectNode;

/**
 * Prints µs/record through {@link Classifier#call} for a ~1 KB valid order
 * (config/rules/orders.schema.json) and checks that dispatch does not depend on the number of
 * rules. Generous bounds only (shared CI machines): the figures are in the test output.
 */
class TimingTest {
    static byte[] order() {
        ObjectNode o = TestSupport.MAPPER.createObjectNode();
        o.put("order_id", "o-0001-2023-11-14-000123");
        o.put("amount", 1234.5);
        o.put("currency", "EUR");
        o.putObject("customer").put("id", "c-000042").put("name", "Ada Lovelace").put("tier", "gold");
        ArrayNode lines = o.putArray("lines");
        for (int i = 0; lines.toString().length() < 850; i++) {
            lines.addObject().put("sku", "SKU-" + (10000 + i)).put("qty", 1 + i % 5).put("price", 9.99 + i);
        }
        o.putObject("meta").put("event_time", 1700000000123L).put("source", "demo");
        return o.toString().getBytes(StandardCharsets.UTF_8);
    }

    static String ordersConfig(int extraRules) throws Exception {
        Path schema = Path.of("../../config/rules/orders.schema.json");
        ObjectNode cfg = TestSupport.config(1 << 20, true);
        for (int i = 0; i < extraRules; i++) {
            TestSupport.rule(cfg, "topic-" + i, "{\"type\":\"object\",\"required\":[\"x" + i + "\"]}");
        }
        ObjectNode rule = TestSupport.rule(cfg, "orders", Files.readString(schema));
        TestSupport.eventTime(rule, "epoch_millis", "meta", "event_time");
        return cfg.toString();
    }

    static double microsPerRecord(Classifier c, String topic, byte[] value, int n) {
        for (int i = 0; i < n; i++) { // warm-up
            c.call(topic, value);
        }
        long t0 = System.nanoTime();
        for (int i = 0; i < n; i++) {
            c.call(topic, value);
        }
        return (System.nanoTime() - t0) / 1000.0 / n;
    }

    @Test
    void ordersDocument() throws Exception {
        byte[] value = order();
        assertTrue(value.length >= 950 && value.length <= 1100, "order is " + value.length + " bytes");
        Classifier c = new Classifier(ordersConfig(0));
        assertEquals(java.util.Arrays.asList(null, 1700000000123L, false, "v-orders"), java.util.Arrays.asList(
                c.call("orders", value).get(0), c.call("orders", value).get(1), c.call("orders", value).get(2),
                c.call("orders", value).get(3)));
        assertTrue(c.compiled().decidedFast("orders", value), "the orders rule has no one-pass check");
        double us = microsPerRecord(c, "orders", value, 200_000);
        boolean before = CompiledConfig.fastChecks;
        double usFull;
        try {
            CompiledConfig.fastChecks = false;
            usFull = microsPerRecord(c, "orders", value, 200_000);
        } finally {
            CompiledConfig.fastChecks = before;
        }
        System.out.printf("TIMING orders (%d bytes, valid): %.2f us/record (%.2f without the one-pass check)%n",
                value.length, us, usFull);
        byte[] invalid = new String(value, StandardCharsets.UTF_8).replace("\"qty\":1", "\"qty\":0")
                .getBytes(StandardCharsets.UTF_8);
        assertEquals("schema:/properties/lines/items/properties/qty/minimum", c.call("orders", invalid).get(0));
        double usInvalid = microsPerRecord(c, "orders", invalid, 100_000);
        System.out.printf("TIMING orders (%d bytes, invalid): %.2f us/record%n", invalid.length, usInvalid);
        assertTrue(us < 200, "far too slow: " + us + " us/record");
    }

    @Test
    void dispatchDoesNotDependOnTheNumberOfRules() throws Exception {
        byte[] value = order();
        Classifier one = new Classifier(ordersConfig(0));
        Classifier many = new Classifier(ordersConfig(1000)); // orders is the 1001st rule
        assertNull(many.call("orders", value).get(0));
        double a = microsPerRecord(one, "orders", value, 100_000);
        double b = microsPerRecord(many, "orders", value, 100_000);
        double a2 = microsPerRecord(one, "orders", value, 100_000);
        System.out.printf("TIMING dispatch: 1 rule %.2f us/record, 1001 rules %.2f us/record%n", Math.min(a, a2), b);
        assertTrue(b < 3 * Math.min(a, a2) + 5, "dispatch depends on the number of rules");
    }
}
