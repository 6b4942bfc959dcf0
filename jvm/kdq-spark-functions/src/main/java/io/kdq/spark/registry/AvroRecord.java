package io.kdq.spark.registry;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.time.Instant;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.util.List;
import java.util.Map;

import org.apache.avro.LogicalType;
import org.apache.avro.LogicalTypes;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericEnumSymbol;
import org.apache.avro.generic.GenericFixed;
import org.apache.avro.generic.IndexedRecord;
import org.apache.avro.util.Utf8;

/**
 * A decoded Avro value with its schema. Logical types are converted when a path is read, not while decoding:
 * most records are only counted, and a read converts the one field it returns.
 */
final class AvroRecord implements DecodedRecord {
    final Schema schema;
    final Object datum;

    AvroRecord(Schema schema, Object datum) {
        this.schema = schema;
        this.datum = datum;
    }

    @Override
    public Object get(String... path) {
        Schema s = schema;
        Object v = datum;
        for (String step : path) {
            if (v == null) {
                return null;
            }
            s = branch(s, v);
            switch (s.getType()) {
                case RECORD: {
                    Schema.Field f = s.getField(step);
                    if (f == null) {
                        return null;
                    }
                    v = ((IndexedRecord) v).get(f.pos());
                    s = f.schema();
                    break;
                }
                case MAP:
                    v = ((Map<?, ?>) v).get(new Utf8(step));
                    s = s.getValueType();
                    break;
                case ARRAY: {
                    List<?> list = (List<?>) v;
                    int i = PathSteps.arrayIndex(step);
                    if (i < 0 || i >= list.size()) {
                        return null;
                    }
                    v = list.get(i);
                    s = s.getElementType();
                    break;
                }
                default:
                    return null;
            }
        }
        return v == null ? null : plain(v, branch(s, v));
    }

    private static Schema branch(Schema s, Object v) {
        return s.getType() == Schema.Type.UNION ? s.getTypes().get(PathDatumReader.DATA.resolveUnion(s, v)) : s;
    }

    static Object plain(Object v, Schema s) {
        LogicalType lt = s.getLogicalType();
        if (lt != null) {
            Object converted = logical(v, s, lt);
            if (converted != null) {
                return converted;
            }
        }
        if (v instanceof Utf8 || v instanceof GenericEnumSymbol) {
            return v.toString();
        }
        if (v instanceof ByteBuffer) {
            ByteBuffer b = ((ByteBuffer) v).duplicate();
            byte[] out = new byte[b.remaining()];
            b.get(out);
            return out;
        }
        if (v instanceof GenericFixed) {
            return ((GenericFixed) v).bytes().clone();
        }
        return v;
    }

    private static Object logical(Object v, Schema s, LogicalType lt) {
        String name = lt.getName();
        if (v instanceof Long) {
            long x = (Long) v;
            switch (name) {
                case "timestamp-millis":
                    return Instant.ofEpochMilli(x);
                case "timestamp-micros":
                    return Instant.ofEpochSecond(Math.floorDiv(x, 1_000_000L), Math.floorMod(x, 1_000_000L) * 1000L);
                case "timestamp-nanos":
                    return Instant.ofEpochSecond(Math.floorDiv(x, 1_000_000_000L), Math.floorMod(x, 1_000_000_000L));
                case "local-timestamp-millis":
                    return LocalDateTime.ofEpochSecond(Math.floorDiv(x, 1000L),
                            (int) Math.floorMod(x, 1000L) * 1_000_000, ZoneOffset.UTC);
                case "local-timestamp-micros":
                    return LocalDateTime.ofEpochSecond(Math.floorDiv(x, 1_000_000L),
                            (int) Math.floorMod(x, 1_000_000L) * 1000, ZoneOffset.UTC);
                default:
                    return null;
            }
        }
        if (v instanceof Integer && name.equals("date")) {
            return LocalDate.ofEpochDay((Integer) v);
        }
        if (lt instanceof LogicalTypes.Decimal) {
            int scale = ((LogicalTypes.Decimal) lt).getScale();
            byte[] bytes = (byte[]) plain(v, Schema.create(Schema.Type.BYTES)); // the unscaled two's complement
            return bytes.length == 0 ? BigDecimal.ZERO.setScale(scale) : new BigDecimal(new BigInteger(bytes), scale);
        }
        if (name.equals("uuid") && v instanceof GenericFixed && ((GenericFixed) v).bytes().length == 16) {
            ByteBuffer b = ByteBuffer.wrap(((GenericFixed) v).bytes());
            return new java.util.UUID(b.getLong(), b.getLong()).toString();
        }
        return null; // uuid strings are strings; unknown logical types are their underlying type (the spec's rule)
    }

    @Override
    public String toString() {
        return String.valueOf(datum);
    }
}
