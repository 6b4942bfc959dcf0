package io.kdq.spark.registry;

import java.io.IOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;

import javax.net.ssl.SSLContext;

import tools.jackson.databind.JsonNode;
import tools.jackson.databind.json.JsonMapper;

/**
 * A registry's Confluent-compatible REST API over {@code java.net.http} (Confluent Schema Registry, Apicurio's
 * {@code /apis/ccompat/v7}, Karapace, Redpanda): the base URL is the API's root, e.g.
 * {@code http://127.0.0.1:8080/apis/ccompat/v7}. Basic auth or a bearer token, extra headers (Confluent Cloud's
 * {@code target-sr-cluster}); TLS through the JVM's default trust store ({@code javax.net.ssl.trustStore}) or the
 * given {@link SSLContext} (a private CA, {@link RegistryConnection#trusting}). The JSON is read with the Jackson 3 this jar already ships
 * (relocated), so nothing is added to Spark's class path.
 *
 * <p>200 is an answer, 404 is "no such id / subject / version" (null or empty), anything else (401/403 included:
 * a credentials problem is not the record's) and every I/O failure or timeout is a
 * {@link RegistryUnavailableException}.
 */
public final class HttpSchemaSource implements SchemaSource {
    private static final JsonMapper MAPPER = JsonMapper.builder().build();
    private static final String ACCEPT = "application/vnd.schemaregistry.v1+json, application/json";

    private final String base;
    private final String authorization;
    private final Map<String, String> headers;
    private final Duration timeout;
    private final HttpClient client;

    /**
     * @param baseUrl       the API's root (a trailing slash is ignored)
     * @param authorization an {@code Authorization} header value ({@link #basic}, {@link #bearer}) or null
     * @param timeout       connect and request timeout
     */
    public HttpSchemaSource(String baseUrl, String authorization, Duration timeout) {
        this(baseUrl, authorization, Map.of(), null, timeout);
    }

    /**
     * @param headers sent with every request besides Accept and Authorization
     * @param ssl     the TLS context of an https:// registry, or null for the JVM's default
     */
    public HttpSchemaSource(String baseUrl, String authorization, Map<String, String> headers, SSLContext ssl,
            Duration timeout) {
        this.base = baseUrl.endsWith("/") ? baseUrl.substring(0, baseUrl.length() - 1) : baseUrl;
        this.authorization = authorization;
        this.headers = Map.copyOf(headers);
        this.timeout = timeout;
        HttpClient.Builder builder = HttpClient.newBuilder().connectTimeout(timeout)
                .followRedirects(HttpClient.Redirect.NORMAL);
        if (ssl != null) {
            builder.sslContext(ssl);
        }
        this.client = builder.build();
    }

    public static String basic(String user, String password) {
        return "Basic " + Base64.getEncoder().encodeToString((user + ":" + password).getBytes(StandardCharsets.UTF_8));
    }

    public static String bearer(String token) {
        return "Bearer " + token;
    }

    @Override
    public RegisteredSchema schemaById(int id) {
        JsonNode body = get("/schemas/ids/" + id);
        return body == null ? null : schema(body);
    }

    @Override
    public List<Integer> versions(String subject) {
        JsonNode body = get("/subjects/" + segment(subject) + "/versions");
        List<Integer> out = new ArrayList<>();
        if (body != null) {
            if (!body.isArray()) {
                throw unreadable("/subjects/" + subject + "/versions", "not a list of versions");
            }
            for (JsonNode v : body) {
                out.add(v.asInt());
            }
        }
        return out;
    }

    @Override
    public SubjectVersion version(String subject, int version) {
        String path = "/subjects/" + segment(subject) + "/versions/" + version;
        JsonNode body = get(path);
        if (body == null) {
            return null;
        }
        if (!body.path("id").isNumber()) {
            throw unreadable(path, "no schema id");
        }
        return new SubjectVersion(subject, version, body.get("id").asInt(), schema(body));
    }

    private static RegisteredSchema schema(JsonNode body) {
        List<SchemaReference> refs = new ArrayList<>();
        for (JsonNode r : body.path("references")) {
            refs.add(new SchemaReference(r.path("name").asString(), r.path("subject").asString(),
                    r.path("version").asInt()));
        }
        String type = body.path("schemaType").isString() ? body.get("schemaType").asString() : null;
        return new RegisteredSchema(type, body.path("schema").asString(), refs);
    }

    /** The parsed body of a 200, null for a 404. */
    private JsonNode get(String path) {
        HttpRequest.Builder req = HttpRequest.newBuilder(URI.create(base + path)).timeout(timeout)
                .header("Accept", ACCEPT).GET();
        if (authorization != null) {
            req.header("Authorization", authorization);
        }
        headers.forEach(req::header);
        HttpResponse<byte[]> resp;
        try {
            resp = client.send(req.build(), HttpResponse.BodyHandlers.ofByteArray());
        } catch (IOException e) {
            throw new RegistryUnavailableException("schema registry " + base + path + ": " + e, e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new RegistryUnavailableException("interrupted while asking the schema registry " + base + path, e);
        }
        if (resp.statusCode() == 404) {
            return null;
        }
        if (resp.statusCode() != 200) {
            throw new RegistryUnavailableException("schema registry " + base + path + " answered HTTP "
                    + resp.statusCode() + ": " + preview(resp.body()), null);
        }
        try {
            return MAPPER.readTree(resp.body());
        } catch (RuntimeException e) {
            throw unreadable(path, e.getMessage());
        }
    }

    private RegistryUnavailableException unreadable(String path, String what) {
        return new RegistryUnavailableException("schema registry " + base + path + ": unreadable answer (" + what
                + ")", null);
    }

    private static String preview(byte[] body) {
        String s = new String(body, StandardCharsets.UTF_8);
        return s.length() > 200 ? s.substring(0, 200) + "..." : s;
    }

    /** One path segment: subjects may hold any character (record-name strategies use dots, some use slashes). */
    static String segment(String s) {
        return URLEncoder.encode(s, StandardCharsets.UTF_8).replace("+", "%20");
    }
}
