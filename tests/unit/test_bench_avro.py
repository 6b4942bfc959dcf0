"""The benchmark's Avro variant (`--rule-variants avro`, make bench-avro): the orders as Avro in Confluent's
wire format and their ground truth, the plain consumer's Avro check, the rules folder and config the stream gets,
and the comparison with the JSON orders rule in the report."""

from __future__ import annotations

import io
import json
import struct
from collections import Counter
from pathlib import Path

import fastavro
import fastjsonschema
import pytest
from benchmarks.baselines import avro_validator
from benchmarks.workload import (
    AVRO_INVALID_KINDS,
    INVALID_KINDS,
    SCHEMA_KINDS,
    VALID,
    AvroGenerator,
    Generator,
    Workload,
    avro_schema,
    choose_kind,
    expected_valid,
    generator,
    totals,
    zigzag_varint,
)

ORDERS = Path(__file__).resolve().parents[2] / "config" / "rules" / "orders.schema.json"
REGISTRY = {"ids": {"bench-a-0": 3, "bench-a-1": 3, "bench-a-2": 41}, "other_id": 4, "unknown_id": 1_000_041}
SEQS = (0, 1, 99, 123_456, 10**9 + 5)


@pytest.fixture(scope="module")
def gen() -> AvroGenerator:
    return AvroGenerator(1024, seed=7, registry=REGISTRY)


def _decode(payload: bytes) -> tuple[dict, int]:
    """fastavro's reading of a payload: the record and the bytes it used."""
    body = io.BytesIO(payload)
    record = fastavro.schemaless_reader(body, fastavro.parse_schema(avro_schema()))
    return record, body.tell()


def test_avro_kinds_are_distinct_from_the_json_ones_and_all_invalid() -> None:
    assert not set(AVRO_INVALID_KINDS) & {VALID, *INVALID_KINDS}
    assert all(not expected_valid(kind, schema=True) for kind in AVRO_INVALID_KINDS)
    kinds = Counter({("t", VALID): 90, **{("t", k): 2 for k in AVRO_INVALID_KINDS}})
    assert totals(kinds, schema=True) == {"valid": 90, "invalid": 2 * len(AVRO_INVALID_KINDS)}
    assert Workload(10, encoding="avro").invalid_kinds() == AVRO_INVALID_KINDS
    assert Workload(10).invalid_kinds() == INVALID_KINDS


def test_the_invalid_share_is_the_same_for_both_encodings() -> None:
    import random

    for kinds in (INVALID_KINDS, AVRO_INVALID_KINDS):
        rng = random.Random(3)
        drawn = Counter(choose_kind(rng, 0.05, kinds) for _ in range(40_000))
        assert set(drawn) == {VALID, *kinds}
        assert 0.045 < 1 - drawn[VALID] / 40_000 < 0.055


@pytest.mark.parametrize("n", (0, 1, -1, 3, 63, 64, -65, 1_000, 2**31 - 1, -(2**40)))
def test_zigzag_varint_is_avros_long_encoding(n: int) -> None:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, "long", n)
    assert zigzag_varint(n) == out.getvalue()


def test_a_valid_message_is_the_topics_header_and_a_whole_order(gen: AvroGenerator) -> None:
    json_gen = Generator(1024, seed=7)
    validate = fastjsonschema.compile(json.loads(ORDERS.read_text()))
    for topic, schema_id in REGISTRY["ids"].items():
        for seq in SEQS:
            value = gen.value(VALID, seq, topic)
            assert 900 < len(value) < 1150, len(value)  # ≈ 1 KB like the JSON messages
            assert value[0] == 0 and struct.unpack(">I", value[1:5])[0] == schema_id
            record, used = _decode(value[5:])
            assert used == len(value) - 5  # no bytes left over
            # The same order as the JSON workload's message of the same sequence number ...
            doc = json.loads(json_gen.value(VALID, seq))
            assert (record["order_id"], record["customer"]["id"]) == (doc["order_id"], doc["customer"]["id"])
            assert record["amount"] == pytest.approx(doc["amount"])
            # ... and a document the JSON orders rule accepts.
            validate(record)
    # every value differs (no unrealistic compression)
    assert len({gen.value(VALID, seq, "bench-a-0") for seq in range(500)}) == 500


def test_reasons_map_back_to_the_avro_kinds() -> None:
    from benchmarks.workload import AVRO_REASONS, avro_kind_of

    assert set(AVRO_REASONS) == set(AVRO_INVALID_KINDS)
    assert avro_kind_of(None) == VALID
    assert avro_kind_of("avro:/lines/32/price") == avro_kind_of("avro:/lines/0/note") == "truncated"
    assert avro_kind_of("avro:/currency") == "bad_enum"
    assert avro_kind_of("schema_not_for_subject") == "other_subject"
    assert avro_kind_of("avro:/currency/x") == "avro:/currency/x"  # not an expected reason: kept, so it shows
    assert avro_kind_of("avro:/lines") == "avro:/lines"


def test_the_generator_follows_the_workloads_encoding() -> None:
    assert isinstance(generator(Workload(10)), Generator)
    avro = generator(Workload(10, encoding="avro", registry=REGISTRY))
    assert isinstance(avro, AvroGenerator) and avro.value(VALID, 1, "bench-a-2")[:5] == b"\x00\x00\x00\x00\x29"


@pytest.mark.parametrize("kind", AVRO_INVALID_KINDS)
def test_each_invalid_avro_kind_is_what_its_name_says(gen: AvroGenerator, kind: str) -> None:
    """The reason kdq's registry-backed rule gives each kind (config/rules/README.md): what the bytes must be."""
    for seq in SEQS:
        valid = gen.value(VALID, seq, "bench-a-0")
        value = gen.value(kind, seq, "bench-a-0")
        if kind == "no_magic_byte":
            assert value[0] != 0 and json.loads(value)["order_id"] == f"o-{seq}"
        elif kind == "unknown_schema_id":
            assert value == gen.unknown_header + valid[5:]
        elif kind == "other_subject":
            assert value == b"\x00" + struct.pack(">I", REGISTRY["other_id"]) + valid[5:]
        elif kind == "trailing_bytes":
            assert value[:-1] == valid and _decode(value[5:])[1] == len(value) - 6
        elif kind == "truncated":
            assert valid.startswith(value) and len(value) == len(valid) - 7
            with pytest.raises(EOFError):
                _decode(value[5:])
        elif kind == "bad_enum":
            assert len(value) == len(valid) and value != valid
            with pytest.raises(IndexError):  # fastavro: symbol index 3 of the 3 symbols
                _decode(value[5:])


@pytest.mark.parametrize("kind", (VALID, *AVRO_INVALID_KINDS))
def test_the_plain_consumers_avro_check_agrees_with_the_ground_truth(gen: AvroGenerator, kind: str) -> None:
    valid = avro_validator({"avro_schema": avro_schema(), "ids": REGISTRY["ids"]})
    for topic in REGISTRY["ids"]:
        for seq in SEQS:
            assert valid(topic, gen.value(kind, seq, topic)) == expected_valid(kind, schema=True)
    # a topic's message framed with another topic's subject id is not valid there
    assert not valid("bench-a-2", gen.value(VALID, 5, "bench-a-0"))
    assert not valid("bench-a-0", b"")


def test_json_kinds_are_unchanged_by_the_avro_variant() -> None:
    """The JSON generator ignores the topic; the JSON ground truth is as before."""
    json_gen = Generator(1024, seed=7)
    for kind in (VALID, *INVALID_KINDS):
        assert json_gen.value(kind, 42, "any-topic") == json_gen.value(kind, 42)
    assert all(expected_valid(kind, schema=False) for kind in SCHEMA_KINDS)


def test_register_avro_uses_each_topics_subject(monkeypatch) -> None:
    import confluent_kafka.schema_registry as sr
    from benchmarks.workload import register_avro

    subjects: dict[str, int] = {}

    class FakeClient:
        def __init__(self, conf: dict) -> None:
            assert conf == {"url": "http://registry"}

        def register_schema(self, subject: str, schema) -> int:
            assert schema.schema_type == "AVRO"
            # the same content, the same id (as Confluent's and Apicurio's ccompat API)
            subjects[subject] = 7 if json.loads(schema.schema_str)["name"] == "Order" else 8
            return subjects[subject]

    monkeypatch.setattr(sr, "SchemaRegistryClient", FakeClient)
    got = register_avro("http://registry", ["bench-a-0", "bench-a-1"], "bench-a-refunds-value")
    assert subjects == {"bench-a-0-value": 7, "bench-a-1-value": 7, "bench-a-refunds-value": 8}
    assert got == {"ids": {"bench-a-0": 7, "bench-a-1": 7}, "other_id": 8, "unknown_id": 1_000_008}


# -- the harness: options, the rules folder and config of the avro run ---------------------------------------


def test_avro_is_a_rule_variant_of_make_bench() -> None:
    from benchmarks.__main__ import RULE_VARIANTS, parse_args

    default = parse_args([])
    assert "avro" in default.rule_variants and default.name == "latest"  # make bench runs the Avro variant too
    args = parse_args(["--quick", "--rule-variants", "avro", "--name", "avro"])
    assert args.rule_variants == ["avro"] and args.name == "avro"
    assert RULE_VARIANTS["avro"][0] not in {v[0] for k, v in RULE_VARIANTS.items() if k != "avro"}  # its own topics


def test_the_avro_rules_folder_is_one_registry_rule(tmp_path) -> None:
    from benchmarks.__main__ import write_rules

    from kdq.rules import load_rules

    folder = write_rules(tmp_path / "rules", True, "avro", ["bench-a-0"])
    assert sorted(p.name for p in folder.iterdir()) == ["topics.toml"]
    (rule,) = load_rules(folder).rules
    assert (rule.match, rule.is_pattern, rule.schema, rule.subject_strategy) == ("bench-.*", True, None, "topic_name")


def test_the_streams_config_carries_the_registry_only_when_set(tmp_path) -> None:
    from benchmarks.__main__ import make_config
    from benchmarks.speed import write_config

    from kdq.spark.session import registry_conf

    url = "http://127.0.0.1:1234/apis/ccompat/v7"
    config = make_config(tmp_path / "a" / "data", tmp_path / "rules", registry={"url": url})
    written = write_config(config, tmp_path / "a.toml")
    assert written.registry.url == url
    assert registry_conf(written)["spark.kdq.registry.url"] == url
    plain = write_config(make_config(tmp_path / "b" / "data", tmp_path / "rules"), tmp_path / "b.toml")
    assert "[registry]" not in (tmp_path / "b.toml").read_text() and plain.registry.url == ""


# -- the report: Avro beside the JSON orders rule ---------------------------------------------------------------


def _avro_result(avro_msgs_per_s: int) -> dict:
    from tests.unit.test_benchmarks import _bench_run

    json_run = _bench_run("orders", 4, 3, 20_000, {})
    json_run["catch_up"]["writer_ms_mean"] = {"plan": 100.0, "classify_archive": 3500.0}
    json_run["baselines"][0].update(bytes=1_000_000_000, messages=1_000_000)
    avro = _bench_run("avro", 4, 3, avro_msgs_per_s, {})
    avro["workload"]["encoding"] = "avro"
    avro["catch_up"]["writer_ms_mean"] = {"plan": 100.0, "classify_archive": 2500.0}
    avro["checks"]["reasons_match_expected"] = True
    avro["baselines"][0].update(bytes=1_017_000_000, messages=1_000_000, msgs_per_s=70_000)
    return {"started_at": "2026-11-24T10:00:00Z", "command": "python -m benchmarks --rule-variants avro",
            "duration_seconds": 600, "runs": [json_run, avro],
            "machine": {"cpu": "cpu", "cores": 2, "memory_gb": 8, "os": "Linux", "python": "3.11", "java": "java 17",
                        "pyspark": "4.0", "delta": "4.0", "kafka_broker": "4.0", "spark_kafka_clients": "3.9",
                        "confluent_kafka": "2.6", "librdkafka": "2.6", "load_average_at_start": [0.1, 0.1, 0.1]}}


def test_the_avro_comparison_is_against_the_json_orders_run() -> None:
    from benchmarks.report import avro_comparison

    c = avro_comparison(_avro_result(23_000))
    assert (c["ratio"], c["target"], c["met"]) == (1.15, 1.0, True)
    assert c["json"]["msgs_per_s"] == 20_000 and c["avro"]["msgs_per_s"] == 23_000
    assert (c["json"]["message_bytes"], c["avro"]["message_bytes"]) == (1000, 1017)
    assert (c["avro"]["classify_ms"], c["avro"]["plain_msgs_per_s"], c["avro"]["checks_ok"]) == (2500.0, 70_000, True)
    assert (c["json"]["classify_ms"], c["json"]["checks_ok"]) == (3500.0, True)  # no reasons check on JSON runs
    assert avro_comparison(_avro_result(19_000))["met"] is False
    wrong_reasons = _avro_result(23_000)
    wrong_reasons["runs"][1]["checks"]["reasons_match_expected"] = False
    assert avro_comparison(wrong_reasons)["avro"]["checks_ok"] is False
    only_json = _avro_result(1)
    only_json["runs"].pop()
    assert avro_comparison(only_json) is None


def test_the_report_shows_avro_beside_json() -> None:
    from benchmarks.report import markdown, targets

    result = _avro_result(19_000)
    rows = {t: (v, met) for t, v, met in targets(result)}
    assert rows["the orders as Avro through the Schema Registry ≥ 100% of the JSON orders rule's throughput"] == (
        "95% (19,000 vs 20,000 msgs/s)", "no")
    lines = markdown(result).splitlines()
    section = lines[lines.index("### Avro through the Schema Registry vs the JSON orders rule (same run)"):]
    assert "| **kdq catch-up msgs/s** | **20,000** | **19,000** |" in section
    assert "| MB/s (message bytes) | 20.0 (1,000 B) | 20.0 (1,017 B) |" in section
    assert "| classify (+ archive) per steady batch, ms | 3,500 | 2,500 |" in section
    assert "Avro ÷ JSON: **0.950×** (target ≥ 1.00×: **not met**)." in section
    assert any(line.endswith("each Avro kind's reason in the archive = the kinds produced: True.") for line in lines)
    assert "smoke check" not in markdown(result) and "No steady figure" not in markdown(result)
    # one micro-batch per run: no steady figure; a --quick run's (50,000 messages): a smoke check
    for run in result["runs"]:
        run["catch_up"]["steady_msgs_per_s"] = None
    assert "smoke check" not in markdown(result) and "No steady figure: a run of one micro-batch" in markdown(result)
    for run in result["runs"]:
        run["catch_up"]["messages"] = 50_000
    assert "a smoke check, not a comparison" in markdown(result)
    assert any(line.startswith("Workload: 1,000,000 messages of ≈ 1,024 B Avro,") for line in lines)
    assert any("fastavro" in line for line in lines if line.startswith("| plain consumer"))
