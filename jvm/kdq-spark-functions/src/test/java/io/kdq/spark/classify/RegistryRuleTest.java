package io.kdq.spark.classify;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.Arrays;

import org.apache.avro.generic.GenericRecord;
import org.apache.spark.sql.Row;
import org.junit.jupiter.api.Test;

import io.kdq.spark.registry.Avro;
import io.kdq.spark.registry.FakeRegistry;
import io.kdq.spark.registry.Orders;
import io.kdq.spark.registry.RegistryConnection;
import io.kdq.spark.registry.RegistryUnavailableException;

import tools.jackson.databind.node.ObjectNode;

/**
 * A rule with {@code registry = true} in the classifier: the same struct as a JSON rule, the registry's reasons,
 * the event time read from the decoded record, an outage on an unseen id thrown (a retried task), never a verdict.
 */
class RegistryRuleTest {
    private static final String TOPIC = "orders-avro";
    private static final String OTHER = """
            {"type":"record","name":"Other","fields":[{"name":"x","type":"long"}]}""";

    private static ObjectNode registryConfig() {
        ObjectNode cfg = TestSupport.config(1_048_576L, true);
        ObjectNode rule = TestSupport.rule(cfg, TOPIC, null);
        rule.putObject("registry").put("subject_strategy", "topic_name");
        TestSupport.eventTime(rule, "auto", "placed_at");
        return cfg;
    }

    private static CompiledConfig compile(FakeRegistry registry, ObjectNode cfg) {
        // A URL of its own per test: the JVM-wide caches are per registry URL and credentials.
        return CompiledConfig.compile(cfg.toString(),
                () -> RegistryConnection.decoder(registry.url(), null, Duration.ofSeconds(5)));
    }

    @Test
    void verdictsOfARegistryBackedTopic() throws Exception {
        try (FakeRegistry registry = new FakeRegistry()) {
            int id = registry.register(TOPIC + "-value", "AVRO", Orders.SCHEMA);
            int other = registry.register("elsewhere-value", "AVRO", OTHER);
            CompiledConfig config = compile(registry, registryConfig());
            assertTrue(config.summary().contains("1 through the Schema Registry"), config.summary());

            byte[] payload = Avro.encode(Orders.PARSED, Orders.order(3, "gift wrap"));
            Row valid = config.classify(TOPIC, Avro.frame(id, payload));
            assertEquals(Arrays.asList(null, 1_700_000_000_123L, false, "v-" + TOPIC), Arrays.asList(valid.get(0), valid.get(1), valid.get(2), valid.get(3)));

            assertEquals("no_magic_byte", config.classify(TOPIC, TestSupport.utf8("{\"order_id\":1}")).get(0));
            assertEquals("unknown_schema_id", config.classify(TOPIC, Avro.frame(9_999, payload)).get(0));
            assertEquals("schema_not_for_subject", config.classify(TOPIC, Avro.frame(other, payload)).get(0));
            Row truncated = config.classify(TOPIC, Avro.frame(id, Arrays.copyOf(payload, payload.length / 2)));
            assertTrue(((String) truncated.get(0)).startsWith("avro:"), String.valueOf(truncated.get(0)));
            assertNull(truncated.get(1));
            assertEquals(true, truncated.get(2)); // the rule has an event-time field and it was not read
            assertEquals("null_value", config.classify(TOPIC, null).get(0));
            // Other topics keep the JSON path.
            assertNull(config.classify("plain", TestSupport.utf8("{\"a\":1}")).get(0));
            assertEquals("not_utf8", config.classify("plain", Avro.frame(id, payload)).get(0));
        }
    }

    @Test
    void anOutageOnAnUnseenIdIsThrownWhileSeenIdsKeepTheirVerdicts() throws Exception {
        try (FakeRegistry registry = new FakeRegistry()) {
            int id = registry.register(TOPIC + "-value", "AVRO", Orders.SCHEMA);
            CompiledConfig config = compile(registry, registryConfig());
            GenericRecord order = Orders.order(1, null);
            byte[] framed = Avro.frame(id, Avro.encode(Orders.PARSED, order));
            assertNull(config.classify(TOPIC, framed).get(0));
            int later = registry.register(TOPIC + "-value", "AVRO", Orders.SCHEMA.replace("\"gift\"", "\"gifted\""));
            registry.down = true;
            assertNull(config.classify(TOPIC, framed).get(0));
            byte[] unseen = Avro.frame(later, Avro.encode(Orders.PARSED, order));
            assertThrows(RegistryUnavailableException.class, () -> config.classify(TOPIC, unseen));
            registry.down = false;
            assertNull(config.classify(TOPIC, unseen).get(0)); // the retry judges it once the registry answers
        }
    }

    @Test
    void aRegistryRuleWithoutARegistryOrWithASchemaIsRefusedAtStart() {
        // Without a registry the rules compile (a job that never meets the topic needs none), the start-up check
        // refuses them naming the rule, and a record of the topic fails its task: never a verdict.
        CompiledConfig unconfigured = CompiledConfig.compile(registryConfig().toString(),
                () -> RegistryConnection.fromConf(key -> null));
        assertNull(unconfigured.classify("plain", TestSupport.utf8("{}")).get(0));
        IllegalArgumentException none = assertThrows(IllegalArgumentException.class, unconfigured::checkRegistry);
        assertTrue(none.getMessage().startsWith("rule '" + TOPIC + "' uses the Schema Registry but none is configured"),
                none.getMessage());
        RegistryUnavailableException record = assertThrows(RegistryUnavailableException.class,
                () -> unconfigured.classify(TOPIC, Avro.frame(1, new byte[] {2})));
        assertTrue(record.getMessage().contains("none is configured"), record.getMessage());

        ObjectNode both = registryConfig();
        ((ObjectNode) both.get("rules").get(0)).set("schema", TestSupport.json("{\"type\":\"object\"}"));
        IllegalArgumentException twice = assertThrows(IllegalArgumentException.class,
                () -> CompiledConfig.compile(both.toString(), () -> null));
        assertTrue(twice.getMessage().contains("both a JSON Schema and registry = true"), twice.getMessage());

        ObjectNode strategy = registryConfig();
        ((ObjectNode) strategy.get("rules").get(0).get("registry")).put("subject_strategy", "by_magic");
        IllegalArgumentException unsupported = assertThrows(IllegalArgumentException.class,
                () -> CompiledConfig.compile(strategy.toString(), () -> null));
        assertTrue(unsupported.getMessage().contains("subject_strategy 'by_magic' is not supported"),
                unsupported.getMessage());
    }

    @Test
    void theStartUpCheckAsksTheRegistry() throws Exception {
        try (FakeRegistry registry = new FakeRegistry()) {
            CompiledConfig config = compile(registry, registryConfig());
            config.checkRegistry(); // no subject yet: still an answer
            registry.down = true;
            IllegalArgumentException down = assertThrows(IllegalArgumentException.class, config::checkRegistry);
            assertTrue(down.getMessage().startsWith("rule '" + TOPIC + "' uses the Schema Registry, which does not"
                    + " answer: ") && down.getMessage().contains("503"), down.getMessage());
        }
    }

    @Test
    void eventTimeOfDecodedValues() {
        EventTime.Format auto = EventTime.Format.of("auto");
        assertEquals(1_700_000_000_123L, EventTime.readDecoded(java.time.Instant.ofEpochMilli(1_700_000_000_123L),
                EventTime.Format.of("iso8601")));
        assertEquals(86_400_000L, EventTime.readDecoded(java.time.LocalDate.of(1970, 1, 2), auto));
        assertEquals(1_000L, EventTime.readDecoded(1_000L, auto));
        assertNull(EventTime.readDecoded(1_000L, EventTime.Format.of("iso8601")));
        assertEquals(0L, EventTime.readDecoded("1970-01-01T00:00:00Z", auto));
        assertNull(EventTime.readDecoded(1.5d, auto));
        assertNull(EventTime.readDecoded(java.time.Instant.MAX, auto));
        assertNull(EventTime.readDecoded(-1L, auto));
    }
}
