package io.kdq.spark.registry;

/** A schema's reference to another registered schema: the name it is imported as, and where it lives. */
public record SchemaReference(String name, String subject, int version) {
}
