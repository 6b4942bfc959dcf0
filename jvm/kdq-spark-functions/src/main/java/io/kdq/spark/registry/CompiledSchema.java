package io.kdq.spark.registry;

/**
 * One registered schema ready to decode payloads (the bytes after the 5-byte header). Compiled once per id
 * by {@link SchemaCache}; {@link #decode} is thread-safe and never throws on a payload's content.
 */
abstract class CompiledSchema {
    final int id;

    CompiledSchema(int id) {
        this.id = id;
    }

    abstract Verdict decode(byte[] value, int offset);

    /**
     * The record name Confluent's serializers give this schema for the record-name subject strategies
     * ({@link SubjectStrategy}), or null: none (a schema that cannot be read, a JSON Schema without {@code title}),
     * or the payload does not say which (Protobuf message indexes that do not read).
     */
    String recordName(byte[] value, int offset) {
        return null;
    }

    /** Every payload of a schema these decoders cannot read gets the same verdict (and no retry). */
    static CompiledSchema fixed(int id, String problem) {
        return new CompiledSchema(id) {
            @Override
            Verdict decode(byte[] value, int offset) {
                return Verdict.problem(problem, id);
            }
        };
    }

    static CompiledSchema unsupported(int id, String type) {
        return fixed(id, RegistryReasons.UNSUPPORTED_TYPE_PREFIX + type);
    }
}
