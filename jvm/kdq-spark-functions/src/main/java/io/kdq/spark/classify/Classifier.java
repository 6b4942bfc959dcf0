package io.kdq.spark.classify;

import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF2;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * Spark UDF classifying one Kafka record value against the topic's JSON Schema rule.
 *
 * <p>{@code call(topic, value)} returns {@link #RETURN_DDL}: {@code problem} (null when the value
 * passes, otherwise the first reason that applies: {@code too_large}, {@code null_value},
 * {@code not_utf8}, {@code not_json}, {@code too_complex}, {@code schema:<keywordLocation>},
 * {@code pattern_budget:<keywordLocation>}, {@code internal_error:<ExceptionClass>}),
 * {@code event_ms}/{@code event_time_bad} (the rule's event-time field) and
 * {@code rules_version} (the matched rule's version, "none" without a rule). A verdict is a function of
 * the record and the rules only: it never depends on the calling thread's stack (see {@link DeepStack})
 * and only a RuntimeException on the record's data becomes {@code internal_error}; an Error
 * (OutOfMemoryError, StackOverflowError...) is the JVM's condition, not the record's, and is thrown.
 *
 * <p>The instance holds the configuration JSON only; the compiled rules live in a JVM-wide cache
 * keyed by the SHA-256 of that JSON, so each executor compiles a rule set once however many tasks
 * deserialize the UDF. {@link #check(String)} compiles everything eagerly and reports broken rules
 * (call it when a stream or job starts).
 */
public class Classifier implements UDF2<String, byte[], Row>, Serializable {
    private static final long serialVersionUID = 1L;

    /** The Spark SQL type of {@link #call}'s result. */
    public static final String RETURN_DDL =
            "problem STRING, event_ms BIGINT, event_time_bad BOOLEAN, rules_version STRING";

    private static final ConcurrentHashMap<String, CompiledConfig> CACHE = new ConcurrentHashMap<>();

    private final String configJson;
    private transient volatile CompiledConfig compiled;

    public Classifier(String configJson) {
        this.configJson = configJson;
    }

    /** {@link #RETURN_DDL} as a StructType (built directly, without Spark's DDL parser). */
    public static StructType returnType() {
        return DataTypes.createStructType(new StructField[] {
            DataTypes.createStructField("problem", DataTypes.StringType, true),
            DataTypes.createStructField("event_ms", DataTypes.LongType, true),
            DataTypes.createStructField("event_time_bad", DataTypes.BooleanType, true),
            DataTypes.createStructField("rules_version", DataTypes.StringType, true),
        });
    }

    /**
     * Compiles every rule of {@code configJson} now and asks the Schema Registry of registry-backed rules whether
     * it answers (a job's start).
     *
     * @return a short summary, e.g. "3 rules compiled (2 with a schema)"
     * @throws IllegalArgumentException naming the rule (source and label) and the problem
     */
    public static String check(String configJson) {
        return check(configJson, true);
    }

    /**
     * {@link #check(String)}; without {@code askRegistry} the registry is not asked (a micro-batch registering the
     * function: a registry outage must not stop the counting of schemas already seen, and an unseen one fails
     * its task, not the registration).
     */
    public static String check(String configJson, boolean askRegistry) {
        CompiledConfig config = DeepStack.call(() -> CompiledConfig.compile(configJson));
        if (askRegistry) {
            config.checkRegistry();
        }
        CACHE.putIfAbsent(sha256(configJson), config);
        return config.summary();
    }

    @Override
    public Row call(String topic, byte[] value) {
        return compiled().classify(topic, value);
    }

    CompiledConfig compiled() {
        CompiledConfig c = compiled;
        if (c == null) {
            c = CACHE.computeIfAbsent(sha256(configJson), k -> {
                try {
                    // On a deep stack, like check() in the driver: a deeply nested schema compiles
                    // (or fails) the same on every executor.
                    return DeepStack.call(() -> CompiledConfig.compile(configJson));
                } catch (DeepStack.Interrupted e) {
                    throw e;
                } catch (RuntimeException e) {
                    // check() refuses such a configuration at start; should it reach an executor
                    // anyway, every record says why instead of recompiling per record. An Error
                    // (out of memory while compiling) propagates and is not remembered.
                    return CompiledConfig.failed(e);
                }
            });
            compiled = c;
        }
        return c;
    }

    static Row row(String problem, Long eventMs, boolean eventTimeBad, String version) {
        return RowFactory.create(problem, eventMs, eventTimeBad, version);
    }

    public static String sha256(String text) {
        try {
            MessageDigest md = MessageDigest.getInstance("SHA-256");
            byte[] digest = md.digest(String.valueOf(text).getBytes(StandardCharsets.UTF_8));
            return HexFormat.of().formatHex(digest);
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }
}
