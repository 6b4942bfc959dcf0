package io.kdq.spark.summary;

import java.io.Serializable;
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
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import io.kdq.spark.counts.BatchCounts;

/**
 * A micro-batch's summary states as one aggregate value: the rows of
 * {@code kdq.spark.summaries.transforms.summary_states} (one mergeable state per summary, topic, window, group
 * and lateness), returned as a JSON array.
 *
 * <p>Why an aggregate function and not two GROUP BYs: the speed layer computes it, as it computes the batch's counts
 * ({@link io.kdq.spark.counts.BatchCounts}), as an observed metric of the one pass that writes the micro-batch's
 * records to the raw archive. The summaries then need neither the batch's 1 KB rows cached nor a second pass over
 * them (benchmarks/PERF_NOTES.md, "the summaries in the archive's pass"). Spark merges an observed metric's partial
 * results once per result task, so every record is in exactly one state.
 *
 * <p>Input columns, in order ({@link #input()}): topic, and the record's entries (null when no summary counts the
 * record): one struct per summary on the record's topic, as {@code summary_values} explodes them (summary,
 * window_start_ms, group_key, groups, x, bucket, reject, late). Output: {@code [{"summary":…, "topic":…,
 * "window_start_ms":…, "group_key":…, "late":…, "groups":{…}, "count":…, "sum":…, "sum_sq":…, "min":…, "max":…,
 * "hist":{"<bucket>":n,…}, "rejected":{"<reason>":n,…}, "rows":…}, …]}; the figures are those of
 * {@code summary_states} (count: rows with a bucket; sum, sum_sq, min, max: over the rows' values; rows: all),
 * a unit test compares both on the same rows.
 */
public final class SummaryStates extends Aggregator<Row, SummaryStates.States, String> {
    private static final long serialVersionUID = 1L;

    /** One entry's struct, as {@code kdq.spark.summaries.transforms} builds it. */
    public static StructType entry() {
        return DataTypes.createStructType(new StructField[] {
            DataTypes.createStructField("summary", DataTypes.StringType, true),
            DataTypes.createStructField("window_start_ms", DataTypes.LongType, true),
            DataTypes.createStructField("group_key", DataTypes.StringType, true),
            DataTypes.createStructField("groups",
                DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType, true), true),
            DataTypes.createStructField("x", DataTypes.DoubleType, true),
            DataTypes.createStructField("bucket", DataTypes.DoubleType, true),
            DataTypes.createStructField("reject", DataTypes.StringType, true),
            DataTypes.createStructField("late", DataTypes.BooleanType, true),
        });
    }

    /** The input columns, in order. */
    public static StructType input() {
        return DataTypes.createStructType(new StructField[] {
            DataTypes.createStructField("topic", DataTypes.StringType, true),
            DataTypes.createStructField("entries", DataTypes.createArrayType(entry(), true), true),
        });
    }

    /** The aggregate as a Spark function over the {@link #input()} columns (register it with {@code spark.udf().register}). */
    public static UserDefinedFunction udaf() {
        return functions.udaf(new SummaryStates(), Encoders.row(input()));
    }

    /** One state's key; a mutable probe is reused for lookups, a copy is stored. */
    static final class Key implements Serializable {
        private static final long serialVersionUID = 1L;
        String summary;
        String topic;
        long windowStartMs;
        boolean windowNull;
        String groupKey;
        Boolean late;

        Key copy() {
            Key k = new Key();
            k.summary = summary;
            k.topic = topic;
            k.windowStartMs = windowStartMs;
            k.windowNull = windowNull;
            k.groupKey = groupKey;
            k.late = late;
            return k;
        }

        @Override
        public boolean equals(Object o) {
            if (!(o instanceof Key)) {
                return false;
            }
            Key k = (Key) o;
            return windowStartMs == k.windowStartMs && windowNull == k.windowNull && Objects.equals(summary, k.summary)
                && Objects.equals(topic, k.topic) && Objects.equals(groupKey, k.groupKey) && Objects.equals(late, k.late);
        }

        @Override
        public int hashCode() {
            int h = Objects.hashCode(summary);
            h = 31 * h + Objects.hashCode(topic);
            h = 31 * h + Long.hashCode(windowStartMs);
            h = 31 * h + Objects.hashCode(groupKey);
            return 31 * h + (late == null ? 0 : late ? 1 : 2);
        }
    }

    /** One state's figures; {@code hasValue} false means min and max are SQL NULL (no row had a value). */
    static final class State implements Serializable {
        private static final long serialVersionUID = 1L;
        HashMap<String, String> groups;
        long count;
        double sum;
        double sumSq;
        boolean hasValue;
        double min;
        double max;
        final HashMap<Bucket, Long> hist = new HashMap<>();
        final HashMap<String, Long> rejected = new HashMap<>();
        long rows;

        void add(double x) {
            sum += x;
            sumSq += x * x;
            min = hasValue ? Math.min(min, x) : x;
            max = hasValue ? Math.max(max, x) : x;
            hasValue = true;
        }

        /** One more row in {@code bucket}'s bar of the histogram. */
        void addBucket(double bucket) {
            hist.merge(new Bucket(normalized(bucket)), 1L, Long::sum);
        }

        void merge(State o) {
            if (groups == null) {
                groups = o.groups;
            }
            count += o.count;
            sum += o.sum;
            sumSq += o.sumSq;
            if (o.hasValue) {
                min = hasValue ? Math.min(min, o.min) : o.min;
                max = hasValue ? Math.max(max, o.max) : o.max;
                hasValue = true;
            }
            o.hist.forEach((b, n) -> hist.merge(b, n, Long::sum));
            o.rejected.forEach((r, n) -> rejected.merge(r, n, Long::sum));
            rows += o.rows;
        }
    }

    /**
     * A histogram bucket as a map key. Why not {@code Double}: its hash folds the high word onto the low one, so
     * the buckets of a range of integers (100.0, 101.0, …: their low words are zero) share their low hash bits and
     * {@code HashMap} turned their bins into trees; a multiplicative hash spreads them.
     */
    static final class Bucket implements Serializable {
        private static final long serialVersionUID = 1L;
        final double value;

        Bucket(double value) {
            this.value = value;
        }

        @Override
        public boolean equals(Object o) {
            return o instanceof Bucket b && Double.doubleToLongBits(b.value) == Double.doubleToLongBits(value);
        }

        @Override
        public int hashCode() {
            long h = Double.doubleToLongBits(value) * 0x9E3779B97F4A7C15L;
            return (int) (h >>> 32);
        }
    }

    /** The aggregation buffer: a state per key. */
    public static final class States implements Serializable {
        private static final long serialVersionUID = 1L;
        final HashMap<Key, State> map = new HashMap<>();
        transient Key probe;
    }

    @Override
    public States zero() {
        return new States();
    }

    @Override
    public States reduce(States states, Row row) {
        if (row.isNullAt(1)) {
            return states;
        }
        Key probe = states.probe;
        if (probe == null) {
            probe = states.probe = new Key();
        }
        String topic = row.isNullAt(0) ? null : row.getString(0);
        List<Row> entries = row.getList(1);
        for (Row e : entries) {
            if (e == null) {
                continue;
            }
            probe.summary = e.isNullAt(0) ? null : e.getString(0);
            probe.topic = topic;
            probe.windowNull = e.isNullAt(1);
            probe.windowStartMs = probe.windowNull ? 0L : e.getLong(1);
            probe.groupKey = e.isNullAt(2) ? null : e.getString(2);
            probe.late = e.isNullAt(7) ? null : e.getBoolean(7);
            State s = states.map.get(probe);
            if (s == null) {
                s = new State();
                s.groups = e.isNullAt(3) ? null : new HashMap<>(e.<String, String>getJavaMap(3));
                states.map.put(probe.copy(), s);
            }
            s.rows++;
            if (!e.isNullAt(4)) {
                s.add(e.getDouble(4));
            }
            if (!e.isNullAt(5)) {
                s.count++;
                s.addBucket(e.getDouble(5));
            }
            if (!e.isNullAt(6)) {
                s.rejected.merge(e.getString(6), 1L, Long::sum);
            }
        }
        return states;
    }

    @Override
    public States merge(States a, States b) {
        return mergeStates(a, b);
    }

    /** {@code b}'s states added into {@code a}'s. */
    static States mergeStates(States a, States b) {
        for (Map.Entry<Key, State> e : b.map.entrySet()) {
            State s = a.map.get(e.getKey());
            if (s == null) {
                a.map.put(e.getKey(), e.getValue());
            } else {
                s.merge(e.getValue());
            }
        }
        return a;
    }

    @Override
    public String finish(States states) {
        return json(states);
    }

    /** The states as the JSON array the Python side reads ({@code summary_states_rows}). */
    static String json(States states) {
        StringBuilder out = new StringBuilder(64 + states.map.size() * 300).append('[');
        boolean first = true;
        for (Map.Entry<Key, State> e : states.map.entrySet()) {
            Key k = e.getKey();
            State s = e.getValue();
            if (!first) {
                out.append(',');
            }
            first = false;
            out.append("{\"summary\":");
            BatchCounts.string(out, k.summary);
            out.append(",\"topic\":");
            BatchCounts.string(out, k.topic);
            out.append(",\"window_start_ms\":").append(k.windowNull ? "null" : Long.toString(k.windowStartMs));
            out.append(",\"group_key\":");
            BatchCounts.string(out, k.groupKey);
            out.append(",\"late\":").append(k.late);
            out.append(",\"groups\":");
            if (s.groups == null) {
                out.append("null");
            } else {
                object(out, s.groups);
            }
            out.append(",\"count\":").append(s.count);
            out.append(",\"sum\":").append(number(s.sum));
            out.append(",\"sum_sq\":").append(number(s.sumSq));
            out.append(",\"min\":").append(s.hasValue ? number(s.min) : "null");
            out.append(",\"max\":").append(s.hasValue ? number(s.max) : "null");
            out.append(",\"hist\":{");
            boolean firstBucket = true;
            for (Map.Entry<Bucket, Long> b : s.hist.entrySet()) {
                if (!firstBucket) {
                    out.append(',');
                }
                firstBucket = false;
                out.append('"').append(Double.toString(b.getKey().value)).append("\":").append(b.getValue());
            }
            out.append("},\"rejected\":{");
            boolean firstReason = true;
            for (Map.Entry<String, Long> r : s.rejected.entrySet()) {
                if (!firstReason) {
                    out.append(',');
                }
                firstReason = false;
                BatchCounts.string(out, r.getKey());
                out.append(':').append(r.getValue());
            }
            out.append("},\"rows\":").append(s.rows).append('}');
        }
        return out.append(']').toString();
    }

    @Override
    public Encoder<States> bufferEncoder() {
        return Encoders.javaSerialization(States.class);
    }

    @Override
    public Encoder<String> outputEncoder() {
        return Encoders.STRING();
    }

    /** Spark groups -0.0 with 0.0 (and every NaN together): so do the histogram's buckets. */
    static double normalized(double bucket) {
        return bucket == 0.0 ? 0.0 : Double.isNaN(bucket) ? Double.NaN : bucket;
    }

    /** A double as JSON (Python's json module reads NaN and Infinity, which Java writes as such). */
    private static String number(double d) {
        return Double.toString(d);
    }

    private static void object(StringBuilder out, Map<String, String> map) {
        out.append('{');
        boolean first = true;
        for (Map.Entry<String, String> e : map.entrySet()) {
            if (!first) {
                out.append(',');
            }
            first = false;
            BatchCounts.string(out, e.getKey());
            out.append(':');
            BatchCounts.string(out, e.getValue());
        }
        out.append('}');
    }
}
