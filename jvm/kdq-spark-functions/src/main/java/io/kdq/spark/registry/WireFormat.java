package io.kdq.spark.registry;

/**
 * Confluent's wire format: byte 0 is the magic byte 0, bytes 1-4 the schema id (big-endian), then the payload.
 * Protobuf payloads start with the message indexes (which message of the .proto file, nested ones by path): a
 * zig-zag varint count and that many zig-zag varint indexes, the single {@code 0} byte standing for
 * {@code [0]} (the file's first message).
 */
public final class WireFormat {
    public static final byte MAGIC = 0;
    public static final int HEADER = 5;

    private WireFormat() {
    }

    /** True when {@code value} has the magic byte and a whole header. */
    public static boolean framed(byte[] value) {
        return value != null && value.length >= HEADER && value[0] == MAGIC;
    }

    /** The header's schema id (call {@link #framed} first). */
    public static int schemaId(byte[] value) {
        return ((value[1] & 0xff) << 24) | ((value[2] & 0xff) << 16) | ((value[3] & 0xff) << 8) | (value[4] & 0xff);
    }

    /**
     * Protobuf message indexes from {@code value[offset]}: element 0 is the offset just after them, the rest the
     * indexes ({@code [next, 0]} for the single 0 byte).
     *
     * @throws IllegalArgumentException when they are truncated, negative, or more than the payload could hold
     */
    public static int[] messageIndexes(byte[] value, int offset) {
        int[] pos = {offset};
        int count = zigzag(value, pos);
        if (count == 0) {
            return new int[] {pos[0], 0};
        }
        if (count < 0 || count > value.length - pos[0]) {
            throw new IllegalArgumentException("message index count " + count);
        }
        int[] out = new int[count + 1];
        for (int i = 1; i <= count; i++) {
            out[i] = zigzag(value, pos);
            if (out[i] < 0) {
                throw new IllegalArgumentException("negative message index " + out[i]);
            }
        }
        out[0] = pos[0];
        return out;
    }

    private static int zigzag(byte[] b, int[] pos) {
        int n = 0;
        for (int shift = 0; shift < 35; shift += 7) {
            if (pos[0] >= b.length) {
                throw new IllegalArgumentException("truncated message indexes");
            }
            int x = b[pos[0]++] & 0xff;
            n |= (x & 0x7f) << shift;
            if (x < 0x80) {
                return (n >>> 1) ^ -(n & 1);
            }
        }
        throw new IllegalArgumentException("overlong varint in message indexes");
    }
}
