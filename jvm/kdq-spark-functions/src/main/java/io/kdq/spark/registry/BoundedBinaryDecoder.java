package io.kdq.spark.registry;

import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;

import org.apache.avro.io.Decoder;
import org.apache.avro.util.Utf8;

/**
 * Avro's binary encoding read from one byte array, every length checked against the bytes left before anything
 * is allocated. Avro's own {@code BinaryDecoder} allocates a string's or bytes' claimed length first (up to
 * {@code org.apache.avro.limits.*}, 2 GB by default, a JVM-wide setting shared with Spark's Avro reader): a
 * 6-byte Kafka value could make an executor run out of memory. Here a length past the payload's end is a
 * truncation, found before any allocation. Also strict where the specification is: a boolean byte other than
 * 0/1, a varint longer than 5 (int) or 10 (long) bytes, a negative length or block size, {@code Long.MIN_VALUE}
 * as a block count (its negation overflows) are malformed. Reused per thread ({@link #reset}); not thread-safe.
 */
final class BoundedBinaryDecoder extends Decoder {
    private byte[] buf;
    private int pos;
    private int limit;

    /** The payload ends before the value does. No stack trace: truncated records may be frequent. */
    static final class Truncated extends EOFException {
        private static final long serialVersionUID = 1L;

        @Override
        public synchronized Throwable fillInStackTrace() {
            return this;
        }
    }

    void reset(byte[] value, int offset) {
        this.buf = value;
        this.pos = offset;
        this.limit = value == null ? 0 : value.length;
    }

    int remaining() {
        return limit - pos;
    }

    private int next() throws EOFException {
        if (pos >= limit) {
            throw new Truncated();
        }
        return buf[pos++] & 0xff;
    }

    @Override
    public void readNull() {
    }

    @Override
    public boolean readBoolean() throws IOException {
        int b = next();
        if (b > 1) {
            throw new MalformedData("boolean byte " + b);
        }
        return b == 1;
    }

    @Override
    public int readInt() throws IOException {
        int n = 0;
        for (int shift = 0; shift < 35; shift += 7) {
            int b = next();
            n |= (b & 0x7f) << shift;
            if (b < 0x80) {
                return (n >>> 1) ^ -(n & 1);
            }
        }
        throw new MalformedData("int varint longer than 5 bytes");
    }

    @Override
    public long readLong() throws IOException {
        long n = 0;
        for (int shift = 0; shift < 70; shift += 7) {
            int b = next();
            n |= (long) (b & 0x7f) << shift;
            if (b < 0x80) {
                return (n >>> 1) ^ -(n & 1);
            }
        }
        throw new MalformedData("long varint longer than 10 bytes");
    }

    @Override
    public float readFloat() throws IOException {
        need(4);
        int bits = (buf[pos] & 0xff) | (buf[pos + 1] & 0xff) << 8 | (buf[pos + 2] & 0xff) << 16
                | (buf[pos + 3] & 0xff) << 24;
        pos += 4;
        return Float.intBitsToFloat(bits);
    }

    @Override
    public double readDouble() throws IOException {
        need(8);
        long bits = 0;
        for (int i = 7; i >= 0; i--) {
            bits = bits << 8 | (buf[pos + i] & 0xff);
        }
        pos += 8;
        return Double.longBitsToDouble(bits);
    }

    /** A length prefix, checked against the bytes left. */
    private int length() throws IOException {
        long len = readLong();
        if (len < 0) {
            throw new MalformedData("negative length " + len);
        }
        if (len > limit - pos) {
            throw new Truncated();
        }
        return (int) len;
    }

    private void need(int n) throws EOFException {
        if (n > limit - pos) {
            throw new Truncated();
        }
    }

    @Override
    public Utf8 readString(Utf8 old) throws IOException {
        int len = length();
        Utf8 out = old != null ? old : new Utf8();
        out.setByteLength(len);
        System.arraycopy(buf, pos, out.getBytes(), 0, len);
        pos += len;
        return out;
    }

    @Override
    public String readString() throws IOException {
        int len = length();
        String s = new String(buf, pos, len, StandardCharsets.UTF_8);
        pos += len;
        return s;
    }

    @Override
    public void skipString() throws IOException {
        pos += length();
    }

    @Override
    public ByteBuffer readBytes(ByteBuffer old) throws IOException {
        int len = length();
        byte[] copy = new byte[len];
        System.arraycopy(buf, pos, copy, 0, len);
        pos += len;
        return ByteBuffer.wrap(copy);
    }

    @Override
    public void skipBytes() throws IOException {
        pos += length();
    }

    @Override
    public void readFixed(byte[] bytes, int start, int length) throws IOException {
        need(length);
        System.arraycopy(buf, pos, bytes, start, length);
        pos += length;
    }

    @Override
    public void skipFixed(int length) throws IOException {
        need(length);
        pos += length;
    }

    @Override
    public int readEnum() throws IOException {
        return readInt();
    }

    @Override
    public int readIndex() throws IOException {
        return readInt();
    }

    /** A block's item count; a negative count is followed by the block's size in bytes (read and checked). */
    private long blockCount() throws IOException {
        long n = readLong();
        if (n < 0) {
            if (n == Long.MIN_VALUE) {
                throw new MalformedData("block count Long.MIN_VALUE");
            }
            n = -n;
            long size = readLong();
            if (size < 0 || size > limit - pos) {
                throw new MalformedData("block size " + size);
            }
        }
        return n;
    }

    /** Skips whole blocks when their byte size is given; else returns the first count to skip item by item. */
    private long skipBlocks() throws IOException {
        while (true) {
            long n = readLong();
            if (n >= 0) {
                return n;
            }
            if (n == Long.MIN_VALUE) {
                throw new MalformedData("block count Long.MIN_VALUE");
            }
            long size = readLong();
            if (size < 0 || size > limit - pos) {
                throw new MalformedData("block size " + size);
            }
            pos += (int) size;
        }
    }

    @Override
    public long readArrayStart() throws IOException {
        return blockCount();
    }

    @Override
    public long arrayNext() throws IOException {
        return blockCount();
    }

    @Override
    public long skipArray() throws IOException {
        return skipBlocks();
    }

    @Override
    public long readMapStart() throws IOException {
        return blockCount();
    }

    @Override
    public long mapNext() throws IOException {
        return blockCount();
    }

    @Override
    public long skipMap() throws IOException {
        return skipBlocks();
    }
}
