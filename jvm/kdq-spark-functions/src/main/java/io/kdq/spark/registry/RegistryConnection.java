package io.kdq.spark.registry;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Duration;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.util.HexFormat;
import java.util.Map;
import java.util.Objects;
import java.util.TreeMap;
import java.util.function.Function;

import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;

/**
 * The Schema Registry the classifier asks, from the Spark configuration: {@code spark.kdq.registry.url} and its
 * credentials ({@code .username} with {@code .password}, or {@code .bearer.token} with {@code .logical.cluster} on
 * Confluent Cloud), {@code .ca.file} (a PEM file of the CAs of an https:// registry, present on every machine that
 * runs an executor), {@code .timeout.ms}. kdq's
 * Python side sets them from {@code [registry]} (kdq.spark.session.spark_conf; the secrets reach spark-submit in
 * a properties file, never on a command line, and Spark's UI redacts them). The connection is deliberately not
 * part of the rules document the classifier compiles: that document is stored with every micro-batch in the
 * stream's checkpoint, and a password has no place there.
 *
 * <p>Every executor reads the same settings (Spark ships its configuration to them) and keeps one
 * {@link SchemaCache} per registry and credentials ({@link SchemaCache#shared}).
 */
public final class RegistryConnection {
    public static final String URL = "spark.kdq.registry.url";
    public static final String USERNAME = "spark.kdq.registry.username";
    public static final String PASSWORD = "spark.kdq.registry.password";
    public static final String BEARER_TOKEN = "spark.kdq.registry.bearer.token";
    public static final String TIMEOUT_MS = "spark.kdq.registry.timeout.ms";
    public static final String LOGICAL_CLUSTER = "spark.kdq.registry.logical.cluster";
    public static final String CA_FILE = "spark.kdq.registry.ca.file";

    private RegistryConnection() {
    }

    /**
     * The decoder over the registry the Spark configuration names.
     *
     * @throws IllegalArgumentException when no registry is configured (a rule with {@code registry = true} then
     *                                  cannot judge anything: the job must not start)
     */
    public static RegistryDecoder fromSparkEnv() {
        SparkEnv env = SparkEnv.get();
        SparkConf conf = env == null ? null : env.conf();
        return fromConf(key -> conf == null ? null : conf.get(key, null));
    }

    /** {@link #fromSparkEnv} over any source of the settings ({@code setting.apply(key)}: the value or null). */
    public static RegistryDecoder fromConf(Function<String, String> setting) {
        String url = Objects.requireNonNullElse(setting.apply(URL), "").trim();
        if (url.isEmpty()) {
            throw new IllegalArgumentException("uses the Schema Registry but none is configured: set [registry] url in"
                    + " kdq.toml (or KDQ_REGISTRY__URL), or start the local stack's registry with `make run`");
        }
        String user = Objects.requireNonNullElse(setting.apply(USERNAME), "");
        String token = Objects.requireNonNullElse(setting.apply(BEARER_TOKEN), "");
        String authorization = null;
        if (!user.isEmpty()) {
            authorization = HttpSchemaSource.basic(user, Objects.requireNonNullElse(setting.apply(PASSWORD), ""));
        } else if (!token.isEmpty()) {
            authorization = HttpSchemaSource.bearer(token);
        }
        String timeout = setting.apply(TIMEOUT_MS);
        long timeoutMs;
        try {
            timeoutMs = timeout == null ? 10_000L : Long.parseLong(timeout.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(TIMEOUT_MS + " must be a number of milliseconds, not '" + timeout + "'");
        }
        Map<String, String> headers = new TreeMap<>();
        String cluster = Objects.requireNonNullElse(setting.apply(LOGICAL_CLUSTER), "");
        if (!cluster.isEmpty()) {
            headers.put("target-sr-cluster", cluster); // Confluent Cloud's registry, with a bearer token
        }
        String caFile = Objects.requireNonNullElse(setting.apply(CA_FILE), "");
        SSLContext ssl = caFile.isEmpty() ? null : trusting(Path.of(caFile));
        return decoder(url, authorization, headers, ssl, caFile, Duration.ofMillis(timeoutMs));
    }

    /** The decoder over one registry, sharing its JVM-wide cache with every other user of the same registry. */
    public static RegistryDecoder decoder(String url, String authorization, Duration timeout) {
        return decoder(url, authorization, Map.of(), null, "", timeout);
    }

    private static RegistryDecoder decoder(String url, String authorization, Map<String, String> headers,
            SSLContext ssl, String trust, Duration timeout) {
        String key = url + "#" + digest((authorization == null ? "" : authorization) + "\u0000" + headers + "\u0000"
                + trust);
        return new RegistryDecoder(SchemaCache.shared(key,
                () -> new HttpSchemaSource(url, authorization, headers, ssl, timeout)));
    }

    /**
     * A TLS context trusting exactly the certificate authorities of a PEM file ({@code [registry] ca_file}).
     *
     * @throws IllegalArgumentException naming the file when it cannot be read or holds no certificate
     */
    public static SSLContext trusting(Path pem) {
        try (InputStream in = Files.newInputStream(pem)) {
            KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
            store.load(null, null);
            int n = 0;
            for (Certificate cert : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
                store.setCertificateEntry("ca-" + n++, cert);
            }
            if (n == 0) {
                throw new IllegalArgumentException("registry CA file " + pem + " holds no certificate");
            }
            TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            tmf.init(store);
            SSLContext ssl = SSLContext.getInstance("TLS");
            ssl.init(null, tmf.getTrustManagers(), null);
            return ssl;
        } catch (IOException | GeneralSecurityException e) {
            throw new IllegalArgumentException("registry CA file " + pem + " cannot be used: " + e.getMessage(), e);
        }
    }

    private static String digest(String s) {
        try {
            return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(s.getBytes(StandardCharsets.UTF_8)));
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }
}
