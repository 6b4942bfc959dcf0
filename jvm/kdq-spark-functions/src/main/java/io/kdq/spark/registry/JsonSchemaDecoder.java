package io.kdq.spark.registry;

import java.net.URI;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.function.Function;

import io.kdq.spark.classify.JsonSchemaCheck;
import tools.jackson.databind.JsonNode;
import tools.jackson.databind.json.JsonMapper;

/**
 * A JSON Schema from the registry (schemaType JSON), compiled once per id with the classifier's own JSON Schema
 * machinery ({@link JsonSchemaCheck}: the same strict JSON parser, networknt registry, limits and first-error
 * choice as a rule's schema file). The payload after the 5-byte header is JSON text. Reasons: {@code not_utf8},
 * {@code not_json}, {@code too_complex}, {@code pattern_budget:<keywordLocation>} as the classifier's;
 * {@code json:<keywordLocation>} where the classifier says {@code schema:<keywordLocation>}.
 *
 * <p>References: each referenced schema (by subject and version, transitively) is a document at its reference
 * name, resolved against the schema's own base {@code kdq:/registry/schemas/<id>.json} (a relative name such as
 * {@code customer.json} is {@code kdq:/registry/schemas/customer.json}; an absolute one is itself), so the
 * {@code $ref}s that name them resolve; nothing is fetched from anywhere else.
 */
final class JsonSchemaDecoder extends CompiledSchema {
    /** The rules' defaults (kdq's max_nesting_depth and assert_format). */
    static final int MAX_NESTING_DEPTH = 500;
    static final boolean ASSERT_FORMAT = true;
    static final String BASE = "kdq:/registry/schemas/";

    private static final JsonMapper TITLE_READER = JsonMapper.builder().build();

    private final JsonSchemaCheck check;
    /** The schema's {@code title}: its record name for the record-name subject strategies, as the serializers'. */
    private final String title;

    private JsonSchemaDecoder(int id, JsonSchemaCheck check, String title) {
        super(id);
        this.check = check;
        this.title = title;
    }

    static CompiledSchema compile(int id, RegisteredSchema registered,
            Function<SchemaReference, RegisteredSchema> references) {
        try {
            Map<String, String> documents = new LinkedHashMap<>();
            collect(registered, references, documents, new HashSet<>(), 0);
            JsonSchemaCheck check = JsonSchemaCheck.compile(registered.schema(), BASE + id + ".json", documents,
                    MAX_NESTING_DEPTH, ASSERT_FORMAT);
            JsonNode title = TITLE_READER.readTree(registered.schema()).path("title");
            return new JsonSchemaDecoder(id, check, title.isString() ? title.asString() : null);
        } catch (RegistryUnavailableException e) {
            throw e;
        } catch (RuntimeException e) {
            return fixed(id, RegistryReasons.INTERNAL_ERROR_PREFIX + e.getClass().getSimpleName());
        }
    }

    private static void collect(RegisteredSchema s, Function<SchemaReference, RegisteredSchema> references,
            Map<String, String> out, Set<String> seen, int depth) {
        if (depth > 64) {
            throw new IllegalArgumentException("schema references nested deeper than 64");
        }
        for (SchemaReference ref : s.references()) {
            if (seen.add(ref.name() + "\u0000" + ref.subject() + "\u0000" + ref.version())) {
                RegisteredSchema r = references.apply(ref);
                out.putIfAbsent(documentIri(ref.name()), r.schema());
                collect(r, references, out, seen, depth + 1);
            }
        }
    }

    /** A reference name as the IRI its {@code $ref}s reach: absolute as it is, relative against {@link #BASE}. */
    static String documentIri(String name) {
        String iri = URI.create(BASE).resolve(URI.create(name)).toString();
        return iri.endsWith("#") ? iri.substring(0, iri.length() - 1) : iri;
    }

    @Override
    String recordName(byte[] value, int offset) {
        return title;
    }

    @Override
    Verdict decode(byte[] value, int offset) {
        JsonSchemaCheck.Result r = check.check(value, offset);
        if (r.problem() == null) {
            return Verdict.decoded(id, new JsonRecord(r.doc()));
        }
        String problem = r.problem();
        if (problem.startsWith(JsonSchemaCheck.SCHEMA_PREFIX)) {
            problem = RegistryReasons.JSON_PREFIX + problem.substring(JsonSchemaCheck.SCHEMA_PREFIX.length());
        }
        return Verdict.problem(problem, id);
    }
}
