package io.kdq.spark.counts;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;

import org.apache.spark.sql.Encoder;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.expressions.Aggregator;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

import tools.jackson.core.io.JsonStringEncoder;

/**
 * A micro-batch's counts as one aggregate value: rows per (topic, window, valid, reason, counted)
 * with the group's largest trusted event time (the watermark's input), its rules version and the
 * range of its Kafka timestamps, returned as a JSON array.
 *
 * <p>Why an aggregate function and not a GROUP BY: the speed layer computes it as an observed
 * metric ({@code Dataset.observe}) of the one pass that writes the micro-batch's records to the
 * raw archive, so the 1 KB values are read, classified and written once and never cached. Spark
 * merges an observed metric's partial results once per result task (retried or speculative
 * attempts included), the same guarantee an action's accumulators have, and the archive write is
 * a single result stage (no shuffle between the observation and the write). The groups are
 * exactly those of {@code kdq.spark.transforms.batch_aggregates}, which the batch layer and the
 * replay of an archived micro-batch still use; a unit test compares both on the same rows.
 *
 * <p>Input columns, in order ({@link #input()}): topic, window_start_ms, valid, reason (null when
 * valid), counted, rules_version, watermark_ms (null when the record's clock is not trusted),
 * kafka_ms. Output: {@code [{"topic":…, "window_start_ms":…, "valid":…, "reason":…,
 * "counted":…, "count":…, "max_event_ms":…, "rules_version":…, "oldest_kafka_ms":…,
 * "newest_kafka_ms":…}, …]}, nulls written as JSON null.
 */
public final class BatchCounts extends Aggregator<Row, BatchCounts.Groups, String> {
    private static final long serialVersionUID = 1L;

    /** The input columns, in order (built on demand: Spark's type objects need the SQL engine's classes). */
    public static StructType input() {
        return DataTypes.createStructType(new org.apache.spark.sql.types.StructField[] {
            DataTypes.createStructField("topic", DataTypes.StringType, true),
            DataTypes.createStructField("window_start_ms", DataTypes.LongType, true),
            DataTypes.createStructField("valid", DataTypes.BooleanType, true),
            DataTypes.createStructField("reason", DataTypes.StringType, true),
            DataTypes.createStructField("counted", DataTypes.BooleanType, true),
            DataTypes.createStructField("rules_version", DataTypes.StringType, true),
            DataTypes.createStructField("watermark_ms", DataTypes.LongType, true),
            DataTypes.createStructField("kafka_ms", DataTypes.LongType, true),
        });
    }

    /** The aggregate as a Spark function over the {@link #input()} columns (register it with {@code spark.udf().register}). */
    public static UserDefinedFunction udaf() {
        return functions.udaf(new BatchCounts(), Encoders.row(input()));
    }

    /** One group's key; a mutable probe is reused for lookups, a copy is stored. */
    static final class Key implements Serializable {
        private static final long serialVersionUID = 1L;
        String topic;
        long windowStartMs;
        boolean windowNull;
        Boolean valid;
        String reason;
        Boolean counted;

        Key copy() {
            Key k = new Key();
            k.topic = topic;
            k.windowStartMs = windowStartMs;
            k.windowNull = windowNull;
            k.valid = valid;
            k.reason = reason;
            k.counted = counted;
            return k;
        }

        @Override
        public boolean equals(Object o) {
            if (!(o instanceof Key)) {
                return false;
            }
            Key k = (Key) o;
            return windowStartMs == k.windowStartMs && windowNull == k.windowNull && Objects.equals(topic, k.topic)
                && Objects.equals(valid, k.valid) && Objects.equals(reason, k.reason) && Objects.equals(counted, k.counted);
        }

        @Override
        public int hashCode() {
            int h = Objects.hashCode(topic);
            h = 31 * h + Long.hashCode(windowStartMs);
            h = 31 * h + Objects.hashCode(reason);
            h = 31 * h + (valid == null ? 0 : valid ? 1 : 2);
            return 31 * h + (counted == null ? 0 : counted ? 1 : 2);
        }
    }

    /** One group's figures; {@code has*} false means SQL NULL (no row of the group had a value). */
    static final class Figures implements Serializable {
        private static final long serialVersionUID = 1L;
        long count;
        boolean hasMaxEvent;
        long maxEventMs;
        String rulesVersion;
        boolean hasKafka;
        long oldestKafkaMs;
        long newestKafkaMs;

        void merge(Figures o) {
            count += o.count;
            if (o.hasMaxEvent) {
                maxEventMs = hasMaxEvent ? Math.max(maxEventMs, o.maxEventMs) : o.maxEventMs;
                hasMaxEvent = true;
            }
            rulesVersion = maxString(rulesVersion, o.rulesVersion);
            if (o.hasKafka) {
                oldestKafkaMs = hasKafka ? Math.min(oldestKafkaMs, o.oldestKafkaMs) : o.oldestKafkaMs;
                newestKafkaMs = hasKafka ? Math.max(newestKafkaMs, o.newestKafkaMs) : o.newestKafkaMs;
                hasKafka = true;
            }
        }
    }

    /** The aggregation buffer: figures per group. */
    public static final class Groups implements Serializable {
        private static final long serialVersionUID = 1L;
        final HashMap<Key, Figures> map = new HashMap<>();
        transient Key probe;
    }

    @Override
    public Groups zero() {
        return new Groups();
    }

    @Override
    public Groups reduce(Groups groups, Row row) {
        Key probe = groups.probe;
        if (probe == null) {
            probe = groups.probe = new Key();
        }
        probe.topic = row.isNullAt(0) ? null : row.getString(0);
        probe.windowNull = row.isNullAt(1);
        probe.windowStartMs = probe.windowNull ? 0L : row.getLong(1);
        probe.valid = row.isNullAt(2) ? null : row.getBoolean(2);
        probe.reason = row.isNullAt(3) ? null : row.getString(3);
        probe.counted = row.isNullAt(4) ? null : row.getBoolean(4);
        Figures f = groups.map.get(probe);
        if (f == null) {
            f = new Figures();
            groups.map.put(probe.copy(), f);
        }
        f.count++;
        if (!row.isNullAt(5)) {
            f.rulesVersion = maxString(f.rulesVersion, row.getString(5));
        }
        if (!row.isNullAt(6)) {
            long wm = row.getLong(6);
            f.maxEventMs = f.hasMaxEvent ? Math.max(f.maxEventMs, wm) : wm;
            f.hasMaxEvent = true;
        }
        if (!row.isNullAt(7)) {
            long k = row.getLong(7);
            f.oldestKafkaMs = f.hasKafka ? Math.min(f.oldestKafkaMs, k) : k;
            f.newestKafkaMs = f.hasKafka ? Math.max(f.newestKafkaMs, k) : k;
            f.hasKafka = true;
        }
        return groups;
    }

    @Override
    public Groups merge(Groups a, Groups b) {
        for (Map.Entry<Key, Figures> e : b.map.entrySet()) {
            Figures f = a.map.get(e.getKey());
            if (f == null) {
                a.map.put(e.getKey(), e.getValue());
            } else {
                f.merge(e.getValue());
            }
        }
        return a;
    }

    @Override
    public String finish(Groups groups) {
        List<Map.Entry<Key, Figures>> entries = new ArrayList<>(groups.map.entrySet());
        StringBuilder out = new StringBuilder(64 + entries.size() * 200).append('[');
        boolean first = true;
        for (Map.Entry<Key, Figures> e : entries) {
            Key k = e.getKey();
            Figures f = e.getValue();
            if (!first) {
                out.append(',');
            }
            first = false;
            out.append("{\"topic\":");
            string(out, k.topic);
            out.append(",\"window_start_ms\":").append(k.windowNull ? "null" : Long.toString(k.windowStartMs));
            out.append(",\"valid\":").append(k.valid);
            out.append(",\"reason\":");
            string(out, k.reason);
            out.append(",\"counted\":").append(k.counted);
            out.append(",\"count\":").append(f.count);
            out.append(",\"max_event_ms\":").append(f.hasMaxEvent ? Long.toString(f.maxEventMs) : "null");
            out.append(",\"rules_version\":");
            string(out, f.rulesVersion);
            out.append(",\"oldest_kafka_ms\":").append(f.hasKafka ? Long.toString(f.oldestKafkaMs) : "null");
            out.append(",\"newest_kafka_ms\":").append(f.hasKafka ? Long.toString(f.newestKafkaMs) : "null");
            out.append('}');
        }
        return out.append(']').toString();
    }

    @Override
    public Encoder<Groups> bufferEncoder() {
        return Encoders.javaSerialization(Groups.class);
    }

    @Override
    public Encoder<String> outputEncoder() {
        return Encoders.STRING();
    }

    /** Spark's max over strings compares UTF-8 bytes; rules versions are ASCII, where UTF-16 order is the same. */
    static String maxString(String a, String b) {
        if (a == null) {
            return b;
        }
        if (b == null) {
            return a;
        }
        return a.compareTo(b) >= 0 ? a : b;
    }

    /** {@code s} as a JSON string (null as JSON null): the aggregates' JSON output (also {@code SummaryStates}'). */
    public static void string(StringBuilder out, String s) {
        if (s == null) {
            out.append("null");
            return;
        }
        out.append('"');
        JsonStringEncoder.getInstance().quoteAsString(s, out);
        out.append('"');
    }
}
