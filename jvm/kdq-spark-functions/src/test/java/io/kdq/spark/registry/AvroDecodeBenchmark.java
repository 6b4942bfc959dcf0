package io.kdq.spark.registry;

import java.util.List;

import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;

/**
 * Not a test (nothing asserted): records/s on one thread through {@link RegistryDecoder#decode} for a ~1 KB
 * 'orders' record ({@link Orders}), valid and truncated, beside Avro's own reader alone (BinaryDecoder reused,
 * fast reader on) as the floor. Run after {@code mvn test-compile}:
 * {@code java -cp target/classes:target/test-classes:<avro and its jackson> io.kdq.spark.registry.AvroDecodeBenchmark [seconds]}.
 */
public final class AvroDecodeBenchmark {
    private AvroDecodeBenchmark() {
    }

    public static void main(String[] args) throws Exception {
        double seconds = args.length > 0 ? Double.parseDouble(args[0]) : 3;
        byte[] payload = Avro.encode(Orders.PARSED, Orders.order(34, null));
        byte[] value = Avro.frame(1, payload);
        byte[] truncated = java.util.Arrays.copyOf(value, value.length - 30);
        SchemaSource source = new SchemaSource() {
            @Override
            public RegisteredSchema schemaById(int id) {
                return id == 1 ? new RegisteredSchema(null, Orders.SCHEMA, null) : null;
            }

            @Override
            public List<Integer> versions(String subject) {
                return List.of(1);
            }

            @Override
            public SubjectVersion version(String subject, int version) {
                return new SubjectVersion(subject, 1, 1, schemaById(1));
            }
        };
        RegistryDecoder decoder = new RegistryDecoder(new SchemaCache(source, SchemaCache.DEFAULT_RECHECK_NANOS,
                System::nanoTime));
        System.out.printf("BENCH value %d bytes (payload %d)%n", value.length, payload.length);
        run("registry decode, valid", seconds, () -> {
            if (decoder.decode("orders-value", value).problem != null) {
                throw new AssertionError();
            }
        });
        run("registry decode + event time field", seconds, () -> {
            if (decoder.decode("orders-value", value).record.get("placed_at") == null) {
                throw new AssertionError();
            }
        });
        run("registry decode, truncated", seconds, () -> {
            if (!"avro:/lines/33/price".equals(decoder.decode("orders-value", truncated).problem)) {
                throw new AssertionError(decoder.decode("orders-value", truncated).problem);
            }
        });
        GenericDatumReader<Object> plain = new GenericDatumReader<>(Orders.PARSED, Orders.PARSED, new GenericData());
        BinaryDecoder[] reuse = {null};
        run("Avro alone (BinaryDecoder reused, fast reader)", seconds, () -> {
            reuse[0] = DecoderFactory.get().binaryDecoder(payload, reuse[0]);
            plain.read(null, reuse[0]);
        });
    }

    interface Body {
        void run() throws Exception;
    }

    static void run(String name, double seconds, Body body) throws Exception {
        long end = System.nanoTime() + (long) (seconds * 0.4e9);
        while (System.nanoTime() < end) { // warm-up
            body.run();
        }
        long n = 0;
        long t0 = System.nanoTime();
        end = t0 + (long) (seconds * 1e9);
        long now;
        do {
            for (int i = 0; i < 1000; i++) {
                body.run();
            }
            n += 1000;
            now = System.nanoTime();
        } while (now < end);
        double perSecond = n / ((now - t0) / 1e9);
        System.out.printf("BENCH %-48s %,12.0f records/s  %6.2f us/record%n", name, perSecond, 1e6 / perSecond);
    }
}
