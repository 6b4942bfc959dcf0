package io.kdq.spark.classify;

import java.lang.reflect.Field;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.Supplier;
import java.util.regex.PatternSyntaxException;

import com.networknt.schema.ExecutionConfig;
import com.networknt.schema.ExecutionContext;
import com.networknt.schema.Schema;
import com.networknt.schema.SchemaContext;
import com.networknt.schema.SchemaLocation;
import com.networknt.schema.SchemaRegistry;
import com.networknt.schema.SpecificationVersion;
import com.networknt.schema.format.Format;
import com.networknt.schema.format.Formats;
import com.networknt.schema.format.RegexFormat;
import com.networknt.schema.keyword.BaseKeywordValidator;
import com.networknt.schema.keyword.FormatValidator;
import com.networknt.schema.keyword.KeywordValidator;
import com.networknt.schema.keyword.NonValidationKeyword;
import com.networknt.schema.path.NodePath;

import tools.jackson.core.JacksonException;
import tools.jackson.core.JsonParser;
import tools.jackson.core.JsonToken;
import tools.jackson.databind.JsonNode;
import tools.jackson.databind.node.BooleanNode;
import tools.jackson.databind.node.DoubleNode;
import tools.jackson.databind.node.IntNode;
import tools.jackson.databind.node.LongNode;
import tools.jackson.databind.node.MissingNode;
import tools.jackson.databind.node.NullNode;
import tools.jackson.databind.node.StringNode;

/**
 * The common case in one pass: a record that is one JSON document and valid against its rule's schema, decided
 * on the parser's tokens, without building a tree and without networknt. Most records are valid, and for them
 * the tree and networknt's evaluation were most of the classifier's time.
 *
 * <p>It answers only "valid" (with the value at the rule's event-time field) or "don't know": every other record
 * goes the full way ({@link Json#parse} + {@link Evaluation}), which alone gives verdicts and reasons. So it
 * must never say valid when the full way would not:
 * <ul>
 *   <li>the schema is compiled only when every keyword a value can reach is one whose meaning is the same in
 *       drafts 6, 7, 2019-09 and 2020-12 (type, enum, const, required, properties, additionalProperties, items
 *       as one schema, the length, size and numeric bounds, allOf, anyOf, oneOf, not, format, a {@code $ref}
 *       to a JSON pointer in the same document); any other keyword makes its schema "don't know";</li>
 *   <li>a value is decided only when the answer is certain: a number that rounds to a bound, an integer
 *       written {@code 1.0}, a non-ASCII string under a length bound, a number under an enum with numbers:
 *       "don't know". {@code format} is asked of networknt itself, on that one string ({@link FormatCheck});</li>
 *   <li>what {@link Json} rejects (a duplicate key, trailing tokens, an exponent or a long number, a lone
 *       surrogate escape, a parser limit) is "don't know" here.</li>
 * </ul>
 * {@code ConformanceTest} (the JSON-Schema-Test-Suite) and {@code FastCheckTest} compare both ways.
 */
final class FastCheck {
    static final int VALID = 1;
    static final int INVALID = 0;
    static final int UNKNOWN = -1;

    /** Node evaluations per record before giving up (networknt's own step limit is far above). */
    private static final int MAX_STEPS = 50_000;
    /** Document depth followed here (the recursion's depth); deeper: don't know. */
    private static final int MAX_DEPTH = 64;
    /** Schema graphs deeper or larger than this are not compiled. */
    private static final int MAX_SCHEMA_DEPTH = 64;
    private static final int MAX_SCHEMA_NODES = 10_000;
    /** 2^53: integers up to this are exact as doubles. */
    private static final double EXACT_INTEGER = 9_007_199_254_740_992.0;

    private static final int T_NULL = 1;
    private static final int T_BOOLEAN = 2;
    private static final int T_OBJECT = 4;
    private static final int T_ARRAY = 8;
    private static final int T_NUMBER = 16;
    private static final int T_STRING = 32;
    private static final int T_INTEGER = 64;
    private static final int T_ALL = 127;

    /** Keywords that assert nothing, in every supported draft. */
    private static final Set<String> ANNOTATIONS = Set.of("title", "description", "$comment", "default", "examples",
            "deprecated", "readOnly", "writeOnly", "definitions", "$defs");
    /** Dialects whose meaning of the supported keywords is the same. */
    private static final Set<SpecificationVersion> DIALECTS = Set.of(SpecificationVersion.DRAFT_6,
            SpecificationVersion.DRAFT_7, SpecificationVersion.DRAFT_2019_09, SpecificationVersion.DRAFT_2020_12);
    /** Stands for JSON null in an enum's set. */
    private static final Object NULL = new Object();

    /** Thrown while compiling: the schema is not in the supported subset (no fast check for the rule). */
    static final class Unsupported extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Unsupported(String why) {
            super(why, null, false, false);
        }
    }

    /** One schema, compiled. */
    static final class Node {
        boolean any;
        boolean none;
        /** A keyword outside the subset: any value reaching it is "don't know". */
        boolean opaque;
        int types = T_ALL;
        /**
         * The type keyword lists "integer": networknt then compares this schema's numeric bounds as integers
         * (a fraction is dropped: {@code 0.3} fails {@code exclusiveMinimum: 0}), so only integers are decided.
         */
        boolean integerType;
        String[] required;
        Map<String, Node> properties;
        /** {@link #properties} as arrays, looked up by identity first (the parser's names are canonical). */
        String[] propertyNames;
        Node[] propertyNodes;
        Node additional;
        Node items;
        int minItems = 0;
        int maxItems = Integer.MAX_VALUE;
        int minProperties = 0;
        int maxProperties = Integer.MAX_VALUE;
        int minLength = 0;
        int maxLength = Integer.MAX_VALUE;
        Bound minimum;
        Bound maximum;
        Bound exclusiveMinimum;
        Bound exclusiveMaximum;
        /** enum / const: the allowed strings, booleans and nulls ({@link #NULL}). */
        Set<Object> allowed;
        boolean allowedHasNumbers;
        Node[] allOf;
        Node[] anyOf;
        Node[] oneOf;
        Node not;
        /** format: networknt's check of a string, in the rule's dialect and registry. */
        FormatCheck format;

        /** The schema of member {@code name} (properties, else additionalProperties), or null: unconstrained. */
        Node member(String name) {
            if (propertyNames != null) {
                String[] names = propertyNames;
                for (int i = 0; i < names.length; i++) {
                    if (names[i] == name) {
                        return propertyNodes[i];
                    }
                }
                for (int i = 0; i < names.length; i++) {
                    if (names[i].equals(name)) {
                        // The parser's canonical instance from now on: the next record matches by identity.
                        // A racy write of an equal immutable String: every thread reads one of the two.
                        names[i] = name;
                        return propertyNodes[i];
                    }
                }
                return additional;
            }
            Node c = properties == null ? null : properties.get(name);
            return c == null ? additional : c;
        }

        boolean hasApplicatorsOtherThanAllOf() {
            return anyOf != null || oneOf != null || not != null;
        }
    }

    /** A numeric bound: its double, and whether it is an integer exact as a double (ties are then decidable). */
    static final class Bound {
        final double value;
        final boolean exactInteger;

        Bound(double value, boolean exactInteger) {
            this.value = value;
            this.exactInteger = exactInteger;
        }
    }

    /**
     * {@code format} on a string: networknt's answer, as {@link Evaluation#validate} gives it for the schema
     * {@code {"$schema": <the rule's dialect>, "format": <name>}} compiled in the rule's registry ({@link #schema}).
     * That is a whole evaluation per string (an {@link Evaluation} with its lists and deques, the schema walk, a
     * {@code StringNode}, the error with its message when the string fails), for what comes down to one call of
     * the {@link Format} that networknt's {@link FormatValidator} holds. So where it certainly comes down to that
     * call, the call is made directly ({@link #direct}); everywhere else the evaluation runs as before.
     *
     * <p>What the evaluation does there (networknt 3.0.9, read in its bytecode): {@code Schema.validate} enters the
     * schema (one evaluation step, depth 0), runs each validator (one step each): {@code $schema}'s does nothing;
     * {@code FormatValidator.validate} collects an annotation (not an error) and, with a {@code Format} for the name,
     * calls its {@code validate}, whose default adds an error iff assertions are on ({@code ExecutionConfig}'s
     * {@code formatAssertionsEnabled} when set) and {@code matches(ctx, schemaContext, node)} is false; for a string
     * node, that is {@code matches(ctx, schemaContext, string)}. A {@code PatternSyntaxException} is logged and the
     * value passes. The verdict is valid iff no error was added (and no limit or exception ended the evaluation).
     *
     * <p>The direct call is set up only when all of this holds of the compiled schema (else {@link #direct} is null):
     * its validators are the format's and at most {@code $schema}'s; the format is known to the dialect (an unknown
     * name follows networknt's rules for unknown formats, the format-assertion vocabulary and strict mode: left to
     * the evaluation); it is one of networknt's own {@link Formats#DEFAULT} (their {@code matches} never read the
     * execution context, so none is made: null), not {@code regex} (it compiles through the rule's
     * {@link BudgetRegexFactory}, whose pattern budget and deep stack belong to the record's evaluation); and it
     * keeps {@code Format}'s default {@code validate} and {@code matches} chain. It is used only when the execution
     * configurations say whether format asserts (both the same), do not fail fast (an error would throw) and let
     * the evaluation's few steps run ({@link #runsToTheEnd}). {@code FastCheckFormatTest} compares both ways for
     * every format networknt knows, unknown names, each supported dialect, with and without format assertion.
     */
    static final class FormatCheck {
        /** networknt's private fields read once per compiled format (null: not readable, the evaluation is used). */
        private static final Field FORMAT = field(FormatValidator.class, "format", Format.class);
        private static final Field CONTEXT = field(BaseKeywordValidator.class, "schemaContext", SchemaContext.class);

        /** The schema {@code {"$schema": <dialect>, "format": <name>}}: today's route, and the fallback. */
        final Schema schema;
        /** The format its validator calls, when calling it directly gives the evaluation's answer; else null. */
        final Format direct;
        /** The validator's schema context, which {@code matches} is given (duration reads its strictness). */
        private final SchemaContext context;
        /** Evaluation steps of the schema: entering it, then one per validator. */
        private final long steps;

        private FormatCheck(Schema schema, Format direct, SchemaContext context, long steps) {
            this.schema = schema;
            this.direct = direct;
            this.context = context;
            this.steps = steps;
        }

        /** The format check of {@code name} in {@code dialect} (may be null: the registry's default dialect). */
        static FormatCheck compile(SchemaRegistry registry, String location, JsonNode dialect, String name) {
            tools.jackson.databind.node.ObjectNode s = Json.configMapper().createObjectNode();
            if (dialect != null) {
                s.set("$schema", dialect);
            }
            s.put("format", name);
            Schema schema = registry.getSchema(SchemaLocation.of(location), s);
            schema.initializeValidators();
            List<KeywordValidator> validators = schema.getValidators();
            FormatValidator validator = null;
            for (KeywordValidator v : validators) {
                if (v.getClass() == FormatValidator.class && validator == null) {
                    validator = (FormatValidator) v;
                } else if (!(v.getClass().getEnclosingClass() == NonValidationKeyword.class
                        && "$schema".equals(v.getKeyword()))) {
                    return new FormatCheck(schema, null, null, 0); // something else runs too
                }
            }
            Format format = validator == null ? null : (Format) read(FORMAT, validator);
            SchemaContext context = validator == null ? null : (SchemaContext) read(CONTEXT, validator);
            if (format == null || context == null || format instanceof RegexFormat || !isDefault(format)
                    || !keepsDefaultChain(format.getClass())) {
                return new FormatCheck(schema, null, null, 0);
            }
            return new FormatCheck(schema, format, context, validators.size() + 1L);
        }

        /**
         * {@link FastCheck#VALID}, or {@link FastCheck#UNKNOWN} when networknt reports anything for {@code s} (a
         * format error, a pattern budget, an evaluation limit): today's answer, from one call of the format where that
         * gives it.
         */
        int check(String s, ExecutionConfig inline, ExecutionConfig full, long patternBudget) {
            Boolean asserts = inline.getFormatAssertionsEnabled();
            if (direct != null && asserts != null && runsToTheEnd(inline, asserts) && runsToTheEnd(full, asserts)) {
                if (!asserts) {
                    return VALID; // Format.validate checks nothing when assertions are off
                }
                try {
                    // No ExecutionContext (making one is most of the evaluation's cost): networknt's own formats,
                    // the only ones compile() takes, never read it (3.0.9's bytecode; FastCheckFormatTest would fail
                    // on a version where one did).
                    return direct.matches(null, context, s) ? VALID : UNKNOWN;
                } catch (PatternSyntaxException e) {
                    // FormatValidator logs this and lets the value pass: the evaluation below does exactly that.
                }
            }
            return viaEvaluation(s, inline, full, patternBudget);
        }

        /** Today's route: the whole evaluation of {@link #schema} (the fallback; the tests' reference). */
        int viaEvaluation(String s, ExecutionConfig inline, ExecutionConfig full, long patternBudget) {
            String problem = Evaluation.validate(schema, inline, full, StringNode.valueOf(s), patternBudget, 0);
            return problem == null ? VALID : UNKNOWN;
        }

        /**
         * Whether an evaluation under {@code c} would run the format's check and end with its answer: format
         * assertion as {@code asserts} (Evaluation.validate uses {@code inline}, or {@code full} on a deep stack),
         * no fail-fast exception, no depth limit at depth 0 (networknt aborts when the depth reached is ≥ a non-zero
         * maximum), and room for the schema's steps (it aborts when the steps admitted are ≥ a non-zero maximum).
         */
        private boolean runsToTheEnd(ExecutionConfig c, Boolean asserts) {
            long maxSteps = c.getMaxEvaluationSteps();
            return asserts.equals(c.getFormatAssertionsEnabled()) && !c.isFailFast() && c.getMaxEvaluationDepth() >= 0
                    && (maxSteps == 0 || maxSteps >= steps);
        }

        private static boolean isDefault(Format format) {
            for (Format f : Formats.DEFAULT) {
                if (f == format) {
                    return true;
                }
            }
            return false;
        }

        /** Whether {@code Format.validate} reaches {@code matches(ctx, schemaContext, String)} as its defaults do. */
        private static boolean keepsDefaultChain(Class<?> c) {
            try {
                return c.getMethod("validate", ExecutionContext.class, SchemaContext.class, JsonNode.class,
                        JsonNode.class, NodePath.class, boolean.class, Supplier.class, FormatValidator.class)
                        .getDeclaringClass() == Format.class
                        && c.getMethod("matches", ExecutionContext.class, SchemaContext.class, JsonNode.class,
                                JsonNode.class, NodePath.class, boolean.class, FormatValidator.class)
                                .getDeclaringClass() == Format.class
                        && c.getMethod("matches", ExecutionContext.class, SchemaContext.class, JsonNode.class)
                                .getDeclaringClass() == Format.class;
            } catch (NoSuchMethodException | RuntimeException e) {
                return false;
            }
        }

        private static Field field(Class<?> owner, String name, Class<?> type) {
            try {
                Field f = owner.getDeclaredField(name);
                if (f.getType() != type) {
                    return null;
                }
                f.setAccessible(true);
                return f;
            } catch (ReflectiveOperationException | RuntimeException e) {
                return null;
            }
        }

        private static Object read(Field f, Object owner) {
            try {
                return f == null ? null : f.get(owner);
            } catch (ReflectiveOperationException | RuntimeException e) {
                return null;
            }
        }
    }

    /** Accepts every value: a rule without a schema (the document must still be JSON). */
    static final FastCheck ANY_JSON = new FastCheck(anyNode());

    private final Node root;

    private FastCheck(Node root) {
        this.root = root;
    }

    private static Node anyNode() {
        Node n = new Node();
        n.any = true;
        return n;
    }

    // ------------------------------------------------------------------ compile

    /**
     * The fast check of a rule's schema, or null when the schema is outside the supported subset.
     *
     * @param registry the rule's own registry (format checks are compiled in it, in the rule's dialect)
     */
    static FastCheck compile(JsonNode schema, String baseUri, SchemaRegistry registry) {
        try {
            return new FastCheck(new Compiler(schema, baseUri, registry).compileRoot());
        } catch (Unsupported | IllegalArgumentException e) {
            return null;
        }
    }

    private static final class Compiler {
        private final JsonNode root;
        private final String baseUri;
        private final SchemaRegistry registry;
        private final JsonNode dialect;
        private final Map<JsonNode, Node> done = new IdentityHashMap<>();
        private final Set<JsonNode> inProgress = java.util.Collections.newSetFromMap(new IdentityHashMap<>());
        private final Map<String, FormatCheck> formats = new HashMap<>();
        private int nodes;

        Compiler(JsonNode root, String baseUri, SchemaRegistry registry) {
            this.root = root;
            this.baseUri = baseUri;
            this.registry = registry;
            this.dialect = root.isObject() ? root.get("$schema") : null;
        }

        Node compileRoot() {
            if (dialect != null) {
                if (!dialect.isString()) {
                    throw new Unsupported("$schema");
                }
                String id = dialect.asString();
                SpecificationVersion version = SpecificationVersion.fromDialectId(id)
                        .or(() -> SpecificationVersion.fromDialectId(id.endsWith("#") ? id.substring(0, id.length() - 1) : id + "#"))
                        .orElseThrow(() -> new Unsupported("dialect " + id));
                if (!DIALECTS.contains(version)) {
                    throw new Unsupported("dialect " + id);
                }
            }
            // An embedded resource ($id below the root) changes what references resolve to.
            forbidNested(root, true);
            Node node = compile(root, 0);
            if (depth(node, 0, new IdentityHashMap<>()) > MAX_SCHEMA_DEPTH) {
                throw new Unsupported("too deep");
            }
            return node;
        }

        private void forbidNested(JsonNode node, boolean isRoot) {
            if (node.isObject()) {
                for (var e : node.properties()) {
                    String k = e.getKey();
                    if (!isRoot && (k.equals("$id") || k.equals("$schema")) && e.getValue().isString()) {
                        throw new Unsupported("nested " + k);
                    }
                    forbidNested(e.getValue(), false);
                }
            } else if (node.isArray()) {
                for (JsonNode child : node) {
                    forbidNested(child, false);
                }
            }
        }

        private int depth(Node n, int d, IdentityHashMap<Node, Integer> seen) {
            if (d > MAX_SCHEMA_DEPTH) {
                return d;
            }
            Integer known = seen.get(n);
            if (known != null) {
                return d + known;
            }
            int max = 0;
            List<Node> children = new ArrayList<>();
            if (n.properties != null) {
                children.addAll(n.properties.values());
            }
            for (Node c : new Node[] {n.additional, n.items, n.not}) {
                if (c != null) {
                    children.add(c);
                }
            }
            for (Node[] group : new Node[][] {n.allOf, n.anyOf, n.oneOf}) {
                if (group != null) {
                    children.addAll(List.of(group));
                }
            }
            for (Node c : children) {
                max = Math.max(max, depth(c, 0, seen) + 1);
                if (max > MAX_SCHEMA_DEPTH) {
                    return d + max;
                }
            }
            seen.put(n, max);
            return d + max;
        }

        private Node compile(JsonNode s, int depth) {
            if (depth > MAX_SCHEMA_DEPTH || ++nodes > MAX_SCHEMA_NODES) {
                throw new Unsupported("schema too large");
            }
            Node known = done.get(s);
            if (known != null) {
                return known;
            }
            if (!inProgress.add(s)) {
                throw new Unsupported("recursive schema");
            }
            Node n = build(s, depth);
            inProgress.remove(s);
            done.put(s, n);
            return n;
        }

        private Node build(JsonNode s, int depth) {
            Node n = new Node();
            if (s.isBoolean()) {
                n.any = s.booleanValue();
                n.none = !s.booleanValue();
                return n;
            }
            if (!s.isObject()) {
                throw new Unsupported("schema is not an object");
            }
            JsonNode ref = s.get("$ref");
            if (ref != null) {
                for (var e : s.properties()) {
                    String k = e.getKey();
                    if (!k.equals("$ref") && !k.equals("$schema") && !k.equals("$id") && !ANNOTATIONS.contains(k)) {
                        // Draft 7 ignores a $ref's siblings, 2019-09 applies them: not decided here.
                        n.opaque = true;
                        return n;
                    }
                }
                JsonNode target = ref.isString() ? resolve(ref.asString()) : null;
                if (target == null) {
                    n.opaque = true;
                    return n;
                }
                return compile(target, depth + 1);
            }
            boolean any = true;
            for (var e : s.properties()) {
                String k = e.getKey();
                JsonNode v = e.getValue();
                if (ANNOTATIONS.contains(k) || k.equals("$schema") || k.equals("$id")) {
                    continue;
                }
                any = false;
                if (!keyword(n, k, v, depth)) {
                    Node opaque = new Node();
                    opaque.opaque = true;
                    return opaque;
                }
            }
            n.any = any;
            return n;
        }

        /** Compiles one keyword into n; false when it is outside the subset. */
        private boolean keyword(Node n, String k, JsonNode v, int depth) {
            switch (k) {
                case "type":
                    n.types = types(v);
                    n.integerType = n.types >= 0 && (n.types & T_INTEGER) != 0;
                    return n.types >= 0;
                case "enum":
                    if (!v.isArray() || n.allowed != null) {
                        return false; // with const too: two sets (not merged here)
                    }
                    n.allowed = new HashSet<>();
                    for (JsonNode member : v) {
                        if (!allow(n, member)) {
                            return false;
                        }
                    }
                    return true;
                case "const":
                    if (n.allowed != null) {
                        return false;
                    }
                    n.allowed = new HashSet<>();
                    return allow(n, v);
                case "required":
                    if (!v.isArray()) {
                        return false;
                    }
                    n.required = new String[v.size()];
                    for (int i = 0; i < v.size(); i++) {
                        if (!v.get(i).isString()) {
                            return false;
                        }
                        n.required[i] = v.get(i).asString();
                    }
                    return true;
                case "properties":
                    if (!v.isObject()) {
                        return false;
                    }
                    n.properties = new HashMap<>();
                    for (var e : v.properties()) {
                        n.properties.put(e.getKey(), compile(e.getValue(), depth + 1));
                    }
                    if (n.properties.size() <= 16) {
                        n.propertyNames = new String[n.properties.size()];
                        n.propertyNodes = new Node[n.properties.size()];
                        int i = 0;
                        for (var e : n.properties.entrySet()) {
                            n.propertyNames[i] = e.getKey();
                            n.propertyNodes[i++] = e.getValue();
                        }
                    }
                    return true;
                case "additionalProperties":
                    n.additional = compile(v, depth + 1);
                    return true;
                case "items":
                    if (!v.isObject() && !v.isBoolean()) {
                        return false; // the array form means a tuple before 2020-12
                    }
                    n.items = compile(v, depth + 1);
                    return true;
                case "minItems":
                    return (n.minItems = count(v)) >= 0;
                case "maxItems":
                    return (n.maxItems = count(v)) >= 0;
                case "minProperties":
                    return (n.minProperties = count(v)) >= 0;
                case "maxProperties":
                    return (n.maxProperties = count(v)) >= 0;
                case "minLength":
                    return (n.minLength = count(v)) >= 0;
                case "maxLength":
                    return (n.maxLength = count(v)) >= 0;
                case "minimum":
                    return (n.minimum = bound(v)) != null;
                case "maximum":
                    return (n.maximum = bound(v)) != null;
                case "exclusiveMinimum":
                    return (n.exclusiveMinimum = bound(v)) != null; // a boolean (draft 4) is refused here
                case "exclusiveMaximum":
                    return (n.exclusiveMaximum = bound(v)) != null;
                case "allOf":
                    return (n.allOf = group(v, depth)) != null;
                case "anyOf":
                    return (n.anyOf = group(v, depth)) != null;
                case "oneOf":
                    return (n.oneOf = group(v, depth)) != null;
                case "not":
                    if (!v.isObject() && !v.isBoolean()) {
                        return false;
                    }
                    n.not = compile(v, depth + 1);
                    return true;
                case "format":
                    if (!v.isString()) {
                        return false;
                    }
                    n.format = format(v.asString());
                    return true;
                default:
                    return false;
            }
        }

        private FormatCheck format(String name) {
            return formats.computeIfAbsent(name,
                    f -> FormatCheck.compile(registry, baseUri + ".kdq-format-" + formats.size(), dialect, f));
        }

        private Node[] group(JsonNode v, int depth) {
            if (!v.isArray() || v.isEmpty()) {
                return null;
            }
            Node[] out = new Node[v.size()];
            for (int i = 0; i < v.size(); i++) {
                if (!v.get(i).isObject() && !v.get(i).isBoolean()) {
                    return null;
                }
                out[i] = compile(v.get(i), depth + 1);
            }
            return out;
        }

        /** A JSON pointer into the root document ("#" or "#/a/b"), or null. */
        private JsonNode resolve(String ref) {
            if (ref.equals("#")) {
                return root;
            }
            if (!ref.startsWith("#/") || ref.indexOf('%') >= 0) {
                return null;
            }
            JsonNode node = root;
            for (String token : ref.substring(2).split("/", -1)) {
                String name = token.replace("~1", "/").replace("~0", "~");
                if (node.isObject()) {
                    node = node.get(name);
                } else if (node.isArray() && name.matches("0|[1-9][0-9]{0,8}")) {
                    node = node.get(Integer.parseInt(name));
                } else {
                    return null;
                }
                if (node == null) {
                    return null;
                }
            }
            return node;
        }

        private static int types(JsonNode v) {
            if (v.isString()) {
                return type(v.asString());
            }
            if (!v.isArray() || v.isEmpty()) {
                return -1;
            }
            int bits = 0;
            for (JsonNode t : v) {
                int b = t.isString() ? type(t.asString()) : -1;
                if (b < 0) {
                    return -1;
                }
                bits |= b;
            }
            return bits;
        }

        private static int type(String name) {
            switch (name) {
                case "null":
                    return T_NULL;
                case "boolean":
                    return T_BOOLEAN;
                case "object":
                    return T_OBJECT;
                case "array":
                    return T_ARRAY;
                case "number":
                    return T_NUMBER;
                case "string":
                    return T_STRING;
                case "integer":
                    return T_INTEGER;
                default:
                    return -1;
            }
        }

        private static boolean allow(Node n, JsonNode member) {
            if (member.isString()) {
                n.allowed.add(member.asString());
            } else if (member.isBoolean()) {
                n.allowed.add(member.booleanValue());
            } else if (member.isNull()) {
                n.allowed.add(NULL);
            } else if (member.isNumber()) {
                n.allowedHasNumbers = true;
            } else {
                return false; // objects and arrays in an enum: not decided here
            }
            return true;
        }

        private static int count(JsonNode v) {
            if (v.isIntegralNumber() && v.canConvertToInt() && v.intValue() >= 0) {
                return v.intValue();
            }
            return -1;
        }

        private static Bound bound(JsonNode v) {
            if (!v.isNumber()) {
                return null;
            }
            double d = v.doubleValue();
            if (!Double.isFinite(d)) {
                return null;
            }
            boolean exactInteger = v.isIntegralNumber() && v.canConvertToLong() && Math.abs(d) <= EXACT_INTEGER;
            return new Bound(d, exactInteger);
        }
    }

    // ------------------------------------------------------------------ run time

    /**
     * Checks one record; {@code eventTimeField} may be null.
     *
     * @return null when not decided here; else the value at the event-time field ({@link MissingNode} when
     *         absent or not asked for): the record is valid
     */
    JsonNode check(Json json, byte[] value, String[] eventTimeField, ExecutionConfig inline, ExecutionConfig full) {
        if (Json.mayHaveSurrogateEscape(value)) {
            return null;
        }
        Walk w = new Walk(eventTimeField, inline, full, value.length);
        try (JsonParser p = json.parser(value)) {
            JsonToken t = p.nextToken();
            if (t == null) {
                return null;
            }
            if (!w.value(p, t, root, null, 0)) {
                return null;
            }
            if (p.nextToken() != null) {
                return null; // trailing tokens
            }
        } catch (JacksonException e) {
            return null; // not JSON, or a parser limit: the full way says which
        }
        return w.eventValue;
    }

    /** One record's walk over the tokens. */
    private static final class Walk {
        private final String[] field;
        private final ExecutionConfig inline;
        private final ExecutionConfig full;
        private final long patternBudget;
        private int steps;
        /** The member names of the objects the walk is in (each object's from where it started). */
        private String[] names = new String[32];
        private int nameCount;
        /** Leading members of {@link #field} matched by the objects the walk is in. */
        private int matched;
        JsonNode eventValue = MissingNode.getInstance();

        // The current scalar token, read once for every schema that looks at it.
        private JsonParser parser;
        private JsonToken token;
        private String string;
        private double number;
        /** Of a number token: VALID integer, INVALID not an integer, UNKNOWN written as 1.0. */
        private int integer;
        private boolean exactInteger;

        Walk(String[] field, ExecutionConfig inline, ExecutionConfig full, int bytes) {
            this.field = field;
            this.inline = inline;
            this.full = full;
            this.patternBudget = BudgetRegexFactory.BASE_BUDGET + BudgetRegexFactory.PER_BYTE_BUDGET * (long) bytes;
        }

        /**
         * Walks the value starting at {@code t}, which must satisfy {@code first} and every node of {@code more}
         * (may be null); false when that is not certain (the caller stops: don't know).
         */
        boolean value(JsonParser p, JsonToken t, Node first, List<Node> more, int depth) {
            if (t == JsonToken.START_OBJECT || t == JsonToken.START_ARRAY) {
                if (depth >= MAX_DEPTH) {
                    return false;
                }
                List<Node> nodes = first == null && more == null ? List.of() : new ArrayList<>(2);
                int kind = t == JsonToken.START_OBJECT ? T_OBJECT : T_ARRAY;
                if (first != null && !expand(first, kind, nodes, 0)) {
                    return false;
                }
                if (more != null) {
                    for (Node n : more) {
                        if (!expand(n, kind, nodes, 0)) {
                            return false;
                        }
                    }
                }
                return kind == T_OBJECT ? object(p, nodes, depth) : array(p, nodes, depth);
            }
            if (t == JsonToken.VALUE_NUMBER_FLOAT && !plainDecimal(p)) {
                return false; // an exponent: Json.parse reads it exactly (maybe too_complex)
            }
            if (first == null && more == null) {
                return true; // nothing asks about this value: the parser has checked it is JSON
            }
            if (!scalar(p, t)) {
                return false;
            }
            if (first != null && evaluate(first) != VALID) {
                return false;
            }
            if (more != null) {
                for (Node n : more) {
                    if (evaluate(n) != VALID) {
                        return false;
                    }
                }
            }
            return true;
        }

        /** Adds the nodes that apply to a container (allOf flattened); false when one cannot be decided. */
        private boolean expand(Node n, int kind, List<Node> out, int depth) {
            if (n.any) {
                return true;
            }
            if (n.none || n.opaque || n.allowed != null || n.hasApplicatorsOtherThanAllOf() || depth > MAX_SCHEMA_DEPTH
                    || ++steps > MAX_STEPS) {
                return false;
            }
            if ((n.types & kind) == 0) {
                return false;
            }
            out.add(n);
            if (n.allOf != null) {
                for (Node m : n.allOf) {
                    if (!expand(m, kind, out, depth + 1)) {
                        return false;
                    }
                }
            }
            return true;
        }

        private boolean object(JsonParser p, List<Node> nodes, int depth) {
            // Member names seen: a duplicate is not JSON for Json.parse (FAIL_ON_READING_DUP_TREE_KEY).
            int from = nameCount;
            Set<String> many = null;
            List<Node> children = null;
            boolean onPath = field != null && matched == depth;
            JsonToken t;
            while ((t = p.nextToken()) == JsonToken.PROPERTY_NAME) {
                String name = p.currentName();
                if (many != null) {
                    if (!many.add(name)) {
                        return false;
                    }
                } else {
                    for (int i = from; i < nameCount; i++) {
                        if (names[i].equals(name)) {
                            return false;
                        }
                    }
                    if (nameCount - from == 16) {
                        many = new HashSet<>();
                        for (int i = from; i < nameCount; i++) {
                            many.add(names[i]);
                        }
                        many.add(name);
                    } else {
                        pushName(name);
                    }
                }
                Node only = null;
                if (children != null) {
                    children.clear();
                }
                for (Node n : nodes) {
                    Node c = n.member(name);
                    if (c != null && !c.any) {
                        if (only == null) {
                            only = c;
                        } else {
                            if (children == null) {
                                children = new ArrayList<>(2);
                            }
                            children.add(c);
                        }
                    }
                }
                t = p.nextToken();
                boolean follow = onPath && depth < field.length && name.equals(field[depth]);
                if (follow && depth == field.length - 1) {
                    if (!capture(p, t)) {
                        return false;
                    }
                }
                if (follow) {
                    matched = depth + 1;
                }
                boolean ok = value(p, t, only, children == null || children.isEmpty() ? null
                        : new ArrayList<>(children), depth + 1);
                if (follow) {
                    matched = depth;
                }
                if (!ok) {
                    return false;
                }
            }
            if (t != JsonToken.END_OBJECT) {
                return false;
            }
            int size = many != null ? many.size() : nameCount - from;
            for (Node n : nodes) {
                if (size < n.minProperties || size > n.maxProperties) {
                    return false;
                }
                if (n.required != null) {
                    for (String r : n.required) {
                        if (many != null ? !many.contains(r) : !seen(r, from)) {
                            return false;
                        }
                    }
                }
            }
            nameCount = from;
            return true;
        }

        private void pushName(String name) {
            if (nameCount == names.length) {
                names = java.util.Arrays.copyOf(names, names.length * 2);
            }
            names[nameCount++] = name;
        }

        private boolean seen(String name, int from) {
            for (int i = from; i < nameCount; i++) {
                if (names[i].equals(name)) {
                    return true;
                }
            }
            return false;
        }

        private boolean array(JsonParser p, List<Node> nodes, int depth) {
            Node only = null;
            List<Node> items = null;
            for (Node n : nodes) {
                if (n.items != null && !n.items.any) {
                    if (only == null) {
                        only = n.items;
                    } else {
                        if (items == null) {
                            items = new ArrayList<>(2);
                        }
                        items.add(n.items);
                    }
                }
            }
            int size = 0;
            JsonToken t;
            while ((t = p.nextToken()) != JsonToken.END_ARRAY) {
                if (t == null || !value(p, t, only, items, depth + 1)) {
                    return false;
                }
                size++;
            }
            for (Node n : nodes) {
                if (size < n.minItems || size > n.maxItems) {
                    return false;
                }
            }
            return true;
        }

        /** The event-time field's value, as Json.parse would have built it; false when not decided here. */
        private boolean capture(JsonParser p, JsonToken t) {
            switch (t) {
                case VALUE_STRING:
                    eventValue = StringNode.valueOf(p.getString());
                    return true;
                case VALUE_NUMBER_INT:
                    switch (p.getNumberType()) {
                        case INT:
                            eventValue = IntNode.valueOf(p.getIntValue());
                            return true;
                        case LONG:
                            eventValue = LongNode.valueOf(p.getLongValue());
                            return true;
                        default:
                            return false;
                    }
                case VALUE_NUMBER_FLOAT:
                    eventValue = DoubleNode.valueOf(p.getDoubleValue());
                    return true;
                case VALUE_TRUE:
                case VALUE_FALSE:
                    eventValue = BooleanNode.valueOf(t == JsonToken.VALUE_TRUE);
                    return true;
                case VALUE_NULL:
                    eventValue = NullNode.getInstance();
                    return true;
                default:
                    return false; // an object or array there: the full way
            }
        }

        /** Reads the scalar token once; false when a number is not decidable here. */
        private boolean scalar(JsonParser p, JsonToken t) {
            parser = p;
            token = t;
            string = null;
            switch (t) {
                case VALUE_STRING:
                    // Read only when a schema looks at it (below): an unconstrained string is skipped by the parser.
                    return true;
                case VALUE_NUMBER_INT:
                    if (p.getNumberType() == JsonParser.NumberType.BIG_INTEGER) {
                        return false;
                    }
                    long l = p.getLongValue();
                    number = l;
                    integer = VALID;
                    exactInteger = Math.abs(number) <= EXACT_INTEGER;
                    return true;
                case VALUE_NUMBER_FLOAT:
                    integer = fractionKind(p.getStringCharacters(), p.getStringOffset(), p.getStringLength());
                    if (integer == -2) {
                        return false; // not a plain decimal (mayOverflowDouble let it through: cannot happen)
                    }
                    number = p.getDoubleValue();
                    exactInteger = false;
                    return Double.isFinite(number);
                case VALUE_TRUE:
                case VALUE_FALSE:
                case VALUE_NULL:
                    return true;
                default:
                    return false;
            }
        }

        /** Whether the float token is written without an exponent. */
        private static boolean plainDecimal(JsonParser p) {
            char[] text = p.getStringCharacters();
            int end = p.getStringOffset() + p.getStringLength();
            for (int i = p.getStringOffset(); i < end; i++) {
                char c = text[i];
                if (c == 'e' || c == 'E') {
                    return false;
                }
            }
            return true;
        }

        /** Of a plain decimal's text: INVALID when its fraction has a non-zero digit, UNKNOWN when all zeros. */
        private static int fractionKind(char[] text, int offset, int length) {
            int dot = -1;
            for (int i = offset; i < offset + length; i++) {
                char c = text[i];
                if (c == '.') {
                    dot = i;
                } else if (c == '-' && i == offset) {
                    continue;
                } else if (c < '0' || c > '9') {
                    return -2;
                } else if (dot >= 0 && c != '0') {
                    return INVALID;
                }
            }
            return dot < 0 ? -2 : UNKNOWN;
        }

        /** The current scalar against one schema: VALID, INVALID or UNKNOWN, each certain. */
        private int evaluate(Node n) {
            if (n.any) {
                return VALID;
            }
            if (n.none) {
                return INVALID;
            }
            if (n.opaque || ++steps > MAX_STEPS) {
                return UNKNOWN;
            }
            int result = VALID;
            switch (token) {
                case VALUE_STRING:
                    result = and(result, (n.types & T_STRING) != 0 ? VALID : INVALID);
                    if (result == INVALID) {
                        return INVALID;
                    }
                    if (n.allowed != null) {
                        result = and(result, n.allowed.contains(currentString()) ? VALID : INVALID);
                    }
                    if (n.minLength > 0 || n.maxLength < Integer.MAX_VALUE) {
                        result = and(result, length(currentString(), n.minLength, n.maxLength));
                    }
                    if (n.format != null && result != INVALID) {
                        // networknt's own answer; anything but "valid" (a budget, a deep stack) is not decided here
                        result = and(result, n.format.check(currentString(), inline, full, patternBudget));
                    }
                    break;
                case VALUE_NUMBER_INT:
                case VALUE_NUMBER_FLOAT:
                    if ((n.types & T_NUMBER) == 0) {
                        if ((n.types & T_INTEGER) == 0) {
                            return INVALID;
                        }
                        result = and(result, integer);
                    }
                    if (n.allowed != null) {
                        result = and(result, n.allowedHasNumbers ? UNKNOWN : INVALID);
                    }
                    result = and(result, atLeast(n.minimum, false, n.integerType));
                    result = and(result, atLeast(n.exclusiveMinimum, true, n.integerType));
                    result = and(result, atMost(n.maximum, false, n.integerType));
                    result = and(result, atMost(n.exclusiveMaximum, true, n.integerType));
                    if (n.format != null) {
                        result = and(result, UNKNOWN); // a format on a number (int32...): networknt's
                    }
                    break;
                case VALUE_TRUE:
                case VALUE_FALSE:
                    if ((n.types & T_BOOLEAN) == 0) {
                        return INVALID;
                    }
                    if (n.allowed != null) {
                        result = and(result, n.allowed.contains(token == JsonToken.VALUE_TRUE) ? VALID : INVALID);
                    }
                    if (n.format != null) {
                        result = and(result, UNKNOWN);
                    }
                    break;
                default: // VALUE_NULL
                    if ((n.types & T_NULL) == 0) {
                        return INVALID;
                    }
                    if (n.allowed != null) {
                        result = and(result, n.allowed.contains(NULL) ? VALID : INVALID);
                    }
                    if (n.format != null) {
                        result = and(result, UNKNOWN);
                    }
                    break;
            }
            if (result == INVALID) {
                return INVALID;
            }
            if (n.allOf != null) {
                for (Node m : n.allOf) {
                    result = and(result, evaluate(m));
                    if (result == INVALID) {
                        return INVALID;
                    }
                }
            }
            if (n.anyOf != null) {
                int any = INVALID;
                for (Node m : n.anyOf) {
                    int r = evaluate(m);
                    if (r == VALID) {
                        any = VALID;
                        break;
                    }
                    if (r == UNKNOWN) {
                        any = UNKNOWN;
                    }
                }
                result = and(result, any);
            }
            if (n.oneOf != null) {
                int valid = 0;
                boolean unknown = false;
                for (Node m : n.oneOf) {
                    int r = evaluate(m);
                    if (r == VALID) {
                        valid++;
                    } else if (r == UNKNOWN) {
                        unknown = true;
                    }
                }
                result = and(result, valid > 1 ? INVALID : unknown ? UNKNOWN : valid == 1 ? VALID : INVALID);
            }
            if (n.not != null) {
                int r = evaluate(n.not);
                result = and(result, r == VALID ? INVALID : r == INVALID ? VALID : UNKNOWN);
            }
            return result;
        }

        /** The current string token's text, read from the parser the first time a schema asks. */
        private String currentString() {
            if (string == null) {
                string = parser.getString();
            }
            return string;
        }

        /** minimum (x >= b) or exclusiveMinimum (x > b) of the current number. */
        private int atLeast(Bound b, boolean exclusive, boolean integerType) {
            if (b == null) {
                return VALID;
            }
            if (integerType && !(exactInteger && b.exactInteger)) {
                return UNKNOWN;
            }
            if (number > b.value) {
                return VALID; // correctly rounded: the exact values compare the same way
            }
            if (number < b.value) {
                return INVALID;
            }
            if (exactInteger && b.exactInteger) {
                return exclusive ? INVALID : VALID;
            }
            return UNKNOWN;
        }

        private int atMost(Bound b, boolean exclusive, boolean integerType) {
            if (b == null) {
                return VALID;
            }
            if (integerType && !(exactInteger && b.exactInteger)) {
                return UNKNOWN;
            }
            if (number < b.value) {
                return VALID;
            }
            if (number > b.value) {
                return INVALID;
            }
            if (exactInteger && b.exactInteger) {
                return exclusive ? INVALID : VALID;
            }
            return UNKNOWN;
        }

        private static int length(String s, int min, int max) {
            int n = s.length();
            for (int i = 0; i < n; i++) {
                if (s.charAt(i) >= 0x80) {
                    return UNKNOWN; // code points, graphemes or UTF-16 units: left to networknt
                }
            }
            return n >= min && n <= max ? VALID : INVALID;
        }

        private static int and(int a, int b) {
            if (a == INVALID || b == INVALID) {
                return INVALID;
            }
            return a == UNKNOWN || b == UNKNOWN ? UNKNOWN : VALID;
        }
    }
}
