"""Rebuild after a rule change, end to end on the real broker, Spark, Delta and InfluxDB.

The stream counts a topic under a permissive schema; the schema then gains a
``minimum`` some records violate; one rebuild of the range moves every output
to the new truth, computed here from what the test produced.
"""

from __future__ import annotations

import argparse
import json

from pyspark.sql import functions as F
from spark_jobs import rebuild as rebuild_job

from kdq.rules import load_rules
from kdq.spark.speed_layer import SpeedLayer
from tests.integration.helpers import (
    W0,
    expected_counts,
    expected_reasons,
    influx_points,
    isolated_config,
    latest_metrics,
    produce,
    reason_counts,
    window_counts,
)
from tests.integration.test_speed_layer_example import run_available_now

PERMISSIVE = {"type": "object", "properties": {"amount": {"type": "number"}}}
STRICT = {"type": "object", "properties": {"amount": {"type": "number", "minimum": 0}}}


def _args(from_ms: int, to_ms: int, topics: list[str], run_id: str) -> argparse.Namespace:
    return argparse.Namespace(from_ms=from_ms, to_ms=to_ms, topics=topics, run_id=run_id, skip_push=False, keep_archive=False)


def _versions(spark, config, topic: str) -> set[str]:
    df = spark.read.format("delta").load(str(config.tables_dir / "window_counts")).where(F.col("topic") == topic)
    return {r["rules_version"] for r in df.select("rules_version").distinct().collect()}


def test_rule_change_rebuild_moves_counts_to_the_new_truth_once(spark, local_stack, tmp_path) -> None:
    prefix = f"rb{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-pay"
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    schema_file = rules_dir / f"{topic}.schema.json"
    schema_file.write_text(json.dumps(PERMISSIVE))
    config = isolated_config(local_stack, tmp_path / "data", prefix, paths={"rules_dir": str(rules_dir)})
    local_stack.kafka.create_topic(topic, partitions=3)

    # (partition, amount, timestamp): w0 and w1 get negative amounts, w2 only positive ones.
    sent = [
        (0, 5, W0 + 10), (1, -1, W0 + 20), (2, 7, W0 + 30), (0, -3, W0 + 400),
        (1, 2, W0 + 1100), (2, -8, W0 + 1200), (0, 9, W0 + 1900),
        (1, 1, W0 + 2100), (2, 4, W0 + 2200),
    ]
    produce(config.kafka_bootstrap(), topic, [(p, json.dumps({"amount": a}).encode(), ts) for p, a, ts in sent])
    old_rules = load_rules(rules_dir)
    run_available_now(SpeedLayer(spark, config, old_rules))
    assert window_counts(spark, config, topic) == expected_counts(topic, [(ts, True) for _, _, ts in sent])
    old_version = old_rules.version_for(topic)
    assert _versions(spark, config, topic) == {old_version}

    # The rule changes: negative amounts become invalid.
    schema_file.write_text(json.dumps(STRICT))
    new_version = load_rules(rules_dir).version_for(topic)
    assert new_version != old_version
    truth = expected_counts(topic, [(ts, a >= 0) for _, a, ts in sent])
    before = window_counts(spark, config, topic)

    summary = rebuild_job.run(spark, config, _args(W0, W0 + 10_000, [topic], "rb-1"))
    assert summary["ok"], summary
    assert window_counts(spark, config, topic) == truth
    assert _versions(spark, config, topic) == {new_version}, "every rebuilt window records the new rules version"

    # Exactly the expected corrections, all of reason rule_change.
    keys = set(before) | set(truth)
    expected_changes = {(k[1], k[2], before.get(k, 0), truth.get(k, 0)) for k in keys if before.get(k, 0) != truth.get(k, 0)}
    corrections = (
        spark.read.format("delta").load(str(config.tables_dir / "corrections")).where(F.col("topic") == topic)
        .select(F.unix_millis("window_start").alias("w"), "status", "old_count", "new_count", "reason", "run_id")
        .collect()
    )
    assert {(r["w"], r["status"], r["old_count"], r["new_count"]) for r in corrections} == expected_changes
    assert len(corrections) == len(expected_changes) == 4
    assert {r["reason"] for r in corrections} == {"rule_change"} and {r["run_id"] for r in corrections} == {"rb-1"}
    # w2 kept its counts: no correction, but its rules version moved (summary's version_only).
    assert summary["corrections"] == 4 and summary["version_only"] == 1

    # The archive now says why: the negative amounts are invalid with the schema pointer.
    archive = spark.read.format("delta").load(str(config.tables_dir / "raw_archive")).where(F.col("topic") == topic)
    reasons = sorted((r["offset"], r["partition"], r["reason"]) for r in archive.where(~F.col("valid")).collect())
    assert len(reasons) == sum(1 for _, a, _ in sent if a < 0)
    assert {r for _, _, r in reasons} == {"schema:/properties/amount/minimum"}
    assert {r["rules_version"] for r in archive.select("rules_version").distinct().collect()} == {new_version}

    # invalid_reasons follows: the rebuild adjusted the reasons of the range's coarse windows.
    minimum = "schema:/properties/amount/minimum"
    assert summary["reason_corrections"] == 1
    assert reason_counts(spark, config, topic) == expected_reasons([(ts, minimum) for _, a, ts in sent if a < 0]) == {
        ((W0 - 20_000), minimum): 3
    }

    # Pushed: the metrics topic and InfluxDB show the new truth for the changed windows.
    metrics = latest_metrics(config)
    for (t, w, status), n in truth.items():
        if before.get((t, w, status), 0) != n:
            assert metrics[(t, w, status)] == n
    points = influx_points(config, topic)
    for w in (W0, W0 + 1000):
        assert points[w] == (truth.get((topic, w, "valid"), 0), truth.get((topic, w, "invalid"), 0))

    # A second rebuild of the same range changes nothing.
    again = rebuild_job.run(spark, config, _args(W0, W0 + 10_000, [topic], "rb-2"))
    assert again["corrections"] == 0 and again["version_only"] == 0 and again["archive_rows_updated"] == 0, again
    assert again["reason_corrections"] == 0 and reason_counts(spark, config, topic) == {((W0 - 20_000), minimum): 3}
    assert window_counts(spark, config, topic) == truth
    n_corrections = spark.read.format("delta").load(str(config.tables_dir / "corrections")).where(F.col("topic") == topic).count()
    assert n_corrections == 4


def test_event_time_rule_moves_records_between_windows(spark, local_stack, tmp_path) -> None:
    """A new event-time field moves records to other windows, one of them outside the rebuilt range."""
    prefix = f"rm{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-ev"
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()  # no rule: valid JSON, Kafka timestamps
    config = isolated_config(local_stack, tmp_path / "data", prefix, paths={"rules_dir": str(rules_dir)})
    local_stack.kafka.create_topic(topic, partitions=2)
    # (partition, kafka timestamp, ts field); the last one is outside the range [W0, W0 + 10 s) and stays put.
    sent = [
        (0, W0 + 10, W0 + 10), (1, W0 + 20, W0 + 5_100), (0, W0 + 1_500, W0 + 5_200),
        (1, W0 + 1_600, W0 + 20_300), (0, W0 + 20_500, W0 + 20_500),
    ]
    produce(config.kafka_bootstrap(), topic, [(p, json.dumps({"ts": f}).encode(), k) for p, k, f in sent])
    run_available_now(SpeedLayer(spark, config, load_rules(rules_dir)))
    assert window_counts(spark, config, topic) == expected_counts(topic, [(k, True) for _, k, _ in sent])

    (rules_dir / "topics.toml").write_text(
        f'[[topic]]\nmatch = "{topic}"\nevent_time_field = "ts"\nevent_time_format = "epoch_millis"\n'
    )
    truth = expected_counts(topic, [(f, True) for _, _, f in sent])
    before = window_counts(spark, config, topic)
    summary = rebuild_job.run(spark, config, _args(W0, W0 + 10_000, [topic], "rm-1"))
    assert window_counts(spark, config, topic) == truth, summary
    corrections = (
        spark.read.format("delta").load(str(config.tables_dir / "corrections")).where(F.col("topic") == topic)
        .select(F.unix_millis("window_start").alias("w"), "status", "old_count", "new_count", "reason").collect()
    )
    keys = set(before) | set(truth)
    assert {(r["w"], r["status"], r["old_count"], r["new_count"]) for r in corrections} == {
        (k[1], k[2], before.get(k, 0), truth.get(k, 0)) for k in keys if before.get(k, 0) != truth.get(k, 0)
    }
    assert {r["reason"] for r in corrections} == {"rule_change"}
    again = rebuild_job.run(spark, config, _args(W0, W0 + 10_000, [topic], "rm-2"))
    assert again["corrections"] == 0 and again["archive_rows_updated"] == 0, again
    assert window_counts(spark, config, topic) == truth
