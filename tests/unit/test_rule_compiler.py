"""Rules compiled to Spark expressions, and the Python fallback, give the documented reasons.

All cases run in one DataFrame: one row per (topic, value), each topic's rule
exercising one keyword. The same rows are evaluated natively and with every
schema forced through the Python fallback; both must give the expected reasons.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from kdq.rules import RuleSet, load_rules

# Python workers must run this interpreter (it has pandas and jsonschema);
# set before the session-scoped SparkSession starts, which reads it once.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

MAX_BYTES = 1000
EXAMPLE_RULES = Path(__file__).resolve().parents[2] / "config" / "rules"
ORDER = {"order_id": "o-1", "amount": 12.5, "currency": "EUR", "customer": {"id": "c-1"}}

SCHEMAS: dict[str, dict] = {
    "kw.type.string": {"type": "string"},
    "kw.type.integer": {"type": "integer"},
    "kw.type.number": {"type": "number"},
    "kw.type.boolean": {"type": "boolean"},
    "kw.type.null": {"type": "null"},
    "kw.type.array": {"type": "array"},
    "kw.type.object": {"type": "object"},
    "kw.type.list": {"type": ["string", "null"]},
    "kw.required": {"required": ["a", "b"]},
    "kw.properties": {"properties": {"a": {"type": "string"}}},
    "kw.nested": {
        "type": "object",
        "properties": {
            "customer": {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}},
            "a": {"properties": {"b": {"properties": {"c": {"properties": {"d": {"minimum": 0}}}}}}},
        },
    },
    "kw.enum": {"enum": ["EUR", "USD", 1, None, True]},
    "kw.const": {"const": "x"},
    "kw.minimum": {"minimum": 0},
    "kw.maximum": {"maximum": 10},
    "kw.exclusiveMinimum": {"exclusiveMinimum": 0},
    "kw.exclusiveMaximum": {"exclusiveMaximum": 10},
    "kw.minLength": {"minLength": 2},
    "kw.maxLength": {"maxLength": 2},
    "kw.pattern": {"pattern": "[0-9]"},
    "kw.pattern.anchored": {"pattern": "^ab"},
    "kw.items": {"items": {"type": "integer", "minimum": 1}},
    "kw.items.nested": {"properties": {"lines": {"type": "array", "items": {"properties": {"qty": {"minimum": 1}}}}}},
    "kw.items.order": {"items": {"properties": {"qty": {"minimum": 1}}, "required": ["sku"]}},
    "kw.additional.false": {"properties": {"a": {}}, "additionalProperties": False},
    "kw.additional.none": {"additionalProperties": False},
    "kw.additional.schema": {"properties": {"a": {}}, "additionalProperties": {"type": "string"}},
    "kw.annotations": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://example.com/a",
        "title": "A",
        "description": "annotations only",
        "examples": [{}],
        "default": {},
        "$comment": "ignored",
        "x-owner": "team-a",
        "type": "object",
    },
    "kw.order.props_first": {"properties": {"a": {"type": "string"}}, "required": ["a", "b"]},
    "kw.order.required_first": {"required": ["a", "b"], "properties": {"a": {"type": "string"}}},
    "kw.draft4": {"$schema": "http://json-schema.org/draft-04/schema#", "minimum": 0, "exclusiveMinimum": True},
    "kw.escape": {
        "properties": {
            "a/b~c": {"type": "string"},
            "it's": {"type": "string"},
            "x`y.z": {"type": "string"},
            "": {"type": "string"},
            "a": {"type": "string"},
            "[x]": {"type": "string"},
        }
    },
    "fb.quotes": {"properties": {"q'\"b": {"type": "string"}}},
    # Not compilable: these always run in the Python fallback.
    "fb.oneof": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    "fb.ref": {"$defs": {"pos": {"type": "integer", "minimum": 1}}, "properties": {"n": {"$ref": "#/$defs/pos"}}},
    "fb.mixed": {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "anyOf": [{"required": ["x"]}, {"required": ["y"]}],
    },
}

TOPICS_TOML = """
[[topic]]
match = "pat.free"

[[topic]]
match = 're:pat\\..*'
schema = "pattern-rule.json"

[[topic]]
match = "evt"
event_time_field = "meta.event_time"
event_time_format = "epoch_millis"
"""

# (topic, value, expected reason); None = valid.
CASES: list[tuple[str, bytes | None, str | None]] = [
    # envelope, in priority order
    ("none.topic", b'{"a":1}', None),
    ("none.topic", b"5", None),
    ("none.topic", b'"text"', None),
    ("none.topic", b"null", None),
    ("none.topic", b"x", "not_json"),
    ("none.topic", b"{", "not_json"),
    ("none.topic", b"", "not_json"),
    ("none.topic", b"   ", "not_json"),
    ("none.topic", b"\xff\xfe", "not_utf8"),
    ("none.topic", None, "null_value"),
    ("none.topic", b'"' + b"a" * MAX_BYTES + b'"', "too_large"),
    ("none.topic", b"\xff" * (MAX_BYTES + 1), "too_large"),
    ("kw.type.string", b"{", "not_json"),
    ("kw.type.string", b"\xc3\x28", "not_utf8"),
    ("kw.type.string", None, "null_value"),
    # type, strictly
    ("kw.type.string", b'"a"', None),
    ("kw.type.string", b"5", "schema:/type"),
    ("kw.type.string", b"null", "schema:/type"),
    ("kw.type.string", b'{"a":"b"}', "schema:/type"),
    ("kw.type.integer", b"5", None),
    ("kw.type.integer", b"-0", None),
    ("kw.type.integer", b"5.0", None),
    ("kw.type.integer", b"1e2", None),
    ("kw.type.integer", b"12345678901234567890", None),
    ("kw.type.integer", b"5.5", "schema:/type"),
    ("kw.type.integer", b"1e20", None),
    ("kw.type.integer", b"-1e300", None),
    ("kw.type.integer", b"9007199254740993", None),
    ("kw.type.integer", b"4503599627370495.5", "schema:/type"),
    ("kw.type.integer", b"-0.5", "schema:/type"),
    ("kw.type.integer", b'"5"', "schema:/type"),
    ("kw.type.integer", b"true", "schema:/type"),
    ("kw.type.number", b"5.5", None),
    ("kw.type.number", b"5", None),
    ("kw.type.number", b"1e400", None),
    ("kw.type.number", b'"5"', "schema:/type"),
    ("kw.type.number", b"true", "schema:/type"),
    ("kw.type.number", b"[5]", "schema:/type"),
    ("kw.type.boolean", b"true", None),
    ("kw.type.boolean", b"1", "schema:/type"),
    ("kw.type.boolean", b'"true"', "schema:/type"),
    ("kw.type.null", b"null", None),
    ("kw.type.null", b"0", "schema:/type"),
    ("kw.type.null", b'"null"', "schema:/type"),
    ("kw.type.array", b"[]", None),
    ("kw.type.array", b"{}", "schema:/type"),
    ("kw.type.object", b"{}", None),
    ("kw.type.object", b"[]", "schema:/type"),
    ("kw.type.list", b'"a"', None),
    ("kw.type.list", b"null", None),
    ("kw.type.list", b"1", "schema:/type"),
    # required: a JSON null is present; required applies to objects only
    ("kw.required", b'{"a":1,"b":null}', None),
    ("kw.required", b'{"a":1}', "schema:/required/1"),
    ("kw.required", b"{}", "schema:/required/0"),
    ("kw.required", b"[1]", None),
    # properties: a missing property is not checked, a JSON null is
    ("kw.properties", b"{}", None),
    ("kw.properties", b'{"a":"x"}', None),
    ("kw.properties", b'{"a":null}', "schema:/properties/a/type"),
    ("kw.properties", b'{"a":1}', "schema:/properties/a/type"),
    ("kw.properties", b'"not an object"', None),
    ("kw.nested", b'{"customer":{"id":"c"},"a":{"b":{"c":{"d":1}}}}', None),
    ("kw.nested", b'{"customer":{"id":1}}', "schema:/properties/customer/properties/id/type"),
    ("kw.nested", b'{"customer":{}}', "schema:/properties/customer/required/0"),
    ("kw.nested", b'{"customer":[]}', "schema:/properties/customer/type"),
    ("kw.nested", b'{"a":{"b":{"c":{"d":-1}}}}', "schema:/properties/a/properties/b/properties/c/properties/d/minimum"),
    # enum / const: JSON equality (1 == 1.0, true != 1, "1" != 1)
    ("kw.enum", b'"EUR"', None),
    ("kw.enum", b"1.0", None),
    ("kw.enum", b"null", None),
    ("kw.enum", b"true", None),
    ("kw.enum", b'"GBP"', "schema:/enum"),
    ("kw.enum", b'"1"', "schema:/enum"),
    ("kw.enum", b"false", "schema:/enum"),
    ("kw.enum", b"1.5", "schema:/enum"),
    ("kw.enum", b"{}", "schema:/enum"),
    ("kw.const", b'"x"', None),
    ("kw.const", b'"y"', "schema:/const"),
    # numeric bounds apply to numbers only
    ("kw.minimum", b"0", None),
    ("kw.minimum", b"-1", "schema:/minimum"),
    ("kw.minimum", b"-0.5", "schema:/minimum"),
    ("kw.minimum", b'"-1"', None),
    ("kw.maximum", b"10", None),
    ("kw.maximum", b"10.5", "schema:/maximum"),
    ("kw.exclusiveMinimum", b"0.1", None),
    ("kw.exclusiveMinimum", b"0", "schema:/exclusiveMinimum"),
    ("kw.exclusiveMaximum", b"9.99", None),
    ("kw.exclusiveMaximum", b"10", "schema:/exclusiveMaximum"),
    ("kw.draft4", b"1", None),
    ("kw.draft4", b"0", "schema:/minimum"),
    # string lengths count code points, not bytes
    ("kw.minLength", b'"ab"', None),
    ("kw.minLength", b'"a"', "schema:/minLength"),
    ("kw.minLength", '"é"'.encode(), "schema:/minLength"),
    ("kw.minLength", b"5", None),
    ("kw.maxLength", '"éé"'.encode(), None),
    ("kw.maxLength", b'"abc"', "schema:/maxLength"),
    # pattern is an unanchored search
    ("kw.pattern", b'"ab1c"', None),
    ("kw.pattern", b'"abc"', "schema:/pattern"),
    ("kw.pattern", b"5", None),
    ("kw.pattern.anchored", b'"abx"', None),
    ("kw.pattern.anchored", b'"xab"', "schema:/pattern"),
    # items
    ("kw.items", b"[1,2]", None),
    ("kw.items", b"[]", None),
    ("kw.items", b"{}", None),
    ("kw.items", b"[1,0]", "schema:/items/minimum"),
    ("kw.items", b'[1,"2"]', "schema:/items/type"),
    ("kw.items", b"[1,null]", "schema:/items/type"),
    ("kw.items.nested", b'{"lines":[{"qty":1},{"qty":2}]}', None),
    ("kw.items.nested", b'{"lines":[{"qty":1},{"qty":0}]}', "schema:/properties/lines/items/properties/qty/minimum"),
    ("kw.items.nested", b'{"lines":{}}', "schema:/properties/lines/type"),
    # the earliest failing keyword for any element, not the first failing element
    ("kw.items.order", b'[{"qty":1},{"sku":1,"qty":0}]', "schema:/items/properties/qty/minimum"),
    ("kw.items.order", b'[{"sku":1,"qty":1},{"qty":1}]', "schema:/items/required/0"),
    ("kw.items.order", b'[{"sku":1,"qty":1},5,null,[1]]', None),
    # long arrays, and elements that are no objects or fail late in the array
    ("kw.items", b"[" + b"1," * 20 + b"1]", None),
    ("kw.items", b"[" + b"1," * 20 + b"0]", "schema:/items/minimum"),
    ("kw.items", b"[" + b"1," * 16 + b'"x",0]', "schema:/items/type"),
    ("kw.items", b"[" + b"1," * 15 + b"0]", "schema:/items/minimum"),
    ("kw.items.order", b"[" + b'{"sku":1,"qty":1},' * 16 + b'{"qty":1}]', "schema:/items/required/0"),
    ("kw.items.order", b"[" + b'{"sku":1,"qty":1},' * 16 + b'{"qty":0}]', "schema:/items/properties/qty/minimum"),
    ("kw.items.order", b"[" + b'{"sku":1,"qty":1},' * 15 + b'{"qty":1}]', "schema:/items/required/0"),
    ("kw.items.nested", b'{"lines":[' + b'{"qty":1},' * 30 + b'{"qty":0}]}', "schema:/properties/lines/items/properties/qty/minimum"),
    ("kw.items.nested", b'{"lines":[' + b'{"qty":1},' * 15 + b'5,{"qty":0}]}', "schema:/properties/lines/items/properties/qty/minimum"),
    # additionalProperties
    ("kw.additional.false", b'{"a":1}', None),
    ("kw.additional.false", b'{"a":1,"b":2}', "schema:/additionalProperties"),
    ("kw.additional.none", b"{}", None),
    ("kw.additional.none", b'{"x":1}', "schema:/additionalProperties"),
    ("kw.additional.none", b"[1]", None),
    ("kw.additional.schema", b'{"a":1,"b":"x"}', None),
    ("kw.additional.schema", b'{"a":1,"b":2}', "schema:/additionalProperties/type"),
    # annotations are ignored
    ("kw.annotations", b"{}", None),
    ("kw.annotations", b"[]", "schema:/type"),
    # document order decides between several failures
    ("kw.order.props_first", b'{"a":1}', "schema:/properties/a/type"),
    ("kw.order.required_first", b'{"a":1}', "schema:/required/1"),
    # JSON-pointer escaping and quotes in property names
    ("kw.escape", b'{"a/b~c":1}', "schema:/properties/a~1b~0c/type"),
    ("kw.escape", b'{"it\'s":1}', "schema:/properties/it's/type"),
    ("kw.escape", b'{"a/b~c":"x","it\'s":"y"}', None),
    ("kw.escape", b'{"[x]":1}', "schema:/properties/[x]/type"),
    ("kw.escape", b'{"x`y.z":1}', "schema:/properties/x`y.z/type"),
    ("kw.escape", b'{"":1}', "schema:/properties//type"),
    ("kw.escape", b'{"A":1}', None),
    ("kw.escape", b'{"A":1,"a":2}', "schema:/properties/a/type"),
    # topic patterns (topics created at any time), first match wins
    ("pat.new1", b'{"id":1}', None),
    ("pat.new1", b"{}", "schema:/required/0"),
    ("pat.x.y", b"{}", "schema:/required/0"),
    ("pat.free", b"{}", None),
    ("patX", b"{}", None),
    ("xpat.a", b"{}", None),
    # the shipped example rule (config/rules/orders.schema.json)
    ("orders", json.dumps(ORDER).encode(), None),
    ("orders", json.dumps({**ORDER, "lines": [{"sku": "a", "qty": 2}]}).encode(), None),
    ("orders", json.dumps({**ORDER, "amount": -1}).encode(), "schema:/properties/amount/minimum"),
    ("orders", json.dumps({**ORDER, "amount": "12.5"}).encode(), "schema:/properties/amount/type"),
    ("orders", json.dumps({**ORDER, "currency": "CHF"}).encode(), "schema:/properties/currency/enum"),
    ("orders", json.dumps({**ORDER, "customer": {}}).encode(), "schema:/properties/customer/required/0"),
    ("orders", json.dumps({k: v for k, v in ORDER.items() if k != "currency"}).encode(), "schema:/required/2"),
    (
        "orders",
        json.dumps({**ORDER, "lines": [{"sku": "a", "qty": 1.5}]}).encode(),
        "schema:/properties/lines/items/properties/qty/type",
    ),
    # non-compilable rules: Python fallback, same reason format
    ("fb.oneof", b'"a"', None),
    ("fb.oneof", b"3", None),
    ("fb.oneof", b"1.5", "schema:/oneOf"),
    ("fb.oneof", b"\xff", "not_utf8"),
    ("fb.oneof", b"{", "not_json"),
    ("fb.ref", b'{"n":1}', None),
    ("fb.ref", b'{"n":0}', "schema:/properties/n/$ref/minimum"),
    ("fb.mixed", b'{"a":1}', "schema:/properties/a/type"),
    ("fb.mixed", b'{"a":"s"}', "schema:/anyOf"),
    ("fb.mixed", b'{"a":"s","y":1}', None),
    ("fb.quotes", b'{"q\'\\"b":1}', "schema:/properties/q'\"b/type"),
]


@pytest.fixture(scope="module")
def ruleset(tmp_path_factory: pytest.TempPathFactory) -> RuleSet:
    folder: Path = tmp_path_factory.mktemp("rules")
    shutil.copy(EXAMPLE_RULES / "orders.schema.json", folder)
    for topic, schema in SCHEMAS.items():
        (folder / f"{topic}.schema.json").write_text(json.dumps(schema))
    (folder / "pattern-rule.json").write_text(json.dumps({"type": "object", "required": ["id"]}))
    (folder / "topics.toml").write_text(TOPICS_TOML)
    return load_rules(folder)


@pytest.fixture(scope="module")
def reasons(spark, ruleset: RuleSet) -> dict[bool, list[str | None]]:
    """Reasons for every case, natively (False) and with every schema forced to the fallback (True)."""
    from pyspark.sql import functions as F

    from kdq.spark.rule_compiler import parse_value, value_reason

    rows = [(i, topic, value) for i, (topic, value, _) in enumerate(CASES)]
    df = spark.createDataFrame(rows, "id int, topic string, value binary")
    # Parsed once into a column, as the jobs do; every check reads that column.
    df = df.withColumn("parsed", parse_value(F.col("value"), MAX_BYTES))
    args = (F.col("topic"), F.col("value"), F.col("parsed"), ruleset, MAX_BYTES)
    native = value_reason(*args)
    forced = value_reason(*args, force_fallback=True)
    out = {r.id: r for r in df.select("id", native.alias("native"), forced.alias("forced")).collect()}
    return {False: [out[i].native for i in range(len(CASES))], True: [out[i].forced for i in range(len(CASES))]}


def _mismatches(got: list[str | None]) -> list[str]:
    return [
        f"{topic} {value!r}: expected {expected!r}, got {actual!r}"
        for (topic, value, expected), actual in zip(CASES, got, strict=True)
        if expected != actual
    ]


def test_native_reasons(reasons: dict[bool, list[str | None]]) -> None:
    assert _mismatches(reasons[False]) == []


def test_items_read_only_members_when_enough(ruleset: RuleSet) -> None:
    """An item schema on members only (orders' lines) casts the members once: no per-element variant, no zip."""
    from pyspark.sql import functions as F

    from kdq.spark.rule_compiler import value_reason

    orders = RuleSet(rules=tuple(r for r in ruleset.rules if r.match == "orders"))
    text = str(value_reason(F.col("topic"), F.col("value"), F.col("parsed"), orders, MAX_BYTES))
    assert "transform(" in text and "arrays_zip" not in text


def test_fallback_gives_identical_reasons(reasons: dict[bool, list[str | None]]) -> None:
    assert _mismatches(reasons[True]) == []
    assert reasons[True] == reasons[False]


def test_describe_names_the_fallback_topics(ruleset: RuleSet) -> None:
    from kdq.spark.rule_compiler import describe

    lines = describe(ruleset)
    assert "orders: compiled (native Spark)" in lines
    assert "kw.items.nested: compiled (native Spark)" in lines
    assert "kw.draft4: compiled (native Spark)" in lines
    assert "fb.oneof: Python fallback (oneOf at /oneOf)" in lines
    assert "fb.ref: Python fallback ($ref at /properties/n/$ref)" in lines
    assert "fb.mixed: Python fallback (anyOf at /anyOf)" in lines
    assert "pat.free: no schema (valid iff UTF-8 JSON)" in lines
    assert "re:pat\\..*: compiled (native Spark)" in lines
    assert lines[-1] == "other topics: no rule (valid iff UTF-8 JSON)"
    assert all("fallback (forced)" in line for line in describe(ruleset, force_fallback=True) if "kw." in line)


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"type": "integer", "$schema": "http://json-schema.org/draft-04/schema#"}, "draft-04 integer at /type"),
        ({"enum": [{"a": 1}]}, "enum with object/array values at /enum"),
        ({"properties": {"x": {"format": "email"}}}, "format at /properties/x/format"),
        ({"patternProperties": {"^a": {}}}, "patternProperties at /patternProperties"),
        ({"items": {"multipleOf": 2}}, "multipleOf at /items/multipleOf"),
        ({"dependentRequired": {"a": ["b"]}}, "dependentRequired at /dependentRequired"),
        ({"pattern": "(?P<x>a)"}, "pattern not valid in Java at /pattern: Python-only named group syntax (?P...)"),
        ({"properties": {"a'\"b": {}}}, "property name 'a\\'\"b' has both quote characters at /properties/a'\"b"),
        ({"required": ["a'\"b"]}, "property name 'a\\'\"b' has both quote characters at /required/0"),
    ],
)
def test_what_falls_back(schema: dict, why: str) -> None:
    from kdq.rules import TopicRule
    from kdq.spark.rule_compiler import plan_rule

    plan = plan_rule(TopicRule("t", False, schema, None, None, "auto", "v"))
    assert not plan.native
    assert plan.fallback_reason == why


def test_regex_that_only_java_rejects(spark) -> None:
    """With a session at hand, patterns are also checked by Java's regex engine (what RLIKE runs)."""
    from pyspark.sql import functions as F

    from kdq.rules import RuleError, TopicRule
    from kdq.spark.rule_compiler import plan_rule, topic_matches

    plan = plan_rule(TopicRule("t", False, {"pattern": "a{"}, None, None, "auto", "v"))
    assert not plan.native and plan.fallback_reason.startswith("pattern not valid in Java at /pattern: ")
    with pytest.raises(RuleError, match=r"topic pattern 're:a\{' is not a valid Java regex"):
        topic_matches(F.col("topic"), TopicRule("a{", True, None, None, None, "auto", "v"))


def test_parse_value_is_shared_with_event_time(spark, ruleset: RuleSet) -> None:
    """The parsed VARIANT also serves the event-time field, selected per topic like the rule."""
    from pyspark.sql import functions as F

    from kdq.spark.rule_compiler import parse_value, select_by_topic

    df = spark.createDataFrame(
        [("evt", b'{"meta":{"event_time":1700000000123}}'), ("evt", b"x" * 50), ("kw.minimum", b"5")],
        "topic string, value binary",
    )
    parsed = parse_value(F.col("value"), max_value_bytes=10)
    event_time = select_by_topic(
        F.col("topic"),
        ruleset,
        lambda rule: F.try_variant_get(parsed, rule.event_time_path, "bigint") if rule.event_time_field else None,
    )
    got = [tuple(r) for r in df.select(parsed.isNull(), event_time).collect()]
    # the 50-byte value is over max_value_bytes=10: not parsed at all; the first is 38 bytes too
    assert got == [(True, None), (True, None), (False, None)]
    parsed_all = parse_value(F.col("value"))
    got = [
        r[0]
        for r in df.select(
            select_by_topic(
                F.col("topic"),
                ruleset,
                lambda rule: (
                    F.try_variant_get(parsed_all, rule.event_time_path, "bigint") if rule.event_time_field else None
                ),
            )
        ).collect()
    ]
    assert got == [1700000000123, None, None]
