package io.kdq.spark.registry;

import java.math.BigInteger;
import java.time.Instant;
import java.util.List;

import com.google.protobuf.ByteString;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.EnumValueDescriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.Message;

/**
 * A decoded Protobuf message ({@link com.google.protobuf.DynamicMessage}) read by path: field names, repeated
 * elements by index, map values by key (as text: {@code "7"}, {@code "true"}, the string itself). A field with
 * presence (proto2 {@code optional}, proto3 {@code optional}, messages, oneof members) that is not set reads as
 * null; a proto3 field without presence reads as its value, the default included (0, "", the first enum value),
 * as proto3 defines it. Values: enums by name (an open enum's unknown number as the Integer), {@code bytes} as
 * byte[], {@code uint32}/{@code fixed32} as Long and {@code uint64}/{@code fixed64} as Long (BigInteger past
 * {@code Long.MAX_VALUE}), {@code google.protobuf.Timestamp} as {@link Instant}, the wrapper types
 * ({@code google.protobuf.Int64Value}...) as their value; other messages and repeated fields as protobuf-java's
 * objects (a Message, a List).
 */
final class ProtobufRecord implements DecodedRecord {
    final Message message;

    ProtobufRecord(Message message) {
        this.message = message;
    }

    @Override
    public Object get(String... path) {
        Object v = message;
        FieldDescriptor field = null;
        boolean list = false;
        for (String step : path) {
            if (list) {
                List<?> items = (List<?>) v;
                list = false;
                if (field.isMapField()) {
                    Descriptor entry = field.getMessageType();
                    FieldDescriptor key = entry.findFieldByNumber(1);
                    FieldDescriptor value = entry.findFieldByNumber(2);
                    Object found = null;
                    for (Object e : items) { // the last entry with the key wins, as in a parsed map
                        Message m = (Message) e;
                        if (step.equals(keyText(key, m.getField(key)))) {
                            found = m.getField(value);
                        }
                    }
                    if (found == null) {
                        return null;
                    }
                    v = found;
                    field = value;
                } else {
                    int i = PathSteps.arrayIndex(step);
                    if (i < 0 || i >= items.size()) {
                        return null;
                    }
                    v = items.get(i);
                }
            } else if (v instanceof Message) {
                Message m = (Message) v;
                FieldDescriptor f = m.getDescriptorForType().findFieldByName(step);
                if (f == null) {
                    return null;
                }
                field = f;
                if (f.isRepeated()) {
                    v = m.getField(f);
                    list = true;
                } else if (f.hasPresence() && !m.hasField(f)) {
                    return null;
                } else {
                    v = m.getField(f);
                }
            } else {
                return null;
            }
        }
        return list ? v : plain(v, field);
    }

    /** A map key as a path step: the number in decimal (unsigned types unsigned), true/false, the string. */
    static String keyText(FieldDescriptor keyField, Object key) {
        return String.valueOf(plain(key, keyField));
    }

    static Object plain(Object v, FieldDescriptor f) {
        if (f == null) {
            return v;
        }
        switch (f.getType()) {
            case UINT32:
            case FIXED32:
                return Integer.toUnsignedLong((Integer) v);
            case UINT64:
            case FIXED64: {
                long x = (Long) v;
                return x >= 0 ? (Object) x : new BigInteger(Long.toUnsignedString(x));
            }
            case ENUM: {
                EnumValueDescriptor e = (EnumValueDescriptor) v;
                return e.getType().findValueByNumber(e.getNumber()) == null ? (Object) e.getNumber() : e.getName();
            }
            case BYTES:
                return ((ByteString) v).toByteArray();
            case MESSAGE:
            case GROUP:
                return plain((Message) v);
            default:
                return v;
        }
    }

    /** Timestamp as Instant, a wrapper as its value, any other message as itself. */
    static Object plain(Message m) {
        Descriptor d = m.getDescriptorForType();
        String name = d.getFullName();
        if (!name.startsWith("google.protobuf.")) {
            return m;
        }
        if (name.equals("google.protobuf.Timestamp")) {
            long seconds = (Long) m.getField(d.findFieldByName("seconds"));
            int nanos = (Integer) m.getField(d.findFieldByName("nanos"));
            try {
                return Instant.ofEpochSecond(seconds, nanos);
            } catch (RuntimeException e) {
                return null; // outside Instant's range: no time
            }
        }
        if (name.endsWith("Value") && d.getFields().size() == 1 && d.getFields().get(0).getName().equals("value")) {
            FieldDescriptor value = d.getFields().get(0);
            return plain(m.getField(value), value);
        }
        return m;
    }

    @Override
    public String toString() {
        return String.valueOf(message);
    }
}
