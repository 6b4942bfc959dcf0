"""Streaming summaries on local Spark + Delta: the SQL equals the pure Python definitions."""

from __future__ import annotations

import json
import math
import random

import pytest
from pyspark.sql import functions as F

from kdq.config import SummaryConfig
from kdq.spark import summaries as ss
from kdq.spark.summaries.transforms import key_of
from kdq.spark.tables import ensure_tables, table_path
from kdq.spark.writers import STALE_READ
from kdq.summaries import (
    MISSING,
    NOT_NUMERIC,
    OUT_OF_RANGE,
    SummaryLimitError,
    SummaryState,
    bucket,
    merge,
    statistics,
)
from kdq.tables import SUMMARIES
from tests.conftest import make_config

W0 = 1_700_000_400_000  # a multiple of 600 s
APP = "test-app"


def _edge_values() -> list[float]:
    rng = random.Random(4)
    values = [0.29, 9.995, -9.995, 1e-300, -1e-300, 9.99e-301, -12.345, 1e150, -1e150, 2e23, 0.1, 0.3, 0.7, 1000.0,
              999.9999999999999, 1e-5, 0.0, -0.0, 7.0, 1e22, 1e23, 0.57, 2.675, 5e-324]
    values += [rng.uniform(-1e6, 1e6) for _ in range(500)]
    values += [math.copysign(10 ** rng.uniform(-300, 150), rng.random() - 0.5) for _ in range(500)]
    values += [round(rng.uniform(0, 100), rng.randrange(0, 5)) for _ in range(500)]
    return values


PRECISIONS = ({"significant_digits": 1}, {"significant_digits": 3}, {"significant_digits": 15},
              {"step": 0.5}, {"step": 0.1}, {"step": 0.001}, {"step": 10.0})


def test_jvm_buckets_equal_python(spark) -> None:
    # Every precision at once: one summary per precision over the same field, one JVM call per record.
    summaries = [SummaryConfig(name=f"s{i}", topic="t", value="v", **p) for i, p in enumerate(PRECISIONS)]
    values = _edge_values()
    docs = spark.createDataFrame([(i, json.dumps({"v": x}).encode()) for i, x in enumerate(values)], "i INT, value BINARY")
    got = docs.select("i", ss.summary_fields(spark, summaries)(F.lit("t"), F.col("value")).alias("f")).collect()
    mismatches = []
    for row in got:
        x = values[row["i"]]
        for s, entry in zip(summaries, row["f"], strict=True):
            in_range = s.step is None or abs(x) / s.step < 1e12
            expected = (x, bucket(x, s), None) if in_range else (None, None, OUT_OF_RANGE)
            if (entry["x"], entry["bucket"], entry["reject"]) != expected:
                mismatches.append((s.name, x, tuple(entry), expected))
    assert len(got) == len(values) and not mismatches, mismatches[:5]


# JSON texts of a field, for the comparison with Spark's VARIANT functions (what the summaries used before
# the JVM function, and what users read in SQL): every kind of number, strings with escapes, containers.
FIELD_TEXTS = [
    '"EUR"', '""', '"a\\u00e9\\"q\\\\ \\n\\t\\u0001"', '5', '-0', '0', '1.50', '-0.0', '0.000000001', '1e5', '1E-7',
    '1.0e300', '12345678901234567890', '-12345678901234567890', '123456789012345678901234567890123456789012',
    '1.2345678901234567890123456789012345678901', '100000000000000000000.0', '0.1', '3.14159', '1e22', '1e-5',
    '123456789.123', '1e400', '-1e400', '9007199254740993', '1.5e1', '2.50E+2', 'true', 'false', 'null',
    '{"b":1,"a":[1,2.50,"x",null,true],"c":{"z":1e5,"y":"w"}}', '[]', '{}', '[1,"x",null]',
]


def test_jvm_fields_equal_spark_variant_reading(spark) -> None:
    """Group texts, numbers and reject reasons read by the JVM function equal Spark's VARIANT functions."""
    s = SummaryConfig(name="g", topic="t", value="a.v", group_by=["a.v", "b", "a"])
    rows = [(i, '{"a":{"v":' + text + '},"b":' + text + "}") for i, text in enumerate(FIELD_TEXTS)]
    rows.append((len(rows), '{"b":1}'))  # a.v missing
    rows.append((len(rows), '{"a":[1],"b":{"v":1}}'))  # a path through an array
    rows.append((len(rows), '[1,2]'))  # not an object
    df = spark.createDataFrame(rows, "i INT, text STRING")
    p = F.try_parse_json("text")
    kind = F.schema_of_variant(F.variant_get(p, "$.a.v", "variant"))
    numeric = kind.isin("BIGINT", "DOUBLE") | kind.startswith("DECIMAL")
    reference = df.select(
        "i",
        F.when(kind.isNull() | (kind == "VOID"), F.lit(MISSING)).when(~numeric, F.lit(NOT_NUMERIC)).alias("kind"),
        F.when(numeric, F.try_variant_get(p, "$.a.v", "double")).alias("number"),
        F.array(*[F.try_variant_get(p, path, "string") for path in ("$.a.v", "$.b", "$.a")]).alias("groups"),
    )
    jvm = df.select("i", ss.summary_fields(spark, [s])(F.lit("t"), F.col("text").cast("binary"))[0].alias("f"))
    got = {r["i"]: r["f"] for r in jvm.collect()}
    differences = []
    for r in reference.collect():
        f = got[r["i"]]
        number = r["number"]
        in_range = number is not None and abs(number) <= 1e150
        expected_reject = r["kind"] or (None if in_range else OUT_OF_RANGE)
        if (f["reject"], f["x"], list(f["groups"])) != (expected_reject, number if in_range else None, list(r["groups"])):
            differences.append((rows[r["i"]][1], tuple(f), (expected_reject, number, list(r["groups"]))))
    assert len(got) == len(rows) and not differences, differences


@pytest.fixture
def config(tmp_path):
    base = make_config(tmp_path, spark={"master": "local[2]", "shuffle_partitions": 2})
    return base.with_summaries(
        [
            {"name": "wait", "topic": "re:ops\\..*", "value": "m.value", "group_by": ["env", "metric"],
             "window_seconds": 600, "allowed_lateness_seconds": 60, "percentiles": [50, 90, 99, 99.9]},
            {"name": "coarse", "topic": "ops.a", "value": "m.value", "step": 0.5, "window_seconds": 60},
        ]
    )


def _classified(spark, rows):
    """(topic, window_start_ms, valid, value text) → the classified columns the transforms read."""
    return spark.createDataFrame(
        [(t, w, v, None if text is None else text.encode()) for t, w, v, text in rows],
        "topic STRING, w BIGINT, valid BOOLEAN, value BINARY",
    ).select("topic", F.timestamp_millis("w").alias("window_start"), "valid", "value")


def _doc(value, env="prod", metric="db") -> str:
    return json.dumps({"env": env, "metric": metric, "m": {"value": value}})


def test_values_and_states_match_the_python_reference(spark, config) -> None:
    rng = random.Random(9)
    rows, truth = [], {}
    for _ in range(600):
        value = rng.choice([rng.lognormvariate(3, 1), -rng.uniform(0, 50), rng.randrange(0, 1000)])
        env = rng.choice(["prod", "dev"])
        w = W0 + rng.randrange(0, 1200) * 1000
        rows.append(("ops.a", w, True, _doc(value, env)))
        truth.setdefault((w // 600_000 * 600_000, env), []).append(value)
    odd = [None, "NaN", "12.5", True, [1], {"x": 1}, 1e308, 123456789012345678901234567890, 10**400]
    rows += [("ops.a", W0, True, _doc(v)) for v in odd]
    truth[(W0, "prod")] += odd
    rows.append(("ops.a", W0, True, json.dumps({"env": "prod", "metric": "db"})))  # no m.value at all
    truth[(W0, "prod")].append(None)
    rows.append(("ops.a", W0, False, _doc(5.0)))  # invalid for the topic: not summarised
    rows.append(("orders", W0, True, _doc(5.0)))  # another topic
    values = ss.summary_values(_classified(spark, rows), config.summaries)
    states = {
        (r["summary"], r["window_start_ms"], r["group_key"]): r.asDict()
        for r in ss.summary_states(values).collect()
    }
    wait = config.summary("wait")
    for (w, env), vals in truth.items():
        got = states[("wait", w, json.dumps({"env": env, "metric": "db"}, separators=(",", ":")))]
        expected = SummaryState.of_values(vals, wait)
        state = SummaryState.from_row(got)
        assert (state.count, state.min, state.max, state.hist, state.rejected) == (
            expected.count, expected.min, expected.max, expected.hist, expected.rejected
        )
        assert state.sum == pytest.approx(expected.sum, rel=1e-12)
        assert got["groups"] == {"env": env, "metric": "db"} and got["late"] is False
    assert SummaryState.from_row(states[("wait", W0, '{"env":"prod","metric":"db"}')]).rejected == {
        MISSING: 2, NOT_NUMERIC: 5, OUT_OF_RANGE: 2
    }
    # The step summary: 60 s windows, no group, buckets floored to multiples of 0.5; in step mode the
    # huge integer (1.2e29, beyond 1e12 steps) is out of range too.
    coarse = [r for k, r in states.items() if k[0] == "coarse"]
    assert {r["group_key"] for r in coarse} == {"{}"} and sum(r["count"] for r in coarse) == 600
    assert sum(r["rejected"].get(OUT_OF_RANGE, 0) for r in coarse) == 3
    assert all(float(b) * 2 == int(float(b) * 2) for r in coarse for b in r["hist"])


def test_lateness_is_judged_per_topic_and_summary_window(spark, config) -> None:
    # Watermark of ops.a: W0 + 700 s. "wait" (600 s windows, 60 s lateness): the window W0 ended at
    # W0 + 600 s <= W0 + 640 s, so it is late; "coarse" (60 s windows, default lateness 3600 s) is not.
    rows = [("ops.a", W0 + 5_000, True, _doc(1.0)), ("ops.b", W0 + 5_000, True, _doc(1.0))]
    values = ss.summary_values(_classified(spark, rows), config.summaries, {"ops.a": W0 + 700_000})
    late = {(r["summary"], r["topic"]): r["late"] for r in values.collect()}
    assert late == {("wait", "ops.a"): True, ("wait", "ops.b"): False, ("coarse", "ops.a"): False}


def _entry(summary, w, group, values, s):
    groups = dict(zip(s.group_by, group, strict=True))
    key = json.dumps(groups, separators=(",", ":"))
    return {"summary": summary, "topic": "ops.a", "window_start_ms": w, "group_key": key, "groups": groups,
            "state": SummaryState.of_values(values, s)}


def test_merge_read_back_and_sql_statistics_equal_python(spark, config) -> None:
    ensure_tables(spark, config)
    wait = config.summary("wait")
    rng = random.Random(1)
    first = [_entry("wait", W0, ("prod", "db"), [rng.lognormvariate(2, 1) for _ in range(300)], wait),
             _entry("wait", W0, ("dev", "db"), [1.5, None, "x"], wait)]
    second = [_entry("wait", W0, ("prod", "db"), [rng.lognormvariate(2, 1) for _ in range(50)] + [1e150], wait),
              _entry("wait", W0 + 600_000, ("prod", "db"), [None], wait)]
    ss.merge_increments(spark, config, first, APP, 0)
    ss.merge_increments(spark, config, second, APP, 1)
    ss.merge_increments(spark, config, second, APP, 1)  # a replay: skipped by Delta
    stored = ss.read_states(spark, config, [("wait", "ops.a", W0), ("wait", "ops.a", W0 + 600_000)])
    expected = {
        ("wait", "ops.a", W0, first[0]["group_key"]): merge(first[0]["state"], second[0]["state"]),
        ("wait", "ops.a", W0, first[1]["group_key"]): first[1]["state"],
        ("wait", "ops.a", W0 + 600_000, second[1]["group_key"]): second[1]["state"],
    }
    assert set(stored) == set(expected)
    for key, state in expected.items():
        assert stored[key]["state"] == state, key  # the MERGE's arithmetic is Python's, operation for operation
    table = spark.read.format("delta").load(table_path(config, SUMMARIES))
    for row in table.collect():
        key = (row["summary"], row["topic"], int(row["window_start"].timestamp() * 1000), row["group_key"])
        stats = statistics(expected[key], wait.percentiles)
        assert row["mean"] == stats["mean"] and row["stddev"] == stats["stddev"]
        assert dict(row["percentiles"]) == {k: stats[k] for k in ("p50", "p90", "p99", "p99.9")}
        assert row["precision"] == "3 significant digits" and row["updated_by"] == "stream"
        assert row["window_end"].timestamp() * 1000 - key[2] == 600_000
    # Absolute writes are compare-and-sets on the group as read: one the stream changed since fails and writes
    # nothing; a group whose state became empty is deleted.
    read = ss.read_states(spark, config, [("wait", "ops.a", W0)])
    dev = key_of(first[1])
    gone = ss.diff_states([("wait", "ops.a", W0)], {k: v for k, v in read.items() if k != dev}, read)
    assert [key_of(c) for c in gone] == [dev] and gone[0]["old_updated_us"] == read[dev]["updated_us"]
    ss.merge_increments(spark, config, [first[1]], APP, 2)  # the stream adds to it after the read
    with pytest.raises(Exception, match=STALE_READ):
        ss.merge_absolute(spark, config, gone, "batch-app", 0)
    assert ss.read_states(spark, config, [("wait", "ops.a", W0)])[dev]["state"] == merge(first[1]["state"], first[1]["state"])
    gone = ss.diff_states([("wait", "ops.a", W0)], {k: v for k, v in read.items() if k != dev},
                          ss.read_states(spark, config, [("wait", "ops.a", W0)]))
    ss.merge_absolute(spark, config, gone, "batch-app", 0)
    assert set(ss.read_states(spark, config, [("wait", "ops.a", W0)])) == set(read) - {dev}


def test_limits_fail_loudly(config) -> None:
    wait = config.summary("wait")
    small = config.with_summaries([{**wait.model_dump(), "max_buckets": 3, "max_groups": 2}])
    entry = _entry("wait", W0, ("prod", "db"), [1.0, 2.0, 3.0, 4.0], wait)
    with pytest.raises(SummaryLimitError, match=r"4 histogram buckets .* exceed summaries\[0\]\.max_buckets = 3"):
        ss.check_limits(small, {("wait", "ops.a", W0, entry["group_key"]): entry})
    many = {("wait", "ops.a", W0, f"g{i}"): _entry("wait", W0, (f"e{i}", "db"), [1.0], wait) for i in range(3)}
    with pytest.raises(SummaryLimitError, match=r"3 groups .* exceed summaries\[0\]\.max_groups = 2"):
        ss.check_limits(small, many)


def test_the_summary_function_knows_the_registry_topics_only_when_the_rules_have_some(spark, tmp_path) -> None:
    """Without registry-backed rules the summaries' document (and function) stays what it was; with them, the
    rules' topic matchers in precedence order go with it and the function takes the topic; a JSON topic's
    values are read as before."""
    from kdq.rules import load_rules
    from kdq.spark.summaries.transforms import summary_fields_config

    summaries = [SummaryConfig(name="s", topic="t", value="v", significant_digits=3)]
    plain = summary_fields_config(summaries)
    (tmp_path / "orders.schema.json").write_text("{}")
    assert summary_fields_config(summaries, load_rules(tmp_path)) == plain
    (tmp_path / "topics.toml").write_text('[[topic]]\nmatch = "t"\n[[topic]]\nmatch = "re:t.*"\nregistry = true\n')
    rules = load_rules(tmp_path)
    document = json.loads(summary_fields_config(summaries, rules))
    assert document["rules"] == [{"match": "t", "is_pattern": False, "registry": False},
                                 {"match": "t.*", "is_pattern": True, "registry": True},
                                 {"match": "orders", "is_pattern": False, "registry": False}]
    docs = spark.createDataFrame([("t", json.dumps({"v": 2.5}).encode())], "topic STRING, value BINARY")
    got = docs.select(ss.summary_fields(spark, summaries, rules)(F.col("topic"), F.col("value"))[0]["x"]).first()[0]
    assert got == 2.5


@pytest.mark.parametrize("path", ["records", "entries"])
def test_the_observed_states_equal_summary_states(spark, config, path) -> None:
    """The speed layer's summary states, observed as one JVM aggregate of the archive pass, are the rows of
    summary_states on the same records: keys, groups, lateness, counts, min/max, histograms, rejections and rows
    exactly, sums to the last bits a different addition order may change. Both ways: straight from the records
    (SummaryRecordStates, JSON topics) and from the entries built as columns (SummaryStates, registry-backed
    topics). Spread over four partitions, so the aggregate's per-task states are merged."""
    from pyspark.sql import Observation

    rng = random.Random(11)
    rows = []
    envs = ["prod", "dev", 'q"\\é', "tab\tnew\nline\x01/", {"b": [1, 2.50], "a": None}, 7, 1.5e300, True]
    for _ in range(800):
        value = rng.choice([rng.lognormvariate(3, 1), -rng.uniform(0, 50), rng.randrange(0, 1000), 0.0, -0.0, "x", None])
        topic = rng.choice(["ops.a", "ops.b", "orders", "ops.bc"])
        rows.append((topic, W0 + rng.randrange(0, 1500) * 1000, rng.random() > 0.1,
                     _doc(value, rng.choice(envs), rng.choice(["db", None]))))
    rows.append(("ops.a", W0, True, json.dumps({"env": "prod"})))  # no value, a group field missing
    rows.append(("ops.a", None, True, _doc(3.5)))  # no window
    rows.append((None, W0, True, _doc(3.5)))  # no topic: no summary's
    rows.append(("ops.b", W0, True, "not json"))  # every field missing
    watermarks = {"ops.a": W0 + 700_000, "ops.b": W0 + 100_000}  # some windows late for "wait"
    records = _classified(spark, rows).repartition(4)

    expected = {ss.key_of(r) + (r["late"],): r.asDict() for r in ss.summary_states(
        ss.summary_values(records, config.summaries, watermarks)).collect()}
    observation = Observation("summary_states")
    if path == "records":
        entries, metric = ss.with_summary_states_metric(records, config.summaries, watermarks)
    else:
        entries = ss.with_summary_entries(records, config.summaries, watermarks)
        metric = ss.summary_states_metric(entries)
    observed = entries.observe(observation, metric.alias("s"))
    assert observed.count() == len(rows)  # the records pass through unchanged
    got = {ss.key_of(r) + (r["late"],): r for r in ss.summary_states_rows(observation.get["s"])}

    assert got.keys() == expected.keys() and len(got) > 50
    assert any(key[-1] for key in got) and not all(key[-1] for key in got)  # late and on-time states both
    for key, want in expected.items():
        have = got[key]
        exact = ("groups", "count", "min", "max", "hist", "rejected", "rows")
        assert {k: have[k] for k in exact} == {k: want[k] for k in exact}, key
        assert have["sum"] == pytest.approx(want["sum"], rel=1e-9, abs=1e-9)
        assert have["sum_sq"] == pytest.approx(want["sum_sq"], rel=1e-9, abs=1e-9)
        assert SummaryState.from_row(have).hist == SummaryState.from_row(want).hist
