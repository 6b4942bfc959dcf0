package io.kdq.spark.registry;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.Arrays;
import java.util.List;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Every verdict of a Protobuf topic through a registry served over HTTP (a schema importing another by subject and
 * version, Google's Timestamp), fields read from decoded messages, and each kind of invalid payload with its exact
 * reason. Payloads are written by hand, byte by byte ({@link Pb}), so each test says what is on the wire.
 */
class ProtobufDecodingTest {
    static final String COMMON = "syntax = \"proto3\";\n"
            + "package shop.common;\n"
            + "message Money { string currency = 1; int64 units = 2; }\n"
            + "enum Tier { TIER_UNSPECIFIED = 0; SILVER = 1; GOLD = 2; }\n";
    static final String ORDERS = "syntax = \"proto3\";\n"
            + "package shop;\n"
            + "import \"shop/common.proto\";\n"
            + "import \"google/protobuf/timestamp.proto\";\n"
            + "// an order, as the demo's producer writes it\n"
            + "message Order {\n"
            + "  string order_id = 1;\n"
            + "  common.Money total = 2;\n"
            + "  Customer customer = 3;\n"
            + "  repeated Line lines = 4;\n"
            + "  map<string, string> attrs = 5;\n"
            + "  google.protobuf.Timestamp placed_at = 6;\n"
            + "  Status status = 7;\n"
            + "  oneof payment { string card = 8; string iban = 9; }\n"
            + "  repeated int32 tags = 10;\n"
            + "  optional string note = 11;\n"
            + "  map<int32, Line> by_pos = 12;\n"
            + "  uint32 count = 13;\n"
            + "  message Customer { string name = 1; shop.common.Tier tier = 2; }\n"
            + "  message Line { string sku = 1; int32 qty = 2; double price = 3; }\n"
            + "  enum Status { NEW = 0; PAID = 1; }\n"
            + "}\n"
            + "message Refund { string order_id = 1; }\n";
    static final String EVENTS = "syntax = \"proto2\";\n"
            + "package ev;\n"
            + "message Event {\n"
            + "  required string id = 1;\n"
            + "  optional Kind kind = 2;\n"
            + "  repeated Kind kinds = 3;\n"
            + "  optional Inner inner = 4;\n"
            + "  map<string, Inner> by_name = 5;\n"
            + "  repeated Kind packed_kinds = 6 [packed = true];\n"
            + "  optional group Extra = 7 { optional int32 level = 8; }\n"
            + "  enum Kind { A = 1; B = 2; }\n"
            + "  message Inner { required int32 n = 1; }\n"
            + "}\n";

    static FakeRegistry registry;
    static RegistryDecoder decoder;
    static int orders;
    static int events;

    @BeforeAll
    static void start() throws Exception {
        registry = new FakeRegistry();
        registry.register("shop-common", "PROTOBUF", COMMON);
        orders = registry.register("orders-value", "PROTOBUF", ORDERS,
                new SchemaReference("shop/common.proto", "shop-common", 1));
        events = registry.register("events-value", "PROTOBUF", EVENTS);
        decoder = new RegistryDecoder(new SchemaCache(new HttpSchemaSource(registry.url(), null, Duration.ofSeconds(5)),
                SchemaCache.DEFAULT_RECHECK_NANOS, System::nanoTime));
    }

    @AfterAll
    static void stop() {
        registry.close();
    }

    /** A protobuf writer for tests: fields appended in the order given. */
    static final class Pb {
        final ByteArrayOutputStream out = new ByteArrayOutputStream();

        Pb varint(long v) {
            while ((v & ~0x7FL) != 0) {
                out.write((int) ((v & 0x7F) | 0x80));
                v >>>= 7;
            }
            out.write((int) v);
            return this;
        }

        Pb tag(int field, int wireType) {
            return varint((long) field << 3 | wireType);
        }

        Pb v(int field, long value) {
            return tag(field, 0).varint(value);
        }

        Pb s(int field, String value) {
            return b(field, value.getBytes(StandardCharsets.UTF_8));
        }

        Pb b(int field, byte[] value) {
            tag(field, 2).varint(value.length);
            out.writeBytes(value);
            return this;
        }

        Pb m(int field, Pb message) {
            return b(field, message.bytes());
        }

        Pb d(int field, double value) {
            tag(field, 1);
            long bits = Double.doubleToLongBits(value);
            for (int i = 0; i < 8; i++) {
                out.write((int) (bits >>> (8 * i)) & 0xff);
            }
            return this;
        }

        Pb raw(int... bytes) {
            for (int x : bytes) {
                out.write(x);
            }
            return this;
        }

        byte[] bytes() {
            return out.toByteArray();
        }
    }

    static Pb pb() {
        return new Pb();
    }

    /** Header, message indexes (raw bytes), payload. */
    static byte[] frame(int id, byte[] indexes, byte[] payload) {
        byte[] out = new byte[5 + indexes.length + payload.length];
        out[1] = (byte) (id >>> 24);
        out[2] = (byte) (id >>> 16);
        out[3] = (byte) (id >>> 8);
        out[4] = (byte) id;
        System.arraycopy(indexes, 0, out, 5, indexes.length);
        System.arraycopy(payload, 0, out, 5 + indexes.length, payload.length);
        return out;
    }

    static byte[] first(int id, Pb payload) {
        return frame(id, new byte[] {0}, payload.bytes());
    }

    static Pb line(String sku, int qty, double price) {
        return pb().s(1, sku).v(2, qty).d(3, price);
    }

    static Pb order() {
        return pb().s(1, "o-1")
                .m(2, pb().s(1, "EUR").v(2, 1234))
                .m(3, pb().s(1, "Ada").v(2, 2))
                .m(4, line("A-1", 1, 9.5)).m(4, line("B-2", 2, 11.99))
                .m(5, pb().s(1, "channel").s(2, "web"))
                .m(6, pb().v(1, 1_700_000_000L).v(2, 123_000_000))
                .v(7, 1)
                .s(9, "DE89")
                .b(10, new byte[] {3, 4, 5})
                .m(12, pb().v(1, 7).m(2, line("C-3", 3, 1.0)))
                .v(13, 4_000_000_000L);
    }

    static String problem(int id, Pb payload) {
        return decoder.decode(id == orders ? "orders-value" : "events-value", first(id, payload)).problem;
    }

    @Test
    void decodesNestedMessagesEnumsOneofsRepeatedMapsReferencesAndTimestamps() {
        Verdict v = decoder.decode("orders-value", first(orders, order()));
        assertNull(v.problem, v.toString());
        assertEquals(orders, v.schemaId);
        DecodedRecord r = v.record;
        assertEquals("o-1", r.get("order_id"));
        assertEquals("EUR", r.get("total", "currency"));
        assertEquals(1234L, r.get("total", "units"));
        assertEquals("GOLD", r.get("customer", "tier"), "an enum of the imported file, by name");
        assertEquals("B-2", r.get("lines", "1", "sku"));
        assertEquals(11.99, r.get("lines", "1", "price"));
        assertNull(r.get("lines", "2", "sku"));
        assertEquals("web", r.get("attrs", "channel"));
        assertNull(r.get("attrs", "nope"));
        assertEquals(Instant.ofEpochSecond(1_700_000_000L, 123_000_000), r.get("placed_at"));
        assertEquals("PAID", r.get("status"));
        assertEquals("DE89", r.get("iban"));
        assertNull(r.get("card"), "the other member of the oneof");
        assertEquals(4, r.get("tags", "1"), "packed repeated");
        assertNull(r.get("note"), "proto3 optional, not set");
        assertEquals("C-3", r.get("by_pos", "7", "sku"));
        assertEquals(4_000_000_000L, r.get("count"), "uint32 as unsigned");
        assertNull(r.get("order_id", "deeper"));
        assertNull(r.get("missing"));
        assertTrue(r.get("lines") instanceof List);

        Verdict empty = decoder.decode("orders-value", first(orders, pb()));
        assertNull(empty.problem);
        assertEquals("", empty.record.get("order_id"), "proto3 implicit presence: the default");
        assertEquals("NEW", empty.record.get("status"));
        assertNull(empty.record.get("customer", "name"), "an unset message");

        Verdict open = decoder.decode("orders-value", first(orders, pb().v(7, 9)));
        assertNull(open.problem, "proto3 enums are open");
        assertEquals(9, open.record.get("status"));
        assertNull(decoder.decode("orders-value", first(orders, order().v(99, 1).s(98, "newer field"))).problem,
                "unknown field numbers: a newer writer's fields");
    }

    @Test
    void messageIndexesPickTopLevelAndNestedMessages() {
        Verdict refund = decoder.decode("orders-value", frame(orders, new byte[] {2, 2}, pb().s(1, "r-9").bytes()));
        assertNull(refund.problem, refund.toString());
        assertEquals("r-9", refund.record.get("order_id"));
        Verdict customer = decoder.decode("orders-value", frame(orders, new byte[] {4, 0, 0},
                pb().s(1, "Bo").v(2, 1).bytes()));
        assertNull(customer.problem, customer.toString());
        assertEquals("SILVER", customer.record.get("tier"));
        Verdict line = decoder.decode("orders-value", frame(orders, new byte[] {4, 0, 2}, line("X", 1, 2).bytes()));
        assertEquals("X", line.record.get("sku"), "[0, 1]: Order's second nested message");
        assertEquals("protobuf:$message_index",
                decoder.decode("orders-value", frame(orders, new byte[] {2, 4}, new byte[0])).problem);
        assertEquals("protobuf:$message_index",
                decoder.decode("orders-value", frame(orders, new byte[] {4, 0, 8}, new byte[0])).problem);
        assertEquals("protobuf:$message_index",
                decoder.decode("orders-value", frame(orders, new byte[] {4, 2, 0}, new byte[0])).problem,
                "Refund has no nested message");
        assertEquals("protobuf:$message_index",
                decoder.decode("orders-value", frame(orders, new byte[0], new byte[0])).problem, "header only");
        assertEquals("protobuf:$message_index",
                decoder.decode("orders-value", frame(orders, new byte[] {1}, new byte[0])).problem, "count -1");
        assertEquals("protobuf:$message_index",
                decoder.decode("orders-value", frame(orders, new byte[] {6, 0}, new byte[0])).problem, "truncated");
    }

    @Test
    void truncatedPayloadsNameTheFieldTheyStopIn() {
        byte[] full = order().bytes();
        assertEquals("protobuf:/order_id", problem(orders, pb().raw(Arrays.copyOf(full, 3)[0],
                Arrays.copyOf(full, 3)[1], Arrays.copyOf(full, 3)[2])));
        byte[] lines = pb().m(4, line("A-1", 1, 9.5)).m(4, line("B-2", 2, 11.99)).bytes();
        assertEquals("protobuf:/lines/1", decoder.decode("orders-value",
                frame(orders, new byte[] {0}, Arrays.copyOf(lines, lines.length - 3))).problem);
        assertEquals("protobuf:/lines/0/price", decoder.decode("orders-value", frame(orders, new byte[] {0},
                pb().b(4, Arrays.copyOf(line("A-1", 1, 9.5).bytes(), 10)).bytes())).problem,
                "a whole element whose last double is cut");
        assertEquals("protobuf:$", problem(orders, pb().raw(0x80)), "a tag cut in its varint");
        int cut = 0;
        for (int n = 1; n < full.length; n++) {
            String p = decoder.decode("orders-value", frame(orders, new byte[] {0}, Arrays.copyOf(full, n))).problem;
            if (p != null) {
                cut++;
                assertTrue(p.startsWith("protobuf:/"), n + ": " + p);
            }
        }
        assertTrue(cut > full.length / 2);
    }

    @Test
    void wrongWireTypesBadTagsAndBadUtf8() {
        assertEquals("protobuf:/order_id", problem(orders, pb().v(1, 5)), "a string sent as a varint");
        assertEquals("protobuf:/lines/0/qty", problem(orders, pb().m(4, pb().s(1, "A").s(2, "two"))));
        assertEquals("protobuf:/customer", problem(orders, pb().v(3, 1)), "a message sent as a varint");
        assertEquals("protobuf:/attrs", problem(orders, pb().v(5, 1)), "a map sent as a varint");
        assertEquals("protobuf:$", problem(orders, pb().raw(0x00, 0x01)), "field number 0");
        assertEquals("protobuf:$", problem(orders, pb().raw(0x7f, 0x01)), "wire type 7 on an unknown number");
        assertEquals("protobuf:$", problem(orders, pb().raw(0x7c)), "an end-group tag outside any group");
        assertEquals("protobuf:/order_id", problem(orders, pb().b(1, new byte[] {(byte) 0xc3, 0x28})),
                "proto3 strings are UTF-8");
        assertEquals("protobuf:/attrs/k", problem(orders, pb().m(5, pb().s(1, "k").b(2, new byte[] {(byte) 0xff}))));
        assertEquals("protobuf:/by_pos/7/qty", problem(orders, pb().m(12, pb().v(1, 7).m(2, pb().s(2, "x")))));
        assertEquals("protobuf:/by_pos", problem(orders, pb().m(12, pb().s(1, "not an int"))), "a bad key");
        assertEquals("protobuf:/total/units", problem(orders, pb().m(2, pb().raw(0x10, 0xff, 0xff, 0xff, 0xff,
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01))), "a varint longer than 10 bytes");
        assertEquals("protobuf:/lines/0", problem(orders, pb().raw(0x22, 0xff, 0xff, 0xff, 0xff, 0x0f)),
                "a length of 4 GB");
    }

    @Test
    void proto2ClosedEnumsAndRequiredFields() {
        assertNull(problem(events, pb().s(1, "e").v(2, 2).v(3, 1).v(3, 2)));
        Verdict ok = decoder.decode("events-value", first(events, pb().s(1, "e").v(2, 2).tag(7, 3).v(8, 5).tag(7, 4)));
        assertNull(ok.problem, ok.toString());
        assertEquals("B", ok.record.get("kind"));
        assertEquals(5, ok.record.get("extra", "level"), "a proto2 group");
        assertNull(ok.record.get("inner"), "proto2 optional, not set");

        assertEquals("protobuf:/id", problem(events, pb().v(2, 1)), "a missing required field");
        assertEquals("protobuf:/kind", problem(events, pb().s(1, "e").v(2, 7)), "7 is not a Kind (closed enum)");
        assertEquals("protobuf:/kinds/1", problem(events, pb().s(1, "e").v(3, 1).v(3, 9)));
        assertEquals("protobuf:/packed_kinds/2", problem(events, pb().s(1, "e").b(6, new byte[] {1, 2, 3, 1})));
        assertEquals("protobuf:/inner/n", problem(events, pb().s(1, "e").m(4, pb())));
        assertEquals("protobuf:/by_name/x/n", problem(events, pb().s(1, "e").m(5, pb().s(1, "x").m(2, pb()))));
        assertEquals("protobuf:/extra", problem(events, pb().s(1, "e").tag(7, 3).v(8, 5)), "a group never closed");
        assertEquals("protobuf:/kind", problem(events, pb().s(1, "e").s(2, "A")), "an enum sent as a string");
    }

    @Test
    void eachSchemaAndReferenceIsFetchedOnce() throws Exception {
        try (FakeRegistry r = new FakeRegistry()) {
            r.register("shop-common", "PROTOBUF", COMMON);
            int id = r.register("orders-value", "PROTOBUF", ORDERS, new SchemaReference("shop/common.proto", "shop-common", 1));
            RegistryDecoder d = new RegistryDecoder(new SchemaCache(new HttpSchemaSource(r.url(), null,
                    Duration.ofSeconds(5)), SchemaCache.DEFAULT_RECHECK_NANOS, System::nanoTime));
            byte[] value = first(id, order());
            byte[] bad = first(id, pb().v(1, 5));
            for (int i = 0; i < 1000; i++) {
                assertNull(d.decode("orders-value", value).problem);
                assertEquals("protobuf:/order_id", d.decode("orders-value", bad).problem);
            }
            assertEquals(1, r.count("id"), "one GET /schemas/ids/{id}");
            assertEquals(1, r.count("versions"), "the subject's versions, once");
            assertEquals(2, r.count("version"), "the subject's version 1, and the reference shop-common v1, once each");
        }
    }

    @Test
    void schemasThatDoNotBuildAreAVerdictNotARetry() {
        int syntax = registry.register("broken-value", "PROTOBUF", "syntax = \"proto3\";\nmessage B { string x = }\n");
        assertEquals("internal_error:IllegalArgumentException",
                decoder.decode("broken-value", first(syntax, pb())).problem);
        int missingImport = registry.register("broken2-value", "PROTOBUF",
                "syntax = \"proto3\";\nimport \"elsewhere.proto\";\nmessage B { other.T x = 1; }\n");
        assertEquals("internal_error:IllegalArgumentException",
                decoder.decode("broken2-value", first(missingImport, pb())).problem);
        int missingReference = registry.register("broken3-value", "PROTOBUF",
                "syntax = \"proto3\";\nimport \"elsewhere.proto\";\nmessage C { other.T x = 1; }\n",
                new SchemaReference("elsewhere.proto", "nowhere", 1));
        assertEquals("internal_error:IllegalArgumentException",
                decoder.decode("broken3-value", first(missingReference, pb())).problem);
        int unresolved = registry.register("broken4-value", "PROTOBUF", "syntax = \"proto3\";\nmessage D { Nope x = 1; }\n");
        assertEquals("internal_error:DescriptorValidationException",
                decoder.decode("broken4-value", first(unresolved, pb())).problem);
        int noMessage = registry.register("broken5-value", "PROTOBUF", "syntax = \"proto3\";\nenum E { Z = 0; }\n");
        assertEquals("protobuf:$message_index", decoder.decode("broken5-value", first(noMessage, pb())).problem);
    }

    @Test
    void bytesAndUnsigned64() {
        String s = "syntax = \"proto3\";\nmessage U { bytes b = 1; uint64 big = 2; fixed32 f = 3; }\n";
        int id = registry.register("u-value", "PROTOBUF", s);
        Verdict v = decoder.decode("u-value", first(id, pb().b(1, new byte[] {(byte) 0xca, (byte) 0xfe}).v(2, -1L)
                .tag(3, 5).raw(0xff, 0xff, 0xff, 0xff)));
        assertNull(v.problem, v.toString());
        assertArrayEquals(new byte[] {(byte) 0xca, (byte) 0xfe}, (byte[]) v.record.get("b"));
        assertEquals(new java.math.BigInteger("18446744073709551615"), v.record.get("big"));
        assertEquals(4294967295L, v.record.get("f"));
    }

    @Test
    void aSchemaRegisteredAsABase64DescriptorDecodesAsItsText() throws Exception {
        // Confluent's Python serializer registers the base64 of the FileDescriptorProto, and Apicurio keeps it so.
        String base64 = java.util.Base64.getEncoder().encodeToString(
                ProtoFiles.parse("events.proto", EVENTS).toByteArray());
        int id = registry.register("events-b64-value", "PROTOBUF", base64);
        Pb event = pb().s(1, "e-1").v(2, 2);
        Verdict v = decoder.decode("events-b64-value", first(id, event));
        assertNull(v.problem, v.toString());
        assertEquals("B", v.record.get("kind"));
        assertEquals("protobuf:/kind", decoder.decode("events-b64-value", first(id, pb().s(1, "e-1").v(2, 9))).problem);
        // Not base64 of a descriptor (nor .proto text): a fixed verdict for the id, never a crash.
        int broken = registry.register("broken-value", "PROTOBUF", "bm90IGEgZGVzY3JpcHRvcg==");
        assertTrue(decoder.decode("broken-value", first(broken, event)).problem.startsWith("internal_error:"));
    }
}
