package io.kdq.bench;

import java.lang.management.ManagementFactory;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.atomic.LongAdder;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Named;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.processor.api.RecordMetadata;

import tools.jackson.databind.json.JsonMapper;

/**
 * The Kafka Streams baseline of the benchmark (benchmarks/kstreams.py runs it): the application a
 * data team would write instead of kdq's speed layer.
 *
 * <pre>
 * input topics ─ classify (valid/invalid; key := topic|status) ─ repartition (by-topic-status)
 *   ─ 1 s tumbling event-time windows, grace = kdq's allowed lateness ─ count (RocksDB window store)
 *   ─ output topic: key topic|window_start_ms|status, value the count (long, big-endian)
 * </pre>
 *
 * processing.guarantee=exactly_once_v2; the output carries every update of a window's count (the
 * record cache's defaults), so a reader keeps the last committed value per key.
 *
 * <p>Throughput: from the moment the application is RUNNING (its threads assigned; or the first
 * record it classified, if that came first) until its committed consumer offsets have reached the
 * end of every input partition AND of every partition of its repartition topic (the latter once
 * the input is done, so that topic no longer grows: committed &ge; end - 1, the last offset being
 * the commit marker of the upstream's last transaction, and no open transaction left). Offsets are
 * committed in the same transaction as the counts they produced, so at that moment every record
 * is counted (or dropped as too late) and its counts are committed to the output topic.
 *
 * <p>One line on stdout: {@code KSTREAMS_RESULT {json}}; exit status 0, or 1 with
 * {@code "error"} in that JSON.
 */
public final class KStreamsBaseline {
    static final String RESULT_PREFIX = "KSTREAMS_RESULT ";
    static final String REPARTITION = "by-topic-status";
    private static final byte[] EMPTY = new byte[0];

    private KStreamsBaseline() {
    }

    /** What the application saw, for the harness: when the first record came, verdicts by topic|status. */
    static final class Seen {
        final AtomicLong firstRecordNanos = new AtomicLong();
        /** Records classified by topic|status (a record processed again after a task failure counts twice). */
        final Map<String, LongAdder> classified = new ConcurrentHashMap<>();
    }

    /** Classifies each record and re-keys it by topic|status; the value is not needed any more. */
    static final class Classify implements Processor<byte[], byte[], String, byte[]> {
        private final Validity validity;
        private final Seen seen;
        private ProcessorContext<String, byte[]> context;

        Classify(Validity validity, Seen seen) {
            this.validity = validity;
            this.seen = seen;
        }

        @Override
        public void init(ProcessorContext<String, byte[]> context) {
            this.context = context;
        }

        @Override
        public void process(Record<byte[], byte[]> record) {
            if (seen.firstRecordNanos.get() == 0) {
                seen.firstRecordNanos.compareAndSet(0, System.nanoTime());
            }
            String topic = context.recordMetadata().map(RecordMetadata::topic).orElse("?");
            String key = topic + (validity.isValid(record.value()) ? "|valid" : "|invalid");
            seen.classified.computeIfAbsent(key, k -> new LongAdder()).increment();
            context.forward(record.withKey(key).withValue(EMPTY));
        }
    }

    static Topology topology(List<String> topics, String output, Validity validity, long windowMs, long graceMs,
            Seen seen) {
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(topics, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .process(() -> new Classify(validity, seen), Named.as("classify"))
                .groupByKey(Grouped.with(REPARTITION, Serdes.String(), Serdes.ByteArray()))
                .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(windowMs), Duration.ofMillis(graceMs)))
                .count(Materialized.with(Serdes.String(), Serdes.Long()))
                .toStream()
                .map((Windowed<String> key, Long count) -> KeyValue.pair(outputKey(key), count))
                .to(output, Produced.with(Serdes.String(), Serdes.Long()));
        return builder.build();
    }

    /** topic|status in window w → topic|window_start_ms|status. */
    static String outputKey(Windowed<String> key) {
        String k = key.key();
        int bar = k.lastIndexOf('|');
        return k.substring(0, bar) + "|" + key.window().start() + "|" + k.substring(bar + 1);
    }

    /** --name value pairs; --set may repeat (extra Streams settings, KEY=VALUE). */
    static final class Args {
        String bootstrap;
        List<String> topics;
        String output;
        int threads = 1;
        String appId;
        String stateDir;
        Path schema;
        long windowMs = 1000;
        long graceMs = 60_000;
        long timeoutMs = 1_800_000;
        long pollMs = 100;
        final Map<String, String> extra = new LinkedHashMap<>();

        static Args parse(String[] argv) {
            Args a = new Args();
            for (int i = 0; i < argv.length; i++) {
                String name = argv[i];
                if (i + 1 >= argv.length) {
                    throw new IllegalArgumentException("missing value after " + name);
                }
                String v = argv[++i];
                switch (name) {
                    case "--bootstrap" -> a.bootstrap = v;
                    case "--topics" -> a.topics = Arrays.asList(v.split(","));
                    case "--output" -> a.output = v;
                    case "--threads" -> a.threads = Integer.parseInt(v);
                    case "--app-id" -> a.appId = v;
                    case "--state-dir" -> a.stateDir = v;
                    case "--schema" -> a.schema = v.isEmpty() ? null : Path.of(v);
                    case "--window-ms" -> a.windowMs = Long.parseLong(v);
                    case "--grace-ms" -> a.graceMs = Long.parseLong(v);
                    case "--timeout-s" -> a.timeoutMs = (long) (Double.parseDouble(v) * 1000);
                    case "--poll-ms" -> a.pollMs = Long.parseLong(v);
                    case "--set" -> {
                        int eq = v.indexOf('=');
                        if (eq <= 0) {
                            throw new IllegalArgumentException("--set expects KEY=VALUE, got " + v);
                        }
                        a.extra.put(v.substring(0, eq), v.substring(eq + 1));
                    }
                    default -> throw new IllegalArgumentException("unknown option " + name);
                }
            }
            if (a.bootstrap == null || a.topics == null || a.output == null || a.appId == null || a.stateDir == null) {
                throw new IllegalArgumentException(
                        "required: --bootstrap --topics t1,t2 --output topic --app-id id --state-dir dir "
                                + "[--threads n] [--schema file.json] [--window-ms 1000] [--grace-ms 60000] "
                                + "[--timeout-s 1800] [--poll-ms 100] [--set KEY=VALUE]...");
            }
            return a;
        }
    }

    public static void main(String[] argv) {
        long processStart = System.nanoTime();
        Map<String, Object> result = new LinkedHashMap<>();
        int status = 0;
        try {
            run(Args.parse(argv), processStart, result);
        } catch (Throwable t) {
            result.put("error", t.toString());
            t.printStackTrace();
            status = 1;
        }
        String json;
        try {
            json = JsonMapper.builder().build().writeValueAsString(result);
        } catch (Throwable e) {
            String text = String.valueOf(result.getOrDefault("error", "could not write the result: " + e));
            json = "{\"error\": \"" + text.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", " ") + "\"}";
            status = 1;
        }
        System.out.println(RESULT_PREFIX + json);
        System.out.flush();
        System.exit(status);
    }

    private static long cpuNanos() {
        var os = ManagementFactory.getOperatingSystemMXBean();
        if (os instanceof com.sun.management.OperatingSystemMXBean sun) {
            return sun.getProcessCpuTime();
        }
        return 0;
    }

    static void run(Args a, long processStart, Map<String, Object> result) throws Exception {
        Validity validity = new Validity(a.schema);
        result.put("app_id", a.appId);
        result.put("threads", a.threads);
        result.put("window_ms", a.windowMs);
        result.put("grace_ms", a.graceMs);
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, a.appId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, a.bootstrap);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, a.threads);
        props.put(StreamsConfig.STATE_DIR_CONFIG, a.stateDir);
        props.putAll(a.extra);
        result.put("settings", new LinkedHashMap<>(Map.of(
                "processing.guarantee", StreamsConfig.EXACTLY_ONCE_V2, "num.stream.threads", a.threads,
                "extra", a.extra)));

        Properties adminProps = new Properties();
        adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, a.bootstrap);
        try (Admin admin = Admin.create(adminProps)) {
            // The pre-loaded backlog: every partition of the input topics, from its start to its end.
            List<TopicPartition> inputs = new ArrayList<>();
            for (TopicDescription d : admin.describeTopics(a.topics).allTopicNames().get().values()) {
                for (TopicPartitionInfo p : d.partitions()) {
                    inputs.add(new TopicPartition(d.name(), p.partition()));
                }
            }
            Map<TopicPartition, Long> starts = offsets(admin, inputs, OffsetSpec.earliest(), IsolationLevel.READ_UNCOMMITTED);
            Map<TopicPartition, Long> ends = offsets(admin, inputs, OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED);
            long messages = 0;
            for (TopicPartition tp : inputs) {
                messages += ends.get(tp) - starts.get(tp);
            }
            result.put("messages", messages);
            result.put("input_partitions", inputs.size());

            Seen seen = new Seen();
            AtomicLong firstRecord = seen.firstRecordNanos;
            AtomicLong runningAt = new AtomicLong();
            AtomicLong cpuAtRunning = new AtomicLong();
            AtomicInteger rebalances = new AtomicInteger();
            AtomicReference<String> failure = new AtomicReference<>();
            Topology topology = topology(a.topics, a.output, validity, a.windowMs, a.graceMs, seen);
            KafkaStreams streams = new KafkaStreams(topology, props);
            streams.setStateListener((now, before) -> {
                if (now == KafkaStreams.State.RUNNING && runningAt.get() == 0) {
                    cpuAtRunning.set(cpuNanos());
                    runningAt.set(System.nanoTime());
                } else if (before == KafkaStreams.State.RUNNING && now == KafkaStreams.State.REBALANCING) {
                    rebalances.incrementAndGet();
                } else if (now == KafkaStreams.State.ERROR) {
                    failure.compareAndSet(null, "the application went to state ERROR");
                }
            });
            streams.setUncaughtExceptionHandler(e -> {
                failure.compareAndSet(null, "stream thread failed: " + e);
                return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
            });
            long deadline = System.nanoTime() + a.timeoutMs * 1_000_000L;
            streams.start();
            try {
                long[] done = waitUntilCommitted(a, admin, inputs, ends, runningAt, failure, deadline);
                long t0 = runningAt.get();
                long first = firstRecord.get();
                if (first != 0 && first < t0) {
                    t0 = first;
                }
                double seconds = (done[1] - t0) / 1e9;
                result.put("seconds", seconds);
                result.put("msgs_per_s", messages / seconds);
                result.put("input_committed_seconds", (done[0] - t0) / 1e9);
                result.put("startup_seconds", (t0 - processStart) / 1e9);
                result.put("first_record_after_running_seconds", first == 0 ? null : (first - runningAt.get()) / 1e9);
                result.put("cpu_cores", (cpuNanos() - cpuAtRunning.get()) / 1e9 / ((done[1] - runningAt.get()) / 1e9));
                result.put("rebalances_after_running", rebalances.get());
                result.put("dropped_records", metricSum(streams, "stream-task-metrics", "dropped-records-total"));
                Map<String, Long> classified = new TreeMap<>();
                seen.classified.forEach((k, v) -> classified.put(k, v.sum()));
                result.put("classified", classified);
                result.put("heap_used_mb", (Runtime.getRuntime().totalMemory() - Runtime.getRuntime().freeMemory()) >> 20);
            } finally {
                streams.close(Duration.ofSeconds(60));
            }
        }
    }

    /**
     * Polls the group's committed offsets; returns {nanoTime when the input was committed to its end,
     * nanoTime when the repartition topic was too}.
     */
    private static long[] waitUntilCommitted(Args a, Admin admin, List<TopicPartition> inputs, Map<TopicPartition, Long> ends,
            AtomicLong runningAt, AtomicReference<String> failure, long deadline) throws Exception {
        String repartitionTopic = a.appId + "-" + REPARTITION + "-repartition";
        List<TopicPartition> repartition = null;
        long inputDone = 0;
        while (true) {
            if (failure.get() != null) {
                throw new IllegalStateException(failure.get());
            }
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("timed out: the committed offsets did not reach the end of the input");
            }
            Thread.sleep(a.pollMs);
            if (runningAt.get() == 0) {
                continue;
            }
            Map<TopicPartition, OffsetAndMetadata> committed =
                    admin.listConsumerGroupOffsets(a.appId).partitionsToOffsetAndMetadata().get();
            if (inputDone == 0) {
                boolean all = true;
                for (TopicPartition tp : inputs) {
                    OffsetAndMetadata c = committed.get(tp);
                    if (ends.get(tp) > 0 && (c == null || c.offset() < ends.get(tp))) {
                        all = false;
                        break;
                    }
                }
                if (!all) {
                    continue;
                }
                inputDone = System.nanoTime();
            }
            if (repartition == null) {
                repartition = new ArrayList<>();
                TopicDescription d = admin.describeTopics(List.of(repartitionTopic)).allTopicNames().get().get(repartitionTopic);
                for (TopicPartitionInfo p : d.partitions()) {
                    repartition.add(new TopicPartition(repartitionTopic, p.partition()));
                }
            }
            Map<TopicPartition, Long> hw = offsets(admin, repartition, OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED);
            Map<TopicPartition, Long> lso = offsets(admin, repartition, OffsetSpec.latest(), IsolationLevel.READ_COMMITTED);
            boolean all = true;
            for (TopicPartition tp : repartition) {
                long end = hw.get(tp);
                OffsetAndMetadata c = committed.get(tp);
                if (end > 0 && (lso.get(tp) != end || c == null || c.offset() < end - 1)) {
                    all = false;
                    break;
                }
            }
            if (all) {
                return new long[] {inputDone, System.nanoTime()};
            }
        }
    }

    private static Map<TopicPartition, Long> offsets(Admin admin, List<TopicPartition> partitions, OffsetSpec spec,
            IsolationLevel isolation) throws Exception {
        Map<TopicPartition, OffsetSpec> request = new HashMap<>();
        for (TopicPartition tp : partitions) {
            request.put(tp, spec);
        }
        Map<TopicPartition, ListOffsetsResultInfo> info =
                admin.listOffsets(request, new ListOffsetsOptions(isolation)).all().get();
        Map<TopicPartition, Long> out = new HashMap<>();
        info.forEach((tp, i) -> out.put(tp, i.offset()));
        return out;
    }

    private static double metricSum(KafkaStreams streams, String group, String name) {
        double sum = 0;
        for (Map.Entry<MetricName, ? extends Metric> e : streams.metrics().entrySet()) {
            if (e.getKey().group().equals(group) && e.getKey().name().equals(name)) {
                Object v = e.getValue().metricValue();
                if (v instanceof Number n) {
                    sum += n.doubleValue();
                }
            }
        }
        return sum;
    }
}
