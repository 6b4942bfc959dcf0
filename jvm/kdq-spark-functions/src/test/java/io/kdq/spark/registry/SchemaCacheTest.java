package io.kdq.spark.registry;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.junit.jupiter.api.Test;

/**
 * The registry asked once per id and subject (never per record), through outages: ids already seen keep their
 * verdicts, an unseen id is a {@link RegistryUnavailableException} (the batch retries), never a verdict. Against
 * an HTTP registry in this JVM, with the cache's clock driven by the test.
 */
class SchemaCacheTest {
    private static final long MINUTE = 60_000_000_000L;

    static byte[] order(int id) {
        return Avro.frame(id, Avro.encode(Orders.PARSED, Orders.order(2, null)));
    }

    @Test
    void eachIdIsFetchedOnceHoweverManyRecordsAndThreads() throws Exception {
        try (FakeRegistry registry = new FakeRegistry()) {
            int id = registry.register("orders-value", "AVRO", Orders.SCHEMA);
            RegistryDecoder decoder = new RegistryDecoder(new SchemaCache(
                    new HttpSchemaSource(registry.url(), null, Duration.ofSeconds(5)), MINUTE, System::nanoTime));
            byte[] value = order(id);
            byte[] unknown = order(77);
            ExecutorService pool = Executors.newFixedThreadPool(4);
            try {
                List<Future<?>> done = new ArrayList<>();
                for (int t = 0; t < 4; t++) {
                    done.add(pool.submit(() -> {
                        for (int i = 0; i < 2_000; i++) {
                            assertNull(decoder.decode("orders-value", value).problem);
                            assertEquals("unknown_schema_id", decoder.decode("orders-value", unknown).problem);
                        }
                    }));
                }
                for (Future<?> f : done) {
                    f.get(30, TimeUnit.SECONDS);
                }
            } finally {
                pool.shutdownNow();
            }
            assertEquals(2, registry.count("id"), "one GET /schemas/ids/{id} per id");
            assertEquals(1, registry.count("versions"));
            assertEquals(1, registry.count("version"));
        }
    }

    @Test
    void anOutageKeepsTheVerdictsOfSeenIdsAndRetriesUnseenOnes() throws Exception {
        try (FakeRegistry registry = new FakeRegistry()) {
            AtomicLong clock = new AtomicLong();
            int orders = registry.register("orders-value", "AVRO", Orders.SCHEMA);
            int foreign = registry.register("customers-value", "AVRO",
                    Orders.PARSED.getField("customer").schema().toString());
            RegistryDecoder decoder = new RegistryDecoder(new SchemaCache(
                    new HttpSchemaSource(registry.url(), null, Duration.ofSeconds(2)), MINUTE, clock::get));
            byte[] bad = order(orders).clone();
            bad[bad.length - 1] = 7; // the 'gift' boolean
            assertNull(decoder.decode("orders-value", order(orders)).problem);
            assertEquals("avro:/gift", decoder.decode("orders-value", bad).problem);
            assertEquals("unknown_schema_id", decoder.decode("orders-value", order(99)).problem);
            assertEquals("schema_not_for_subject", decoder.decode("orders-value", order(foreign)).problem);
            int requests = registry.requests.get();

            registry.down = true;
            clock.addAndGet(5 * MINUTE); // negative answers are due for a re-check: it fails, they stand
            for (int i = 0; i < 3; i++) {
                assertNull(decoder.decode("orders-value", order(orders)).problem);
                assertEquals("avro:/gift", decoder.decode("orders-value", bad).problem);
                assertEquals("unknown_schema_id", decoder.decode("orders-value", order(99)).problem);
                assertEquals("schema_not_for_subject", decoder.decode("orders-value", order(foreign)).problem);
            }
            int next = registry.register("orders-value", "AVRO",
                    Orders.SCHEMA.replace("\"name\":\"gift\",\"type\":\"boolean\"", "\"name\":\"gift\",\"type\":\"int\""));
            RegistryUnavailableException e = assertThrows(RegistryUnavailableException.class,
                    () -> decoder.decode("orders-value", order(next)));
            assertTrue(e.getMessage().contains("503"), e.getMessage());
            assertTrue(registry.requests.get() > requests, "the re-checks were tried");

            registry.down = false; // back: the retried batch decodes the new version, registered while running
            Verdict v = decoder.decode("orders-value", order(next));
            assertNull(v.problem, v.toString());
            assertEquals(next, v.schemaId);
            assertEquals(0, v.record.get("gift"), "read with the new version: the boolean false byte as the int 0");
        }
    }

    @Test
    void anUnreachableRegistryIsRetriableAndCredentialsAreSent() throws Exception {
        FakeRegistry registry = new FakeRegistry();
        int id = registry.register("orders-value", "AVRO", Orders.SCHEMA);
        registry.requiredAuthorization = HttpSchemaSource.basic("kdq", "s3cret");
        RegistryDecoder wrong = new RegistryDecoder(new SchemaCache(new HttpSchemaSource(registry.url(),
                HttpSchemaSource.bearer("nope"), Duration.ofSeconds(2)), MINUTE, System::nanoTime));
        RegistryUnavailableException denied = assertThrows(RegistryUnavailableException.class,
                () -> wrong.decode("orders-value", order(id)));
        assertTrue(denied.getMessage().contains("401"), denied.getMessage());
        assertEquals("Bearer nope", registry.lastAuthorization);
        RegistryDecoder right = new RegistryDecoder(new SchemaCache(new HttpSchemaSource(registry.url(),
                HttpSchemaSource.basic("kdq", "s3cret"), Duration.ofSeconds(2)), MINUTE, System::nanoTime));
        assertNull(right.decode("orders-value", order(id)).problem);
        String url = registry.url();
        registry.close(); // connection refused from now on
        RegistryDecoder refused = new RegistryDecoder(new SchemaCache(new HttpSchemaSource(url, null,
                Duration.ofSeconds(2)), MINUTE, System::nanoTime));
        assertThrows(RegistryUnavailableException.class, () -> refused.decode("orders-value", order(id)));
        assertNull(right.decode("orders-value", order(id)).problem, "seen before the registry went away");
    }

    @Test
    void subjectsWithAnyCharacterAreOnePathSegment() {
        assertEquals("a%20b%2Fc.d-value", HttpSchemaSource.segment("a b/c.d-value"));
    }
}
