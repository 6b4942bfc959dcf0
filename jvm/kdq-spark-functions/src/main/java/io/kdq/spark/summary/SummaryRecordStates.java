package io.kdq.spark.summary;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.regex.Pattern;

import org.apache.spark.sql.Encoder;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.expressions.Aggregator;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import io.kdq.spark.classify.Classifier;
import io.kdq.spark.classify.Json;

import tools.jackson.core.io.JsonStringEncoder;
import tools.jackson.databind.JsonNode;

/**
 * A micro-batch's summary states straight from its classified records: the same JSON array as
 * {@link SummaryStates} returns for the entries {@code kdq.spark.summaries.transforms.with_summary_entries} builds,
 * without building them.
 *
 * <p>Why: with the entries built as Spark columns (the fields UDF's array of structs, a struct with a map per summary,
 * the group key as {@code to_json}) and handed to {@link SummaryStates} as Rows, the summaries cost a catch-up
 * ~13 core-µs per record against ~18 for everything else of the archive pass (benchmarks/PERF_NOTES.md,
 * twenty-first pass). Here each counted record is read once ({@link SummaryValues}'s one streaming pass) and added
 * to its states directly.
 *
 * <p>Input columns, in order ({@link #input()}): topic, the record's count window start (epoch ms), valid, value, and
 * the topic's watermark before the batch (epoch ms, null when none: nothing is late). The same definitions as the
 * SQL entries, which a test compares on the same records: a record counts for every summary whose topic is its own
 * (equality, or a whole-name match of the pattern) when it is valid; the summary window is the count window
 * floored to the summary's size; late when the window's end is at or before the watermark less the allowed
 * lateness; the group key is Spark's {@code to_json} of the group values by path (nulls kept).
 */
public final class SummaryRecordStates extends Aggregator<Row, SummaryStates.States, String> {
    private static final long serialVersionUID = 1L;

    private static final ConcurrentHashMap<String, Compiled> CACHE = new ConcurrentHashMap<>();

    private final String configJson;
    private transient volatile Compiled compiled;

    /**
     * {@code configJson}: {@code {"fields": <SummaryValues' configuration>, "summaries": [{"name":…, "topic":…,
     * "is_pattern":…, "window_ms":…, "allowed_lateness_ms":…, "group_by": ["path", …]}, …]}}, the summaries in the
     * fields configuration's order.
     */
    public SummaryRecordStates(String configJson) {
        this.configJson = configJson;
    }

    /** The input columns, in order. */
    public static StructType input() {
        return DataTypes.createStructType(new StructField[] {
            DataTypes.createStructField("topic", DataTypes.StringType, true),
            DataTypes.createStructField("window_start_ms", DataTypes.LongType, true),
            DataTypes.createStructField("valid", DataTypes.BooleanType, true),
            DataTypes.createStructField("value", DataTypes.BinaryType, true),
            DataTypes.createStructField("watermark_ms", DataTypes.LongType, true),
        });
    }

    /** The aggregate of {@code configJson} as a Spark function over the {@link #input()} columns. */
    public static UserDefinedFunction udaf(String configJson) {
        check(configJson);
        return functions.udaf(new SummaryRecordStates(configJson), Encoders.row(input()));
    }

    /** Compiles the configuration now (the driver, at start): an exception names the problem. */
    public static String check(String configJson) {
        return compiledFor(configJson).summaries.length + " summaries";
    }

    private static Compiled compiledFor(String configJson) {
        return CACHE.computeIfAbsent(Classifier.sha256(configJson), k -> Compiled.parse(configJson));
    }

    private Compiled compiled() {
        Compiled c = compiled;
        if (c == null) {
            c = compiledFor(configJson);
            compiled = c;
        }
        return c;
    }

    /** One summary's definition beyond its fields. */
    static final class Definition {
        final String name;
        final String topic;
        final Pattern pattern;
        final long windowMs;
        final long allowedLatenessMs;
        /** The group fields' paths (the groups' keys). */
        final String[] groupPaths;
        /** Each group path as {@code to_json} writes it as a field name: quoted and escaped, with its colon. */
        final String[] groupNames;

        Definition(String name, String topic, Pattern pattern, long windowMs, long allowedLatenessMs, String[] groupPaths) {
            this.name = name;
            this.topic = topic;
            this.pattern = pattern;
            this.windowMs = windowMs;
            this.allowedLatenessMs = allowedLatenessMs;
            this.groupPaths = groupPaths;
            this.groupNames = new String[groupPaths.length];
            for (int g = 0; g < groupPaths.length; g++) {
                StringBuilder quoted = new StringBuilder().append('"');
                JsonStringEncoder.getInstance().quoteAsString(groupPaths[g], quoted);
                groupNames[g] = quoted.append("\":").toString();
            }
        }

        boolean matches(String t) {
            if (t == null) {
                return false;
            }
            return pattern == null ? topic.equals(t) : pattern.matcher(t).find();
        }
    }

    static final class Compiled {
        final SummaryValues.Compiled fields;
        final Definition[] summaries;
        /** The summaries (indexes) on each topic seen so far. */
        private final ConcurrentHashMap<String, int[]> byTopic = new ConcurrentHashMap<>();

        private Compiled(SummaryValues.Compiled fields, Definition[] summaries) {
            this.fields = fields;
            this.summaries = summaries;
        }

        static Compiled parse(String configJson) {
            JsonNode doc = Json.configMapper().readTree(configJson);
            JsonNode fields = doc.get("fields");
            JsonNode list = doc.get("summaries");
            if (fields == null || list == null || !list.isArray()) {
                throw new IllegalArgumentException("summary states configuration: \"fields\" and \"summaries\" are required");
            }
            SummaryValues.Compiled compiledFields = SummaryValues.compiledFor(fields.toString());
            if (compiledFields.summaries.length != list.size()) {
                throw new IllegalArgumentException("summary states configuration: " + list.size()
                        + " summaries, but fields for " + compiledFields.summaries.length);
            }
            Definition[] out = new Definition[list.size()];
            for (int i = 0; i < out.length; i++) {
                JsonNode s = list.get(i);
                String topic = s.path("topic").asString();
                boolean isPattern = s.path("is_pattern").asBoolean(false);
                long windowMs = s.path("window_ms").asLong(0);
                if (windowMs <= 0) {
                    throw new IllegalArgumentException("summary states configuration: summary " + i + " has no window_ms");
                }
                JsonNode groupBy = s.path("group_by");
                String[] paths = new String[groupBy.size()];
                if (paths.length != compiledFields.summaries[i].groupSlots.length) {
                    throw new IllegalArgumentException("summary states configuration: summary " + i + "'s group_by differs from its fields'");
                }
                for (int g = 0; g < paths.length; g++) {
                    paths[g] = groupBy.get(g).asString();
                }
                out[i] = new Definition(
                        s.path("name").asString(),
                        topic,
                        isPattern ? Pattern.compile("^(?:" + topic + ")\\z") : null, // Spark's RLIKE: find()
                        windowMs,
                        s.path("allowed_lateness_ms").asLong(0),
                        paths);
            }
            return new Compiled(compiledFields, out);
        }

        int[] on(String topic) {
            int[] found = byTopic.get(topic);
            if (found == null) {
                List<Integer> list = new ArrayList<>();
                for (int i = 0; i < summaries.length; i++) {
                    if (summaries[i].matches(topic)) {
                        list.add(i);
                    }
                }
                found = list.stream().mapToInt(Integer::intValue).toArray();
                if (byTopic.size() < 100_000) { // topics are few; bound it anyway
                    byTopic.put(topic, found);
                }
            }
            return found;
        }
    }

    @Override
    public SummaryStates.States zero() {
        return new SummaryStates.States();
    }

    @Override
    public SummaryStates.States reduce(SummaryStates.States states, Row row) {
        if (row.isNullAt(0) || row.isNullAt(2) || !row.getBoolean(2)) {
            return states; // only valid records count (a null topic matches no summary, as in SQL)
        }
        Compiled c = compiled();
        String topic = row.getString(0);
        int[] on = c.on(topic);
        if (on.length == 0) {
            return states;
        }
        Object[] found = c.fields.read(row.isNullAt(3) ? null : (byte[]) row.get(3));
        boolean windowNull = row.isNullAt(1);
        long countWindowMs = windowNull ? 0L : row.getLong(1);
        boolean hasMark = !row.isNullAt(4);
        long mark = hasMark ? row.getLong(4) : 0L;
        SummaryStates.Key probe = states.probe;
        if (probe == null) {
            probe = states.probe = new SummaryStates.Key();
        }
        for (int index : on) {
            Definition d = c.summaries[index];
            SummaryValues.Summary s = c.fields.summaries[index];
            long windowMs = windowNull ? 0L : Math.floorDiv(countWindowMs, d.windowMs) * d.windowMs;
            probe.summary = d.name;
            probe.topic = topic;
            probe.windowNull = windowNull;
            probe.windowStartMs = windowMs;
            probe.groupKey = groupKey(d, s, found);
            // SQL: coalesce(window + size <= mark - lateness, false); null window or mark → false.
            probe.late = !windowNull && hasMark && windowMs + d.windowMs <= mark - d.allowedLatenessMs;
            SummaryStates.State state = states.map.get(probe);
            if (state == null) {
                state = new SummaryStates.State();
                state.groups = groups(d, s, found);
                states.map.put(probe.copy(), state);
            }
            SummaryValues.Measure m = SummaryValues.measure(s, found);
            state.rows++;
            if (m.reject() == null) {
                state.add(m.x());
                state.count++;
                state.addBucket(m.bucket());
            } else {
                state.rejected.merge(m.reject(), 1L, Long::sum);
            }
        }
        return states;
    }

    /** Spark's {@code to_json(struct(g1 AS path1, …), ignoreNullFields false)}; {@code {}} without groups. */
    private static String groupKey(Definition d, SummaryValues.Summary s, Object[] found) {
        if (d.groupNames.length == 0) {
            return "{}";
        }
        StringBuilder out = new StringBuilder(32).append('{');
        for (int g = 0; g < d.groupNames.length; g++) {
            if (g > 0) {
                out.append(',');
            }
            out.append(d.groupNames[g]);
            String text = SummaryValues.text(found[s.groupSlots[g]]);
            if (text == null) {
                out.append("null");
            } else {
                out.append('"');
                JsonStringEncoder.getInstance().quoteAsString(text, out);
                out.append('"');
            }
        }
        return out.append('}').toString();
    }

    /** The state's groups: path → text (null when missing), as {@code create_map} builds them. */
    private static HashMap<String, String> groups(Definition d, SummaryValues.Summary s, Object[] found) {
        HashMap<String, String> map = new HashMap<>();
        for (int g = 0; g < d.groupPaths.length; g++) {
            map.put(d.groupPaths[g], SummaryValues.text(found[s.groupSlots[g]]));
        }
        return map;
    }

    @Override
    public SummaryStates.States merge(SummaryStates.States a, SummaryStates.States b) {
        return SummaryStates.mergeStates(a, b);
    }

    @Override
    public String finish(SummaryStates.States states) {
        return SummaryStates.json(states);
    }

    @Override
    public Encoder<SummaryStates.States> bufferEncoder() {
        return Encoders.javaSerialization(SummaryStates.States.class);
    }

    @Override
    public Encoder<String> outputEncoder() {
        return Encoders.STRING();
    }
}
