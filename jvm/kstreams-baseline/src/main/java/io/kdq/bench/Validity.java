package io.kdq.bench;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;

import com.networknt.schema.Schema;
import com.networknt.schema.SchemaLocation;
import com.networknt.schema.SchemaRegistry;
import com.networknt.schema.SchemaRegistryConfig;
import com.networknt.schema.SpecificationVersion;

import tools.jackson.core.JacksonException;
import tools.jackson.databind.DeserializationFeature;
import tools.jackson.databind.JsonNode;
import tools.jackson.databind.json.JsonMapper;

/**
 * Valid or invalid, as kdq decides it for the benchmark's values: strict UTF-8 (the JDK decoder
 * with REPORT), exactly one JSON document (no trailing tokens, no duplicate object keys), and,
 * when a rule is given, no error from networknt json-schema-validator (draft 2020-12 by default,
 * format assertions on, as kdq's {@code assert_format} default).
 *
 * <p>One instance per stream task thread is not needed: the mapper and the compiled schema are
 * thread-safe; the UTF-8 decoder is per thread.
 */
final class Validity {
    private static final ThreadLocal<CharsetDecoder> DECODER = ThreadLocal.withInitial(() -> StandardCharsets.UTF_8
            .newDecoder()
            .onMalformedInput(CodingErrorAction.REPORT)
            .onUnmappableCharacter(CodingErrorAction.REPORT));

    private final JsonMapper mapper = JsonMapper.builder()
            .enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS)
            .enable(DeserializationFeature.FAIL_ON_READING_DUP_TREE_KEY)
            .build();
    private final Schema schema;

    /** {@code schemaFile} null: valid = UTF-8 JSON. */
    Validity(Path schemaFile) throws java.io.IOException {
        if (schemaFile == null) {
            schema = null;
            return;
        }
        SchemaRegistryConfig config = SchemaRegistryConfig.builder().formatAssertionsEnabled(true).build();
        SchemaRegistry registry = SchemaRegistry.withDefaultDialect(SpecificationVersion.DRAFT_2020_12,
                builder -> builder.schemaRegistryConfig(config));
        JsonNode node = mapper.readTree(Files.readAllBytes(schemaFile));
        schema = registry.getSchema(SchemaLocation.of(schemaFile.toAbsolutePath().toUri().toString()), node);
        schema.initializeValidators();
    }

    boolean isValid(byte[] value) {
        if (value == null || !utf8(value)) {
            return false;
        }
        JsonNode doc;
        try {
            doc = mapper.readTree(value);
        } catch (JacksonException e) {
            return false;
        }
        if (doc == null || doc.isMissingNode()) {
            return false;
        }
        return schema == null || schema.validate(doc).isEmpty();
    }

    private static boolean utf8(byte[] value) {
        boolean ascii = true;
        for (byte b : value) {
            if (b < 0) {
                ascii = false;
                break;
            }
        }
        if (ascii) {
            return true;
        }
        CharsetDecoder decoder = DECODER.get();
        decoder.reset();
        try {
            decoder.decode(ByteBuffer.wrap(value));
            return true;
        } catch (CharacterCodingException e) {
            return false;
        }
    }
}
