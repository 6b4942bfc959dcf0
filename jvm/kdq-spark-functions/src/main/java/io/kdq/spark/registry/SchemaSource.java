package io.kdq.spark.registry;

import java.util.List;

/**
 * Where schemas come from: a registry's Confluent-compatible API ({@link HttpSchemaSource}). Every method may
 * throw {@link RegistryUnavailableException}; none is called per record ({@link SchemaCache} remembers the
 * answers).
 */
public interface SchemaSource {
    /** {@code GET /schemas/ids/{id}}: the schema, or null when the registry has no such id (404). */
    RegisteredSchema schemaById(int id);

    /** {@code GET /subjects/{subject}/versions}: the subject's version numbers, empty when there is no subject. */
    List<Integer> versions(String subject);

    /** {@code GET /subjects/{subject}/versions/{version}}: that version's id and schema, or null when absent. */
    SubjectVersion version(String subject, int version);

    /** One version of a subject. */
    record SubjectVersion(String subject, int version, int id, RegisteredSchema schema) {
    }
}
