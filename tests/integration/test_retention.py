"""Archive retention and late data, end to end on the real broker, Spark, Delta and InfluxDB.

Scenario: a window is counted; the daily maintenance's retention deletes its raw rows (its hour is past
retention); then records arrive for it too late for the stream. The hourly recompute must add them to the
full count (never replace it with the count of what the archive still holds), invalid_reasons must follow,
a maintenance run that dies between retiring and deleting must not count anything twice, and a rebuild of
the retired range must refuse. Ground truth comes from what the test produced.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json

import pytest
from pyspark.sql import functions as F
from spark_jobs import batch_recompute, maintenance, reconcile
from spark_jobs import rebuild as rebuild_job

from kdq.rules import load_rules
from kdq.spark import retention
from kdq.spark.maintenance import maintenance_plan, run_step
from kdq.spark.speed_layer import SpeedLayer
from kdq.spark.writers import now_ms
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

pytestmark = pytest.mark.integration

GOOD = json.dumps({"id": 1}).encode()
BAD = b"{oops"
W60 = W0 + 60_000


def _recompute(spark, config, interval: tuple[int, int], run_id: str) -> dict:
    args = argparse.Namespace(start=interval[0], end=interval[1], run_id=run_id, reason="late_data", skip_push=False)
    return batch_recompute.run(spark, config, args)


def _archive_rows(spark, config, topic: str) -> int:
    return spark.read.format("delta").load(str(config.tables_dir / "raw_archive")).where(F.col("topic") == topic).count()


def _retired(spark, config, topic: str) -> dict[tuple[int, str], int]:
    rows = (
        retention.read_retired(spark, config).where(F.col("topic") == topic)
        .groupBy(F.unix_millis("window_start").alias("w"), "status").agg(F.sum("count").alias("n")).collect()
    )
    return {(r["w"], r["status"]): r["n"] for r in rows}


def _retire_step(config, before_ms: int):
    """The maintenance's retirement step of a run today, retiring rows ingested before ``before_ms``
    (a run retires those before midnight of the day before it; a test cannot wait for midnight)."""
    today = dt.datetime.now(dt.UTC).date()
    [step] = [s for s in maintenance_plan(config, today, archive_retention_days=30) if s.action == "retire"]
    assert step.retire_before_ms == retention.retirement_instant(today)
    return dataclasses.replace(step, retire_before_ms=before_ms)


def test_late_records_for_a_retired_window_add_to_its_full_count(spark, local_stack, tmp_path, monkeypatch) -> None:
    prefix = f"rt{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-orders"
    local_stack.kafka.create_topic(topic, partitions=2)
    config = isolated_config(local_stack, tmp_path, prefix)  # allowed lateness 10 s
    produced: list[tuple[int, bool]] = []

    def send(records: list[tuple[int, bool, int]]) -> None:
        produce(config.kafka_bootstrap(), topic, [(p, GOOD if ok else BAD, ts) for p, ok, ts in records])
        produced.extend((ts, ok) for _, ok, ts in records)

    # w0: 3 valid + 2 invalid (not_json), and a record a minute later that moves the topic's event time on.
    send([(0, True, W0 + 10), (1, True, W0 + 20), (0, True, W0 + 30), (1, False, W0 + 40), (0, False, W0 + 50),
          (1, True, W60 + 5)])
    layer = SpeedLayer(spark, config, load_rules(config.rules_dir))
    run_available_now(layer)
    assert window_counts(spark, config, topic) == expected_counts(topic, produced)
    assert _archive_rows(spark, config, topic) == 6

    # Retention as the daily maintenance runs it: w0's hour (2023) is far past 30 days. Its rows are
    # retired, then deleted.
    result = run_step(spark, config, _retire_step(config, now_ms()))
    assert result["retired_records"] >= 6 and result["deleted_rows"] >= 6, result
    assert _archive_rows(spark, config, topic) == 0
    assert _retired(spark, config, topic) == {(W0, "valid"): 3, (W0, "invalid"): 2, (W60, "valid"): 1}
    # The counts themselves are untouched by retention.
    assert window_counts(spark, config, topic) == expected_counts(topic, produced)

    # Too late for the stream: one more valid and one more invalid record for w0.
    ingest_from = now_ms()
    send([(0, True, W0 + 600), (1, False, W0 + 700)])
    run_available_now(layer)
    interval = (ingest_from, now_ms() + 1)
    assert _archive_rows(spark, config, topic) == 2  # only the late ones are in the archive now
    assert window_counts(spark, config, topic) == expected_counts(topic, produced[:-2]), "the stream leaves w0 alone"

    summary = _recompute(spark, config, interval, "rt-1")
    truth = expected_counts(topic, produced)
    assert truth[(topic, W0, "valid")] == 4 and truth[(topic, W0, "invalid")] == 3
    # 4 and 3, not the 1 and 1 the archive still holds.
    assert summary["ok"] and summary["corrections"] == 2, summary
    assert window_counts(spark, config, topic) == truth
    metrics = {k: v for k, v in latest_metrics(config).items() if k[0] == topic}
    assert metrics == truth
    assert influx_points(config, topic)[W0] == (4, 3)
    # invalid_reasons: the stream's 2 of w0 plus the batch layer's 1 late one.
    invalid_times = [W0 + 40, W0 + 50, W0 + 700]
    assert summary["reason_corrections"] == 1
    assert reason_counts(spark, config, topic) == expected_reasons([(ts, "not_json") for ts in invalid_times])
    # Reconciliation counts retired + archived rows too: no mismatch.
    report = reconcile.run(spark, config, argparse.Namespace(topics=[topic], pattern=None, from_ms=W0 - 60_000, to_ms=W0 + 3_600_000))
    assert report["count_mismatches"] == 0, report["mismatches"]

    # A maintenance run that retires the late rows and dies before its DELETE: nothing is counted twice.
    later = _retire_step(config, now_ms())
    with monkeypatch.context() as patch:
        from delta.tables import DeltaTable

        def crash(self, condition=None):
            raise RuntimeError("killed between the retirement and the DELETE")

        patch.setattr(DeltaTable, "delete", crash)
        with pytest.raises(RuntimeError, match="killed"):
            run_step(spark, config, later)
    assert _archive_rows(spark, config, topic) == 2
    assert _retired(spark, config, topic) == {(W0, "valid"): 4, (W0, "invalid"): 3, (W60, "valid"): 1}
    again = _recompute(spark, config, interval, "rt-2")
    assert again["corrections"] == 0 and again["reason_corrections"] == 0, again
    assert window_counts(spark, config, topic) == truth
    # The retried run retires nothing more (Delta's idempotent write) and finishes the DELETE.
    retried = run_step(spark, config, later)
    assert (retried["retired_records"], retried["deleted_rows"]) == (0, 2), retried
    assert _retired(spark, config, topic) == {(W0, "valid"): 4, (W0, "invalid"): 3, (W60, "valid"): 1}
    assert _recompute(spark, config, interval, "rt-3")["corrections"] == 0
    assert window_counts(spark, config, topic) == truth

    # A rebuild cannot re-judge deleted raw values: it refuses the range instead of shrinking its counts.
    with pytest.raises(ValueError, match="archive retention deleted raw records"):
        rebuild_job.run(spark, config, argparse.Namespace(
            from_ms=W0, to_ms=W0 + 10_000, topics=[topic], run_id="rb", skip_push=True, keep_archive=False))
    assert window_counts(spark, config, topic) == truth

    # The whole daily job as Airflow submits it (compaction, retention, VACUUM): the counts stay exact.
    report = maintenance.run(spark, config, argparse.Namespace(archive_retention_days=30, vacuum_retain_hours=168, today=None))
    assert report["steps"] == len(maintenance_plan(config, dt.datetime.now(dt.UTC).date(), 30))
    assert any(k.startswith("RETIRE+DELETE") for k in report["results"]), report
    assert window_counts(spark, config, topic) == truth
    assert _recompute(spark, config, interval, "rt-4")["corrections"] == 0
