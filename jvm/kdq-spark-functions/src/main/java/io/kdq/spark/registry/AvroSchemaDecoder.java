package io.kdq.spark.registry;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.function.Function;

import org.apache.avro.Schema;

/**
 * An Avro schema from the registry, compiled once per id: Avro's parser (named types of its references parsed
 * first, in the same parser, as Confluent's serializers do), one {@link PathDatumReader} for every thread, and a
 * {@link BoundedBinaryDecoder} per thread reused across records and schemas.
 */
final class AvroSchemaDecoder extends CompiledSchema {
    private static final ThreadLocal<BoundedBinaryDecoder> DECODER = ThreadLocal.withInitial(BoundedBinaryDecoder::new);

    final Schema schema;
    private final PathDatumReader reader;

    private AvroSchemaDecoder(int id, Schema schema) {
        super(id);
        this.schema = schema;
        this.reader = new PathDatumReader(schema);
    }

    /**
     * Parses the schema (references resolved through {@code references}, which may throw
     * {@link RegistryUnavailableException}: then nothing is cached and the id is asked again). A schema Avro
     * refuses, or whose reference the registry does not have, is a fixed verdict {@code internal_error:<Exception>} for its records (a registry that accepted it
     * will keep serving it; retrying cannot help).
     */
    static CompiledSchema compile(int id, RegisteredSchema registered,
            Function<SchemaReference, RegisteredSchema> references) {
        List<String> texts = new ArrayList<>();
        try {
            collect(registered, references, texts, new HashSet<>(), 0);
        } catch (IllegalArgumentException e) {
            // a reference the registry does not have (404), or a loop: as permanent as a schema Avro refuses
            return fixed(id, RegistryReasons.INTERNAL_ERROR_PREFIX + e.getClass().getSimpleName());
        }
        try {
            Schema.Parser parser = new Schema.Parser();
            Schema schema = null;
            for (String text : texts) {
                schema = parser.parse(text);
            }
            return new AvroSchemaDecoder(id, schema);
        } catch (RuntimeException e) {
            return fixed(id, RegistryReasons.INTERNAL_ERROR_PREFIX + e.getClass().getSimpleName());
        }
    }

    /** Texts in dependency order (references first, each once), the schema itself last. */
    private static void collect(RegisteredSchema s, Function<SchemaReference, RegisteredSchema> references,
            List<String> out, Set<String> seen, int depth) {
        if (depth > 64) {
            throw new IllegalArgumentException("schema references nested deeper than 64");
        }
        for (SchemaReference ref : s.references()) {
            if (seen.add(ref.subject() + "\u0000" + ref.version())) {
                collect(references.apply(ref), references, out, seen, depth + 1);
            }
        }
        out.add(s.schema());
    }

    /** Named types by their full name, other schemas by their type's name (a primitive's name is its type). */
    @Override
    String recordName(byte[] value, int offset) {
        return switch (schema.getType()) {
            case RECORD, ENUM, FIXED -> schema.getFullName();
            default -> schema.getType().getName();
        };
    }

    @Override
    Verdict decode(byte[] value, int offset) {
        BoundedBinaryDecoder in = DECODER.get();
        in.reset(value, offset);
        try {
            Object datum;
            try {
                datum = reader.read(null, in);
            } catch (DecodeFailure f) {
                return Verdict.problem(RegistryReasons.AVRO_PREFIX + f.pointer(), id);
            } catch (IOException | RuntimeException e) {
                return Verdict.problem(RegistryReasons.AVRO_PREFIX + RegistryReasons.ROOT, id);
            }
            if (in.remaining() > 0) {
                return Verdict.problem(RegistryReasons.AVRO_PREFIX + RegistryReasons.TRAILING, id);
            }
            return Verdict.decoded(id, new AvroRecord(schema, datum));
        } finally {
            in.reset(null, 0); // keep no reference to the record's bytes
        }
    }
}
