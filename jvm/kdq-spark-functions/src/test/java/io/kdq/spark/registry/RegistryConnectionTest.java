package io.kdq.spark.registry;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicReference;

import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import com.sun.net.httpserver.HttpsConfigurator;
import com.sun.net.httpserver.HttpsServer;

/**
 * The registry settings of the Spark configuration ({@code spark.kdq.registry.*}): an https:// registry signed by a
 * private CA is trusted through {@code ca.file} and refused without it (never a verdict: an outage), Confluent
 * Cloud's logical-cluster header is sent, a missing URL or a bad timeout is refused naming the setting.
 *
 * <p>{@code registry-tls/registry.p12}: a self-signed certificate for 127.0.0.1 made for this test with keytool
 * (password "changeit"); {@code registry-ca.pem} is its certificate.
 */
class RegistryConnectionTest {
    private static Path resource(String name) throws Exception {
        return Path.of(RegistryConnectionTest.class.getResource("/registry-tls/" + name).toURI());
    }

    private static HttpsServer httpsRegistry(AtomicReference<String> clusterHeader) throws Exception {
        KeyStore keys = KeyStore.getInstance("PKCS12");
        try (InputStream in = Files.newInputStream(resource("registry.p12"))) {
            keys.load(in, "changeit".toCharArray());
        }
        KeyManagerFactory kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
        kmf.init(keys, "changeit".toCharArray());
        SSLContext ssl = SSLContext.getInstance("TLS");
        ssl.init(kmf.getKeyManagers(), null, null);
        HttpsServer server = HttpsServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        server.setHttpsConfigurator(new HttpsConfigurator(ssl));
        server.createContext("/", ex -> {
            clusterHeader.set(ex.getRequestHeaders().getFirst("target-sr-cluster"));
            byte[] body = "[1,2]".getBytes(StandardCharsets.UTF_8);
            ex.sendResponseHeaders(200, body.length);
            try (OutputStream out = ex.getResponseBody()) {
                out.write(body);
            }
        });
        server.start();
        return server;
    }

    @Test
    void aPrivateCaIsTrustedThroughTheCaFileAndTheClusterHeaderIsSent() throws Exception {
        AtomicReference<String> cluster = new AtomicReference<>();
        HttpsServer server = httpsRegistry(cluster);
        try {
            Map<String, String> conf = new HashMap<>();
            conf.put(RegistryConnection.URL, "https://127.0.0.1:" + server.getAddress().getPort() + "/");
            conf.put(RegistryConnection.BEARER_TOKEN, "t0ken");
            conf.put(RegistryConnection.LOGICAL_CLUSTER, "lsrc-123");
            conf.put(RegistryConnection.TIMEOUT_MS, "5000");
            // Without the CA: the handshake fails, an outage (the task fails and is retried), never a verdict.
            RegistryDecoder untrusted = RegistryConnection.fromConf(conf::get);
            assertThrows(RegistryUnavailableException.class, () -> untrusted.checkReachable("orders-value"));

            conf.put(RegistryConnection.CA_FILE, resource("registry-ca.pem").toString());
            RegistryDecoder trusted = RegistryConnection.fromConf(conf::get);
            assertEquals(2, trusted.checkReachable("orders-value"));
            assertEquals("lsrc-123", cluster.get());
        } finally {
            server.stop(0);
        }
    }

    @Test
    void badSettingsAreRefusedNamingThem(@TempDir Path dir) throws Exception {
        IllegalArgumentException none = assertThrows(IllegalArgumentException.class,
                () -> RegistryConnection.fromConf(key -> null));
        assertTrue(none.getMessage().contains("none is configured"), none.getMessage());

        Map<String, String> conf = new HashMap<>(Map.of(RegistryConnection.URL, "http://127.0.0.1:1",
                RegistryConnection.TIMEOUT_MS, "soon"));
        IllegalArgumentException timeout = assertThrows(IllegalArgumentException.class,
                () -> RegistryConnection.fromConf(conf::get));
        assertTrue(timeout.getMessage().contains(RegistryConnection.TIMEOUT_MS), timeout.getMessage());

        Path empty = Files.writeString(dir.resolve("empty.pem"), "");
        IllegalArgumentException noCert = assertThrows(IllegalArgumentException.class,
                () -> RegistryConnection.trusting(empty));
        assertTrue(noCert.getMessage().contains("holds no certificate"), noCert.getMessage());
        IllegalArgumentException absent = assertThrows(IllegalArgumentException.class,
                () -> RegistryConnection.trusting(dir.resolve("absent.pem")));
        assertTrue(absent.getMessage().contains("absent.pem cannot be used"), absent.getMessage());
    }
}
