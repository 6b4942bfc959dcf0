package io.kdq.spark.classify;

import java.util.Arrays;
import java.util.Map;

import com.networknt.schema.ExecutionConfig;
import com.networknt.schema.Schema;
import com.networknt.schema.SchemaRegistry;

import tools.jackson.databind.JsonNode;

/**
 * One JSON Schema applied to JSON values exactly as the classifier applies a rule's schema (the same strict
 * parser, networknt registry, evaluation limits, pattern budget and first-error choice): for the registry
 * decoders' JSON Schema payloads ({@code io.kdq.spark.registry}). Thread-safe once compiled.
 */
public final class JsonSchemaCheck {
    /** The classifier's reasons (without {@code too_large} and {@code null_value}, the caller's). */
    public static final String NOT_UTF8 = Reasons.NOT_UTF8;
    public static final String NOT_JSON = Reasons.NOT_JSON;
    public static final String TOO_COMPLEX = Reasons.TOO_COMPLEX;
    public static final String SCHEMA_PREFIX = Reasons.SCHEMA_PREFIX;

    private final Schema schema;
    private final Json json;
    private final ExecutionConfig full;
    private final ExecutionConfig inline;

    private JsonSchemaCheck(Schema schema, int maxNestingDepth, boolean assertFormat) {
        this.schema = schema;
        this.json = new Json(maxNestingDepth);
        this.full = CompiledConfig.executionConfig(assertFormat, 4 * maxNestingDepth + 100);
        this.inline = CompiledConfig.executionConfig(assertFormat,
                Math.min(Evaluation.INLINE_EVALUATION_DEPTH, 4 * maxNestingDepth + 100));
    }

    /** The outcome for one value: {@link #problem} null when it passes, else a classifier reason; {@link #doc} when it parsed. */
    public record Result(String problem, JsonNode doc) {
    }

    /**
     * Compiles {@code schemaText} as the document at {@code baseUri}; {@code $ref}s resolve only to
     * {@code documents} (absolute IRI to JSON text) and networknt's copies of the official meta-schemas. Default
     * dialect draft 2020-12, as the rules'.
     *
     * @throws IllegalArgumentException when the text is not JSON or does not compile (with why)
     */
    public static JsonSchemaCheck compile(String schemaText, String baseUri, Map<String, String> documents,
            int maxNestingDepth, boolean assertFormat) {
        JsonNode node;
        try {
            node = Json.configMapper().readTree(schemaText);
        } catch (RuntimeException e) {
            throw new IllegalArgumentException("schema is not JSON: " + e.getMessage(), e);
        }
        java.util.LinkedHashMap<String, String> all = new java.util.LinkedHashMap<>(documents);
        all.putIfAbsent(baseUri, schemaText);
        SchemaRegistry registry = CompiledConfig.registry(assertFormat, all);
        Schema schema;
        try {
            schema = DeepStack.call(() -> CompiledConfig.compileSchema(node, baseUri, registry, all));
        } catch (RuntimeException e) {
            throw new IllegalArgumentException(CompiledConfig.describe(e), e);
        }
        return new JsonSchemaCheck(schema, maxNestingDepth, assertFormat);
    }

    /** Parses and validates {@code value[offset..]}. Never throws on the value's content but {@code internal_error}. */
    public Result check(byte[] value, int offset) {
        byte[] payload = offset == 0 ? value : Arrays.copyOfRange(value, offset, value.length);
        if (!Utf8.isValid(payload)) {
            return new Result(Reasons.NOT_UTF8, null);
        }
        JsonNode doc;
        try {
            doc = json.parse(payload);
        } catch (Json.NotJson e) {
            return new Result(Reasons.NOT_JSON, null);
        } catch (Json.TooComplex e) {
            return new Result(Reasons.TOO_COMPLEX, null);
        }
        try {
            long budget = BudgetRegexFactory.BASE_BUDGET + BudgetRegexFactory.PER_BYTE_BUDGET * payload.length;
            return new Result(Evaluation.validate(schema, inline, full, doc, budget, Json.depth(payload)), doc);
        } catch (DeepStack.Interrupted e) {
            throw e;
        } catch (RuntimeException e) {
            return new Result(Reasons.internalError(e), doc);
        }
    }
}
