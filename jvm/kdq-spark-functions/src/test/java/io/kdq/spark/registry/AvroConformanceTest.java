package io.kdq.spark.registry;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;

import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.file.DataFileStream;
import org.apache.avro.generic.GenericDatumReader;
import org.junit.jupiter.api.Test;

import tools.jackson.databind.JsonNode;
import tools.jackson.databind.json.JsonMapper;

/**
 * The decoders on Apache Avro's shared test data (vendored under avro-test-vectors/ with Avro's LICENSE and
 * NOTICE): the cross-SDK must-reject binary vectors, the single-object-encoded message, and the records of the
 * schema test folders (read by Avro's own file reader, written by its own writer, decoded here).
 */
class AvroConformanceTest {
    private static final String DIR = "/avro-test-vectors/";

    static byte[] resource(String name) throws IOException {
        try (InputStream in = AvroConformanceTest.class.getResourceAsStream(DIR + name)) {
            if (in == null) {
                throw new IllegalStateException("missing test resource " + name);
            }
            return in.readAllBytes();
        }
    }

    static Verdict decode(String schema, byte[] payload) {
        CompiledSchema compiled = AvroSchemaDecoder.compile(1, new RegisteredSchema(null, schema, null), r -> null);
        return compiled.decode(Avro.frame(1, payload), WireFormat.HEADER);
    }

    @Test
    void binaryRejections() throws Exception {
        JsonNode doc = JsonMapper.builder().build().readTree(resource("binary-rejections.json"));
        int n = 0;
        for (JsonNode v : doc.get("vectors")) {
            Verdict verdict = decode(v.get("schema").asString(), Avro.hex(v.get("bytesHex").asString()));
            assertEquals("avro:$", verdict.problem, v.get("name").asString());
            n++;
        }
        assertEquals(9, n);
    }

    @Test
    void singleObjectEncodedMessage() throws Exception {
        String schema = new String(resource("messageV1/test_schema.avsc"), StandardCharsets.UTF_8);
        byte[] message = resource("messageV1/test_message.bin");
        assertEquals((byte) 0xc3, message[0]);
        assertEquals((byte) 0x01, message[1]);
        long fingerprint = ByteBuffer.wrap(message, 2, 8).order(ByteOrder.LITTLE_ENDIAN).getLong();
        assertEquals(SchemaNormalization.parsingFingerprint64(new Schema.Parser().parse(schema)), fingerprint);
        Verdict v = decode(schema, Arrays.copyOfRange(message, 10, message.length));
        assertNull(v.problem, v.toString());
        assertEquals(42L, v.record.get("id"));
        assertEquals("Bill", v.record.get("name"));
        assertEquals("dog_lover", v.record.get("tags", "0"));
        assertEquals("cat_hater", v.record.get("tags", "1"));
        assertNull(v.record.get("tags", "2"));
        for (int cut = 10; cut < message.length; cut++) {
            Verdict t = decode(schema, Arrays.copyOfRange(message, 10, cut));
            assertTrue(t.problem != null && t.problem.startsWith("avro:/"), cut + ": " + t);
        }
    }

    @Test
    void schemaFolders() throws Exception {
        for (String folder : List.of("simple", "withUnion")) {
            String schema = new String(resource("schemas/" + folder + "/schema.json"), StandardCharsets.UTF_8);
            int n = 0;
            try (InputStream in = AvroConformanceTest.class.getResourceAsStream(DIR + "schemas/" + folder + "/data.avro");
                    DataFileStream<Object> file = new DataFileStream<>(in, new GenericDatumReader<>())) {
                assertEquals(new Schema.Parser().parse(schema), file.getSchema());
                for (Object datum : file) {
                    Verdict v = decode(schema, Avro.encode(file.getSchema(), datum));
                    assertNull(v.problem, folder + " record " + n + ": " + v);
                    assertEquals(datum, ((AvroRecord) v.record).datum, folder + " record " + n);
                    n++;
                }
            }
            assertTrue(n > 0, folder + " has records");
        }
    }
}
