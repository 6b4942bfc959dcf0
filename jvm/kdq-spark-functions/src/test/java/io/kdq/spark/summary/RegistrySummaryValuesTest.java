package io.kdq.spark.summary;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;

import org.apache.avro.generic.GenericRecord;
import org.apache.spark.sql.Row;
import org.junit.jupiter.api.Test;

import io.kdq.spark.registry.Avro;
import io.kdq.spark.registry.FakeRegistry;
import io.kdq.spark.registry.Orders;
import io.kdq.spark.registry.RegistryConnection;
import io.kdq.spark.registry.RegistryUnavailableException;

/**
 * The summaries' fields of registry-backed topics: read from the decoded record as the JSON path reads the same
 * values from JSON (a decimal, an enum, a nested record's enum, an array element, a timestamp); other topics
 * keep the JSON path; the first matching rule decides.
 */
class RegistrySummaryValuesTest {
    /** amount grouped by currency and customer.tier; the second line's qty; placed_at (a timestamp) as a value. */
    private static final String CONFIG = "{\"max_nesting_depth\":50,\"summaries\":["
            + "{\"value\":[\"amount\"],\"group_by\":[[\"currency\"],[\"customer\",\"tier\"]],\"digits\":3},"
            + "{\"value\":[\"lines\",\"1\",\"qty\"],\"group_by\":[[\"gift\"]],\"digits\":3},"
            + "{\"value\":[\"placed_at\"],\"group_by\":[[\"note\"]],\"digits\":3}],"
            + "\"rules\":[{\"match\":\"orders-json\",\"is_pattern\":false,\"registry\":false},"
            + "{\"match\":\"orders-.*\",\"is_pattern\":true,\"registry\":true}]}";

    @Test
    void readsDecodedRecordsAsTheJsonPathReadsJson() throws Exception {
        try (FakeRegistry registry = new FakeRegistry()) {
            int id = registry.register("orders-avro-value", "AVRO", Orders.SCHEMA);
            RegistrySummaryValues f = new RegistrySummaryValues(CONFIG)
                    .withDecoder(RegistryConnection.decoder(registry.url(), null, Duration.ofSeconds(5)));
            assertTrue(RegistrySummaryValues.check(CONFIG).endsWith("2 topic rules"));
            GenericRecord order = Orders.order(3, null);
            List<Row> decoded = f.call("orders-avro", Avro.frame(id, Avro.encode(Orders.PARSED, order)));
            // The JSON a producer would write for the same order: the same numbers and groups.
            String json = "{\"amount\":1234.50,\"currency\":\"EUR\",\"customer\":{\"tier\":\"GOLD\"},"
                    + "\"lines\":[{\"qty\":1},{\"qty\":2}],\"gift\":" + order.get("gift") + ",\"placed_at\":1700000000123}";
            List<Row> fromJson = new SummaryValues(CONFIG).call(json.getBytes(StandardCharsets.UTF_8));
            assertEquals(1234.5, decoded.get(0).getDouble(0));
            assertEquals(Arrays.asList("EUR", "GOLD"), decoded.get(0).get(3));
            assertEquals(fields(fromJson.get(0)), fields(decoded.get(0)));
            assertEquals(2.0, decoded.get(1).getDouble(0)); // lines[1].qty: an array index as a path step
            assertEquals(Arrays.asList(String.valueOf(order.get("gift"))), decoded.get(1).get(3));
            assertEquals(1.700000000123e12, decoded.get(2).getDouble(0)); // the timestamp's epoch millis
            assertEquals(Arrays.asList((Object) null), decoded.get(2).get(3)); // note: null is missing

            // The exact JSON rule comes first: that topic's values are JSON.
            assertEquals(fields(fromJson.get(0)), fields(f.call("orders-json", json.getBytes(StandardCharsets.UTF_8)).get(0)));
            registry.down = true;
            int unseen = 4242;
            assertThrows(RegistryUnavailableException.class,
                    () -> f.call("orders-avro", Avro.frame(unseen, Avro.encode(Orders.PARSED, order))));
        }
    }

    private static List<Object> fields(Row row) {
        return Arrays.asList(row.get(0), row.get(1), row.get(2), row.get(3));
    }
}
