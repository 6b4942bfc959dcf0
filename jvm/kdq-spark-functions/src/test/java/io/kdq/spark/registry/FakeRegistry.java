package io.kdq.spark.registry;

import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;

import tools.jackson.databind.json.JsonMapper;
import tools.jackson.databind.node.ArrayNode;
import tools.jackson.databind.node.ObjectNode;

/**
 * An in-process registry speaking the three requests of Confluent's API that {@link HttpSchemaSource} makes, on a
 * free loopback port; counts every request, can answer 503 (an outage) or demand an Authorization header.
 */
public final class FakeRegistry implements AutoCloseable {
    private static final JsonMapper MAPPER = JsonMapper.builder().build();

    private final HttpServer server;
    private final Map<Integer, ObjectNode> schemas = new ConcurrentHashMap<>();
    private final Map<String, List<Integer>> subjects = new ConcurrentHashMap<>();
    final AtomicInteger requests = new AtomicInteger();
    final Map<String, AtomicInteger> byKind = new ConcurrentHashMap<>();
    public volatile boolean down;
    volatile String requiredAuthorization;
    volatile String lastAuthorization;
    private int nextId = 1;

    public FakeRegistry() throws IOException {
        server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        server.createContext("/", this::handle);
        server.start();
    }

    public String url() {
        return "http://127.0.0.1:" + server.getAddress().getPort() + "/apis/ccompat/v7/";
    }

    /** Registers {@code schema} under {@code subject} as its next version; returns its id (the same text: the same id). */
    public synchronized int register(String subject, String type, String schema, SchemaReference... refs) {
        int id = -1;
        for (Map.Entry<Integer, ObjectNode> e : schemas.entrySet()) {
            if (e.getValue().get("schema").asString().equals(schema)) {
                id = e.getKey();
            }
        }
        if (id < 0) {
            id = nextId++;
            ObjectNode body = MAPPER.createObjectNode();
            body.put("schema", schema);
            if (!type.equals("AVRO")) {
                body.put("schemaType", type);
            }
            ArrayNode r = body.putArray("references");
            for (SchemaReference ref : refs) {
                r.addObject().put("name", ref.name()).put("subject", ref.subject()).put("version", ref.version());
            }
            schemas.put(id, body);
        }
        subjects.computeIfAbsent(subject, k -> new ArrayList<>()).add(id);
        return id;
    }

    int count(String kind) {
        AtomicInteger n = byKind.get(kind);
        return n == null ? 0 : n.get();
    }

    private void handle(HttpExchange ex) throws IOException {
        requests.incrementAndGet();
        lastAuthorization = ex.getRequestHeaders().getFirst("Authorization");
        String path = ex.getRequestURI().getRawPath().replaceFirst("^/apis/ccompat/v7", "");
        String[] p = path.split("/");
        if (down) {
            send(ex, 503, "{\"error_code\":50300,\"message\":\"down\"}");
            return;
        }
        if (requiredAuthorization != null && !requiredAuthorization.equals(lastAuthorization)) {
            send(ex, 401, "{\"error_code\":40101,\"message\":\"unauthorized\"}");
            return;
        }
        synchronized (this) {
            if (p.length == 4 && p[1].equals("schemas") && p[2].equals("ids")) {
                byKind.computeIfAbsent("id", k -> new AtomicInteger()).incrementAndGet();
                ObjectNode s = schemas.get(Integer.parseInt(p[3]));
                send(ex, s == null ? 404 : 200, s == null ? "{\"error_code\":40403}" : s.toString());
                return;
            }
            if (p.length >= 4 && p[1].equals("subjects") && p[3].equals("versions")) {
                String subject = URLDecoder.decode(p[2], StandardCharsets.UTF_8);
                List<Integer> ids = subjects.get(subject);
                if (p.length == 4) {
                    byKind.computeIfAbsent("versions", k -> new AtomicInteger()).incrementAndGet();
                    if (ids == null) {
                        send(ex, 404, "{\"error_code\":40401}");
                        return;
                    }
                    ArrayNode a = MAPPER.createArrayNode();
                    for (int i = 1; i <= ids.size(); i++) {
                        a.add(i);
                    }
                    send(ex, 200, a.toString());
                    return;
                }
                byKind.computeIfAbsent("version", k -> new AtomicInteger()).incrementAndGet();
                int v = Integer.parseInt(p[4]);
                if (ids == null || v < 1 || v > ids.size()) {
                    send(ex, 404, "{\"error_code\":40402}");
                    return;
                }
                ObjectNode body = schemas.get(ids.get(v - 1)).deepCopy();
                body.put("subject", subject).put("version", v).put("id", ids.get(v - 1));
                send(ex, 200, body.toString());
                return;
            }
        }
        send(ex, 404, "{\"error_code\":404}");
    }

    private static void send(HttpExchange ex, int status, String body) throws IOException {
        byte[] b = body.getBytes(StandardCharsets.UTF_8);
        ex.getResponseHeaders().set("Content-Type", "application/vnd.schemaregistry.v1+json");
        ex.sendResponseHeaders(status, b.length);
        try (OutputStream out = ex.getResponseBody()) {
            out.write(b);
        }
    }

    @Override
    public void close() {
        server.stop(0);
    }
}
