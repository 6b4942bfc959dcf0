"""The JVM record classifier (io.kdq.spark.classify.Classifier through kdq.spark.classifier) gives the documented reasons.

All cases run in one DataFrame: one row per (topic, value), each topic's rule
exercising one keyword, through the same Spark function both layers use. The
official JSON-Schema-Test-Suite runs against the same class in the module's own
tests (jvm/kdq-spark-functions, ConformanceTest) and through Spark in
test_json_schema_suite.py.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from kdq.config import StreamConfig
from kdq.rules import RuleError, RuleSet, load_rules

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
    "ap.quotes": {"properties": {"q'\"b": {"type": "string"}}},
    # Keywords the retired Spark-expression compiler could not express (they went to a Python fallback).
    "ap.oneof": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    "ap.ref": {"$defs": {"pos": {"type": "integer", "minimum": 1}}, "properties": {"n": {"$ref": "#/$defs/pos"}}},
    "ap.mixed": {
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
    # applicators and references, same reason format
    ("ap.oneof", b'"a"', None),
    ("ap.oneof", b"3", None),
    ("ap.oneof", b"1.5", "schema:/oneOf"),
    ("ap.oneof", b"\xff", "not_utf8"),
    ("ap.oneof", b"{", "not_json"),
    ("ap.ref", b'{"n":1}', None),
    ("ap.ref", b'{"n":0}', "schema:/properties/n/$ref/minimum"),
    ("ap.mixed", b'{"a":1}', "schema:/properties/a/type"),
    ("ap.mixed", b'{"a":"s"}', "schema:/anyOf"),
    ("ap.mixed", b'{"a":"s","y":1}', None),
    ("ap.quotes", b'{"q\'\\"b":1}', "schema:/properties/q'\"b/type"),
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


def verdicts(spark, rules: RuleSet, records: list[tuple[str, bytes | None]], max_bytes: int = MAX_BYTES) -> list:
    """(topic, value) → the classifier's struct per record, in input order."""
    from pyspark.sql import functions as F

    from kdq.spark.classifier import classifier

    rows = [(i, topic, value) for i, (topic, value) in enumerate(records)]
    df = spark.createDataFrame(rows, "id int, topic string, value binary")
    verdict = classifier(spark, rules, StreamConfig(max_value_bytes=max_bytes))
    out = {r.id: r.v for r in df.select("id", verdict(F.col("topic"), F.col("value")).alias("v")).collect()}
    return [out[i] for i in range(len(records))]


def test_reasons(spark, ruleset: RuleSet) -> None:
    got = verdicts(spark, ruleset, [(topic, value) for topic, value, _ in CASES])
    mismatches = [
        f"{topic} {value!r}: expected {expected!r}, got {v.problem!r}"
        for (topic, value, expected), v in zip(CASES, got, strict=True)
        if expected != v.problem
    ]
    assert mismatches == [], "\n".join(mismatches)
    versions = {topic: v.rules_version for (topic, _, _), v in zip(CASES, got, strict=True)}
    assert versions["none.topic"] == "none" and versions["orders"] == ruleset.version_for("orders")


def _folder(tmp_path: Path, files: dict[str, object], toml: str = "") -> RuleSet:
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    if toml:
        (tmp_path / "topics.toml").write_text(toml)
    return load_rules(tmp_path)


def test_event_time_field_names_are_taken_literally(spark, tmp_path) -> None:
    """Segments such as @timestamp, event-time or names with both quote characters need no path syntax."""
    rules = _folder(
        tmp_path,
        {},
        """
[[topic]]
match = "at"
event_time_field = "@timestamp"

[[topic]]
match = "dash"
event_time_field = "meta.event-time"
event_time_format = "iso8601"

[[topic]]
match = "quotes"
event_time_field = "it's \\"q\\""
""",
    )
    got = verdicts(
        spark,
        rules,
        [
            ("at", b'{"@timestamp": 1700000000123}'),
            ("dash", b'{"meta": {"event-time": "2023-11-14T22:13:20.123Z"}}'),
            ("quotes", b'{"it\'s \\"q\\"": "1700000000123"}'),
            ("at", b'{"timestamp": 1700000000123}'),
        ],
    )
    assert [(v.event_ms, v.event_time_bad) for v in got] == [
        (1700000000123, False),
        (1700000000123, False),
        (1700000000123, False),
        (None, True),
    ]


def test_ref_to_another_file_of_the_rules_folder(spark, tmp_path) -> None:
    rules = _folder(
        tmp_path,
        {
            "common.json": {"$defs": {"id": {"type": "string", "minLength": 2}}},
            "users.schema.json": {"properties": {"id": {"$ref": "common.json#/$defs/id"}}},
        },
    )
    got = verdicts(spark, rules, [("users", b'{"id": "ab"}'), ("users", b'{"id": "a"}')])
    assert [v.problem for v in got] == [None, "schema:/properties/id/$ref/minLength"]


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"properties": {"a": {"$ref": "missing.json"}}}, "missing.json"),
        ({"$ref": "https://example.com/remote.json"}, "https://example.com/remote.json"),
        ({"$dynamicRef": "#nowhere-remote", "$ref": "http://localhost:1234/draft2020-12/tree.json"}, "localhost:1234"),
        ({"pattern": "a{"}, "regex 'a{' does not compile in Java"),
    ],
)
def test_a_broken_rule_fails_at_start_naming_the_file(spark, tmp_path, schema: dict, problem: str) -> None:
    from kdq.spark.classifier import check_rules

    rules = _folder(tmp_path, {"broken.schema.json": schema})
    with pytest.raises(RuleError, match="broken.schema.json") as caught:
        check_rules(spark, rules, StreamConfig())
    assert problem in str(caught.value)


def test_a_bad_topic_pattern_fails_at_start(spark, tmp_path) -> None:
    from kdq.spark.classifier import check_rules

    # Python's re accepts (?<x>…) only since 3.11 in another spelling; Java refuses this one outright.
    rules = _folder(tmp_path, {}, "[[topic]]\nmatch = 're:(?P<x>a)'\n")
    with pytest.raises(RuleError, match=r"re:\(\?P<x>a\)"):
        check_rules(spark, rules, StreamConfig())


def test_catastrophic_pattern_gets_a_verdict_quickly(spark, tmp_path) -> None:
    # Exponential backtracking in java.util.regex (JDK 17 already runs ^(a+)+$ in linear time).
    rules = _folder(tmp_path, {"redos.schema.json": {"properties": {"s": {"pattern": "^(.*a){20}$"}}}})
    evil = json.dumps({"s": "a" * 64 + "b"}).encode()
    started = time.monotonic()
    got = verdicts(spark, rules, [("redos", evil), ("redos", b'{"s": "aaa"}'), ("redos", b'{"s": "aab"}')])
    # A deadline for the test, not a performance target: 2^64 steps would never finish.
    assert time.monotonic() - started < 120
    assert [v.problem for v in got] == [
        "pattern_budget:/properties/s/pattern",
        "schema:/properties/s/pattern",
        "schema:/properties/s/pattern",
    ]


def test_rule_lookup_with_a_thousand_topics(spark, tmp_path) -> None:
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer", "maximum": 10}}}
    rules = _folder(tmp_path, {f"t{i:04d}.schema.json": {**schema, "title": f"t{i}"} for i in range(1000)})
    records = [(f"t{i:04d}", json.dumps({"n": i % 20}).encode()) for i in range(0, 1000, 7)] + [("other", b"{}")]
    got = verdicts(spark, rules, records)
    expected = [None if i % 20 <= 10 else "schema:/properties/n/maximum" for i in range(0, 1000, 7)] + [None]
    assert [v.problem for v in got] == expected
    assert got[0].rules_version == rules.version_for("t0000") and got[-1].rules_version == "none"
