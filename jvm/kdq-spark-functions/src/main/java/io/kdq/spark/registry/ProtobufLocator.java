package io.kdq.spark.registry;

import java.io.IOException;

import com.google.protobuf.CodedInputStream;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.WireFormat;

/**
 * Where a Protobuf payload that protobuf-java refused (or accepted with a problem, see
 * {@link ProtobufSchemaDecoder}) goes wrong: the payload walked again field by field against the message's
 * descriptor, in byte order, with protobuf-java's {@link CodedInputStream}. The first of: a field whose bytes do
 * not read (truncated, a varint longer than 10 bytes, a length past its message's end), a known field number
 * with another wire type, a closed enum's unknown number, a proto3 string that is not UTF-8, nesting deeper than
 * protobuf-java's 100; or, once a message's bytes are read, a required field it lacks. The pointer names fields
 * by name, repeated elements by index (packed ones too), map values by key ({@code /attrs/colour}; the map field
 * itself when the key does not read); {@link RegistryReasons#ROOT} when the message's own bytes break (a bad tag,
 * an unknown field that does not skip) or when the walk finds nothing. Runs only on refused payloads.
 */
final class ProtobufLocator {
    /** protobuf-java's default recursion limit: a message nested deeper does not parse. */
    static final int MAX_DEPTH = 100;

    private final byte[] value;
    private final int start;

    private ProtobufLocator(byte[] value, int start) {
        this.value = value;
        this.start = start;
    }

    /** The pointer of the first problem of the payload at {@code value[start..]} as a {@code type}. */
    static String locate(Descriptor type, byte[] value, int start) {
        CodedInputStream in = CodedInputStream.newInstance(value, start, value.length - start);
        try {
            new ProtobufLocator(value, start).walk(type, in, -1, 0);
            return RegistryReasons.ROOT;
        } catch (DecodeFailure f) {
            return f.pointer();
        }
    }

    /** One message's fields up to the end of its bytes (or its end-group tag when {@code group} >= 0). */
    private void walk(Descriptor d, CodedInputStream in, int group, int depth) {
        int[] counts = new int[d.getFields().size()];
        boolean[] seen = new boolean[counts.length];
        while (true) {
            int tag;
            try {
                tag = in.readTag();
            } catch (IOException e) {
                throw new DecodeFailure(e);
            }
            if (tag == 0) {
                if (group >= 0) {
                    throw new DecodeFailure(new MalformedData("group without its end tag"));
                }
                break;
            }
            int number = WireFormat.getTagFieldNumber(tag);
            int wireType = WireFormat.getTagWireType(tag);
            if (wireType == WireFormat.WIRETYPE_END_GROUP) {
                if (number == group) {
                    break;
                }
                throw new DecodeFailure(new MalformedData("unexpected end-group tag " + number));
            }
            FieldDescriptor f = d.findFieldByNumber(number);
            if (f == null) {
                try {
                    if (!in.skipField(tag)) {
                        throw new DecodeFailure(new MalformedData("unexpected end-group tag"));
                    }
                } catch (IOException e) {
                    throw new DecodeFailure(e);
                }
                continue;
            }
            seen[f.getIndex()] = true;
            if (f.isMapField()) {
                mapEntry(f, wireType, in, depth);
            } else if (f.isRepeated()) {
                if (wireType == WireFormat.WIRETYPE_LENGTH_DELIMITED && f.isPackable()) {
                    counts[f.getIndex()] = packed(f, in, counts[f.getIndex()]);
                } else {
                    int i = counts[f.getIndex()]++;
                    try {
                        value(f, wireType, in, depth);
                    } catch (DecodeFailure e) {
                        throw e.under(Integer.toString(i)).under(f.getName());
                    } catch (IOException e) {
                        throw new DecodeFailure(e).under(Integer.toString(i)).under(f.getName());
                    }
                }
            } else {
                try {
                    value(f, wireType, in, depth);
                } catch (DecodeFailure e) {
                    throw e.under(f.getName());
                } catch (IOException e) {
                    throw new DecodeFailure(e).under(f.getName());
                }
            }
        }
        for (FieldDescriptor f : d.getFields()) {
            if (f.isRequired() && !seen[f.getIndex()]) {
                throw new DecodeFailure(new MalformedData("missing required field")).under(f.getName());
            }
        }
    }

    private static int expectedWireType(FieldDescriptor f) {
        return f.getLiteType().getWireType();
    }

    /** One value of {@code f} (an element, for a repeated field). */
    private void value(FieldDescriptor f, int wireType, CodedInputStream in, int depth) throws IOException {
        if (wireType != expectedWireType(f)) {
            throw new MalformedData("wire type " + wireType + " for a " + f.getType() + " field");
        }
        switch (f.getType()) {
            case MESSAGE: {
                if (depth + 1 >= MAX_DEPTH) {
                    throw new MalformedData("nested deeper than " + MAX_DEPTH);
                }
                int len = in.readRawVarint32();
                if (len < 0) {
                    throw new MalformedData("negative length");
                }
                int old = in.pushLimit(len);
                walk(f.getMessageType(), in, -1, depth + 1);
                in.popLimit(old);
                break;
            }
            case GROUP:
                if (depth + 1 >= MAX_DEPTH) {
                    throw new MalformedData("nested deeper than " + MAX_DEPTH);
                }
                walk(f.getMessageType(), in, f.getNumber(), depth + 1);
                break;
            default:
                scalar(f, in);
        }
    }

    private static void scalar(FieldDescriptor f, CodedInputStream in) throws IOException {
        switch (f.getType()) {
            case ENUM: {
                int n = in.readEnum();
                if (f.legacyEnumFieldTreatedAsClosed() && f.getEnumType().findValueByNumber(n) == null) {
                    throw new MalformedData("unknown value " + n + " of closed enum " + f.getEnumType().getFullName());
                }
                break;
            }
            case STRING:
                if (f.needsUtf8Check()) {
                    in.readStringRequireUtf8();
                } else {
                    in.readBytes();
                }
                break;
            case BYTES:
                in.readBytes();
                break;
            case DOUBLE:
            case FIXED64:
            case SFIXED64:
                in.readRawLittleEndian64();
                break;
            case FLOAT:
            case FIXED32:
            case SFIXED32:
                in.readRawLittleEndian32();
                break;
            default: // the varint types
                in.readRawVarint64();
        }
    }

    /** A packed run of {@code f}'s elements; returns the next element index. */
    private int packed(FieldDescriptor f, CodedInputStream in, int index) {
        int old;
        try {
            int len = in.readRawVarint32();
            if (len < 0) {
                throw new MalformedData("negative length");
            }
            old = in.pushLimit(len);
        } catch (IOException e) {
            throw new DecodeFailure(e).under(f.getName());
        }
        while (in.getBytesUntilLimit() > 0) {
            try {
                scalar(f, in);
            } catch (IOException e) {
                throw new DecodeFailure(e).under(Integer.toString(index)).under(f.getName());
            }
            index++;
        }
        in.popLimit(old);
        return index;
    }

    /** One map entry: its value's problems under its key, its key's (or the entry's own) under the map field. */
    private void mapEntry(FieldDescriptor f, int wireType, CodedInputStream in, int depth) {
        Descriptor entry = f.getMessageType();
        int old;
        int len;
        try {
            if (wireType != WireFormat.WIRETYPE_LENGTH_DELIMITED) {
                throw new MalformedData("wire type " + wireType + " for a map");
            }
            len = in.readRawVarint32();
            if (len < 0) {
                throw new MalformedData("negative length");
            }
            old = in.pushLimit(len);
        } catch (IOException e) {
            throw new DecodeFailure(e).under(f.getName());
        }
        String key = key(entry.findFieldByNumber(1), start + in.getTotalBytesRead(), len);
        try {
            walk(entry, in, -1, depth + 1);
        } catch (DecodeFailure e) {
            if ("value".equals(e.outermost()) && key != null) {
                throw e.replaceOutermost(key).under(f.getName());
            }
            throw new DecodeFailure(e.getCause()).under(f.getName());
        }
        in.popLimit(old);
    }

    /** The entry's key as {@link ProtobufRecord} spells it (the last one, as parsers keep), or null when it does not read. */
    private String key(FieldDescriptor keyField, int from, int len) {
        CodedInputStream in = CodedInputStream.newInstance(value, from, len);
        String key = ProtobufRecord.keyText(keyField, keyField.getDefaultValue());
        try {
            while (true) {
                int tag = in.readTag();
                if (tag == 0) {
                    return key;
                }
                if (WireFormat.getTagFieldNumber(tag) == 1 && WireFormat.getTagWireType(tag) == expectedWireType(keyField)) {
                    key = ProtobufRecord.keyText(keyField, readKey(keyField, in));
                } else if (!in.skipField(tag)) {
                    return null;
                }
            }
        } catch (IOException | RuntimeException e) {
            return null;
        }
    }

    private static Object readKey(FieldDescriptor f, CodedInputStream in) throws IOException {
        switch (f.getType()) {
            case INT32: return in.readInt32();
            case INT64: return in.readInt64();
            case UINT32: return in.readUInt32();
            case UINT64: return in.readUInt64();
            case SINT32: return in.readSInt32();
            case SINT64: return in.readSInt64();
            case FIXED32: return in.readFixed32();
            case FIXED64: return in.readFixed64();
            case SFIXED32: return in.readSFixed32();
            case SFIXED64: return in.readSFixed64();
            case BOOL: return in.readBool();
            case STRING: return f.needsUtf8Check() ? in.readStringRequireUtf8() : in.readString();
            default: throw new MalformedData("map key type " + f.getType());
        }
    }
}
