"""The reconciliation check finds a missing archive range, on the real broker, Spark and Delta."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from pyspark.sql import functions as F
from spark_jobs import batch_recompute, reconcile

from kdq.rules import load_rules
from kdq.spark.speed_layer import SpeedLayer
from tests.integration.helpers import W0, expected_counts, isolated_config, produce, window_counts
from tests.integration.test_speed_layer_example import run_available_now


def test_reconcile_clean_then_detects_a_deleted_range(spark, local_stack, tmp_path) -> None:
    prefix = f"rc{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-orders"
    config = isolated_config(local_stack, tmp_path, prefix)
    local_stack.kafka.create_topic(topic, partitions=2)
    # 8 records per partition, increasing timestamps, over W0 .. W0 + 4 s.
    sent = [(p, W0 + i * 500 + p) for p in (0, 1) for i in range(8)]
    produce(config.kafka_bootstrap(), topic, [(p, b'{"a":1}' if i % 2 else b"{x", ts) for i, (p, ts) in enumerate(sent)])
    run_available_now(SpeedLayer(spark, config, load_rules(config.rules_dir)))
    args = argparse.Namespace(topics=[topic], pattern=None, from_ms=W0, to_ms=W0 + 10_000)

    clean = reconcile.run(spark, config, args)
    assert clean.ok, clean
    assert [(p["partition"], p["expected"], p["archived"], p["gaps"]) for p in clean["partitions"]] == [(0, 8, 8, []), (1, 8, 8, [])]
    assert clean["count_mismatches"] == 0

    # Partition 1 loses offsets 2..4 from the archive (e.g. a deleted file).
    path = config.tables_dir / "raw_archive"
    spark.sql(f"DELETE FROM delta.`{path}` WHERE topic = '{topic}' AND partition = 1 AND offset BETWEEN 2 AND 4")
    broken = reconcile.run(spark, config, args)
    assert not broken.ok
    assert [(p["topic"], p["partition"], p["gaps"], p["missing"]) for p in broken["problems"]] == [(topic, 1, [[2, 4]], 3)]
    assert broken["missing_offsets"] == 3 and broken["partitions_with_gaps"] == 1
    # The window counts (the stream counted them) no longer match the archive for the windows those records were in.
    lost = {W0 + i * 500 + 1 for i in (2, 3, 4)}
    expected_windows = {ts // 1000 * 1000 for ts in lost}
    assert broken["count_mismatches"] > 0
    assert {m["window_start_ms"] for m in broken["mismatches"]} == expected_windows
    assert sum(m["window_counts"] - m["archive"] for m in broken["mismatches"]) == 3

    # A gap at the edge of the range (the last offsets) is found too.
    spark.sql(f"DELETE FROM delta.`{path}` WHERE topic = '{topic}' AND partition = 0 AND offset >= 6")
    edge = reconcile.run(spark, config, args)
    assert {(p["partition"], tuple(map(tuple, p["gaps"]))) for p in edge["problems"]} == {(0, ((6, 7),)), (1, ((2, 4),))}


def test_hourly_check_leaves_pending_late_rows_out_and_checks_the_windows_late_rows_touched(
    spark, local_stack, tmp_path
) -> None:
    """The hourly DAG's check (``--after-recompute``). A record too late for the stream is archived
    uncounted, at ingest time *now*, for a window of the event hour H of W0.

    * H's check, long after H ended, runs before the recompute of the record's own ingest interval: the
      record is that later run's to count, so it is no mismatch of H (the plain check does call it one);
    * the check of the record's ingest interval covers its window although it lies outside that interval:
      before the recompute it finds the window behind the archive, after the recompute it finds it exact.
    """
    prefix = f"rh{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-orders"
    config = isolated_config(local_stack, tmp_path, prefix)  # allowed lateness 10 s
    local_stack.kafka.create_topic(topic, partitions=2)
    layer = SpeedLayer(spark, config, load_rules(config.rules_dir))
    on_time = [(p, W0 + i * 700 + p) for p in (0, 1) for i in range(6)] + [(0, W0 + 60_000)]  # then a minute on
    produce(config.kafka_bootstrap(), topic, [(p, b'{"a":1}', ts) for p, ts in on_time])
    run_available_now(layer)
    late = [(1, b'{"late":1}', W0 + 300), (0, b"{late", W0 + 1300)]  # beyond the lateness: archived uncounted
    produce(config.kafka_bootstrap(), topic, late)
    run_available_now(layer)
    produced = [(ts, True) for _, ts in on_time] + [(W0 + 300, True), (W0 + 1300, False)]
    counted, truth = expected_counts(topic, produced[: len(on_time)]), expected_counts(topic, produced)
    assert window_counts(spark, config, topic) == counted
    behind = sorted((w, s, counted.get((t, w, s), 0), n) for (t, w, s), n in truth.items() if counted.get((t, w, s)) != n)
    assert [(w, s) for w, s, _, _ in behind] == [(W0, "valid"), (W0 + 1000, "invalid")]
    ingest = [
        r["ms"]
        for r in spark.read.format("delta").load(str(config.tables_dir / "raw_archive"))
        .where((F.col("topic") == topic) & ~F.col("counted"))
        .select(F.unix_millis("ingest_time").alias("ms"))
        .collect()
    ]
    assert len(ingest) == 2

    hour = W0 // 3_600_000 * 3_600_000
    assert datetime.now(UTC).timestamp() * 1000 > hour + 3_600_000
    plain = reconcile.run(spark, config, argparse.Namespace(topics=[topic], pattern=None, from_ms=hour, to_ms=hour + 3_600_000))
    assert not plain.ok and plain["count_mismatches"] == 2, plain["mismatches"]
    hourly = reconcile.run(
        spark, config,
        argparse.Namespace(topics=[topic], pattern=None, from_ms=hour, to_ms=hour + 3_600_000, after_recompute=True),
    )
    assert hourly.ok, hourly["mismatches"]
    assert (hourly["pending_rows"], hourly["late_windows_checked"], hourly["count_mismatches"]) == (2, 0, 0)
    assert [(p["expected"], p["archived"]) for p in hourly["partitions"]] == [(8, 8), (7, 7)]

    # The records' own ingest interval: its late windows (W0 and W0 + 1 s) lie outside it.
    interval = argparse.Namespace(topics=[topic], pattern=None, from_ms=min(ingest), to_ms=max(ingest) + 1, after_recompute=True)
    before = reconcile.run(spark, config, interval)
    assert not before.ok
    assert (before["late_windows_checked"], before["pending_rows"]) == (2, 0)
    assert sorted((m["window_start_ms"], m["status"], m["window_counts"], m["archive"]) for m in before["mismatches"]) == behind
    batch_recompute.run(
        spark, config,
        argparse.Namespace(start=interval.from_ms, end=interval.to_ms, run_id="rh-1", reason="late_data", skip_push=True),
    )
    assert window_counts(spark, config, topic) == truth
    after = reconcile.run(spark, config, interval)
    assert after.ok and after["late_windows_checked"] == 2, after["mismatches"]
