package io.kdq.spark.classify;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.List;

import org.apache.spark.sql.Row;

import tools.jackson.databind.JsonNode;
import tools.jackson.databind.json.JsonMapper;
import tools.jackson.databind.node.ArrayNode;
import tools.jackson.databind.node.ObjectNode;

/** Helpers shared by the tests: configurations built as JSON, rows read back. */
final class TestSupport {
    static final JsonMapper MAPPER = JsonMapper.builder().build();

    private TestSupport() {
    }

    static String resource(String name) {
        try (InputStream in = TestSupport.class.getResourceAsStream(name)) {
            if (in == null) {
                throw new IllegalStateException("missing test resource " + name);
            }
            return new String(in.readAllBytes(), StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    static JsonNode json(String text) {
        return MAPPER.readTree(text);
    }

    static ObjectNode config(long maxBytes, boolean assertFormat) {
        ObjectNode cfg = MAPPER.createObjectNode();
        cfg.put("max_value_bytes", maxBytes);
        cfg.put("max_nesting_depth", 500);
        cfg.put("assert_format", assertFormat);
        cfg.putArray("rules");
        cfg.putObject("resources");
        return cfg;
    }

    static ObjectNode rule(ObjectNode cfg, String match, String schemaJson) {
        ObjectNode r = ((ArrayNode) cfg.get("rules")).addObject();
        r.put("label", match);
        r.put("match", match);
        r.put("is_pattern", false);
        r.put("source", "test/" + match + ".schema.json");
        r.put("base_uri", "kdq:/rules/" + match + ".schema.json");
        if (schemaJson == null) {
            r.putNull("schema");
        } else {
            r.set("schema", json(schemaJson));
        }
        r.putNull("event_time_field");
        r.put("event_time_format", "auto");
        r.put("version", "v-" + match);
        return r;
    }

    static void eventTime(ObjectNode rule, String format, String... field) {
        ArrayNode f = rule.putArray("event_time_field");
        for (String name : field) {
            f.add(name);
        }
        rule.put("event_time_format", format);
    }

    static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    static String problem(Classifier c, String topic, String value) {
        return (String) c.call(topic, value == null ? null : utf8(value)).get(0);
    }

    static String problem(Classifier c, String topic, byte[] value) {
        return (String) c.call(topic, value).get(0);
    }

    static List<Object> fields(Row row) {
        return List.of(String.valueOf(row.get(0)), String.valueOf(row.get(1)), String.valueOf(row.get(2)),
                String.valueOf(row.get(3)));
    }
}
