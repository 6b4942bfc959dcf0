package io.kdq.spark.registry;

import java.util.HashMap;
import java.util.Locale;
import java.util.Map;

import com.google.protobuf.AnyProto;
import com.google.protobuf.ApiProto;
import com.google.protobuf.DescriptorProtos.DescriptorProto;
import com.google.protobuf.DescriptorProtos.EnumDescriptorProto;
import com.google.protobuf.DescriptorProtos.EnumOptions;
import com.google.protobuf.DescriptorProtos.EnumValueDescriptorProto;
import com.google.protobuf.DescriptorProtos.FieldDescriptorProto;
import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.DescriptorProtos.MessageOptions;
import com.google.protobuf.DescriptorProtos.OneofDescriptorProto;
import com.google.protobuf.DescriptorProtos;
import com.google.protobuf.Descriptors.DescriptorValidationException;
import com.google.protobuf.Descriptors.FileDescriptor;
import com.google.protobuf.DurationProto;
import com.google.protobuf.EmptyProto;
import com.google.protobuf.FieldMaskProto;
import com.google.protobuf.SourceContextProto;
import com.google.protobuf.StructProto;
import com.google.protobuf.TimestampProto;
import com.google.protobuf.TypeProto;
import com.google.protobuf.WrappersProto;
import com.squareup.wire.Syntax;
import com.squareup.wire.schema.Field;
import com.squareup.wire.schema.Location;
import com.squareup.wire.schema.internal.parser.EnumConstantElement;
import com.squareup.wire.schema.internal.parser.EnumElement;
import com.squareup.wire.schema.internal.parser.ExtensionsElement;
import com.squareup.wire.schema.internal.parser.FieldElement;
import com.squareup.wire.schema.internal.parser.GroupElement;
import com.squareup.wire.schema.internal.parser.MessageElement;
import com.squareup.wire.schema.internal.parser.OneOfElement;
import com.squareup.wire.schema.internal.parser.OptionElement;
import com.squareup.wire.schema.internal.parser.ProtoFileElement;
import com.squareup.wire.schema.internal.parser.ProtoParser;
import com.squareup.wire.schema.internal.parser.TypeElement;

/**
 * .proto text (proto2 or proto3, as a registry serves it) to protobuf-java {@link FileDescriptor}s: Square Wire's
 * parser reads the text into its syntax tree, which is written out here as a {@code FileDescriptorProto} (type
 * names as written: protobuf-java's {@code FileDescriptor.buildFrom} resolves them by protoc's scoping rules and
 * checks the file as protoc would). Maps become their synthetic {@code XxxEntry} messages, proto2 groups their
 * nested messages, proto3 {@code optional} fields their synthetic oneofs. The imports of Google's well-known types
 * ({@code google/protobuf/timestamp.proto}...) are protobuf-java's own copies unless the registry gave them as
 * references. Options other than those that change decoding ({@code map_entry}, {@code allow_alias},
 * {@code packed}, {@code default}, {@code json_name}) are dropped; services, {@code extend} blocks and editions
 * ({@code edition = "2023"}: Wire's parser refuses them) are not read.
 */
final class ProtoFiles {
    /** Well-known types by import path: registries (Confluent's serializers) do not register them as references. */
    static final Map<String, FileDescriptor> WELL_KNOWN = new HashMap<>();

    static {
        for (FileDescriptor f : new FileDescriptor[] {AnyProto.getDescriptor(), ApiProto.getDescriptor(),
                DurationProto.getDescriptor(), EmptyProto.getDescriptor(), FieldMaskProto.getDescriptor(),
                SourceContextProto.getDescriptor(), StructProto.getDescriptor(), TimestampProto.getDescriptor(),
                TypeProto.getDescriptor(), WrappersProto.getDescriptor(), DescriptorProtos.getDescriptor()}) {
            WELL_KNOWN.put(f.getName(), f);
        }
    }

    private static final Map<String, FieldDescriptorProto.Type> SCALARS = new HashMap<>();

    static {
        SCALARS.put("double", FieldDescriptorProto.Type.TYPE_DOUBLE);
        SCALARS.put("float", FieldDescriptorProto.Type.TYPE_FLOAT);
        SCALARS.put("int64", FieldDescriptorProto.Type.TYPE_INT64);
        SCALARS.put("uint64", FieldDescriptorProto.Type.TYPE_UINT64);
        SCALARS.put("int32", FieldDescriptorProto.Type.TYPE_INT32);
        SCALARS.put("fixed64", FieldDescriptorProto.Type.TYPE_FIXED64);
        SCALARS.put("fixed32", FieldDescriptorProto.Type.TYPE_FIXED32);
        SCALARS.put("bool", FieldDescriptorProto.Type.TYPE_BOOL);
        SCALARS.put("string", FieldDescriptorProto.Type.TYPE_STRING);
        SCALARS.put("bytes", FieldDescriptorProto.Type.TYPE_BYTES);
        SCALARS.put("uint32", FieldDescriptorProto.Type.TYPE_UINT32);
        SCALARS.put("sfixed32", FieldDescriptorProto.Type.TYPE_SFIXED32);
        SCALARS.put("sfixed64", FieldDescriptorProto.Type.TYPE_SFIXED64);
        SCALARS.put("sint32", FieldDescriptorProto.Type.TYPE_SINT32);
        SCALARS.put("sint64", FieldDescriptorProto.Type.TYPE_SINT64);
    }

    private ProtoFiles() {
    }

    private static final java.util.regex.Pattern BASE64 = java.util.regex.Pattern.compile("[A-Za-z0-9+/]+={0,2}");

    /**
     * A registered Protobuf schema: .proto text, or the base64 of a serialized {@code FileDescriptorProto}, which
     * is what Confluent's Python serializer registers (and Apicurio keeps as it came); the latter is taken as it
     * is, its message order protoc's.
     */
    static FileDescriptorProto parseSchema(String name, String schema) {
        String compact = schema.strip();
        if (BASE64.matcher(compact).matches()) {
            try {
                FileDescriptorProto proto = FileDescriptorProto.parseFrom(java.util.Base64.getDecoder().decode(compact));
                if (proto.getMessageTypeCount() > 0 || proto.getEnumTypeCount() > 0) {
                    return proto.hasName() ? proto : proto.toBuilder().setName(name).build();
                }
            } catch (IllegalArgumentException | com.google.protobuf.InvalidProtocolBufferException e) {
                // not a descriptor: parsed as .proto text below (and refused there, naming the problem)
            }
        }
        return parse(name, schema);
    }

    /** Parses {@code text} (named {@code name}, as its importers import it). IllegalArgumentException when Wire refuses it. */
    static FileDescriptorProto parse(String name, String text) {
        ProtoFileElement file;
        try {
            file = ProtoParser.Companion.parse(Location.get(name), text);
        } catch (RuntimeException e) {
            throw new IllegalArgumentException(name + ": " + e.getMessage(), e);
        }
        return toProto(name, file);
    }

    /**
     * Builds {@code proto} against its imports, found in {@code imports} by import path (else among the
     * well-known types); an import found nowhere is an IllegalArgumentException.
     */
    static FileDescriptor build(FileDescriptorProto proto, Map<String, FileDescriptor> imports)
            throws DescriptorValidationException {
        FileDescriptor[] deps = new FileDescriptor[proto.getDependencyCount()];
        for (int i = 0; i < deps.length; i++) {
            String path = proto.getDependency(i);
            FileDescriptor d = imports.get(path);
            if (d == null) {
                d = WELL_KNOWN.get(path);
            }
            if (d == null) {
                throw new IllegalArgumentException(proto.getName() + " imports " + path
                        + ", which is neither a reference of the schema nor a well-known type");
            }
            deps[i] = d;
        }
        return FileDescriptor.buildFrom(proto, deps);
    }

    static FileDescriptorProto toProto(String name, ProtoFileElement file) {
        boolean proto3 = file.getSyntax() == Syntax.PROTO_3;
        FileDescriptorProto.Builder b = FileDescriptorProto.newBuilder().setName(name);
        if (file.getPackageName() != null) {
            b.setPackage(file.getPackageName());
        }
        b.setSyntax(proto3 ? "proto3" : "proto2");
        for (String imp : file.getImports()) {
            b.addDependency(imp);
        }
        for (String imp : file.getPublicImports()) {
            b.addPublicDependency(b.getDependencyCount());
            b.addDependency(imp);
        }
        for (String imp : file.getWeakImports()) {
            b.addWeakDependency(b.getDependencyCount());
            b.addDependency(imp);
        }
        for (TypeElement t : file.getTypes()) {
            if (t instanceof MessageElement) {
                b.addMessageType(message((MessageElement) t, proto3));
            } else if (t instanceof EnumElement) {
                b.addEnumType(enumType((EnumElement) t));
            }
        }
        return b.build();
    }

    private static DescriptorProto message(MessageElement m, boolean proto3) {
        DescriptorProto.Builder b = DescriptorProto.newBuilder().setName(m.getName());
        for (TypeElement t : m.getNestedTypes()) {
            if (t instanceof MessageElement) {
                b.addNestedType(message((MessageElement) t, proto3));
            } else if (t instanceof EnumElement) {
                b.addEnumType(enumType((EnumElement) t));
            }
        }
        for (OneOfElement o : m.getOneOfs()) {
            b.addOneofDecl(OneofDescriptorProto.newBuilder().setName(o.getName()));
        }
        for (FieldElement f : m.getFields()) {
            FieldDescriptorProto.Builder fb = field(f, proto3, b);
            if (proto3 && f.getLabel() == Field.Label.OPTIONAL) {
                fb.setProto3Optional(true);
            }
            b.addField(fb);
        }
        for (GroupElement g : m.getGroups()) {
            group(g, b, label(g.getLabel(), proto3), -1, proto3);
        }
        int oneofIndex = 0;
        for (OneOfElement o : m.getOneOfs()) {
            for (FieldElement f : o.getFields()) {
                b.addField(field(f, proto3, b).setLabel(FieldDescriptorProto.Label.LABEL_OPTIONAL)
                        .setOneofIndex(oneofIndex));
            }
            for (GroupElement g : o.getGroups()) {
                group(g, b, FieldDescriptorProto.Label.LABEL_OPTIONAL, oneofIndex, proto3);
            }
            oneofIndex++;
        }
        // proto3 optional: a synthetic oneof each, after the real ones (protoc names them _<field>).
        for (int i = 0; i < b.getFieldCount(); i++) {
            FieldDescriptorProto f = b.getField(i);
            if (f.getProto3Optional()) {
                b.addOneofDecl(OneofDescriptorProto.newBuilder().setName(syntheticOneofName(b, f.getName())));
                b.setField(i, f.toBuilder().setOneofIndex(b.getOneofDeclCount() - 1));
            }
        }
        for (ExtensionsElement e : m.getExtensions()) {
            for (Object v : e.getValues()) {
                int[] r = range(v);
                b.addExtensionRange(DescriptorProto.ExtensionRange.newBuilder().setStart(r[0]).setEnd(r[1] + 1));
            }
        }
        return b.build();
    }

    private static String syntheticOneofName(DescriptorProto.Builder b, String field) {
        String name = "_" + field;
        boolean clash = true;
        while (clash) {
            clash = false;
            for (OneofDescriptorProto o : b.getOneofDeclList()) {
                if (o.getName().equals(name)) {
                    name = "X" + name;
                    clash = true;
                }
            }
        }
        return name;
    }

    /** An extension range: an Integer, or a Kotlin IntRange (read through its public getters). */
    private static int[] range(Object v) {
        if (v instanceof Integer) {
            return new int[] {(Integer) v, (Integer) v};
        }
        if (v instanceof kotlin.ranges.IntRange) {
            kotlin.ranges.IntRange r = (kotlin.ranges.IntRange) v;
            return new int[] {r.getFirst(), Math.min(r.getLast(), 536_870_911)};
        }
        throw new IllegalArgumentException("extension range " + v);
    }

    private static void group(GroupElement g, DescriptorProto.Builder parent, FieldDescriptorProto.Label label,
            int oneofIndex, boolean proto3) {
        DescriptorProto.Builder type = DescriptorProto.newBuilder().setName(g.getName());
        for (FieldElement f : g.getFields()) {
            type.addField(field(f, proto3, type));
        }
        parent.addNestedType(type);
        FieldDescriptorProto.Builder fb = FieldDescriptorProto.newBuilder()
                .setName(g.getName().toLowerCase(Locale.ROOT)).setNumber(g.getTag()).setLabel(label)
                .setType(FieldDescriptorProto.Type.TYPE_GROUP).setTypeName(g.getName());
        if (oneofIndex >= 0) {
            fb.setOneofIndex(oneofIndex);
        }
        parent.addField(fb);
    }

    private static FieldDescriptorProto.Label label(Field.Label label, boolean proto3) {
        if (label == null) {
            return FieldDescriptorProto.Label.LABEL_OPTIONAL;
        }
        switch (label) {
            case REQUIRED:
                return FieldDescriptorProto.Label.LABEL_REQUIRED;
            case REPEATED:
                return FieldDescriptorProto.Label.LABEL_REPEATED;
            default:
                return FieldDescriptorProto.Label.LABEL_OPTIONAL;
        }
    }

    /** One field; a map field adds its entry message to {@code owner}. */
    private static FieldDescriptorProto.Builder field(FieldElement f, boolean proto3, DescriptorProto.Builder owner) {
        FieldDescriptorProto.Builder b = FieldDescriptorProto.newBuilder().setName(f.getName()).setNumber(f.getTag())
                .setLabel(label(f.getLabel(), proto3));
        String type = f.getType();
        if (type.startsWith("map<") && type.endsWith(">")) {
            String[] kv = type.substring(4, type.length() - 1).split(",", 2);
            String entry = camel(f.getName()) + "Entry";
            owner.addNestedType(DescriptorProto.newBuilder().setName(entry)
                    .setOptions(MessageOptions.newBuilder().setMapEntry(true))
                    .addField(typed(FieldDescriptorProto.newBuilder().setName("key").setNumber(1)
                            .setLabel(FieldDescriptorProto.Label.LABEL_OPTIONAL), kv[0].trim()))
                    .addField(typed(FieldDescriptorProto.newBuilder().setName("value").setNumber(2)
                            .setLabel(FieldDescriptorProto.Label.LABEL_OPTIONAL), kv[1].trim())));
            b.setLabel(FieldDescriptorProto.Label.LABEL_REPEATED).setTypeName(entry);
        } else {
            typed(b, type);
        }
        if (f.getJsonName() != null) {
            b.setJsonName(f.getJsonName());
        }
        if (f.getDefaultValue() != null && b.getType() != FieldDescriptorProto.Type.TYPE_BYTES) {
            b.setDefaultValue(f.getDefaultValue());
        }
        for (OptionElement o : f.getOptions()) {
            if (!o.isParenthesized() && o.getName().equals("packed")) {
                b.getOptionsBuilder().setPacked(Boolean.parseBoolean(String.valueOf(o.getValue())));
            } else if (!o.isParenthesized() && o.getName().equals("default") && b.getDefaultValue().isEmpty()
                    && b.getType() != FieldDescriptorProto.Type.TYPE_BYTES) {
                b.setDefaultValue(String.valueOf(o.getValue()));
            }
        }
        return b;
    }

    private static FieldDescriptorProto.Builder typed(FieldDescriptorProto.Builder b, String type) {
        FieldDescriptorProto.Type scalar = SCALARS.get(type);
        if (scalar != null) {
            return b.setType(scalar);
        }
        return b.setTypeName(type); // message or enum: protobuf-java resolves the name and sets the type
    }

    /** protoc's map entry name: the field name in CamelCase (underscores dropped, the next letter upper case). */
    static String camel(String name) {
        StringBuilder sb = new StringBuilder();
        boolean upper = true;
        for (int i = 0; i < name.length(); i++) {
            char c = name.charAt(i);
            if (c == '_') {
                upper = true;
            } else if (upper) {
                sb.append(Character.toUpperCase(c));
                upper = false;
            } else {
                sb.append(c);
            }
        }
        return sb.toString();
    }

    private static EnumDescriptorProto enumType(EnumElement e) {
        EnumDescriptorProto.Builder b = EnumDescriptorProto.newBuilder().setName(e.getName());
        for (OptionElement o : e.getOptions()) {
            if (!o.isParenthesized() && o.getName().equals("allow_alias")) {
                b.setOptions(EnumOptions.newBuilder().setAllowAlias(Boolean.parseBoolean(String.valueOf(o.getValue()))));
            }
        }
        for (EnumConstantElement c : e.getConstants()) {
            b.addValue(EnumValueDescriptorProto.newBuilder().setName(c.getName()).setNumber(c.getTag()));
        }
        return b.build();
    }
}
