"""load_rules: convention files, topics.toml, precedence, versions and every broken-rule error."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from kdq.rules import NO_RULE_VERSION, RuleError, RuleSet, load_rules

ORDERS = {"type": "object", "required": ["order_id"]}
PAYMENTS = {"type": "object", "properties": {"amount": {"type": "number", "minimum": 0}}}


def write(folder: Path, name: str, content: dict | str) -> Path:
    path = folder / name
    path.write_text(content if isinstance(content, str) else json.dumps(content, indent=2))
    return path


def test_missing_or_empty_folder_gives_an_empty_ruleset(tmp_path: Path) -> None:
    for folder in (tmp_path / "absent", tmp_path):
        rules = load_rules(folder)
        assert rules.rules == ()
        assert rules.rule_for("orders") is None
        assert rules.version_for("orders") == NO_RULE_VERSION
    assert load_rules(tmp_path).version == load_rules(tmp_path / "absent").version


def test_convention_file_applies_to_exactly_its_topic(tmp_path: Path) -> None:
    path = write(tmp_path, "orders.schema.json", ORDERS)
    write(tmp_path, "demo.payments.schema.json", PAYMENTS)
    write(tmp_path, "README.md", "# not a rule")
    rules = load_rules(tmp_path)
    rule = rules.rule_for("orders")
    assert rule is not None
    assert (rule.match, rule.is_pattern, rule.schema, rule.schema_file) == ("orders", False, ORDERS, path)
    assert (rule.event_time_field, rule.event_time_format, rule.event_time_segments) == (None, "auto", None)
    assert rules.rule_for("demo.payments").schema == PAYMENTS
    for other in ("orders2", "Orders", "x.orders", "demo"):
        assert rules.rule_for(other) is None


def test_topics_toml_exact_and_regex_entries(tmp_path: Path) -> None:
    write(tmp_path, "legacy.json", PAYMENTS)
    write(
        tmp_path,
        "topics.toml",
        """
[[topic]]
match = 're:legacy\\.(eu|us)'
schema = "legacy.json"
event_time_field = "meta.event_time"
event_time_format = "iso8601"

[[topic]]
match = "clicks"
event_time_field = "ts"
""",
    )
    rules = load_rules(tmp_path)
    legacy = rules.rule_for("legacy.eu")
    assert legacy is not None and legacy.is_pattern and legacy.label == "re:legacy\\.(eu|us)"
    assert legacy.schema == PAYMENTS and legacy.schema_file == tmp_path / "legacy.json"
    assert (legacy.event_time_field, legacy.event_time_segments, legacy.event_time_format) == (
        "meta.event_time",
        ["meta", "event_time"],
        "iso8601",
    )
    assert rules.rule_for("legacy.us") is legacy
    # fullmatch: neither a prefix nor a longer name matches
    assert rules.rule_for("legacy.euX") is None and rules.rule_for("xlegacy.eu") is None
    clicks = rules.rule_for("clicks")
    assert clicks is not None and clicks.schema is None and clicks.event_time_segments == ["ts"]
    assert clicks.event_time_format == "auto"


def test_explicit_entries_win_over_convention_first_match_in_file_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path, "orders.schema.json", ORDERS)
    write(tmp_path, "payments.schema.json", ORDERS)
    write(tmp_path, "audit.x.schema.json", ORDERS)
    write(tmp_path, "other.json", PAYMENTS)
    write(
        tmp_path,
        "topics.toml",
        """
[[topic]]
match = "payments"
schema = "other.json"

[[topic]]
match = 're:audit\\..*'

[[topic]]
match = "orders"
event_time_field = "created_at"
event_time_format = "epoch_millis"

[[topic]]
match = "re:.*"
schema = "other.json"
""",
    )
    with caplog.at_level(logging.WARNING, logger="kdq.rules"):
        rules = load_rules(tmp_path)
    # an explicit exact entry replaces the convention file's schema
    assert rules.rule_for("payments").schema == PAYMENTS
    # an earlier pattern entry (even without a schema) wins over a convention file
    audit = rules.rule_for("audit.x")
    assert audit is not None and audit.is_pattern and audit.schema is None
    assert any("audit.x.schema.json" in r.getMessage() and "shadowed" in r.getMessage() for r in caplog.records)
    # an exact entry without `schema` keeps the topic's convention file
    orders = rules.rule_for("orders")
    assert orders is not None and orders.schema == ORDERS and orders.event_time_field == "created_at"
    assert orders.schema_file == tmp_path / "orders.schema.json"
    # the catch-all comes last in the file, so it only gets the rest
    assert rules.rule_for("anything").schema == PAYMENTS
    assert [r.label for r in rules.rules][:4] == ["payments", "re:audit\\..*", "orders", "re:.*"]


def test_versions_change_only_for_the_changed_topic(tmp_path: Path) -> None:
    write(tmp_path, "orders.schema.json", ORDERS)
    write(tmp_path, "payments.schema.json", PAYMENTS)
    first = load_rules(tmp_path)
    assert len(first.version_for("orders")) == 12
    assert first.version_for("orders") != first.version_for("payments")
    assert first.version_for("nobody") == NO_RULE_VERSION

    # formatting is not a change
    (tmp_path / "orders.schema.json").write_text(json.dumps(ORDERS, separators=(",", ":")))
    assert load_rules(tmp_path).version_for("orders") == first.version_for("orders")
    assert load_rules(tmp_path).version == first.version

    write(tmp_path, "orders.schema.json", {**ORDERS, "required": ["order_id", "amount"]})
    second = load_rules(tmp_path)
    assert second.version_for("orders") != first.version_for("orders")
    assert second.version_for("payments") == first.version_for("payments")
    assert second.version != first.version

    # event-time settings are part of the rule
    write(tmp_path, "topics.toml", '[[topic]]\nmatch = "payments"\nevent_time_field = "ts"\n')
    third = load_rules(tmp_path)
    assert third.version_for("payments") != second.version_for("payments")
    assert third.version_for("orders") == second.version_for("orders")
    write(
        tmp_path,
        "topics.toml",
        '[[topic]]\nmatch = "payments"\nevent_time_field = "ts"\nevent_time_format = "iso8601"\n',
    )
    assert load_rules(tmp_path).version_for("payments") != third.version_for("payments")

    # moving a rule from a convention file to an explicit entry with the same content is no change
    (tmp_path / "topics.toml").unlink()
    write(tmp_path, "topics.toml", '[[topic]]\nmatch = "re:pay.*"\nschema = "payments.schema.json"\n')
    assert load_rules(tmp_path).version_for("payments") == second.version_for("payments")


def test_ruleset_is_frozen() -> None:
    rules = RuleSet()
    with pytest.raises(AttributeError):
        rules.version = "x"  # type: ignore[misc]


BROKEN_TOML = [
    (
        '[[topic]]\nmatch = "a"\nschma = "x.json"\n',
        r"\[\[topic\]\] entry #1 \(match = 'a'\): unknown key 'schma' \(did you mean 'schema'\?\)",
    ),
    (
        '[[topic]]\nmatch = "a"\n[[topic]]\nmatch = "b"\nevent_time = "ts"\n',
        r"entry #2 \(match = 'b'\): unknown key 'event_time'",
    ),
    ('[[topic]]\nmatch = "re:orders(["\n', r"entry #1 \(match = 're:orders\(\['\): bad regex 'orders\(\['"),
    (
        '[[topic]]\nmatch = "a"\nschema = "missing.json"\n',
        r"entry #1 \(match = 'a'\): schema file 'missing.json' not found",
    ),
    (
        '[[topic]]\nmatch = "a"\n[[topic]]\nmatch = "b"\n[[topic]]\nmatch = "a"\n',
        r"entry #3 \(match = 'a'\): duplicate exact topic 'a' \(already in entry #1\)",
    ),
    (
        '[[topic]]\nmatch = "a"\nevent_time_format = "seconds"\n',
        r"bad event_time_format 'seconds'; expected one of auto, epoch_millis, iso8601",
    ),
    ('[[topic]]\nmatch = "a"\nevent_time_field = "meta..ts"\n', r"event_time_field must be a dotted path"),
    ('[[topic]]\nschema = "x.json"\n', r"entry #1: 'match' is required"),
    ('[[topic]\nmatch = "a"\n', r"not valid TOML"),
    ("[defaults]\nx = 1\n", r"unknown top-level key 'defaults'"),
]


@pytest.mark.parametrize(("toml", "message"), BROKEN_TOML)
def test_broken_topics_toml_names_the_file_and_the_problem(tmp_path: Path, toml: str, message: str) -> None:
    write(tmp_path, "topics.toml", toml)
    with pytest.raises(RuleError, match=message) as info:
        load_rules(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'topics.toml'}: ")


BROKEN_SCHEMAS = [
    ('{\n  "type": "object",\n  "required": ["a"\n}', r"not valid JSON: .* at line 4, column 1"),
    ("[1, 2]", r"a rule must be a JSON Schema \(an object or true/false\), got list"),
    ('{"type": "strng"}', r"not a valid JSON Schema at /type: "),
    (
        '{"properties": {"amount": {"minimum": "0"}}}',
        r"not a valid JSON Schema at /properties/amount/minimum: '0' is not of type 'number'",
    ),
    ('{"required": "order_id"}', r"not a valid JSON Schema at /required: "),
    # A pattern is an ECMA-262 regex: the JVM classifier compiles it and refuses a bad one at start
    # (test_classifier.py::test_a_broken_rule_fails_at_start_naming_the_file), not Python's re.
]


@pytest.mark.parametrize(("text", "message"), BROKEN_SCHEMAS)
def test_broken_schema_file_names_the_file_and_the_problem(tmp_path: Path, text: str, message: str) -> None:
    write(tmp_path, "orders.schema.json", text)
    with pytest.raises(RuleError, match=message) as info:
        load_rules(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'orders.schema.json'}: ")


def test_schema_referenced_from_topics_toml_is_checked_too(tmp_path: Path) -> None:
    write(tmp_path, "legacy.json", '{"type": 5}')
    write(tmp_path, "topics.toml", '[[topic]]\nmatch = "re:legacy.*"\nschema = "legacy.json"\n')
    with pytest.raises(RuleError, match=r"legacy.json: not a valid JSON Schema at /type"):
        load_rules(tmp_path)


def test_rules_dir_that_is_a_file(tmp_path: Path) -> None:
    write(tmp_path, "rules", "x")
    with pytest.raises(RuleError, match="not a folder"):
        load_rules(tmp_path / "rules")


def test_rules_module_imports_neither_spark_nor_airflow() -> None:
    import subprocess
    import sys

    code = "import sys, kdq.rules; print(any(m.split('.')[0] in ('pyspark', 'airflow') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_boolean_schemas_are_rules(tmp_path: Path) -> None:
    write(tmp_path, "open.schema.json", "true")
    write(tmp_path, "closed.schema.json", "false")
    rules = load_rules(tmp_path)
    assert rules.rule_for("open").schema is True and rules.rule_for("closed").schema is False
    assert rules.version_for("open") != rules.version_for("closed")


def test_remotes_map_a_uri_prefix_to_a_subfolder(tmp_path: Path) -> None:
    (tmp_path / "mirror").mkdir()
    write(tmp_path, "topics.toml", '[remotes]\n"https://schemas.example.com/" = "mirror/"\n')
    assert load_rules(tmp_path).remotes == (("https://schemas.example.com/", (tmp_path / "mirror").resolve()),)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('"schemas.example.com/" = "mirror/"', r"must be an absolute URI ending with '/'"),
        ('"https://schemas.example.com" = "mirror/"', r"must be an absolute URI ending with '/'"),
        ('"https://schemas.example.com/" = "absent/"', r"must name a subfolder of"),
        ('"https://schemas.example.com/" = "../"', r"must name a subfolder of"),
    ],
)
def test_broken_remotes_name_the_problem(tmp_path: Path, table: str, message: str) -> None:
    (tmp_path / "mirror").mkdir()
    write(tmp_path, "topics.toml", f"[remotes]\n{table}\n")
    with pytest.raises(RuleError, match=message):
        load_rules(tmp_path)


def test_registry_backed_rules(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``registry = true``: judged by the Schema Registry (subject by the topic-name strategy), never by a schema
    file, not even the topic's convention file; its version differs from a JSON rule's with the same settings,
    and every JSON rule's version stays what it was before registry rules existed."""
    from kdq.config import StreamConfig
    from kdq.rules import rule_version
    from kdq.spark.classifier import classifier_config

    write(tmp_path, "orders.schema.json", ORDERS)
    write(tmp_path, "topics.toml", '[[topic]]\nmatch = "orders"\nregistry = true\nevent_time_field = "created"\n'
          '[[topic]]\nmatch = "re:payments\\\\..*"\nregistry = true\nsubject_strategy = "topic_name"\n')
    with caplog.at_level(logging.WARNING):
        rules = load_rules(tmp_path)
    assert "orders.schema.json is shadowed" in caplog.text
    orders, payments = rules.rule_for("orders"), rules.rule_for("payments.eu")
    assert (orders.registry, orders.subject_strategy, orders.schema, orders.schema_file) == (True, "topic_name", None, None)
    assert payments.registry and payments.is_pattern
    assert orders.version == rule_version(None, "created", "auto", "topic_name") != rule_version(None, "created", "auto")
    assert "orders: the Schema Registry (subject strategy topic_name)" in rules.describe()[0]
    document = json.loads(classifier_config(rules, StreamConfig()))
    assert document["rules"][0]["registry"] == {"subject_strategy": "topic_name"}
    # A JSON rule's document has no registry key at all: its stored documents and versions do not move.
    write(tmp_path, "topics.toml", '[[topic]]\nmatch = "orders"\nevent_time_field = "created"\n')
    assert "registry" not in json.loads(classifier_config(load_rules(tmp_path), StreamConfig()))["rules"][0]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('registry = "yes"', "'registry' must be true or false"),
        ('subject_strategy = "topic_name"', "'subject_strategy' applies only with registry = true"),
        ('registry = true\nsubject_strategy = "by_magic"', "bad subject_strategy 'by_magic'"),
        ('registry = true\nschema = "orders.schema.json"', "'schema' and registry = true exclude each other"),
    ],
)
def test_broken_registry_rules_name_the_problem(tmp_path: Path, entry: str, message: str) -> None:
    write(tmp_path, "orders.schema.json", ORDERS)
    write(tmp_path, "topics.toml", f'[[topic]]\nmatch = "orders"\n{entry}\n')
    with pytest.raises(RuleError, match=message):
        load_rules(tmp_path)


def test_registry_rules_in_use_by_a_job(tmp_path: Path) -> None:
    """A stream needs the Schema Registry only when a registry-backed rule may meet a topic it reads."""
    from kdq.windows import topic_selected

    write(tmp_path, "topics.toml", '[[topic]]\nmatch = "orders.avro"\nregistry = true\n'
          '[[topic]]\nmatch = "orders"\n')
    rules = load_rules(tmp_path)
    assert [r.match for r in rules.registry_rules_in_use(lambda t: topic_selected(t, ".*", "_.*"))] == ["orders.avro"]
    assert rules.registry_rules_in_use(lambda t: topic_selected(t, "t-123.*", "_.*")) == ()
    write(tmp_path, "topics.toml", '[[topic]]\nmatch = "re:pay\\\\..*"\nregistry = true\n')
    assert len(load_rules(tmp_path).registry_rules_in_use(lambda t: False)) == 1  # a pattern: its topics come and go


def test_subject_versions_are_part_of_an_exact_registry_rules_version(tmp_path: Path) -> None:
    """A schema version registered (or deleted) under an exact registry-backed topic's subject changes that rule's
    version and the set's, and nothing else; pattern rules and JSON rules keep theirs."""
    write(tmp_path, "orders.schema.json", ORDERS)
    write(tmp_path, "topics.toml", '[[topic]]\nmatch = "orders.avro"\nregistry = true\n'
          '[[topic]]\nmatch = "re:pay\\\\..*"\nregistry = true\n')
    rules = load_rules(tmp_path)
    assert [r.subject for r in rules.rules] == ["orders.avro-value", None, None]
    one = rules.with_subject_versions({"orders.avro-value": [1]})
    two = rules.with_subject_versions({"orders.avro-value": [2, 1]})
    assert one.version_for("orders.avro") != rules.version_for("orders.avro") != two.version_for("orders.avro")
    assert one.version_for("orders.avro") != two.version_for("orders.avro") and one.version != two.version
    assert rules.with_subject_versions({"orders.avro-value": [1, 2]}).version_for("orders.avro") == two.version_for(
        "orders.avro")  # the registry's order does not matter
    for topic in ("pay.eu", "orders"):
        assert two.version_for(topic) == rules.version_for(topic)
    assert rules.with_subject_versions({}) == rules


def test_topic_record_name_rules_fold_in_every_record_subject_of_their_topic(tmp_path: Path) -> None:
    """By the topic-record-name strategy a topic has a subject per record type (``<topic>-<record>``): each of
    their versions is part of the rule's version; the record-name strategy's subjects are shared by every topic
    carrying the record, so its rules keep their settings' version, as patterns do."""
    write(tmp_path, "topics.toml", '[[topic]]\nmatch = "pay"\nregistry = true\nsubject_strategy = "topic_record_name"\n'
          '[[topic]]\nmatch = "shop"\nregistry = true\nsubject_strategy = "record_name"\n')
    rules = load_rules(tmp_path)
    pay, shop = rules.rules
    assert (pay.subject, pay.subjects_known, shop.subject, shop.subjects_known) == (None, True, None, False)
    assert pay.owns_subject("pay-shop.Refund") and not pay.owns_subject("pay-value") and not pay.owns_subject("pays-x")
    assert not shop.owns_subject("shop.Order") and not shop.owns_subject("shop-value")
    one = rules.with_subject_versions({"pay-shop.Refund": [1], "pay-value": [1], "shop.Order": [1]})
    two = rules.with_subject_versions({"pay-shop.Refund": [1], "pay-shop.Order": [1], "shop.Order": [2]})
    assert len({rules.version_for("pay"), one.version_for("pay"), two.version_for("pay")}) == 3
    assert one.version_for("shop") == two.version_for("shop") == rules.version_for("shop")
    assert rules.with_subject_versions({"pay-value": [3]}) == rules  # not one of its subjects
