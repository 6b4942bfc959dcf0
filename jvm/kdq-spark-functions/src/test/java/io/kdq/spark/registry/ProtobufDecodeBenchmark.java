package io.kdq.spark.registry;

import java.util.List;

import com.google.protobuf.DynamicMessage;

/**
 * Not a test (nothing asserted): records/s on one thread through {@link RegistryDecoder#decode} for a ~1 KB
 * Protobuf order ({@link ProtobufDecodingTest#ORDERS} with 30 lines), valid and truncated, beside protobuf-java's
 * DynamicMessage parse alone as the floor. Run after {@code mvn test-compile}:
 * {@code java -cp target/classes:target/test-classes:<protobuf-java, wire, okio, kotlin-stdlib>
 * io.kdq.spark.registry.ProtobufDecodeBenchmark [seconds]}.
 */
public final class ProtobufDecodeBenchmark {
    private ProtobufDecodeBenchmark() {
    }

    public static void main(String[] args) throws Exception {
        double seconds = args.length > 0 ? Double.parseDouble(args[0]) : 3;
        ProtobufDecodingTest.Pb order = ProtobufDecodingTest.order();
        for (int i = 0; i < 28; i++) {
            order.m(4, ProtobufDecodingTest.line("SKU-" + i + "-XXXXXXXX", i + 1, 10.5 + i));
        }
        byte[] payload = order.bytes();
        byte[] value = ProtobufDecodingTest.frame(1, new byte[] {0}, payload);
        byte[] truncated = java.util.Arrays.copyOf(value, value.length - 31);
        RegisteredSchema common = new RegisteredSchema("PROTOBUF", ProtobufDecodingTest.COMMON, null);
        RegisteredSchema orders = new RegisteredSchema("PROTOBUF", ProtobufDecodingTest.ORDERS,
                List.of(new SchemaReference("shop/common.proto", "shop-common", 1)));
        SchemaSource source = new SchemaSource() {
            @Override
            public RegisteredSchema schemaById(int id) {
                return id == 1 ? orders : null;
            }

            @Override
            public List<Integer> versions(String subject) {
                return List.of(1);
            }

            @Override
            public SubjectVersion version(String subject, int version) {
                return subject.equals("shop-common") ? new SubjectVersion(subject, 1, 2, common)
                        : new SubjectVersion(subject, 1, 1, orders);
            }
        };
        RegistryDecoder decoder = new RegistryDecoder(new SchemaCache(source, SchemaCache.DEFAULT_RECHECK_NANOS,
                System::nanoTime));
        System.out.printf("BENCH value %d bytes (payload %d)%n", value.length, payload.length);
        String cut = decoder.decode("orders-value", truncated).problem;
        AvroDecodeBenchmark.run("registry decode, valid", seconds, () -> {
            if (decoder.decode("orders-value", value).problem != null) {
                throw new AssertionError();
            }
        });
        AvroDecodeBenchmark.run("registry decode + event time field", seconds, () -> {
            if (decoder.decode("orders-value", value).record.get("placed_at") == null) {
                throw new AssertionError();
            }
        });
        AvroDecodeBenchmark.run("registry decode, truncated (" + cut + ")", seconds, () -> {
            if (!cut.equals(decoder.decode("orders-value", truncated).problem)) {
                throw new AssertionError();
            }
        });
        com.google.protobuf.Descriptors.Descriptor type = ((ProtobufSchemaDecoder) ProtobufSchemaDecoder.compile(1,
                orders, r -> common)).file.getMessageTypes().get(0);
        AvroDecodeBenchmark.run("DynamicMessage.parseFrom alone", seconds, () -> DynamicMessage.parseFrom(type, payload));
    }
}
