package io.kdq.spark.registry;

/**
 * How a topic's records name the subject their schema must be a version of: Confluent's serializers' subject name
 * strategies for record values, as every registry client spells them.
 *
 * <ul>
 *   <li>{@link #TOPIC_NAME} (the serializers' default): {@code <topic>-value}, one subject per topic;</li>
 *   <li>{@link #RECORD_NAME}: the record's fully-qualified name, one subject per record type, shared by every topic
 *       carrying it;</li>
 *   <li>{@link #TOPIC_RECORD_NAME}: {@code <topic>-<record name>}, several record types per topic, each its own
 *       subject.</li>
 * </ul>
 *
 * <p>The record name is the one the serializers use ({@link CompiledSchema#recordName}): an Avro schema's full name
 * (a primitive's type name), the Protobuf message the payload's message indexes name, a JSON Schema's
 * {@code title}.
 */
public enum SubjectStrategy {
    TOPIC_NAME("topic_name"),
    RECORD_NAME("record_name"),
    TOPIC_RECORD_NAME("topic_record_name");

    /** How the rules spell it ({@code subject_strategy} in topics.toml). */
    public final String key;

    SubjectStrategy(String key) {
        this.key = key;
    }

    /** @throws IllegalArgumentException naming the supported ones */
    public static SubjectStrategy of(String key) {
        for (SubjectStrategy s : values()) {
            if (s.key.equals(key)) {
                return s;
            }
        }
        throw new IllegalArgumentException("subject_strategy '" + key + "' is not supported (supported: topic_name,"
                + " record_name, topic_record_name)");
    }

    /** Whether the subject depends on the record (its schema's name), not on the topic alone. */
    public boolean byRecord() {
        return this != TOPIC_NAME;
    }

    /** The subject of a record of {@code topic} whose schema is named {@code recordName} (unused by TOPIC_NAME). */
    public String subject(String topic, String recordName) {
        return switch (this) {
            case TOPIC_NAME -> topic + "-value";
            case RECORD_NAME -> recordName;
            case TOPIC_RECORD_NAME -> topic + "-" + recordName;
        };
    }
}
