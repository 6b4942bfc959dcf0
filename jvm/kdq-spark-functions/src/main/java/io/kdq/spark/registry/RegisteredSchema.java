package io.kdq.spark.registry;

import java.util.List;

/**
 * One schema as the registry serves it: its type ({@code AVRO} when the registry says none, as Confluent's API
 * does), its text, and its references (Protobuf imports, Avro named types defined in other subjects).
 */
public record RegisteredSchema(String type, String schema, List<SchemaReference> references) {
    public static final String AVRO = "AVRO";
    public static final String PROTOBUF = "PROTOBUF";
    public static final String JSON = "JSON";

    public RegisteredSchema {
        type = type == null || type.isEmpty() ? AVRO : type;
        references = references == null ? List.of() : List.copyOf(references);
    }
}
