package io.kdq.spark.summary;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.regex.Pattern;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.api.java.UDF2;

import io.kdq.spark.classify.Json;
import io.kdq.spark.registry.RegistryConnection;
import io.kdq.spark.registry.RegistryDecoder;
import io.kdq.spark.registry.Verdict;

import tools.jackson.databind.JsonNode;

/**
 * {@link SummaryValues} for rule sets with registry-backed topics: {@code call(topic, value)} reads a topic whose
 * first matching rule has {@code registry = true} from its decoded record ({@link SummaryValues#extractDecoded}),
 * every other topic from its JSON as {@link SummaryValues} does. Only valid records reach a summary, so the
 * classifier has already checked the record's schema against the topic's subject; here any registered id is
 * accepted. A registry that cannot say what an id is fails the task (a retried batch), as in the classifier.
 *
 * <p>Configuration: {@link SummaryValues}'s document plus {@code "rules": [{"match", "is_pattern", "registry"},
 * ...]}, the rule set's topic matchers in precedence order (the first that matches a topic is its rule).
 */
public class RegistrySummaryValues implements UDF2<String, byte[], List<Row>>, Serializable {
    private static final long serialVersionUID = 1L;

    private final String configJson;
    private transient volatile SummaryValues.Compiled compiled;
    private transient volatile Matchers matchers;
    private transient volatile RegistryDecoder decoder;

    public RegistrySummaryValues(String configJson) {
        this.configJson = configJson;
    }

    /** This function with {@code decoder} instead of the Spark configuration's registry (tests). */
    RegistrySummaryValues withDecoder(RegistryDecoder d) {
        this.decoder = d;
        return this;
    }

    /** Compiles the configuration now (the driver, at start): an exception names the problem. */
    public static String check(String configJson) {
        return SummaryValues.check(configJson) + ", " + Matchers.parse(configJson).rules.size() + " topic rules";
    }

    @Override
    public List<Row> call(String topic, byte[] value) {
        SummaryValues.Compiled c = compiled;
        if (c == null) {
            c = SummaryValues.compiledFor(configJson);
            compiled = c;
        }
        Matchers m = matchers;
        if (m == null) {
            m = Matchers.parse(configJson);
            matchers = m;
        }
        if (value == null || !m.registry(topic)) {
            return c.extract(value);
        }
        RegistryDecoder d = decoder;
        if (d == null) {
            d = RegistryConnection.fromSparkEnv();
            decoder = d;
        }
        Verdict verdict = d.decode(null, value);
        return verdict.problem == null ? SummaryValues.extractDecoded(c, verdict.record) : c.extract(null);
    }

    /** The rule set's topic matchers, in precedence order, and per topic whether its rule is registry-backed. */
    static final class Matchers {
        final List<Object[]> rules = new ArrayList<>(); // {String exact | Pattern, Boolean registry}
        private final ConcurrentHashMap<String, Boolean> byTopic = new ConcurrentHashMap<>();

        static Matchers parse(String configJson) {
            Matchers m = new Matchers();
            JsonNode list = Json.configMapper().readTree(configJson).get("rules");
            if (list == null || !list.isArray()) {
                throw new IllegalArgumentException("summary configuration: \"rules\" must be a list of topic rules");
            }
            for (JsonNode r : list) {
                String match = r.path("match").asString();
                Object matcher = r.path("is_pattern").asBoolean(false) ? Pattern.compile(match) : match;
                m.rules.add(new Object[] {matcher, r.path("registry").asBoolean(false)});
            }
            return m;
        }

        boolean registry(String topic) {
            if (topic == null) {
                return false;
            }
            Boolean known = byTopic.get(topic);
            if (known == null) {
                known = Boolean.FALSE;
                for (Object[] rule : rules) {
                    boolean matches = rule[0] instanceof Pattern p ? p.matcher(topic).matches() : rule[0].equals(topic);
                    if (matches) {
                        known = (Boolean) rule[1];
                        break;
                    }
                }
                if (byTopic.size() < 1_000_000) {
                    byTopic.put(topic, known);
                }
            }
            return known;
        }
    }
}
