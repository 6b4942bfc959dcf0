package io.kdq.spark.registry;

/**
 * Judges one registry-framed Kafka value against a topic's subject, in one pass: {@code null_value},
 * {@code no_magic_byte}, {@code unknown_schema_id}, {@code schema_not_for_subject}, then the payload's decoding
 * ({@code avro:<pointer>}) or the decoded record. Thread-safe; holds no per-record state.
 *
 * <p>The schema comes from the header's id, from the {@link SchemaCache} (a registry request only the first time
 * an id is met); so does the subject check. A registry that cannot answer a question not cached yet makes
 * {@link #decode} throw {@link RegistryUnavailableException}: the caller fails the task, and the retried batch
 * judges the record then, never a guess now.
 */
public final class RegistryDecoder {
    private final SchemaCache cache;

    public RegistryDecoder(SchemaCache cache) {
        this.cache = cache;
    }

    /**
     * @param subject the topic's subject ({@code <topic>-value} by the topic-name strategy), or null to accept any
     *                registered id
     * @throws RegistryUnavailableException when the answer needs the registry and it does not answer
     */
    public Verdict decode(String subject, byte[] value) {
        return judge(null, subject, value);
    }

    /**
     * Judges a value of {@code topic} whose subject comes by {@code strategy}: for the record-name strategies the
     * subject is named by the record's schema ({@link CompiledSchema#recordName}), so a record type whose subject
     * does not hold the header's id is {@code schema_not_for_subject}, as is a schema without a name (a JSON Schema
     * without {@code title}: no record-name serializer writes it).
     *
     * @throws RegistryUnavailableException when the answer needs the registry and it does not answer
     */
    public Verdict decode(SubjectStrategy strategy, String topic, byte[] value) {
        return strategy.byRecord() ? judge(strategy, topic, value) : judge(null, strategy.subject(topic, null), value);
    }

    /** With {@code strategy} null, {@code subjectOrTopic} is the subject (null: any id); else the topic. */
    private Verdict judge(SubjectStrategy strategy, String subjectOrTopic, byte[] value) {
        if (value == null) {
            return Verdict.problem(RegistryReasons.NULL_VALUE, -1);
        }
        if (!WireFormat.framed(value)) {
            return Verdict.problem(RegistryReasons.NO_MAGIC_BYTE, -1);
        }
        int id = WireFormat.schemaId(value);
        CompiledSchema schema = cache.schema(id);
        if (schema == null) {
            return Verdict.problem(RegistryReasons.UNKNOWN_SCHEMA_ID, id);
        }
        if (strategy == null) {
            if (subjectOrTopic != null && !cache.inSubject(subjectOrTopic, id)) {
                return Verdict.problem(RegistryReasons.SCHEMA_NOT_FOR_SUBJECT, id);
            }
            return schema.decode(value, WireFormat.HEADER);
        }
        String name = schema.recordName(value, WireFormat.HEADER);
        if (name == null) {
            // A payload naming no message (Protobuf's indexes) says so in its decoding; a nameless schema is in
            // no record-name subject.
            Verdict decoded = schema.decode(value, WireFormat.HEADER);
            return decoded.problem != null ? decoded : Verdict.problem(RegistryReasons.SCHEMA_NOT_FOR_SUBJECT, id);
        }
        if (!cache.inSubject(strategy.subject(subjectOrTopic, name), id)) {
            return Verdict.problem(RegistryReasons.SCHEMA_NOT_FOR_SUBJECT, id);
        }
        return schema.decode(value, WireFormat.HEADER);
    }

    /**
     * A job's start-up check: the registry answers with these credentials (the number of versions of
     * {@code subject}, 0 when it has none yet).
     *
     * @throws RegistryUnavailableException when it does not answer, or refuses the credentials
     */
    public int checkReachable(String subject) {
        return cache.versionsNow(subject);
    }
}
