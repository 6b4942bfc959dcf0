package io.kdq.spark.registry;

/**
 * The reason strings of {@link RegistryDecoder#decode}: what is wrong with a registry-framed value, first that
 * applies. A decoding failure names where it happened as a JSON pointer into the decoded value
 * ({@code avro:/customer/tier}, {@code avro:/lines/3/qty}, map keys as members); {@link #ROOT} when the value
 * itself (not one of its members) did not decode, {@link #TRAILING} when it decoded with bytes left over.
 */
public final class RegistryReasons {
    public static final String NULL_VALUE = "null_value";
    /** Not Confluent's framing: empty, shorter than the 5-byte header, or a first byte other than 0. */
    public static final String NO_MAGIC_BYTE = "no_magic_byte";
    /** The registry has no schema with the header's id. */
    public static final String UNKNOWN_SCHEMA_ID = "unknown_schema_id";
    /** The id is a schema, but not one of the versions of the topic's subject. */
    public static final String SCHEMA_NOT_FOR_SUBJECT = "schema_not_for_subject";
    public static final String AVRO_PREFIX = "avro:";
    public static final String PROTOBUF_PREFIX = "protobuf:";
    /** A JSON Schema payload that is JSON but fails its schema: {@code json:<keywordLocation>}, as the classifier's {@code schema:}. */
    public static final String JSON_PREFIX = "json:";
    /** The registry serves the id as a type these decoders do not read (yet): {@code unsupported_schema_type:JSON}. */
    public static final String UNSUPPORTED_TYPE_PREFIX = "unsupported_schema_type:";
    /** The registry's schema text does not compile (the producer's registry accepted it; the library does not). */
    public static final String INTERNAL_ERROR_PREFIX = "internal_error:";
    public static final String ROOT = "$";
    public static final String TRAILING = "$trailing_bytes";
    /** Protobuf message indexes that are truncated, malformed, or name no message of the schema. */
    public static final String MESSAGE_INDEX = "$message_index";

    private RegistryReasons() {
    }
}
