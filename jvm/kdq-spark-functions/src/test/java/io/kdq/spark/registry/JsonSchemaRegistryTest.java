package io.kdq.spark.registry;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.nio.charset.StandardCharsets;
import java.time.Duration;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** JSON Schema ids (schemaType JSON) through a registry served over HTTP: verdicts, references, fields read. */
class JsonSchemaRegistryTest {
    static final String CUSTOMER = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
            + "\"tier\":{\"enum\":[\"SILVER\",\"GOLD\"]}},\"required\":[\"name\"]}";
    static final String ORDER = "{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"type\":\"object\","
            + "\"properties\":{\"order_id\":{\"type\":\"string\",\"pattern\":\"^o-\"},"
            + "\"customer\":{\"$ref\":\"customer.json\"},"
            + "\"lines\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"qty\":{\"type\":\"integer\","
            + "\"minimum\":1}}}},\"placed_at\":{\"type\":\"integer\"}},\"required\":[\"order_id\",\"customer\"]}";

    static FakeRegistry registry;
    static RegistryDecoder decoder;
    static int orders;

    @BeforeAll
    static void start() throws Exception {
        registry = new FakeRegistry();
        registry.register("customer", "JSON", CUSTOMER);
        orders = registry.register("orders-value", "JSON", ORDER, new SchemaReference("customer.json", "customer", 1));
        decoder = new RegistryDecoder(new SchemaCache(new HttpSchemaSource(registry.url(), null, Duration.ofSeconds(5)),
                SchemaCache.DEFAULT_RECHECK_NANOS, System::nanoTime));
    }

    @AfterAll
    static void stop() {
        registry.close();
    }

    static Verdict json(String text) {
        return decoder.decode("orders-value", Avro.frame(orders, text.getBytes(StandardCharsets.UTF_8)));
    }

    @Test
    void validPayloadsReadByPath() {
        Verdict v = json("{\"order_id\":\"o-1\",\"customer\":{\"name\":\"Ada\",\"tier\":\"GOLD\"},"
                + "\"lines\":[{\"qty\":1},{\"qty\":3}],\"placed_at\":1700000000123,\"x\":1.5}");
        assertNull(v.problem, v.toString());
        assertEquals("o-1", v.record.get("order_id"));
        assertEquals("GOLD", v.record.get("customer", "tier"));
        assertEquals(3, v.record.get("lines", "1", "qty"));
        assertEquals(1700000000123L, v.record.get("placed_at"));
        assertEquals(1.5, v.record.get("x"));
        assertNull(v.record.get("lines", "2", "qty"));
        assertNull(v.record.get("nope"));
    }

    @Test
    void reasonsAreTheClassifiersWithJsonForSchema() {
        assertEquals("json:/required/1", json("{\"order_id\":\"o-1\"}").problem);
        assertEquals("json:/properties/order_id/pattern", json("{\"order_id\":\"x\",\"customer\":{\"name\":\"A\"}}").problem);
        assertEquals("json:/properties/customer/$ref/properties/tier/enum",
                json("{\"order_id\":\"o-1\",\"customer\":{\"name\":\"A\",\"tier\":\"BRONZE\"}}").problem,
                "through the referenced schema");
        assertEquals("json:/properties/lines/items/properties/qty/minimum",
                json("{\"order_id\":\"o-1\",\"customer\":{\"name\":\"A\"},\"lines\":[{\"qty\":0}]}").problem);
        assertEquals("not_json", json("{\"order_id\":").problem);
        assertEquals("not_json", json("").problem);
        assertEquals("not_utf8", decoder.decode("orders-value", Avro.frame(orders, new byte[] {'"', (byte) 0xff, '"'}))
                .problem);
        assertEquals("no_magic_byte", decoder.decode("orders-value",
                "{\"order_id\":\"o-1\"}".getBytes(StandardCharsets.UTF_8)).problem);
    }

    @Test
    void schemasThatDoNotCompileAreAVerdict() {
        int bad = registry.register("bad-value", "JSON", "{\"type\":");
        assertEquals("internal_error:IllegalArgumentException",
                decoder.decode("bad-value", Avro.frame(bad, "{}".getBytes(StandardCharsets.UTF_8))).problem);
        int unresolved = registry.register("bad2-value", "JSON", "{\"$ref\":\"elsewhere.json\"}");
        assertEquals("internal_error:IllegalArgumentException",
                decoder.decode("bad2-value", Avro.frame(unresolved, "{}".getBytes(StandardCharsets.UTF_8))).problem);
    }
}
