package io.kdq.spark.registry;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.math.BigDecimal;
import java.time.Duration;
import java.time.Instant;
import java.time.LocalDate;
import java.util.Arrays;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** Every verdict of an Avro topic through a registry served over HTTP, and fields read from decoded records. */
class AvroDecodingTest {
    static FakeRegistry registry;
    static RegistryDecoder decoder;
    static int orders;

    @BeforeAll
    static void start() throws Exception {
        registry = new FakeRegistry();
        orders = registry.register("orders-value", "AVRO", Orders.SCHEMA);
        decoder = new RegistryDecoder(new SchemaCache(new HttpSchemaSource(registry.url(), null, Duration.ofSeconds(5)),
                SchemaCache.DEFAULT_RECHECK_NANOS, System::nanoTime));
    }

    @AfterAll
    static void stop() {
        registry.close();
    }

    static String verdict(String subject, String schema, String payloadHex) {
        int id = registry.register(subject, "AVRO", schema);
        return decoder.decode(subject, Avro.frame(id, Avro.hex(payloadHex))).problem;
    }

    @Test
    void decodesNestedRecordsUnionsEnumsMapsAndLogicalTypes() {
        byte[] value = Avro.frame(orders, Avro.encode(Orders.PARSED, Orders.order(3, "leave at the door")));
        Verdict v = decoder.decode("orders-value", value);
        assertNull(v.problem, v.toString());
        assertEquals(orders, v.schemaId);
        DecodedRecord r = v.record;
        assertEquals("o-0001-2023-11-14-000123", r.get("order_id"));
        assertEquals("6f1c2c1e-8d7a-4a53-9a43-2b0c6f0e9d11", r.get("id"));
        assertEquals(new BigDecimal("1234.50"), r.get("amount"));
        assertEquals("EUR", r.get("currency"));
        assertEquals(Instant.ofEpochMilli(1700000000123L), r.get("placed_at"));
        assertEquals(LocalDate.of(2023, 11, 14), r.get("day"));
        assertEquals("GOLD", r.get("customer", "tier"));
        assertEquals(2, r.get("lines", "1", "qty"));
        assertEquals(11.99, r.get("lines", "2", "price"));
        assertEquals("leave at the door", r.get("note"));
        assertEquals("web", r.get("attrs", "channel"));
        assertEquals(false, r.get("gift"));
        assertNull(r.get("lines", "3", "qty"));
        assertNull(r.get("customer", "missing"));
        assertNull(r.get("order_id", "deeper"));
        assertNull(decoder.decode("orders-value", Avro.frame(orders, Avro.encode(Orders.PARSED, Orders.order(1, null))))
                .record.get("note"));
    }

    @Test
    void truncatedPayloadsNameTheFieldTheyStopIn() {
        byte[] payload = Avro.encode(Orders.PARSED, Orders.order(2, null));
        // the last field is the boolean 'gift'
        assertEquals("avro:/gift", decoder.decode("orders-value",
                Avro.frame(orders, Arrays.copyOf(payload, payload.length - 1))).problem);
        assertEquals("avro:/customer/name", decoder.decode("orders-value", Avro.frame(orders,
                Arrays.copyOf(payload, indexOf(payload, "Ada") + 1))).problem);
        assertEquals("avro:/order_id", decoder.decode("orders-value", Avro.frame(orders, new byte[0])).problem);
        Schema lines = new Schema.Parser().parse("{\"type\":\"record\",\"name\":\"L\",\"fields\":[{\"name\":\"lines\","
                + "\"type\":" + Orders.PARSED.getField("lines").schema() + "}]}");
        GenericRecord r = new GenericData.Record(lines);
        r.put("lines", Orders.order(2, null).get("lines"));
        byte[] p = Avro.encode(lines, r);
        int id = registry.register("lines-value", "AVRO", lines.toString());
        // cut after lines[1].sku: 1 (qty) + 8 (price) + 1 (end of array) bytes missing
        assertEquals("avro:/lines/1/qty", decoder.decode("lines-value",
                Avro.frame(id, Arrays.copyOf(p, p.length - 10))).problem);
        assertEquals("avro:/lines/1/price", decoder.decode("lines-value",
                Avro.frame(id, Arrays.copyOf(p, p.length - 5))).problem);
        assertEquals("avro:/lines", decoder.decode("lines-value",
                Avro.frame(id, Arrays.copyOf(p, p.length - 1))).problem);
    }

    private static int indexOf(byte[] b, String s) {
        return new String(b, java.nio.charset.StandardCharsets.ISO_8859_1).indexOf(s);
    }

    @Test
    void trailingBytes() {
        byte[] payload = Avro.encode(Orders.PARSED, Orders.order(1, null));
        byte[] longer = Arrays.copyOf(payload, payload.length + 1);
        assertEquals("avro:$trailing_bytes", decoder.decode("orders-value", Avro.frame(orders, longer)).problem);
    }

    @Test
    void wrongTypesBadEnumsAndUnions() {
        String s = "{\"type\":\"record\",\"name\":\"W\",\"fields\":[{\"name\":\"a\",\"type\":\"int\"},"
                + "{\"name\":\"tier\",\"type\":{\"type\":\"enum\",\"name\":\"T\",\"symbols\":[\"A\",\"B\"]}},"
                + "{\"name\":\"u\",\"type\":[\"null\",\"int\"]},{\"name\":\"flag\",\"type\":\"boolean\"},"
                + "{\"name\":\"m\",\"type\":{\"type\":\"map\",\"values\":\"int\"}},"
                + "{\"name\":\"s\",\"type\":\"string\"}]}";
        assertNull(verdict("w-value", s, "02" + "02" + "0202" + "01" + "02026b04" + "00" + "0261"));
        assertEquals("avro:/tier", verdict("w-value", s, "02" + "0a"));
        assertEquals("avro:/tier", verdict("w-value", s, "02" + "01"));
        assertEquals("avro:/u", verdict("w-value", s, "02" + "02" + "04"));
        assertEquals("avro:/flag", verdict("w-value", s, "02" + "02" + "00" + "02"));
        // map {"k": <int cut short>}
        assertEquals("avro:/m/k", verdict("w-value", s, "02" + "02" + "00" + "01" + "02026b"));
        // a string claiming 2^31 bytes in 5: a truncation, found before anything is allocated
        assertEquals("avro:/s", verdict("w-value", s, "02" + "02" + "00" + "01" + "00" + "feffffff0f"));
        // a negative string length
        assertEquals("avro:/s", verdict("w-value", s, "02" + "02" + "00" + "01" + "00" + "01"));
        // a 2^40-element array of nulls in 6 bytes
        assertEquals("avro:/n", verdict("n-value", "{\"type\":\"record\",\"name\":\"N\",\"fields\":[{\"name\":\"n\","
                + "\"type\":{\"type\":\"array\",\"items\":\"null\"}}]}", "80808080804000"));
    }

    @Test
    void framingIdsAndSubjects() {
        byte[] good = Avro.frame(orders, Avro.encode(Orders.PARSED, Orders.order(1, null)));
        assertEquals("null_value", decoder.decode("orders-value", null).problem);
        assertEquals("no_magic_byte", decoder.decode("orders-value", new byte[0]).problem);
        assertEquals("no_magic_byte", decoder.decode("orders-value", new byte[] {0, 0, 0}).problem);
        byte[] wrongMagic = good.clone();
        wrongMagic[0] = 1;
        assertEquals("no_magic_byte", decoder.decode("orders-value", wrongMagic).problem);
        assertEquals("no_magic_byte", decoder.decode("orders-value", "{\"a\":1}".getBytes()).problem);
        byte[] unknown = good.clone();
        unknown[4] = 99;
        Verdict u = decoder.decode("orders-value", unknown);
        assertEquals("unknown_schema_id", u.problem);
        assertEquals(99, u.schemaId);
        int other = registry.register("customers-value", "AVRO", Orders.PARSED.getField("customer").schema().toString());
        assertEquals("schema_not_for_subject", decoder.decode("orders-value",
                Avro.frame(other, Avro.encode(Orders.PARSED.getField("customer").schema(),
                        Orders.order(1, null).get("customer")))).problem);
        assertNull(decoder.decode("customers-value", Avro.frame(other, Avro.encode(
                Orders.PARSED.getField("customer").schema(), Orders.order(1, null).get("customer")))).problem);
        assertNull(decoder.decode(null, good).problem); // no subject: any registered id
    }

    @Test
    void referencedNamedTypes() {
        String money = "{\"type\":\"record\",\"name\":\"Money\",\"namespace\":\"io.kdq.shared\",\"fields\":["
                + "{\"name\":\"units\",\"type\":\"long\"},{\"name\":\"currency\",\"type\":\"string\"}]}";
        registry.register("io.kdq.shared.Money", "AVRO", money);
        String payment = "{\"type\":\"record\",\"name\":\"Payment\",\"fields\":[{\"name\":\"total\","
                + "\"type\":\"io.kdq.shared.Money\"}]}";
        int id = registry.register("payments-value", "AVRO", payment,
                new SchemaReference("io.kdq.shared.Money", "io.kdq.shared.Money", 1));
        Verdict v = decoder.decode("payments-value", Avro.frame(id, Avro.hex("f403" + "06455552")));
        assertNull(v.problem, v.toString());
        assertEquals(250L, v.record.get("total", "units"));
        assertEquals("EUR", v.record.get("total", "currency"));
        assertEquals("avro:/total/currency", decoder.decode("payments-value", Avro.frame(id, Avro.hex("f403" + "0645")))
                .problem);
    }

    @Test
    void schemasTheLibraryRefusesAreAVerdictNotARetry() {
        int missingRef = registry.register("broken-value", "AVRO", "{\"type\":\"record\",\"name\":\"B\",\"fields\":["
                + "{\"name\":\"x\",\"type\":\"io.kdq.Nowhere\"}]}", new SchemaReference("io.kdq.Nowhere", "nowhere", 1));
        assertEquals("internal_error:IllegalArgumentException", decoder.decode("broken-value",
                Avro.frame(missingRef, new byte[] {2})).problem);
        int unparsable = registry.register("broken2-value", "AVRO", "{\"type\":\"record\",\"name\":\"C\"}");
        assertEquals("internal_error:SchemaParseException", decoder.decode("broken2-value",
                Avro.frame(unparsable, new byte[] {2})).problem);
        assertEquals("unsupported_schema_type:XML", decoder.decode("ev-value", Avro.frame(registry.register(
                "ev-value", "XML", "<schema/>"), new byte[] {0})).problem);
    }

    @Test
    void fixedDecimalsAndUuids() {
        String s = "{\"type\":\"record\",\"name\":\"F\",\"fields\":[{\"name\":\"d\",\"type\":{\"type\":\"fixed\","
                + "\"name\":\"D\",\"size\":4,\"logicalType\":\"decimal\",\"precision\":9,\"scale\":3}},"
                + "{\"name\":\"u\",\"type\":{\"type\":\"fixed\",\"name\":\"U\",\"size\":16,\"logicalType\":\"uuid\"}},"
                + "{\"name\":\"b\",\"type\":\"bytes\"}]}";
        int id = registry.register("f-value", "AVRO", s);
        Verdict v = decoder.decode("f-value", Avro.frame(id, Avro.hex("fffffc18" + "00112233445566778899aabbccddeeff"
                + "04cafe")));
        assertNull(v.problem, v.toString());
        assertEquals(new BigDecimal("-1.000"), v.record.get("d"));
        assertEquals("00112233-4455-6677-8899-aabbccddeeff", v.record.get("u"));
        assertArrayEquals(new byte[] {(byte) 0xca, (byte) 0xfe}, (byte[]) v.record.get("b"));
        assertEquals("avro:/u", decoder.decode("f-value", Avro.frame(id, Avro.hex("fffffc18" + "0011"))).problem);
    }
}
