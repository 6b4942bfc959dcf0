package io.kdq.spark.counts;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.junit.jupiter.api.Test;

/** The micro-batch aggregate's buffer logic; its equality with batch_aggregates' GROUP BY is tested from Python. */
class BatchCountsTest {
    private static Row row(String topic, Long window, Boolean valid, String reason, Boolean counted, String version,
                           Long watermark, Long kafka) {
        return RowFactory.create(topic, window, valid, reason, counted, version, watermark, kafka);
    }

    @SuppressWarnings("unchecked")
    private static <T> T roundTrip(T value) throws Exception {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        try (ObjectOutputStream out = new ObjectOutputStream(bytes)) {
            out.writeObject(value);
        }
        try (ObjectInputStream in = new ObjectInputStream(new ByteArrayInputStream(bytes.toByteArray()))) {
            return (T) in.readObject();
        }
    }

    @Test
    void groupsCountsAndRangesAcrossPartialBuffers() throws Exception {
        BatchCounts agg = new BatchCounts();
        BatchCounts.Groups a = agg.zero();
        agg.reduce(a, row("t", 1000L, true, null, true, "v1", 1500L, 10L));
        agg.reduce(a, row("t", 1000L, true, null, true, "v2", 1200L, 5L));
        agg.reduce(a, row("t", 1000L, false, "schema:/x \"q\"", true, "v1", null, 7L));
        BatchCounts.Groups b = agg.zero();
        agg.reduce(b, row("t", 1000L, true, null, true, "v0", 1900L, 20L));
        agg.reduce(b, row("t", 2000L, true, null, false, null, null, null));
        // Partial buffers travel serialized between tasks and the driver.
        BatchCounts.Groups merged = agg.merge(roundTrip(a), roundTrip(b));
        String json = agg.finish(merged);
        assertEquals(3, merged.map.size());
        org.junit.jupiter.api.Assertions.assertTrue(json.contains(
            "{\"topic\":\"t\",\"window_start_ms\":1000,\"valid\":true,\"reason\":null,\"counted\":true,\"count\":3,"
            + "\"max_event_ms\":1900,\"rules_version\":\"v2\",\"oldest_kafka_ms\":5,\"newest_kafka_ms\":20}"), json);
        org.junit.jupiter.api.Assertions.assertTrue(json.contains(
            "\"reason\":\"schema:/x \\\"q\\\"\",\"counted\":true,\"count\":1,\"max_event_ms\":null"), json);
        org.junit.jupiter.api.Assertions.assertTrue(json.contains(
            "{\"topic\":\"t\",\"window_start_ms\":2000,\"valid\":true,\"reason\":null,\"counted\":false,\"count\":1,"
            + "\"max_event_ms\":null,\"rules_version\":null,\"oldest_kafka_ms\":null,\"newest_kafka_ms\":null}"), json);
    }

    @Test
    void anEmptyBatchIsAnEmptyArray() {
        BatchCounts agg = new BatchCounts();
        assertEquals("[]", agg.finish(agg.merge(agg.zero(), agg.zero())));
    }
}
