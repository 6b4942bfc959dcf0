package io.kdq.spark.classify;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.regex.Pattern;
import java.util.regex.PatternSyntaxException;

import org.apache.spark.sql.Row;

import io.kdq.spark.registry.RegistryConnection;
import io.kdq.spark.registry.RegistryDecoder;
import io.kdq.spark.registry.RegistryUnavailableException;
import io.kdq.spark.registry.SubjectStrategy;
import io.kdq.spark.registry.Verdict;

import com.networknt.schema.AbsoluteIri;
import com.networknt.schema.ExecutionConfig;
import com.networknt.schema.Schema;
import com.networknt.schema.SchemaLocation;
import com.networknt.schema.SchemaRegistry;
import com.networknt.schema.SchemaRegistryConfig;
import com.networknt.schema.SpecificationVersion;
import com.networknt.schema.path.PathType;

import tools.jackson.databind.JsonNode;
import tools.jackson.databind.json.JsonMapper;

/**
 * A compiled configuration: limits, the rules in precedence order with their schemas compiled
 * by networknt (references resolved only from the configuration's resources), and the
 * topic → rule dispatch cache. Thread-safe; shared by every task of an executor.
 */
final class CompiledConfig {
    /** Meta-schemas networknt ships on its classpath: the only IRIs loadable besides the resources. */
    private static final String[] META_SCHEMA_PREFIXES = {"https://json-schema.org/", "http://json-schema.org/"};
    /** Topics remembered by the dispatch cache (Kafka clusters have far fewer). */
    private static final int MAX_CACHED_TOPICS = 1_000_000;
    private static final Object NO_RULE = new Object();
    /**
     * Whether valid records may be decided by {@link FastCheck} (true unless the JVM runs with
     * {@code -Dkdq.classifier.fastCheck=false}: the A/B of the benchmark, the comparison of the tests).
     */
    static volatile boolean fastChecks = !"false".equals(System.getProperty("kdq.classifier.fastCheck"));

    final long maxValueBytes;
    final int maxNestingDepth;
    final boolean assertFormat;
    final List<CompiledRule> rules;
    private final Throwable failure;
    private final Json json;
    private final ExecutionConfig executionConfig;
    /** {@link #executionConfig} with the depth limited to what the calling thread's stack surely holds. */
    private final ExecutionConfig inlineExecutionConfig;
    /** Exact match → first rule (precedence index) with that match. */
    private final Map<String, Integer> exact;
    /** Pattern rules in precedence order. */
    private final List<Integer> patternRules;
    private final ConcurrentHashMap<String, Object> dispatch = new ConcurrentHashMap<>();

    private CompiledConfig(long maxValueBytes, int maxNestingDepth, boolean assertFormat, List<CompiledRule> rules,
            Throwable failure) {
        this.maxValueBytes = maxValueBytes;
        this.maxNestingDepth = maxNestingDepth;
        this.assertFormat = assertFormat;
        this.rules = rules;
        this.failure = failure;
        this.json = new Json(maxNestingDepth);
        this.executionConfig = executionConfig(assertFormat, 4 * maxNestingDepth + 100);
        this.inlineExecutionConfig = executionConfig(assertFormat,
                Math.min(Evaluation.INLINE_EVALUATION_DEPTH, 4 * maxNestingDepth + 100));
        this.exact = new HashMap<>();
        this.patternRules = new ArrayList<>();
        for (int i = 0; i < rules.size(); i++) {
            CompiledRule rule = rules.get(i);
            if (rule.topicPattern != null) {
                patternRules.add(i);
            } else {
                exact.putIfAbsent(rule.match, i);
            }
        }
    }

    static ExecutionConfig executionConfig(boolean assertFormat, int maxEvaluationDepth) {
        return ExecutionConfig.builder()
                .formatAssertionsEnabled(assertFormat)
                .failFast(false)
                // Guards against runaway schemas (deeply recursive or exponential applicators).
                .maxEvaluationDepth(maxEvaluationDepth)
                .maxEvaluationSteps(5_000_000L)
                .build();
    }

    /** A configuration that could not be compiled: every record reports internal_error. */
    static CompiledConfig failed(Throwable failure) {
        return new CompiledConfig(Long.MAX_VALUE, 500, true, List.of(), failure);
    }

    String summary() {
        long withSchema = rules.stream().filter(r -> r.schema != null).count();
        long withRegistry = rules.stream().filter(r -> r.registry != null).count();
        return rules.size() + (rules.size() == 1 ? " rule" : " rules") + " compiled (" + withSchema
                + " with a schema, " + (withRegistry > 0 ? withRegistry + " through the Schema Registry, " : "")
                + patternRules.size() + " topic patterns)";
    }

    /**
     * A job's start-up check of the registry-backed rules: the registry answers (an exact topic's subject is
     * asked for its versions, a pattern's with a subject of no topic).
     *
     * @throws IllegalArgumentException naming the rule and what the registry said
     */
    void checkRegistry() {
        for (CompiledRule rule : rules) {
            if (rule.registry == null) {
                continue;
            }
            // A record-name strategy's subjects are the record types', not known before a record comes.
            String subject = rule.topicPattern == null && !rule.registry.subjectStrategy.byRecord()
                    ? rule.registry.subjectStrategy.subject(rule.match, null) : "kdq-start-up-check";
            try {
                rule.registry.decoder().checkReachable(subject);
            } catch (RegistryUnavailableException e) {
                if (e.getCause() instanceof IllegalArgumentException unconfigured) {
                    throw new IllegalArgumentException("rule '" + rule.label + "' " + unconfigured.getMessage(), e);
                }
                throw new IllegalArgumentException("rule '" + rule.label + "' uses the Schema Registry, which does not"
                        + " answer: " + e.getMessage(), e);
            }
        }
    }

    // ------------------------------------------------------------------ compile

    static CompiledConfig compile(String configJson) {
        return compile(configJson, RegistryConnection::fromSparkEnv);
    }

    /**
     * @param registry the decoder of registry-backed rules ({@code "registry"} in a rule), asked only when a rule
     *                 has one: the Spark configuration's registry in a job, a test's registry in a test
     */
    static CompiledConfig compile(String configJson, java.util.function.Supplier<RegistryDecoder> registry) {
        if (configJson == null) {
            throw new IllegalArgumentException("kdq rules configuration is null");
        }
        JsonMapper mapper = Json.configMapper();
        JsonNode cfg;
        try {
            cfg = mapper.readTree(configJson);
        } catch (RuntimeException e) {
            throw new IllegalArgumentException("kdq rules configuration is not valid JSON: " + e.getMessage(), e);
        }
        if (cfg == null || !cfg.isObject()) {
            throw new IllegalArgumentException("kdq rules configuration must be a JSON object");
        }
        long maxValueBytes = cfg.path("max_value_bytes").asLong(1_048_576L);
        int maxNestingDepth = cfg.path("max_nesting_depth").asInt(500);
        boolean assertFormat = cfg.path("assert_format").asBoolean(true);
        if (maxValueBytes < 0 || maxNestingDepth < 1) {
            throw new IllegalArgumentException("max_value_bytes must be >= 0 and max_nesting_depth >= 1");
        }

        // Every document a $ref may reach, by absolute IRI: the resources, then the rules' own schemas.
        Map<String, String> documents = new LinkedHashMap<>();
        JsonNode resources = cfg.path("resources");
        if (resources.isObject()) {
            for (var e : resources.properties()) {
                documents.put(stripEmptyFragment(e.getKey()), mapper.writeValueAsString(e.getValue()));
            }
        }
        JsonNode ruleNodes = cfg.path("rules");
        if (!ruleNodes.isArray()) {
            throw new IllegalArgumentException("kdq rules configuration has no \"rules\" array");
        }
        List<String> baseUris = new ArrayList<>();
        int index = 0;
        for (JsonNode r : ruleNodes) {
            String base = r.path("base_uri").isString() ? r.get("base_uri").asString()
                    : "kdq:/rules/rule-" + index + ".schema.json";
            base = stripEmptyFragment(base);
            baseUris.add(base);
            JsonNode schema = r.get("schema");
            if (schema != null && !schema.isNull()) {
                documents.putIfAbsent(base, mapper.writeValueAsString(schema));
            }
            index++;
        }

        SchemaRegistry schemas = registry(assertFormat, documents);
        Lazy decoders = new Lazy(registry);

        // $dynamicRef is resolved when a record is evaluated; its static target (the one a $ref with
        // the same value would have) must exist: checked now on a copy where $dynamicRef reads $ref.
        SchemaRegistry probe = null;
        if (documents.values().stream().anyMatch(d -> d.contains("\"$dynamicRef\""))) {
            Map<String, String> probeDocuments = new LinkedHashMap<>();
            for (var e : documents.entrySet()) {
                probeDocuments.put(e.getKey(), mapper.writeValueAsString(dynamicRefAsRef(mapper.readTree(e.getValue()))));
            }
            probe = registry(assertFormat, probeDocuments);
        }

        List<CompiledRule> rules = new ArrayList<>();
        index = 0;
        for (JsonNode r : ruleNodes) {
            rules.add(compileRule(r, baseUris.get(index), schemas, probe, documents, decoders));
            index++;
        }
        return new CompiledConfig(maxValueBytes, maxNestingDepth, assertFormat, List.copyOf(rules), null);
    }

    /**
     * A registry whose references resolve only to {@code documents} (and networknt's copies of the
     * official meta-schemas): nothing is ever fetched. Default dialect: draft 2020-12.
     */
    static SchemaRegistry registry(boolean assertFormat, Map<String, String> documents) {
        SchemaRegistryConfig registryConfig = SchemaRegistryConfig.builder()
                .formatAssertionsEnabled(assertFormat)
                .regularExpressionFactory(BudgetRegexFactory.INSTANCE)
                .pathType(PathType.JSON_POINTER)
                .failFast(false)
                .cacheRefs(true)
                .build();
        return SchemaRegistry.withDefaultDialect(SpecificationVersion.DRAFT_2020_12,
                builder -> builder
                        .schemaRegistryConfig(registryConfig)
                        .schemaLoader(loader -> loader
                                .resourceLoaders(loaders -> loaders.resources(documents))
                                .block(iri -> !allowed(iri, documents))));
    }

    /** A copy of {@code node} where every "$dynamicRef" member with a string value is named "$ref". */
    private static JsonNode dynamicRefAsRef(JsonNode node) {
        if (node.isObject()) {
            tools.jackson.databind.node.ObjectNode copy = Json.configMapper().createObjectNode();
            for (var e : node.properties()) {
                String key = e.getKey().equals("$dynamicRef") && e.getValue().isString() ? "$ref" : e.getKey();
                copy.set(key, dynamicRefAsRef(e.getValue()));
            }
            return copy;
        }
        if (node.isArray()) {
            tools.jackson.databind.node.ArrayNode copy = Json.configMapper().createArrayNode();
            for (JsonNode child : node) {
                copy.add(dynamicRefAsRef(child));
            }
            return copy;
        }
        return node;
    }

    private static String stripEmptyFragment(String iri) {
        return iri.endsWith("#") ? iri.substring(0, iri.length() - 1) : iri;
    }

    private static boolean allowed(AbsoluteIri iri, Map<String, String> documents) {
        String s = iri.toString();
        if (documents.containsKey(s) || documents.containsKey(stripEmptyFragment(s))) {
            return true;
        }
        for (String prefix : META_SCHEMA_PREFIXES) {
            if (s.startsWith(prefix)) {
                return true; // networknt maps these to the copies on its classpath, never the network
            }
        }
        return false;
    }

    private static CompiledRule compileRule(JsonNode r, String baseUri, SchemaRegistry registry, SchemaRegistry probe,
            Map<String, String> documents, Lazy decoders) {
        String label = r.path("label").asString(r.path("match").asString("?"));
        String source = r.path("source").asString("(inline)");
        String where = "rule '" + label + "' (" + source + ")";
        try {
            String match = r.path("match").asString(null);
            if (match == null) {
                throw new IllegalArgumentException("has no \"match\"");
            }
            boolean isPattern = r.path("is_pattern").asBoolean(false);
            Pattern topicPattern = null;
            if (isPattern) {
                try {
                    topicPattern = Pattern.compile(match);
                } catch (PatternSyntaxException e) {
                    throw new IllegalArgumentException("topic pattern '" + match + "' is not a valid Java regex: "
                            + firstLine(e.getMessage()));
                }
            }
            String version = r.path("version").asString("none");
            String[] field = null;
            JsonNode f = r.get("event_time_field");
            if (f != null && !f.isNull()) {
                if (!f.isArray() || f.isEmpty()) {
                    throw new IllegalArgumentException("event_time_field must be a non-empty list of member names");
                }
                field = new String[f.size()];
                for (int i = 0; i < f.size(); i++) {
                    if (!f.get(i).isString()) {
                        throw new IllegalArgumentException("event_time_field must list member names (strings)");
                    }
                    field[i] = f.get(i).asString();
                }
            }
            EventTime.Format format = EventTime.Format.of(r.path("event_time_format").asString("auto"));
            Schema schema = null;
            FastCheck fast = FastCheck.ANY_JSON;
            JsonNode schemaNode = r.get("schema");
            if (schemaNode != null && !schemaNode.isNull()) {
                schema = compileSchema(schemaNode, baseUri, registry, documents);
                fast = FastCheck.compile(schemaNode, baseUri, registry);
                if (probe != null) {
                    try {
                        compileSchema(dynamicRefAsRef(schemaNode), baseUri, probe, documents);
                    } catch (RuntimeException e) {
                        throw new IllegalArgumentException("a $dynamicRef does not resolve: " + describe(e), e);
                    }
                }
            }
            RegistryRule registryRule = null;
            JsonNode reg = r.get("registry");
            if (reg != null && !reg.isNull()) {
                if (schema != null) {
                    throw new IllegalArgumentException("has both a JSON Schema and registry = true: a registry-backed"
                            + " topic is judged by the schema its messages name");
                }
                SubjectStrategy strategy = SubjectStrategy.of(
                        reg.path("subject_strategy").asString(SubjectStrategy.TOPIC_NAME.key));
                registryRule = new RegistryRule(strategy, decoders);
            }
            return new CompiledRule(label, match, topicPattern, version, field, format, schema, fast, registryRule);
        } catch (RuntimeException | StackOverflowError e) {
            throw new IllegalArgumentException(where + ": " + describe(e), e);
        }
    }

    static Schema compileSchema(JsonNode schemaNode, String baseUri, SchemaRegistry registry,
            Map<String, String> documents) {
        if (!schemaNode.isObject() && !schemaNode.isBoolean()) {
            throw new IllegalArgumentException("schema must be a JSON object or a boolean");
        }
        JsonNode dialect = schemaNode.path("$schema");
        if (dialect.isString()) {
            String id = dialect.asString();
            if (SpecificationVersion.fromDialectId(id).isEmpty()
                    && SpecificationVersion.fromDialectId(stripEmptyFragment(id)).isEmpty()
                    && SpecificationVersion.fromDialectId(stripEmptyFragment(id) + "#").isEmpty()
                    && !documents.containsKey(stripEmptyFragment(id))) {
                throw new IllegalArgumentException("unknown $schema dialect '" + id
                        + "' (known: drafts 4, 6, 7, 2019-09, 2020-12, or a meta-schema among the resources)");
            }
        }
        Schema schema = registry.getSchema(SchemaLocation.of(baseUri), schemaNode);
        // Resolve every reference and compile every regex now, not on the first record.
        schema.initializeValidators();
        return schema;
    }

    static String describe(Throwable e) {
        if (e instanceof PatternSyntaxException) {
            PatternSyntaxException p = (PatternSyntaxException) e;
            return "regex '" + p.getPattern() + "' does not compile in Java: " + firstLine(p.getDescription());
        }
        if (e instanceof StackOverflowError) {
            return "schema too deeply nested or self-referencing (StackOverflowError)";
        }
        String message = e.getMessage();
        java.util.regex.Matcher blocked = message == null ? null
                : Pattern.compile("Schema from '(.*)' is not allowed to be loaded\\.?").matcher(message);
        if (blocked != null && blocked.find()) {
            return "reference to '" + blocked.group(1) + "' cannot be resolved: it is neither in the rule nor among"
                    + " the resources (the rules folder's files and mapped URIs); schemas are never fetched";
        }
        if (e instanceof IllegalArgumentException && message != null) {
            return message;
        }
        Throwable cause = e.getCause();
        if (cause != null && cause != e && (message == null || message.equals(cause.toString()))) {
            return describe(cause);
        }
        String name = e.getClass().getSimpleName();
        return message == null ? name : name + ": " + firstLine(message);
    }

    private static String firstLine(String s) {
        if (s == null) {
            return "";
        }
        int nl = s.indexOf('\n');
        return nl < 0 ? s : s.substring(0, nl);
    }

    // ------------------------------------------------------------------ run time

    /** The first rule (precedence order) matching the topic, or null. O(1) once the topic was seen. */
    CompiledRule ruleFor(String topic) {
        if (topic == null) {
            return null;
        }
        Object cached = dispatch.get(topic);
        if (cached == null) {
            cached = resolve(topic);
            if (dispatch.size() < MAX_CACHED_TOPICS) {
                dispatch.putIfAbsent(topic, cached);
            }
        }
        return cached == NO_RULE ? null : (CompiledRule) cached;
    }

    private Object resolve(String topic) {
        Integer exactIndex = exact.get(topic);
        int limit = exactIndex == null ? Integer.MAX_VALUE : exactIndex;
        for (int i : patternRules) {
            if (i > limit) {
                break;
            }
            if (rules.get(i).topicPattern.matcher(topic).matches()) {
                return rules.get(i);
            }
        }
        return exactIndex == null ? NO_RULE : rules.get(exactIndex);
    }

    /** Whether {@link FastCheck} alone decides this record (valid) under the topic's rule: for the tests. */
    boolean decidedFast(String topic, byte[] value) {
        CompiledRule rule = ruleFor(topic);
        FastCheck fast = rule == null ? FastCheck.ANY_JSON : rule.fast;
        return fast != null && (rule == null || rule.registry == null) && value != null && Utf8.isValid(value)
                && fast.check(json, value, rule == null ? null : rule.eventTimeField, inlineExecutionConfig,
                        executionConfig) != null;
    }

    Row classify(String topic, byte[] value) {
        if (failure != null) {
            return Classifier.row(Reasons.internalError(failure), null, false, "none");
        }
        CompiledRule rule = null;
        String version = "none";
        boolean hasField = false;
        Long eventMs = null;
        try {
            rule = ruleFor(topic);
            if (rule != null) {
                version = rule.version;
                hasField = rule.eventTimeField != null;
            }
            if (value != null && value.length > maxValueBytes) {
                return Classifier.row(Reasons.TOO_LARGE, null, hasField, version);
            }
            if (value == null) {
                return Classifier.row(Reasons.NULL_VALUE, null, hasField, version);
            }
            if (rule != null && rule.registry != null) {
                Verdict verdict = rule.registry.decoder().decode(rule.registry.subjectStrategy, topic, value);
                if (verdict.problem != null) {
                    return Classifier.row(verdict.problem, null, hasField, version);
                }
                if (hasField) {
                    eventMs = EventTime.readDecoded(verdict.record.get(rule.eventTimeField), rule.eventTimeFormat);
                }
                return Classifier.row(null, eventMs, hasField && eventMs == null, version);
            }
            if (!Utf8.isValid(value)) {
                return Classifier.row(Reasons.NOT_UTF8, null, hasField, version);
            }
            FastCheck fast = rule == null ? FastCheck.ANY_JSON : rule.fast;
            if (fast != null && fastChecks) {
                JsonNode fieldValue = fast.check(json, value, hasField ? rule.eventTimeField : null,
                        inlineExecutionConfig, executionConfig);
                if (fieldValue != null) {
                    if (hasField && !fieldValue.isMissingNode()) {
                        eventMs = EventTime.readValue(fieldValue, rule.eventTimeFormat);
                    }
                    return Classifier.row(null, eventMs, hasField && eventMs == null, version);
                }
            }
            JsonNode doc;
            try {
                doc = json.parse(value);
            } catch (Json.NotJson e) {
                return Classifier.row(Reasons.NOT_JSON, null, hasField, version);
            } catch (Json.TooComplex e) {
                return Classifier.row(Reasons.TOO_COMPLEX, null, hasField, version);
            }
            if (hasField) {
                eventMs = EventTime.read(doc, rule.eventTimeField, rule.eventTimeFormat);
            }
            boolean bad = hasField && eventMs == null;
            String problem = null;
            if (rule != null && rule.schema != null) {
                long patternBudget = BudgetRegexFactory.BASE_BUDGET + BudgetRegexFactory.PER_BYTE_BUDGET * value.length;
                problem = Evaluation.validate(rule.schema, inlineExecutionConfig, executionConfig, doc, patternBudget,
                        Json.depth(value));
            }
            return Classifier.row(problem, eventMs, bad, version);
        } catch (DeepStack.Interrupted e) {
            throw e; // the task is being killed: no verdict
        } catch (RegistryUnavailableException e) {
            // The registry could not say what an id not seen yet is: the task fails and its retry (or the
            // micro-batch's) judges the record once the registry answers; never a verdict from an outage.
            throw e;
        } catch (RuntimeException e) {
            // A deterministic failure on this record's data (a validator's bug on some input): the same on
            // every replay, so a verdict. An Error (OutOfMemoryError, StackOverflowError, LinkageError...)
            // says something about this JVM, not the record: it propagates, the task fails and Spark retries
            // it (or the batch fails visibly), instead of judging the record by the JVM's state.
            return Classifier.row(Reasons.internalError(e), eventMs, hasField && eventMs == null, version);
        }
    }

    /** One rule, compiled. */
    static final class CompiledRule {
        final String label;
        final String match;
        final Pattern topicPattern;
        final String version;
        final String[] eventTimeField;
        final EventTime.Format eventTimeFormat;
        final Schema schema;
        /** The one-pass check of valid records for this rule's schema, or null (outside its subset). */
        final FastCheck fast;
        /** Non-null when the topic's messages are judged by the Schema Registry (the schema their header names). */
        final RegistryRule registry;

        CompiledRule(String label, String match, Pattern topicPattern, String version, String[] eventTimeField,
                EventTime.Format eventTimeFormat, Schema schema, FastCheck fast, RegistryRule registry) {
            this.label = label;
            this.match = match;
            this.topicPattern = topicPattern;
            this.version = version;
            this.eventTimeField = eventTimeField;
            this.eventTimeFormat = eventTimeFormat;
            this.schema = schema;
            this.fast = fast;
            this.registry = registry;
        }
    }

    /** A registry-backed rule: how a topic names its subject, and the decoder that asks the registry. */
    static final class RegistryRule {
        final SubjectStrategy subjectStrategy;
        private final Lazy decoder;

        RegistryRule(SubjectStrategy subjectStrategy, Lazy decoder) {
            this.subjectStrategy = subjectStrategy;
            this.decoder = decoder;
        }

        RegistryDecoder decoder() {
            return decoder.get();
        }
    }

    /**
     * The registry's decoder, made on first use: a rule set whose registry rules never meet a record (a demo topic
     * the job does not read) needs no registry. Made on an executor without a registry configured, it throws
     * {@link RegistryUnavailableException}: the task fails naming the problem, never a verdict.
     */
    private static final class Lazy {
        private final java.util.function.Supplier<RegistryDecoder> supplier;
        private volatile RegistryDecoder value;

        Lazy(java.util.function.Supplier<RegistryDecoder> supplier) {
            this.supplier = supplier;
        }

        RegistryDecoder get() {
            RegistryDecoder v = value;
            if (v == null) {
                synchronized (this) {
                    v = value;
                    if (v == null) {
                        try {
                            v = supplier.get();
                        } catch (IllegalArgumentException e) {
                            throw new RegistryUnavailableException("a registry-backed rule " + e.getMessage(), e);
                        }
                        value = v;
                    }
                }
            }
            return v;
        }
    }
}
