package io.kdq.spark.registry;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.time.Duration;

import org.junit.jupiter.api.Test;

/**
 * The record-name subject strategies: the subject is named by the record's schema (Avro's full name, the Protobuf
 * message the indexes name, a JSON Schema's title), as Confluent's serializers name it, so several record types
 * share a topic and a record type is judged against its own subject.
 */
class SubjectStrategyTest {
    private static final String ORDER = """
            {"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"long"}]}""";
    private static final String REFUND = """
            {"type":"record","name":"Refund","namespace":"shop","fields":[{"name":"id","type":"long"}]}""";
    private static final String PROTO = "syntax = \"proto3\";\npackage pay;\n"
            + "message Payment { string id = 1; message Leg { int64 cents = 1; } }\n"
            + "message Chargeback { string id = 1; }\n";
    private static final String JSON_TITLED = "{\"title\":\"shop.Note\",\"type\":\"object\"}";
    private static final String JSON_UNTITLED = "{\"type\":\"object\",\"required\":[\"n\"]}";

    private static RegistryDecoder decoder(FakeRegistry registry) {
        return new RegistryDecoder(new SchemaCache(new HttpSchemaSource(registry.url(), null, Duration.ofSeconds(5)),
                SchemaCache.DEFAULT_RECHECK_NANOS, System::nanoTime));
    }

    private static byte[] avro(int id, long orderId) {
        return Avro.frame(id, Avro.encode(new org.apache.avro.Schema.Parser().parse(ORDER),
                new org.apache.avro.generic.GenericRecordBuilder(new org.apache.avro.Schema.Parser().parse(ORDER))
                        .set("id", orderId).build()));
    }

    @Test
    void strategiesAreSpelledAsTheRulesSpellThem() {
        assertEquals(SubjectStrategy.TOPIC_RECORD_NAME, SubjectStrategy.of("topic_record_name"));
        assertEquals("t-value", SubjectStrategy.TOPIC_NAME.subject("t", "shop.Order"));
        assertEquals("shop.Order", SubjectStrategy.RECORD_NAME.subject("t", "shop.Order"));
        assertEquals("t-shop.Order", SubjectStrategy.TOPIC_RECORD_NAME.subject("t", "shop.Order"));
        IllegalArgumentException bad = assertThrows(IllegalArgumentException.class, () -> SubjectStrategy.of("x"));
        assertTrue(bad.getMessage().contains("supported: topic_name, record_name, topic_record_name"), bad.getMessage());
    }

    @Test
    void avroRecordsAreJudgedAgainstTheirRecordsSubject() throws Exception {
        try (FakeRegistry registry = new FakeRegistry()) {
            int order = registry.register("shop.Order", "AVRO", ORDER);
            int refund = registry.register("payments-shop.Refund", "AVRO", REFUND);
            int orderInTopic = registry.register("payments-shop.Order", "AVRO", ORDER);
            assertEquals(order, orderInTopic); // the same text: the same id, in two subjects
            RegistryDecoder d = decoder(registry);
            byte[] framed = avro(order, 7);

            assertNull(d.decode(SubjectStrategy.RECORD_NAME, "anything", framed).problem);
            assertNull(d.decode(SubjectStrategy.TOPIC_RECORD_NAME, "payments", framed).problem);
            // The topic-name strategy would want <topic>-value, which has no version.
            assertEquals("schema_not_for_subject", d.decode(SubjectStrategy.TOPIC_NAME, "payments", framed).problem);
            // shop.Refund is registered only under payments-shop.Refund.
            byte[] refundFramed = Avro.frame(refund, new byte[] {14});
            assertNull(d.decode(SubjectStrategy.TOPIC_RECORD_NAME, "payments", refundFramed).problem);
            assertEquals("schema_not_for_subject",
                    d.decode(SubjectStrategy.TOPIC_RECORD_NAME, "orders", refundFramed).problem);
            assertEquals("schema_not_for_subject", d.decode(SubjectStrategy.RECORD_NAME, "payments", refundFramed).problem);
            // Before the subject: the header's checks; after it: the payload's decoding.
            assertEquals("no_magic_byte", d.decode(SubjectStrategy.RECORD_NAME, "t", new byte[] {1, 2}).problem);
            assertEquals("unknown_schema_id", d.decode(SubjectStrategy.RECORD_NAME, "t", Avro.frame(999, new byte[0])).problem);
            assertTrue(d.decode(SubjectStrategy.RECORD_NAME, "t", Avro.frame(order, new byte[0])).problem.startsWith("avro:"));
        }
    }

    @Test
    void protobufRecordsAreNamedByTheMessageTheirIndexesName() throws Exception {
        try (FakeRegistry registry = new FakeRegistry()) {
            int id = registry.register("pay.Payment.Leg", "PROTOBUF", PROTO);
            registry.register("pay.Chargeback", "PROTOBUF", PROTO);
            RegistryDecoder d = decoder(registry);
            byte[] leg = ProtobufDecodingTest.frame(id, new byte[] {4, 0, 0}, ProtobufDecodingTest.pb().v(1, 5).bytes());
            byte[] chargeback = ProtobufDecodingTest.frame(id, new byte[] {2, 2},
                    ProtobufDecodingTest.pb().s(1, "c-1").bytes());
            byte[] payment = ProtobufDecodingTest.first(id, ProtobufDecodingTest.pb().s(1, "p-1"));
            assertNull(d.decode(SubjectStrategy.RECORD_NAME, "pay", leg).problem);
            assertNull(d.decode(SubjectStrategy.RECORD_NAME, "pay", chargeback).problem);
            // pay.Payment has no subject of its own.
            assertEquals("schema_not_for_subject", d.decode(SubjectStrategy.RECORD_NAME, "pay", payment).problem);
            // Indexes that name no message: the decoding says so, before any subject.
            assertEquals("protobuf:$message_index", d.decode(SubjectStrategy.RECORD_NAME, "pay",
                    ProtobufDecodingTest.frame(id, new byte[] {2, 8}, new byte[0])).problem);
        }
    }

    @Test
    void jsonSchemasAreNamedByTheirTitle() throws Exception {
        try (FakeRegistry registry = new FakeRegistry()) {
            int titled = registry.register("events-shop.Note", "JSON", JSON_TITLED);
            int untitled = registry.register("events-value", "JSON", JSON_UNTITLED);
            RegistryDecoder d = decoder(registry);
            byte[] note = Avro.frame(titled, "{\"n\":1}".getBytes(StandardCharsets.UTF_8));
            assertNull(d.decode(SubjectStrategy.TOPIC_RECORD_NAME, "events", note).problem);
            assertEquals("schema_not_for_subject", d.decode(SubjectStrategy.RECORD_NAME, "events", note).problem);
            // No title: no record-name serializer writes it, so it is in no record-name subject.
            byte[] bare = Avro.frame(untitled, "{\"n\":1}".getBytes(StandardCharsets.UTF_8));
            assertEquals("schema_not_for_subject", d.decode(SubjectStrategy.TOPIC_RECORD_NAME, "events", bare).problem);
            // ...while its own failures still come first.
            assertEquals("json:/required/0", d.decode(SubjectStrategy.TOPIC_RECORD_NAME, "events",
                    Avro.frame(untitled, "{}".getBytes(StandardCharsets.UTF_8))).problem);
        }
    }
}
