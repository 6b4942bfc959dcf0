"""Streaming summaries end to end on the real broker, Spark, Delta and InfluxDB, against numpy.

Ground truth is computed here from what the test produced: numpy statistics of
the accepted values, and numpy's nearest-rank percentiles
(``method="inverted_cdf"``) of the values truncated by the test's own decimal
truncation (tests.integration.helpers.truncate_significant).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections import Counter, defaultdict

import pytest
import requests
from delta.tables import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from spark_jobs import batch_recompute

from kdq.rules import load_rules
from kdq.spark import summaries as ss
from kdq.spark.speed_layer import SpeedLayer
from kdq.spark.writers import now_ms
from tests.integration.helpers import (
    influx_summary_points,
    isolated_config,
    latest_summary_metrics,
    numpy_summary,
    produce,
    summary_rows,
)
from tests.integration.test_speed_layer_example import run_available_now

W0 = 1_700_000_400_000  # a multiple of 600 s
W1 = W0 + 600_000
DIGITS = 3
DB_WAIT = '{"env":"prod","metric":"db_wait"}'


class Truth:
    """What was produced, per (window, env, metric): accepted values and rejections by reason."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.values: dict[tuple[int, str, str], list[float]] = defaultdict(list)
        self.rejected: dict[tuple[int, str, str], Counter] = defaultdict(Counter)
        self.records: list[tuple[int, bytes, int]] = []

    def add(self, ts: int, env: str, metric: str, value=None, raw: bytes | None = None, reason: str | None = None,
            partition: int | None = None) -> None:
        key = (ts // 600_000 * 600_000, env, metric)
        if raw is None:
            doc = {"env": env, "metric": metric, "ts": ts}
            if value is not None:
                doc["value"] = value
            raw = json.dumps(doc).encode()
        if reason:
            self.rejected[key][reason] += 1
            self.values.setdefault(key, [])
        elif value is not None:
            self.values[key].append(float(value))
        self.records.append((len(self.records) % 3 if partition is None else partition, raw, ts))

    def flush(self, config) -> None:
        produce(config.kafka_bootstrap(), self.topic, self.records)
        self.records = []

    def expected(self) -> dict[tuple, dict]:
        out = {}
        for (w, env, metric), values in self.values.items():
            group = json.dumps({"env": env, "metric": metric}, separators=(",", ":"))
            stats = numpy_summary(values, DIGITS) if values else {"count": 0}
            out[("lat", self.topic, w, group)] = {**stats, "rejected": dict(self.rejected[(w, env, metric)])}
        return out


def _close(got, want, n: int, magnitude: float) -> bool:
    """Float sums depend on the order of additions: equal within n·1e-9 of the largest magnitude (or rel 1e-9)."""
    if got is None or want is None:
        return got is None and want is None
    return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9 * max(n, 1) * magnitude)


def _assert_stats(where: str, got: dict, want: dict) -> None:
    n = want["count"]
    if not n:
        assert got["count"] == 0 and got.get("mean") is None and got.get("p50") is None, (where, got)
        return
    magnitude = max(abs(want["min"]), abs(want["max"]))
    for name in ("count", "min", "max", "p50", "p90", "p99"):
        assert got[name] == want[name], (where, name, got[name], want[name])
    for name in ("sum", "mean"):
        assert _close(got[name], want[name], n, magnitude), (where, name, got[name], want[name])
    assert _close(got["stddev"], want["stddev"], n, magnitude), (where, "stddev", got["stddev"], want["stddev"])


def assert_everywhere(spark, config, truth: Truth, expected: dict | None = None) -> None:
    """Delta, the metrics topic and InfluxDB all show the numpy statistics of every (window, group)."""
    expected = truth.expected() if expected is None else expected
    rows = {k: r for k, r in summary_rows(spark, config, "lat").items() if k[1] == truth.topic}
    assert set(rows) == set(expected)
    metrics = latest_summary_metrics(config)
    influx = influx_summary_points(config, "lat")
    for key, want in expected.items():
        row = rows[key]
        got = {**{k: row[k] for k in ("count", "sum", "min", "max", "mean", "stddev")}, **row["percentiles"]}
        _assert_stats(f"delta {key}", got, want)
        assert dict(row["rejected"]) == want["rejected"], key
        message = metrics[key]
        _assert_stats(f"metrics {key}", message, want)
        assert message["rejected"] == sum(want["rejected"].values())
        group = json.loads(key[3])
        point = influx[(key[2], tuple(sorted({**group, "topic": truth.topic}.items())))]
        _assert_stats(f"influx {key}", {"mean": None, "p50": None, **point}, want)
        assert point["rejected"] == sum(want["rejected"].values())


@pytest.fixture
def summary_setup(spark, local_stack, tmp_path):
    prefix = f"su{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-ops"
    local_stack.kafka.create_topic(topic, partitions=3)
    config = isolated_config(local_stack, tmp_path, prefix).with_summaries(
        [{"name": "lat", "topic": topic, "value": "value", "group_by": ["env", "metric"], "window_seconds": 600,
          "allowed_lateness_seconds": 600, "significant_digits": DIGITS, "percentiles": [50, 90, 99]}]
    )
    return topic, config


def test_stream_summaries_equal_numpy_and_late_records_update_them(spark, summary_setup) -> None:
    topic, config = summary_setup
    truth = Truth(topic)
    rng = random.Random(42)
    for _ in range(1500):
        env, metric = rng.choice(["prod", "dev"]), rng.choice(["db_wait", "cpu"])
        scale = {"db_wait": 4.0, "cpu": 25.0}[metric]
        value = round(rng.lognormvariate(math.log(scale), 1.0), 3) if rng.random() < 0.7 else rng.uniform(0, 3 * scale)
        truth.add(W0 + rng.randrange(0, 1_200_000), env, metric, value)  # two windows, out of order
    # Values the summary rejects (counted per reason) and a record invalid for the topic (not_json).
    for value, reason in [("NaN", "not_numeric"), ("12.5", "not_numeric"), (True, "not_numeric"), ([1], "not_numeric"),
                          (None, "missing"), (1e308, "out_of_range"), (-1e308, "out_of_range")]:
        truth.add(W0 + 5_000, "prod", "db_wait", value, reason=reason) if value is not None else truth.add(
            W0 + 5_000, "prod", "db_wait", reason=reason
        )
    truth.add(W0 + 5_000, "prod", "db_wait", raw=b'{"env":"prod","metric":"db_wait","value":1e400}', reason="out_of_range")
    truth.add(W0 + 5_000, "prod", "db_wait", raw=b'{"env":"prod","metric":"db_wait","value":null}', reason="missing")
    truth.records.append((0, b"{oops", W0 + 6_000))  # invalid JSON: counted invalid, never summarised
    # Extreme values that are accepted (|x| <= 1e150, integers of any size as doubles), in their own group.
    for text in ("1e150", "-1e150", "123456789012345678901234567890", "1e-300", "-1e-300", "0", "-0.0", "9.995", "2e23"):
        truth.add(W1 + 7_000, "prod", "extreme", float(text),
                  raw=f'{{"env":"prod","metric":"extreme","value":{text}}}'.encode())
    truth.flush(config)

    layer = SpeedLayer(spark, config, load_rules(config.rules_dir))
    try:
        run_available_now(layer)
        assert_everywhere(spark, config, truth)
        extreme = summary_rows(spark, config, "lat")[("lat", topic, W1, '{"env":"prod","metric":"extreme"}')]
        assert (extreme["count"], extreme["min"], extreme["max"], extreme["percentiles"]["p50"]) == (9, -1e150, 1e150, 1e-300)
        assert math.isfinite(extreme["sum_sq"]) and extreme["hist"][1e-300] == 1 and extreme["hist"][2e23] == 1

        # Within the allowed lateness (the topic's event time is at most W0 + 1200 s; W0's window ends
        # at W0 + 600 s, 600 s of lateness): the record updates W0's statistics and percentiles everywhere.
        truth.add(W0 + 1_000, "prod", "db_wait", 9_999.0)
        truth.flush(config)
        run_available_now(layer)
        assert_everywhere(spark, config, truth)
        assert truth.expected()[("lat", topic, W0, DB_WAIT)]["max"] == 9_999.0

        # Beyond it: the topic's event time moves to W0 + 1900 s, so W0 and W1 (ended by W0 + 1200 s)
        # are closed for the stream. Late records for them are archived and their windows recorded.
        truth.add(W0 + 1_900_000, "dev", "cpu", 3.0)
        truth.flush(config)
        run_available_now(layer)
        stream_view = truth.expected()
        ingest_from = now_ms()
        truth.add(W0 + 2_000, "prod", "db_wait", 0.001)  # a new minimum for W0
        truth.add(W1 + 1_000, "dev", "fresh", 4.2)  # a group the stream never saw
        truth.flush(config)
        run_available_now(layer)
        ingest_to = now_ms() + 1
        assert_everywhere(spark, config, truth, stream_view)
        late = spark.read.format("delta").load(str(config.tables_dir / "summary_late_windows"))
        assert sorted((r["summary"], r["topic"], r["w"], r["rows"]) for r in late.select(
            "summary", "topic", F.unix_millis("window_start").alias("w"), "rows").collect()) == [
            ("lat", topic, W0, 1), ("lat", topic, W1, 1)
        ]
    finally:
        layer.close()

    # The hourly batch layer recomputes both windows from the archive and corrects them everywhere.
    interval = (ingest_from, ingest_to)
    counts = batch_recompute.run(
        spark, config, argparse.Namespace(start=ingest_from, end=ingest_to, run_id="run-1", reason="late_data", skip_push=False)
    )
    assert counts["ok"] and counts["late_windows"] == 2
    result = ss.recompute_summaries(spark, config, interval, "run-1")  # a no-op if the job already ran it
    assert result["ok"] and result["late_windows"] == 2
    assert_everywhere(spark, config, truth)
    corrections = spark.read.format("delta").load(str(config.tables_dir / "summary_corrections"))
    recorded = sorted(
        (r["w"], r["group_key"], r["old_count"], r["new_count"], r["run_id"], r["reason"], r["s"], r["e"])
        for r in corrections.select(
            F.unix_millis("window_start").alias("w"), "group_key", "old_count", "new_count", "run_id", "reason",
            F.unix_millis("interval_start").alias("s"), F.unix_millis("interval_end").alias("e"),
        ).collect()
    )
    n_w0 = stream_view[("lat", topic, W0, DB_WAIT)]["count"]
    tail = ("run-1", "late_data", ingest_from, ingest_to)
    assert recorded == [(W0, DB_WAIT, n_w0, n_w0 + 1, *tail), (W1, '{"env":"dev","metric":"fresh"}', 0, 1, *tail)]
    new_stats = json.loads(corrections.where(F.col("old_count") > 0).first()["new_stats"])
    assert new_stats["min"] == 0.001 and new_stats["count"] == n_w0 + 1

    # The same interval again: nothing to correct, no commit, the same outputs.
    version = DeltaTable.forPath(spark, str(config.tables_dir / "summaries")).history(1).first()["version"]
    again = ss.recompute_summaries(spark, config, interval, "run-2")
    assert (again["late_windows"], again["corrections"], again["ok"]) == (2, 0, True)
    assert DeltaTable.forPath(spark, str(config.tables_dir / "summaries")).history(1).first()["version"] == version
    assert corrections.count() == 2
    assert_everywhere(spark, config, truth)

    # InfluxDB lost the points (e.g. it was down): the catch-up re-pushes summary rows too.
    requests.post(f"{config.influx_url()}/query", params={"db": config.influxdb.database, "q": 'DROP MEASUREMENT "lat"'},
                  timeout=10).raise_for_status()
    assert influx_summary_points(config, "lat") == {}
    assert ss.push_updated_to_influx(spark, config, 0) == len(truth.expected())
    assert_everywhere(spark, config, truth)


def test_rebuild_after_a_rule_change_corrects_the_summaries_of_its_range(spark, local_stack, tmp_path) -> None:
    from spark_jobs import rebuild as rebuild_job

    prefix = f"sr{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-ops"
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    schema = rules_dir / f"{topic}.schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"value": {"type": "number"}}}))
    local_stack.kafka.create_topic(topic, partitions=3)
    config = isolated_config(local_stack, tmp_path / "data", prefix, paths={"rules_dir": str(rules_dir)}).with_summaries(
        [{"name": "lat", "topic": topic, "value": "value", "group_by": ["env", "metric"], "window_seconds": 600,
          "allowed_lateness_seconds": 600, "significant_digits": DIGITS, "percentiles": [50, 90, 99]}]
    )
    rng = random.Random(8)
    sent = [(W0 + rng.randrange(0, 1_200_000), rng.choice(["prod", "dev"]), round(rng.uniform(-50, 100), 2)) for _ in range(300)]
    before, after = Truth(topic), Truth(topic)
    lo, hi = W0 + 300_000, W0 + 900_000  # the rebuild range overlaps both summary windows partly
    for ts, env, value in sent:
        before.add(ts, env, "db_wait", value)
        if value >= 0 or not lo <= ts < hi:
            after.add(ts, env, "db_wait", value)  # outside the range a record keeps its archived classification
    before.flush(config)
    layer = SpeedLayer(spark, config, load_rules(rules_dir))
    try:
        run_available_now(layer)
    finally:
        layer.close()
    assert_everywhere(spark, config, before)

    # The rule changes: negative values become invalid; rebuilding the range excludes those in it.
    schema.write_text(json.dumps({"type": "object", "properties": {"value": {"type": "number", "minimum": 0}}}))
    args = argparse.Namespace(from_ms=lo, to_ms=hi, topics=[topic], run_id="rb-1", skip_push=False, keep_archive=False)
    summary = rebuild_job.run(spark, config, args)
    assert summary["ok"] and summary["summaries_corrections"] == 4, summary
    assert_everywhere(spark, config, after)
    corrections = spark.read.format("delta").load(str(config.tables_dir / "summary_corrections"))
    got = {(r["w"], r["group_key"], r["old_count"], r["new_count"], r["reason"]) for r in corrections.select(
        F.unix_millis("window_start").alias("w"), "group_key", "old_count", "new_count", "reason").collect()}
    b, a = before.expected(), after.expected()
    assert got == {(k[2], k[3], b[k]["count"], a[k]["count"], "rebuild") for k in b}

    again = rebuild_job.run(spark, config, argparse.Namespace(**{**vars(args), "run_id": "rb-2"}))
    assert again["ok"] and again["summaries_corrections"] == 0
    assert corrections.count() == 4
    assert_everywhere(spark, config, after)


def test_a_summary_over_its_group_limit_stops_the_stream_loudly_and_drops_nothing(spark, local_stack, tmp_path) -> None:
    prefix = f"sl{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-ops"
    local_stack.kafka.create_topic(topic, partitions=1)
    config = isolated_config(local_stack, tmp_path, prefix).with_summaries(
        [{"name": "lat", "topic": topic, "value": "value", "group_by": ["host"], "max_groups": 2}]
    )
    produce(config.kafka_bootstrap(), topic, [(0, json.dumps({"host": f"h{i}", "value": i}).encode(), W0 + i) for i in range(3)])
    layer = SpeedLayer(spark, config, load_rules(config.rules_dir))
    query = layer.start(available_now=True)
    try:
        with pytest.raises(StreamingQueryException) as failure:  # the query stops with the batch's error
            query.awaitTermination(180)
        error = str(failure.value)
    finally:
        query.stop()
        layer.close()
    assert "SummaryLimitError" in error and "3 groups" in error and "summaries[0].max_groups = 2" in error, error
    assert summary_rows(spark, config) == {}, "nothing is written when a limit is exceeded"
    archive = spark.read.format("delta").load(str(config.tables_dir / "raw_archive")).where(F.col("topic") == topic)
    assert archive.count() == 3, "the records are archived: raising the limit and restarting replays the batch"
