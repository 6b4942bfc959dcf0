"""Validation rules compiled to native Spark expressions, with a Python fallback.

Every message gets one reason (STRING, null when valid), the first that
applies in this priority:

1. ``too_large``   – ``length(value) > max_value_bytes``
2. ``null_value``  – the Kafka value is null (a tombstone)
3. ``not_utf8``    – the bytes are not valid UTF-8
4. ``not_json``    – not one JSON document (includes the empty value; Spark's
   parser also rejects duplicate object keys and NaN/Infinity)
5. ``schema:<keywordLocation>`` – the topic's JSON Schema fails; the pointer
   names the failing keyword, e.g. ``schema:/properties/amount/minimum``;
   for ``required`` it names the missing element: ``schema:/required/1``.

**Which failing keyword is reported** when several fail: the first in schema
document order, depth first. Keywords are visited in the order they appear in
the schema file; an applicator (``properties``, ``items``,
``additionalProperties``) is descended into at its own position, ``properties``
in the order they are listed and ``required`` in array order. For ``items`` and
``additionalProperties`` the reported keyword is the earliest one that fails
for *any* element, not the first failing element. Compiled and fallback rules
use the same order, so a topic's reasons do not change when its rule moves
from one to the other.

**Compiled keywords** (native Catalyst expressions, no Python on the hot path):
``type`` (incl. lists), ``required``, ``properties`` (any depth), ``enum`` and
``const`` (scalar values), ``minimum``, ``maximum``, ``exclusiveMinimum``,
``exclusiveMaximum`` (numeric, and draft-04's boolean form), ``minLength``,
``maxLength``, ``pattern`` (Java regex, unanchored search like JSON Schema),
``items`` (a single schema), ``additionalProperties`` (false or a schema), and
``true``/``false`` subschemas. Keywords the schema's draft does not define
(``title``, ``description``, ``$id``, ``$defs``, ``x-…``) are ignored, exactly as
jsonschema ignores them. Any other keyword the draft defines (``oneOf``,
``anyOf``, ``allOf``, ``not``, ``$ref``, ``patternProperties``, ``if``,
``format``, ``multipleOf``, ``dependentRequired``, ``minItems``, …), an
``enum`` with object/array values, ``items`` as an array, a property name with
both quote characters, or ``integer`` in a draft-04 schema makes the whole rule
use the Python fallback: a vectorized pandas UDF running ``jsonschema`` (with
format assertion on), whose validators are built once per Python worker process.

**Type semantics** (identical in both paths): a JSON string is never a number
(``"5"`` fails ``integer``); ``integer`` is any number with a zero fraction, so
``5.0`` and ``1e2`` are integers (JSON Schema draft 6 and later; draft-04
schemas using ``integer`` go to the fallback, where ``5.0`` is not one); a
missing property is not checked by its ``properties`` subschema, while a JSON
``null`` is (and fails ``"type": "string"``). Numbers are compared as doubles.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from pyspark.sql import Column
from pyspark.sql import functions as F

from kdq.rules import RuleError, RuleSet, TopicRule

COMPILED_KEYWORDS = frozenset(
    {
        "type",
        "required",
        "properties",
        "enum",
        "const",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "pattern",
        "items",
        "additionalProperties",
    }
)

TOO_LARGE = "too_large"
NULL_VALUE = "null_value"
NOT_UTF8 = "not_utf8"
NOT_JSON = "not_json"
SCHEMA_PREFIX = "schema:"

# --------------------------------------------------------------------------- analysis (pure Python)


class _NotCompilable(Exception):
    pass


def _escape(token: Any) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def _validator_class(schema: dict) -> type:
    from jsonschema.validators import Draft202012Validator, validator_for

    return validator_for(schema, default=Draft202012Validator)


def _segment(name: str) -> str:
    # Spark's variant path syntax has no escapes; a name containing both quote
    # characters cannot be addressed and makes the rule fall back to Python.
    if "'" not in name:
        return f"['{name}']"
    if '"' not in name:
        return f'["{name}"]'
    raise _NotCompilable(f"property name {name!r} has both quote characters")


def _java_regex_problem(pattern: str) -> str | None:
    """Why Java (Spark RLIKE) rejects a regex Python accepted; None when fine or when no JVM is at hand."""
    if "(?P" in pattern:
        return "Python-only named group syntax (?P...)"
    try:
        from pyspark import SparkContext

        sc = SparkContext._active_spark_context
        if sc is None:
            return None
        sc._jvm.java.util.regex.Pattern.compile(pattern)
    except Exception as exc:  # py4j wraps PatternSyntaxException
        java = getattr(exc, "java_exception", None)
        return str(java.getMessage()).splitlines()[0] if java is not None else str(exc).splitlines()[0]
    return None


def _check(schema: Any, ptr: str, cls: type, draft4: bool) -> None:
    """Raise :class:`_NotCompilable` naming the first keyword the compiler cannot express."""
    if isinstance(schema, bool):
        return
    for key, value in schema.items():
        loc = f"{ptr}/{_escape(key)}"
        if key not in cls.VALIDATORS:
            continue  # jsonschema ignores it for this draft, so do we
        if key not in COMPILED_KEYWORDS:
            raise _NotCompilable(f"{key} at {loc}")
        if key == "type":
            types = [value] if isinstance(value, str) else value
            if draft4 and "integer" in types:
                raise _NotCompilable(f"draft-04 integer at {loc}")
        elif key in ("enum", "const"):
            values = value if key == "enum" else [value]
            if any(isinstance(v, (dict, list)) for v in values):
                raise _NotCompilable(f"{key} with object/array values at {loc}")
        elif key == "pattern":
            problem = _java_regex_problem(value)
            if problem:
                raise _NotCompilable(f"pattern not valid in Java at {loc}: {problem}")
        elif key == "required":
            for i, name in enumerate(value):
                try:
                    _segment(name)
                except _NotCompilable as exc:
                    raise _NotCompilable(f"{exc} at {loc}/{i}") from None
        elif key == "properties":
            for name, sub in value.items():
                try:
                    _segment(name)
                except _NotCompilable as exc:
                    raise _NotCompilable(f"{exc} at {loc}/{_escape(name)}") from None
                _check(sub, f"{loc}/{_escape(name)}", cls, draft4)
        elif key == "items":
            if isinstance(value, list):
                raise _NotCompilable(f"items as an array at {loc}")
            _check(value, loc, cls, draft4)
        elif key == "additionalProperties":
            _check(value, loc, cls, draft4)


@dataclass(frozen=True)
class RulePlan:
    """How one rule is evaluated: natively, by the Python fallback, or not at all (no schema)."""

    rule: TopicRule
    native: bool
    fallback_reason: str | None = None

    @property
    def description(self) -> str:
        if self.rule.schema is None:
            return f"{self.rule.label}: no schema (valid iff UTF-8 JSON)"
        if self.native:
            return f"{self.rule.label}: compiled (native Spark)"
        return f"{self.rule.label}: Python fallback ({self.fallback_reason})"


def plan_rule(rule: TopicRule, force_fallback: bool = False) -> RulePlan:
    if rule.schema is None:
        return RulePlan(rule, native=True)
    if force_fallback:
        return RulePlan(rule, native=False, fallback_reason="forced")
    from jsonschema.validators import Draft3Validator, Draft4Validator

    cls = _validator_class(rule.schema)
    if cls is Draft3Validator:
        return RulePlan(rule, native=False, fallback_reason="draft-03 schema at /$schema")
    try:
        _check(rule.schema, "", cls, draft4=cls is Draft4Validator)
    except _NotCompilable as exc:
        return RulePlan(rule, native=False, fallback_reason=str(exc))
    return RulePlan(rule, native=True)


def describe(ruleset: RuleSet, force_fallback: bool = False) -> list[str]:
    """One line per rule, for the stream's start-up log: which topics pay for the Python fallback."""
    lines = [plan_rule(rule, force_fallback).description for rule in ruleset.rules]
    lines.append("other topics: no rule (valid iff UTF-8 JSON)")
    return lines


# --------------------------------------------------------------------------- native compilation
#
# Cost model. Only the matching rule's expression runs for a row (CASE over the
# topic), so many rules cost little. Inside that branch Spark does not share
# repeated subexpressions (its CSE ignores CASE branches), so every check is
# kept to one or two cheap variant calls:
#
# * every read goes from the rule's root (or the array element) with the full
#   path in ONE try_variant_get, which navigates and casts in a single call:
#   no chain of per-level extractions, no struct of all members (that would
#   copy every member on each use);
# * containers are recognised by casts (to an empty struct, to an array),
#   which fail fast on anything else; scalar types by schema_of_variant, cheap
#   on a scalar. A node whose schema expects a scalar pays for
#   schema_of_variant walking a container only when the data is wrong;
# * checks are combined with COALESCE in document order, which stops at the
#   first failing keyword; in an AND the cheap or usually-false side comes first.


class _Node:
    """Expressions over one JSON value: ``path`` below ``root`` (a rule's parsed value or an array element).

    A JSON null is a variant null, not SQL NULL: absent properties never reach
    a node's checks (they are skipped), JSON nulls do and are checked.
    """

    def __init__(self, root: Column, path: str = "$", members: Column | None = None):
        self.root = root
        self.path = path
        # For array elements: the element's members, already read natively
        # into a struct outside the (interpreted) lambda; see _Compiler._each.
        self.members = members

    def get(self, target_type: str) -> Column:
        return F.try_variant_get(self.root, self.path, target_type)

    def child(self, name: str) -> _Node:
        if self.members is not None:
            return _Node(self.members.getField(name))
        return _Node(self.root, self.path + _segment(name))

    @functools.cached_property
    def v(self) -> Column:
        return self.root if self.path == "$" else self.get("variant")

    @functools.cached_property
    def is_object(self) -> Column:
        if self.members is not None:
            return self.members.isNotNull()
        # An empty struct reads no member: the cheapest object test.
        return self.get("struct<>").isNotNull()

    @functools.cached_property
    def as_array(self) -> Column:
        return self.get("array<variant>")

    @functools.cached_property
    def is_array(self) -> Column:
        return self.as_array.isNotNull()

    @functools.cached_property
    def as_map(self) -> Column:
        return self.get("map<string,variant>")

    @functools.cached_property
    def is_null(self) -> Column:
        return F.is_variant_null(self.v)

    @functools.cached_property
    def scalar_kind(self) -> Column:
        # BIGINT, DECIMAL(p,s), DOUBLE, STRING, BOOLEAN, VOID for scalars.
        # Casts cannot tell types apart (they turn 5 into "5" and "5" into 5.0).
        return F.schema_of_variant(self.v)

    @functools.cached_property
    def is_string(self) -> Column:
        return self.scalar_kind == "STRING"

    @functools.cached_property
    def is_boolean(self) -> Column:
        return self.scalar_kind == "BOOLEAN"

    @functools.cached_property
    def is_number(self) -> Column:
        # One schema_of_variant call: the first three letters tell the numeric
        # kinds (BIGINT, DECIMAL(p,s), DOUBLE; the rest never come from JSON).
        return F.substring(self.scalar_kind, 1, 3).isin("BIG", "DEC", "DOU", "FLO", "INT", "SMA", "TIN")

    @functools.cached_property
    def num(self) -> Column:
        # Meaningful only after is_number: the cast also reads "5" and true.
        return self.get("double")

    @functools.cached_property
    def is_integer(self) -> Column:
        # A zero fraction, as in Python's float.is_integer(): Spark keeps 5.0 as
        # DECIMAL(1,0) and 1e2 as DOUBLE; inf % 1 is NaN, so infinity is not one.
        # (One read of the number: without common-subexpression elimination,
        # in a CASE branch or a lambda, every extra read is another variant cast.)
        return self.is_number & ((self.num % 1) == 0)

    @functools.cached_property
    def string(self) -> Column:
        # Meaningful only after is_string (AND short-circuits in generated code).
        return self.get("string")

    def has_type(self, type_name: str) -> Column:
        return {
            "object": lambda: self.is_object,
            "array": lambda: self.is_array,
            "null": lambda: self.is_null,
            "string": lambda: self.is_string,
            "boolean": lambda: self.is_boolean,
            "number": lambda: self.is_number,
            "integer": lambda: self.is_integer,
        }[type_name]()

    def one_of(self, values: Sequence[Any]) -> Column:
        """JSON equality with any of the scalar values (1 == 1.0, true != 1, "1" != 1), one test per type."""
        strings = [v for v in values if isinstance(v, str)]
        numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        booleans = [v for v in values if isinstance(v, bool)]
        tests = []
        if strings:
            tests.append(self.is_string & self.string.isin(strings))
        if numbers:
            tests.append(self.is_number & self.num.isin(numbers))
        if booleans:
            tests.append(self.is_boolean & self.get("boolean").isin(booleans))
        if any(v is None for v in values):
            tests.append(self.is_null)
        return functools.reduce(operator.or_, tests, F.lit(False))


class _Compiler:
    """Turns a compilable schema into one INT column: the index of the first failing keyword, or null.

    Leaves are numbered in document order, depth first, so the smallest failing
    index is the first failing keyword in that order.
    """

    def __init__(self, cls: type, draft4: bool):
        self.cls = cls
        self.draft4 = draft4
        self.locations: list[str] = []

    def _leaf(self, fails: Column, location: str) -> Column:
        self.locations.append(location)
        return F.when(fails, F.lit(len(self.locations) - 1))

    def _bound(self, node: _Node, schema: dict, key: str, limit: Any, loc: str) -> Column:
        value = F.lit(float(limit))
        if key == "minimum":
            exclusive = self.draft4 and schema.get("exclusiveMinimum") is True
            fails = node.num <= value if exclusive else node.num < value
        elif key == "maximum":
            exclusive = self.draft4 and schema.get("exclusiveMaximum") is True
            fails = node.num >= value if exclusive else node.num > value
        elif key == "exclusiveMinimum":
            fails = node.num <= value
        else:
            fails = node.num >= value
        return self._leaf(node.is_number & fails, loc)

    def build(self, schema: Any, node: _Node, ptr: str) -> Column | None:
        if schema is True:
            return None
        if schema is False:
            return self._leaf(F.lit(True), ptr)
        parts: list[Column] = []
        for key, value in schema.items():
            if key not in self.cls.VALIDATORS:
                continue
            loc = f"{ptr}/{_escape(key)}"
            if key == "type":
                types = [value] if isinstance(value, str) else value
                ok = functools.reduce(operator.or_, (node.has_type(t) for t in types), F.lit(False))
                parts.append(self._leaf(~ok, loc))
            elif key == "required":
                for i, name in enumerate(value):
                    # A non-object has no members either, so test membership first.
                    parts.append(self._leaf(node.child(name).v.isNull() & node.is_object, f"{loc}/{i}"))
            elif key == "properties":
                for name, sub in value.items():
                    child = node.child(name)
                    compiled = self.build(sub, child, f"{loc}/{_escape(name)}")
                    if compiled is not None:
                        # Absent (SQL NULL) is skipped; a JSON null is a variant null and checked.
                        parts.append(F.when(child.v.isNotNull(), compiled))
            elif key in ("enum", "const"):
                parts.append(self._leaf(~node.one_of(value if key == "enum" else [value]), loc))
            elif key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                if isinstance(value, bool):
                    continue  # draft-04 modifier, applied by minimum/maximum
                parts.append(self._bound(node, schema, key, value, loc))
            elif key == "minLength":
                parts.append(self._leaf(node.is_string & (F.length(node.string) < value), loc))
            elif key == "maxLength":
                parts.append(self._leaf(node.is_string & (F.length(node.string) > value), loc))
            elif key == "pattern":
                # RLIKE is Matcher.find(): an unanchored search, as JSON Schema specifies.
                parts.append(self._leaf(node.is_string & ~node.string.rlike(value), loc))
            elif key == "items":
                part = self._each(node, value, loc)
                if part is not None:
                    parts.append(part)
            elif key == "additionalProperties":
                known = list(dict.fromkeys(schema.get("properties", {})))
                if value is False:
                    # Extra keys exist iff the object has more keys than known
                    # ones present: arithmetic, no lambda.
                    present = [node.child(name).v.isNotNull().cast("int") for name in known]
                    count = functools.reduce(operator.add, present, F.lit(0))
                    parts.append(self._leaf(node.as_map.isNotNull() & (F.size(node.as_map) > count), loc))
                elif value is not True:
                    extras = node.as_map
                    if known:
                        extras = F.map_filter(extras, _key_not_in(known))
                    part = self._each_value(F.map_values(extras), value, loc)
                    if part is not None:
                        parts.append(part)
            else:  # pragma: no cover - _check admits only the keywords above
                raise AssertionError(f"uncompiled keyword {key} at {loc}")
        if not parts:
            return None
        # Each part is null or a leaf index and the parts are in document
        # order, so the first non-null one is the earliest failing keyword.
        return parts[0] if len(parts) == 1 else F.coalesce(*parts)

    def _each(self, node: _Node, schema: Any, loc: str) -> Column | None:
        """``items``: the earliest failing keyword over all elements of the node's array.

        ``transform`` is a CodegenFallback: the lambda and every expression
        under it run interpreted, and each scalar variant cast there builds a
        Literal that reads the SQL conf (a new ReadOnlySQLConf per call on a
        task thread; see benchmarks/PERF_NOTES.md). So the members the item
        schema reads are cast for all elements at once into an array of
        structs; inside the lambda a member is then a field read instead of a
        variant navigation. The elements themselves (each rebuilt as a
        variant) are extracted and zipped in only when the item schema reads
        more than members. Unrolling the first elements into native code was
        tried and dropped: planning the copies cost more per batch than it saved.
        """
        names = _member_names(schema) if isinstance(schema, dict) else []
        if not names:
            return self._each_value(node.as_array, schema, loc)
        struct = "struct<" + ", ".join("`" + n.replace("`", "``") + "`: variant" for n in names) + ">"
        members = node.get(f"array<{struct}>")
        if not _needs_element_value(schema, self.cls):
            # Only members are read (type object, required, properties): an
            # element that is no object is a null struct, so the elements
            # themselves are not extracted (each would be rebuilt as a variant)
            # nor zipped (an interpreted struct per element).
            return self._map_min(members, lambda m: _Node(F.lit(None).cast("variant"), members=m), schema, loc)
        zipped = F.arrays_zip(node.as_array.alias("v"), members.alias("m"))
        return self._map_min(zipped, lambda z: _Node(z.getField("v"), members=z.getField("m")), schema, loc)

    def _each_value(self, elements: Column, schema: Any, loc: str) -> Column | None:
        return self._map_min(elements, _Node, schema, loc)

    def _map_min(self, elements: Column, make: Callable[[Column], _Node], schema: Any, loc: str) -> Column | None:
        # Each element yields its own first failing index; array_min picks the
        # earliest keyword, whichever element failed it.
        built: list[Column | None] = []

        def body(e: Column) -> Column:
            built.append(self.build(schema, make(e), loc))
            return built[0] if built[0] is not None else F.lit(None).cast("int")

        mapped = F.transform(elements, body)  # calls body once, to build the lambda
        return F.array_min(mapped) if built[0] is not None else None


def _needs_element_value(schema: Any, cls: type) -> bool:
    """Whether an item schema reads the element itself, not only its members (type object, required, properties)."""
    if not isinstance(schema, dict):
        return True
    for key, value in schema.items():
        if key not in cls.VALIDATORS or key in ("properties", "required"):
            continue
        if key == "type" and value == "object":
            continue
        return True
    return False


def _key_not_in(known: list[str]) -> Callable[[Column, Column], Column]:
    return lambda k, _v: ~k.isin(known)


def _member_names(schema: dict) -> list[str]:
    names = list(schema.get("properties", {})) if isinstance(schema.get("properties"), dict) else []
    names += schema.get("required", []) if isinstance(schema.get("required"), list) else []
    return list(dict.fromkeys(names))


def compile_schema(schema: dict, parsed: Column) -> tuple[Column | None, list[str]]:
    """The reason column (``schema:<pointer>`` or null) for a compilable schema, and its keyword locations."""
    from jsonschema.validators import Draft4Validator

    cls = _validator_class(schema)
    compiler = _Compiler(cls, draft4=cls is Draft4Validator)
    index = compiler.build(schema, _Node(parsed), "")
    if index is None:
        return None, []
    reasons = F.array(*[F.lit(SCHEMA_PREFIX + loc) for loc in compiler.locations])
    # try_element_at: ANSI mode (Spark 4's default) raises on an out-of-range index.
    return F.try_element_at(reasons, index + 1), compiler.locations


# --------------------------------------------------------------------------- Python fallback

# One compiled validator per schema per Python worker process: Spark reuses its
# Python workers (spark.python.worker.reuse), so a schema is compiled once, not per row or batch.
_VALIDATORS: dict[str, tuple[Any, dict]] = {}


def _validator(schema_json: str) -> tuple[Any, dict]:
    cached = _VALIDATORS.get(schema_json)
    if cached is None:
        schema = json.loads(schema_json)
        cls = _validator_class(schema)
        cached = (cls(schema, format_checker=cls.FORMAT_CHECKER), schema)
        _VALIDATORS[schema_json] = cached
    return cached


def _resolve_local(root: Any, ref: str) -> Any:
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None  # remote or anchor reference: not followed
    node = root
    for token in ref[2:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


def _keyword_location(schema: dict, error: Any) -> list[Any]:
    """The error's keywordLocation as JSON Schema's output format defines it.

    jsonschema's ``schema_path`` leaves out the ``$ref`` it went through, so the
    ``$ref`` steps are put back (for local references) to give a pointer that
    reads along the file: ``/properties/n/$ref/minimum``.
    """
    parts: list[Any] = []
    node: Any = schema
    for part in error.schema_path:
        for _ in range(32):  # a chain of references, bounded against cycles
            ref = node.get("$ref") if isinstance(node, dict) and part not in node else None
            target = _resolve_local(schema, ref) if isinstance(ref, str) else None
            if target is None:
                break
            parts.append("$ref")
            node = target
        parts.append(part)
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            node = None
    if error.validator == "required" and isinstance(error.instance, dict):
        # jsonschema reports /required; the compiled path names the element.
        # Each missing property yields one error, so the first missing one is
        # the earliest in document order.
        missing = [i for i, name in enumerate(error.validator_value) if name not in error.instance]
        if missing:
            parts.append(missing[0])
    return parts


def _document_order(schema: Any, parts: list[Any]) -> tuple[int, ...]:
    """Position of a keyword location in the schema file, depth first: the compiled leaf order."""
    key: list[int] = []
    node = schema
    for part in parts:
        if isinstance(node, dict) and part in node:
            key.append(list(node).index(part))
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            key.append(part)
            node = node[part]
        else:
            break  # e.g. through a $ref: order by the part before it
    return tuple(key)


def fallback_reason(schema_json: str, value: str) -> str | None:
    """``schema:<keywordLocation>`` of the first failing keyword (document order), or None when valid."""
    validator, schema = _validator(schema_json)
    try:
        instance = json.loads(value)
    except ValueError:
        return NOT_JSON
    best: tuple[tuple[int, ...], list[Any]] | None = None
    for error in validator.iter_errors(instance):
        parts = _keyword_location(schema, error)
        order = _document_order(schema, parts)
        if best is None or order < best[0]:
            best = (order, parts)
    if best is None:
        return None
    return SCHEMA_PREFIX + "".join(f"/{_escape(p)}" for p in best[1])


def _fallback_udf(schemas: tuple[str, ...]) -> Callable[..., Column]:
    def validate(ids: pd.Series, values: pd.Series) -> pd.Series:
        out = [
            None if value is None or pd.isna(i) else fallback_reason(schemas[int(i)], value)
            for i, value in zip(ids, values, strict=True)
        ]
        return pd.Series(out, dtype=object)

    return F.pandas_udf(validate, "string")


# --------------------------------------------------------------------------- the columns


def parse_value(value_col: Column, max_value_bytes: int | None = None) -> Column:
    """The Kafka value (BINARY) parsed once to a VARIANT; null when not JSON.

    Share this column between validation and event-time extraction: parsing is
    the most expensive step per message. With ``max_value_bytes`` oversized
    values are not parsed at all (they are invalid as ``too_large`` anyway).
    """
    parsed = F.try_parse_json(value_col.cast("string"))
    if max_value_bytes is None:
        return parsed
    return F.when(F.length(value_col) <= F.lit(max_value_bytes), parsed)


def topic_matches(topic_col: Column, rule: TopicRule) -> Column:
    """The rule's topic condition: equality, or a whole-name RLIKE (Java regex) for ``re:`` rules."""
    if not rule.is_pattern:
        return topic_col == F.lit(rule.match)
    problem = _java_regex_problem(rule.match)
    if problem:
        raise RuleError(f"topic pattern {rule.label!r} is not a valid Java regex for Spark RLIKE: {problem}")
    # RLIKE searches; anchoring with ^ and \z makes it Python's fullmatch.
    return topic_col.rlike(f"^(?:{rule.match})\\z")


def select_by_topic(topic_col: Column, ruleset: RuleSet, pick: Callable[[TopicRule], Column | None]) -> Column | None:
    """``CASE WHEN <rule 1 matches> THEN pick(rule 1) ... END`` in precedence order; None without rules.

    Evaluated per row from the topic column, so a topic created while a stream
    runs gets its pattern rule without a restart. A rule for which ``pick``
    returns None still ends the search (its branch is NULL), so first match wins.
    """
    return _select(topic_col, ruleset.rules, lambda _position, rule: pick(rule))


def _select(
    topic_col: Column, rules: Sequence[TopicRule], pick: Callable[[int, TopicRule], Column | None]
) -> Column | None:
    result: Column | None = None
    for position, rule in enumerate(rules):
        value = pick(position, rule)
        value = value if value is not None else F.lit(None)
        cond = topic_matches(topic_col, rule)
        result = F.when(cond, value) if result is None else result.when(cond, value)
    return result


def value_reason(
    topic_col: Column,
    value_col: Column,
    parsed_col: Column,
    ruleset: RuleSet,
    max_value_bytes: int,
    *,
    force_fallback: bool = False,
) -> Column:
    """Why a message is invalid (see the module docstring for the codes and their order); null when valid.

    ``parsed_col`` should be a column holding :func:`parse_value` of
    ``value_col`` (select it first): passed as an expression it would be parsed
    again for every check. ``force_fallback`` sends every schema through the
    Python fallback (for tests comparing both paths).
    """
    value_str = value_col.cast("string")
    too_large = F.length(value_col) > F.lit(max_value_bytes)
    not_utf8 = ~F.is_valid_utf8(value_str)
    plans = [plan_rule(rule, force_fallback) for rule in ruleset.rules]

    # Position of each fallback rule in the UDF's tuple of schemas.
    fallback_ids: dict[int, int] = {}
    fallback_schemas: list[str] = []
    for position, plan in enumerate(plans):
        if plan.rule.schema is not None and not plan.native:
            fallback_ids[position] = len(fallback_schemas)
            fallback_schemas.append(json.dumps(plan.rule.schema, separators=(",", ":")))

    fallback_result: Column | None = None
    if fallback_schemas:
        # Spark runs a Python UDF on every row of the batch (it is pulled out
        # into its own operator whatever surrounds it), so rows that do not
        # need it get NULL inputs and cost an Arrow null each, not a JSON parse.
        ids = _select(
            topic_col,
            ruleset.rules,
            lambda position, _rule: F.lit(fallback_ids[position]) if position in fallback_ids else None,
        )
        needed = ~too_large & value_col.isNotNull() & ~not_utf8 & parsed_col.isNotNull()
        ids = F.when(needed, ids).cast("int")
        fallback_result = _fallback_udf(tuple(fallback_schemas))(ids, F.when(ids.isNotNull(), value_str))

    def schema_reason(position: int, rule: TopicRule) -> Column | None:
        if rule.schema is None:
            return None
        if position in fallback_ids:
            return fallback_result
        return compile_schema(rule.schema, parsed_col)[0]

    # One CASE over the topic, evaluated per row: only the matching rule's
    # checks run, and a topic created while the stream runs gets its pattern
    # rule without a restart.
    by_topic = _select(topic_col, ruleset.rules, schema_reason)
    return (
        F.when(too_large, F.lit(TOO_LARGE))
        .when(value_col.isNull(), F.lit(NULL_VALUE))
        .when(not_utf8, F.lit(NOT_UTF8))
        .when(parsed_col.isNull(), F.lit(NOT_JSON))
        .otherwise(by_topic if by_topic is not None else F.lit(None))
        .cast("string")
    )
