package io.kdq.spark.registry;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Function;

import com.google.protobuf.CodedInputStream;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.DescriptorValidationException;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.Descriptors.FileDescriptor;
import com.google.protobuf.DynamicMessage;
import com.google.protobuf.Message;

/**
 * A Protobuf schema from the registry, compiled once per id: its .proto text and the texts of its references
 * (imports, each by subject and version, built once per schema even when imported twice) parsed by Wire and
 * built into protobuf-java descriptors ({@link ProtoFiles}); each payload's message indexes pick the message, and
 * protobuf-java's {@link DynamicMessage} parses it.
 *
 * <p>protobuf-java accepts, as every protobuf parser must, some bytes that do not fit the schema: a known field
 * number with another wire type, and a closed (proto2) enum's unknown number, are kept as unknown fields; a
 * proto2 required field may be missing ({@code buildPartial}). Those are problems here, and so is whatever makes
 * the parser throw (truncated, a malformed varint or tag, an invalid wire type, a proto3 string that is not
 * UTF-8, nesting deeper than 100). Unknown field numbers are not: a newer writer's fields. Only a payload found
 * bad is walked again ({@link ProtobufLocator}) to name where: {@code protobuf:<pointer>}.
 */
final class ProtobufSchemaDecoder extends CompiledSchema {
    final FileDescriptor file;
    private final Descriptor first;
    /** Per message type: its message-typed fields (the ones {@link #clean} descends into). */
    private final ConcurrentHashMap<Descriptor, FieldDescriptor[]> messageFields = new ConcurrentHashMap<>();
    /** Per message type: whether a required field may be missing anywhere below it. */
    private final ConcurrentHashMap<Descriptor, Boolean> requiredBelow = new ConcurrentHashMap<>();

    private ProtobufSchemaDecoder(int id, FileDescriptor file) {
        super(id);
        this.file = file;
        this.first = file.getMessageTypes().isEmpty() ? null : file.getMessageTypes().get(0);
    }

    /**
     * Builds the schema's descriptors (references through {@code references}, which may throw
     * {@link RegistryUnavailableException}: then nothing is cached and the id is asked again). A .proto that Wire
     * or protobuf-java refuses, or a reference the registry does not have, is a fixed verdict
     * {@code internal_error:<Exception>} for its records.
     */
    static CompiledSchema compile(int id, RegisteredSchema registered,
            Function<SchemaReference, RegisteredSchema> references) {
        try {
            return new ProtobufSchemaDecoder(id,
                    build("kdq-registry-schema-" + id + ".proto", registered, references, new HashMap<>(), 0));
        } catch (RegistryUnavailableException e) {
            throw e;
        } catch (DescriptorValidationException | RuntimeException e) {
            return fixed(id, RegistryReasons.INTERNAL_ERROR_PREFIX + e.getClass().getSimpleName());
        }
    }

    private static FileDescriptor build(String name, RegisteredSchema s,
            Function<SchemaReference, RegisteredSchema> references, Map<String, FileDescriptor> built, int depth)
            throws DescriptorValidationException {
        if (depth > 64) {
            throw new IllegalArgumentException("schema references nested deeper than 64 (a loop?)");
        }
        if (!RegisteredSchema.PROTOBUF.equals(s.type())) {
            throw new IllegalArgumentException(name + " is a " + s.type() + " schema, imported by a Protobuf one");
        }
        Map<String, FileDescriptor> imports = new HashMap<>();
        for (SchemaReference ref : s.references()) {
            String key = ref.name() + "\u0000" + ref.subject() + "\u0000" + ref.version();
            FileDescriptor d = built.get(key);
            if (d == null) {
                d = build(ref.name(), references.apply(ref), references, built, depth + 1);
                built.put(key, d);
            }
            imports.put(ref.name(), d);
        }
        return ProtoFiles.build(ProtoFiles.parseSchema(name, s.schema()), imports);
    }

    /**
     * The message the indexes name (top-level message, then nested messages by position), or null.
     *
     * <p>Positions are those of the descriptor's nested types, and the two ways a schema is registered give the
     * two ecosystems' positions. A base64 {@code FileDescriptorProto} (what Confluent's Python, Go and .NET
     * serializers register) keeps protoc's order, where a map field's synthetic {@code XxxEntry} message sits
     * among the declared ones, as those clients count. A {@code .proto} text (what the Java serializer and most
     * registries' UIs register) is built by {@link ProtoFiles} with the declared messages first and the map entries
     * after them, so the declared messages' positions are the ones the Java serializer counts (it walks the
     * declared messages only).
     */
    Descriptor message(int[] indexes) {
        List<Descriptor> level = file.getMessageTypes();
        Descriptor d = null;
        for (int i = 1; i < indexes.length; i++) {
            if (indexes[i] >= level.size()) {
                return null;
            }
            d = level.get(indexes[i]);
            level = d.getNestedTypes();
        }
        return d;
    }

    /** The fully-qualified name of the message the payload's indexes name (what the serializers name). */
    @Override
    String recordName(byte[] value, int offset) {
        if (offset < value.length && value[offset] == 0) {
            return first == null ? null : first.getFullName();
        }
        try {
            Descriptor d = message(WireFormat.messageIndexes(value, offset));
            return d == null ? null : d.getFullName();
        } catch (IllegalArgumentException e) {
            return null;
        }
    }

    @Override
    Verdict decode(byte[] value, int offset) {
        Descriptor type;
        int start;
        if (offset < value.length && value[offset] == 0) { // [0]: the first message, the common case
            type = first;
            start = offset + 1;
        } else {
            int[] indexes;
            try {
                indexes = WireFormat.messageIndexes(value, offset);
            } catch (IllegalArgumentException e) {
                return Verdict.problem(RegistryReasons.PROTOBUF_PREFIX + RegistryReasons.MESSAGE_INDEX, id);
            }
            type = message(indexes);
            start = indexes[0];
        }
        if (type == null) {
            return Verdict.problem(RegistryReasons.PROTOBUF_PREFIX + RegistryReasons.MESSAGE_INDEX, id);
        }
        DynamicMessage message = null;
        try {
            CodedInputStream in = CodedInputStream.newInstance(value, start, value.length - start);
            DynamicMessage.Builder b = DynamicMessage.newBuilder(type);
            b.mergeFrom(in);
            if (in.isAtEnd()) { // else a stray end-group tag stopped the parser
                message = b.buildPartial();
            }
        } catch (IOException | RuntimeException e) {
            message = null;
        }
        if (message == null || !clean(message, 0) || (requiredBelow(type) && !message.isInitialized())) {
            return Verdict.problem(RegistryReasons.PROTOBUF_PREFIX + ProtobufLocator.locate(type, value, start), id);
        }
        return Verdict.decoded(id, new ProtobufRecord(message));
    }

    /** No unknown field carries a known field's number (another wire type, a closed enum's unknown value). */
    private boolean clean(Message m, int depth) {
        Descriptor d = m.getDescriptorForType();
        if (!m.getUnknownFields().isEmpty()) {
            for (int number : m.getUnknownFields().asMap().keySet()) {
                if (d.findFieldByNumber(number) != null) {
                    return false;
                }
            }
        }
        for (FieldDescriptor f : messageFields.computeIfAbsent(d, ProtobufSchemaDecoder::messageFieldsOf)) {
            if (f.isRepeated()) {
                for (int i = 0, n = m.getRepeatedFieldCount(f); i < n; i++) {
                    if (!clean((Message) m.getRepeatedField(f, i), depth + 1)) {
                        return false;
                    }
                }
            } else if (m.hasField(f) && !clean((Message) m.getField(f), depth + 1)) {
                return false;
            }
        }
        return true;
    }

    private static FieldDescriptor[] messageFieldsOf(Descriptor d) {
        List<FieldDescriptor> out = new ArrayList<>();
        for (FieldDescriptor f : d.getFields()) {
            if (f.getJavaType() == FieldDescriptor.JavaType.MESSAGE) {
                out.add(f);
            }
        }
        return out.toArray(new FieldDescriptor[0]);
    }

    private boolean requiredBelow(Descriptor d) {
        Boolean known = requiredBelow.get(d);
        if (known == null) {
            known = hasRequired(d, new java.util.HashSet<>());
            requiredBelow.put(d, known);
        }
        return known;
    }

    private static boolean hasRequired(Descriptor d, java.util.Set<Descriptor> seen) {
        if (!seen.add(d)) {
            return false;
        }
        for (FieldDescriptor f : d.getFields()) {
            if (f.isRequired()) {
                return true;
            }
            if (f.getJavaType() == FieldDescriptor.JavaType.MESSAGE && hasRequired(f.getMessageType(), seen)) {
                return true;
            }
        }
        return false;
    }
}
