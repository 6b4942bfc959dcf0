"""The batch layer end to end on the real broker, Spark, Delta and InfluxDB.

The stream runs in-process; the batch jobs run through their ``run()``
functions in the same session. Ground truth is computed from what the test
produced (tests.integration.helpers.expected_counts), never by the code under test.
"""

from __future__ import annotations

import argparse
import json
import socket

from delta.tables import DeltaTable
from pyspark.sql import functions as F
from spark_jobs import batch_recompute, influx_catch_up

from kdq.rules import load_rules
from kdq.spark.speed_layer import SpeedLayer
from kdq.spark.writers import now_ms
from kdq.stream.state import InfluxPushState
from tests.integration.helpers import (
    W0,
    expected_counts,
    influx_points,
    isolated_config,
    latest_metrics,
    produce,
    window_counts,
)
from tests.integration.test_speed_layer_example import run_available_now

GOOD = json.dumps({"id": 1}).encode()
BAD = b"{oops"
W1, W2, W60 = W0 + 1000, W0 + 2000, W0 + 60_000


def _points(counts: dict[tuple[str, int, str], int]) -> dict[int, tuple[int, int]]:
    """Window counts → the InfluxDB points they must produce: (valid, invalid), a missing status as 0."""
    windows = {w for _, w, _ in counts}
    return {w: (sum(n for (_, x, s), n in counts.items() if x == w and s == "valid"),
                sum(n for (_, x, s), n in counts.items() if x == w and s == "invalid")) for w in windows}


def _version(spark, path) -> int:
    return DeltaTable.forPath(spark, str(path)).history(1).first()["version"]


def _recompute(spark, config, start_ms: int, end_ms: int, run_id: str) -> dict:
    args = argparse.Namespace(start=start_ms, end=end_ms, run_id=run_id, reason="late_data", skip_push=False)
    return batch_recompute.run(spark, config, args)


def test_hourly_recompute_corrects_late_windows_everywhere_once(spark, local_stack, tmp_path) -> None:
    prefix = f"br{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-orders"
    local_stack.kafka.create_topic(topic, partitions=3)
    config = isolated_config(local_stack, tmp_path, prefix)  # allowed lateness 10 s
    produced: list[tuple[int, bool]] = []

    def send(records: list[tuple[int, bool, int]]) -> None:
        produce(config.kafka_bootstrap(), topic, [(p, GOOD if ok else BAD, ts) for p, ok, ts in records])
        produced.extend((ts, ok) for _, ok, ts in records)

    # PRODUCT.md's example, plus a record a minute later that moves the topic's event time on.
    send([(0, True, W0 + 10), (0, True, W0 + 20), (0, True, W0 + 30), (0, False, W0 + 40)]
         + [(2, True, W0 + 500), (2, True, W0 + 900), (1, False, W0 + 1500), (0, True, W60 + 5)])
    layer = SpeedLayer(spark, config, load_rules(config.rules_dir))
    run_available_now(layer)
    on_time = expected_counts(topic, produced)
    assert window_counts(spark, config, topic) == on_time

    # Too late for the stream (beyond 10 s): one more valid for w0, one invalid for w1, a valid for a new w2.
    ingest_from = now_ms()
    send([(2, True, W0 + 800), (1, False, W1 + 200), (0, True, W2 + 500)])
    run_available_now(layer)
    ingest_to = now_ms() + 1
    assert window_counts(spark, config, topic) == on_time, "the speed layer must leave closed windows alone"
    archive = spark.read.format("delta").load(str(config.tables_dir / "raw_archive"))
    assert archive.where((F.col("topic") == topic) & ~F.col("counted")).count() == 3
    # A count the archive does not support (e.g. written under an older rule): the batch must bring it to 0.
    spark.sql(
        f"INSERT INTO delta.`{config.tables_dir / 'window_counts'}` VALUES ('{topic}', timestamp_millis({W2}), "
        f"timestamp_millis({W2 + 1000}), 'invalid', 3, current_timestamp(), 'stream', 'v0', to_date(timestamp_millis({W2})), "
        f"hour(timestamp_millis({W2})))"
    )

    # An interval before the late records: nothing to do (on-time records are not recomputed).
    before = _recompute(spark, config, ingest_from - 3_600_000, ingest_from, "run-0")
    assert (before["late_windows"], before["corrections"]) == (0, 0)

    summary = _recompute(spark, config, ingest_from, ingest_to, "run-1")
    truth = expected_counts(topic, produced)
    assert summary["ok"] and summary["late_windows"] == 3 and summary["corrections"] == 4
    assert summary["stream_caught_up"] is True  # the stream's last micro-batch committed
    # The interval's late rows came from one micro-batch: every earlier archive file was skipped.
    assert 0 < summary["scanned_late_rows"]["files"] < summary["archive_total"]["files"], summary

    # Delta: exact counts, the corrected rows marked as the batch's, the zero row deleted.
    assert window_counts(spark, config, topic) == truth
    rows = spark.read.format("delta").load(str(config.tables_dir / "window_counts")).where(F.col("topic") == topic)
    updated_by = {(r["w"], r["status"]): r["updated_by"] for r in rows.select(F.unix_millis("window_start").alias("w"), "status", "updated_by").collect()}
    assert updated_by == {
        (W0, "valid"): "batch",
        (W0, "invalid"): "stream",
        (W1, "invalid"): "batch",
        (W2, "valid"): "batch",
        (W60, "valid"): "stream",
    }
    corrections = spark.read.format("delta").load(str(config.tables_dir / "corrections"))
    recorded = sorted(
        (r["w"], r["status"], r["old_count"], r["new_count"], r["run_id"], r["s"], r["e"], r["reason"])
        for r in corrections.select(
            F.unix_millis("window_start").alias("w"), "status", "old_count", "new_count", "run_id",
            F.unix_millis("interval_start").alias("s"), F.unix_millis("interval_end").alias("e"), "reason",
        ).collect()
    )
    tail = ("run-1", ingest_from, ingest_to, "late_data")
    assert recorded == [
        (W0, "valid", 5, 6, *tail),
        (W1, "invalid", 1, 2, *tail),
        (W2, "invalid", 3, 0, *tail),
        (W2, "valid", 0, 1, *tail),
    ]

    # Metrics topic: every key converges to the truth; the deleted status to 0.
    metrics = {k: v for k, v in latest_metrics(config).items() if k[0] == topic}
    assert metrics == {**truth, (topic, W2, "invalid"): 0}
    # InfluxDB: both fields of every window, corrected.
    assert influx_points(config, topic) == _points(truth) == {W0: (6, 1), W1: (0, 2), W2: (1, 0), W60: (1, 0)}

    # The same interval again: no commit to either table, no new corrections, same outputs.
    versions = (_version(spark, config.tables_dir / "window_counts"), _version(spark, config.tables_dir / "corrections"))
    again = _recompute(spark, config, ingest_from, ingest_to, "run-2")
    assert (again["late_windows"], again["corrections"], again["ok"]) == (3, 0, True)
    assert (_version(spark, config.tables_dir / "window_counts"), _version(spark, config.tables_dir / "corrections")) == versions
    assert window_counts(spark, config, topic) == truth
    assert corrections.count() == 4
    assert influx_points(config, topic) == _points(truth)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_influx_catch_up_after_the_stream_could_not_push(spark, local_stack, tmp_path) -> None:
    prefix = f"cu{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-events"
    local_stack.kafka.create_topic(topic, partitions=2)
    config = isolated_config(local_stack, tmp_path, prefix)
    # The same deployment while InfluxDB is unreachable (connection refused, no retries).
    down = config.model_copy(
        update={"influxdb": config.influxdb.model_copy(update={"url": f"http://127.0.0.1:{_closed_port()}", "retries": 0})}
    )
    produced: list[tuple[int, bool]] = []

    def send(records: list[tuple[int, bool, int]]) -> None:
        produce(config.kafka_bootstrap(), topic, [(p, GOOD if ok else BAD, ts) for p, ok, ts in records])
        produced.extend((ts, ok) for _, ok, ts in records)

    layer = SpeedLayer(spark, down, load_rules(down.rules_dir))
    first_batch_from = now_ms()
    send([(i % 2, i % 4 != 0, W0 + i * 170) for i in range(20)])
    run_available_now(layer)
    state = InfluxPushState(config).read()
    pending = state["pending_since_ms"]
    assert pending is not None and first_batch_from <= pending <= now_ms(), state
    # A second batch while InfluxDB is still down: the earliest failure is kept.
    send([(0, True, W0 + 250), (1, False, W0 + 4100)])
    run_available_now(layer)
    assert InfluxPushState(config).read()["pending_since_ms"] == pending
    truth = expected_counts(topic, produced)
    assert window_counts(spark, config, topic) == truth
    assert influx_points(config, topic) == {}

    summary = influx_catch_up.run(spark, config, argparse.Namespace(since=None, force=False))
    assert summary["since_ms"] == pending and summary["cleared"]
    # InfluxDB equals window_counts point for point (and both equal what was produced).
    assert influx_points(config, topic) == _points(window_counts(spark, config, topic)) == _points(truth)
    assert summary["points"] == len(_points(truth))
    assert InfluxPushState(config).read()["pending_since_ms"] is None

    # Nothing pending any more: a second catch-up does nothing.
    assert influx_catch_up.run(spark, config, argparse.Namespace(since=None, force=False))["points"] == 0
