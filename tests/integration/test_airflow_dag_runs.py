"""The DAGs run by Airflow itself (`airflow dags test`) against the real stack, stream, Delta and InfluxDB.

* The supervisor DAG starts the speed layer detached; after the stream is SIGKILLed, its next run
  restarts it and the counts stay exact (ground truth from what the test produced).
* The hourly DAG, run for the hour in which records too late for the stream were ingested, corrects
  window_counts, writes one corrections row per change and pushes the corrected windows to InfluxDB and
  the metrics topic (the push is its own task: `recompute` runs with `--skip-push`).

The Airflow home and database are shared by every Airflow test (``airflow_local``); the stream started
here keeps running for the next test and is stopped by that fixture.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import UTC, datetime, timedelta

import psutil
import pytest
from pyspark.sql import functions as F

from kdq.spark.speed_layer import app_id_for
from kdq.spark.stream_process import stop_stream, stream_process
from kdq.spark.writers import txn_version
from kdq.stream.checkpoint_offsets import speed_layer_checkpoint
from tests.integration.helpers import (
    W0,
    dags_test,
    expected_counts,
    influx_points,
    latest_metrics,
    produce,
    wait_for,
    window_counts,
)

GOOD = json.dumps({"ok": True}).encode()
BAD = b"\xff not json"
W1, W2, W60 = W0 + 1000, W0 + 2000, W0 + 60_000

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", autouse=True)
def _stop_the_stream_after_the_module(airflow_local):
    """The stream the supervisor started serves both tests; later Airflow tests need the CPU."""
    yield
    stop_stream(airflow_local.config, timeout=60)


def archive_rows(spark, config, topic: str):
    return spark.read.format("delta").load(str(config.tables_dir / "raw_archive")).where(F.col("topic") == topic)


def _wave(start_ms: int, n: int) -> list[tuple[int, bool, int]]:
    """n records over 3 partitions, every 5th invalid, event times out of order over ~2 s."""
    return [(i % 3, i % 5 != 2, start_ms + (i * 397) % 2000) for i in range(n)]


@pytest.mark.timeout(900)
def test_supervisor_restarts_a_killed_stream_and_counts_stay_exact(spark, local_stack, airflow_local) -> None:
    config = airflow_local.config
    topic = f"{airflow_local.prefix}-supervised"
    local_stack.kafka.create_topic(topic, partitions=3)
    produced: list[tuple[int, bool]] = []

    def send(records: list[tuple[int, bool, int]]) -> None:
        produce(config.kafka_bootstrap(), topic, [(p, GOOD if ok else BAD, ts) for p, ok, ts in records])
        produced.extend((ts, ok) for _, ok, ts in records)

    dags_test(airflow_local.airflow, "kdq_stream_supervisor", datetime.now(UTC))
    first = stream_process(config).process()
    assert first is not None, "the supervisor did not start the stream"
    send(_wave(int(time.time() * 1000), 60))
    wait_for(lambda: window_counts(spark, config, topic) == expected_counts(topic, produced), 300,
             "the supervised stream counts the first wave")

    os.killpg(first.pid, signal.SIGKILL)  # the JVM and the Python driver: no graceful stop
    psutil.wait_procs([first], timeout=30)
    assert stream_process(config).process() is None
    send(_wave(int(time.time() * 1000), 45))  # produced while nothing consumes

    dags_test(airflow_local.airflow, "kdq_stream_supervisor", datetime.now(UTC) + timedelta(seconds=1))
    second = stream_process(config).process()
    assert second is not None and second.pid != first.pid, "the supervisor did not restart the stream"
    truth = expected_counts(topic, produced)
    wait_for(lambda: window_counts(spark, config, topic) == truth, 300, "the restarted stream catches up")
    # Exact, and stays so: no window counted twice after the crash. Proven over a later micro-batch, not a pause:
    # a Spark stream runs no batch without new records, so a third wave makes at least one, and every window (the
    # first two waves' too) must then hold exactly the truth. The evidence that a batch ran is the stream's own
    # Delta transaction record in window_counts (the batch id its MERGE committed, in the same commit as the
    # counts; the progress file is written later, by a listener).
    counts_table = str(config.tables_dir / "window_counts")
    stream_app_id = app_id_for(speed_layer_checkpoint(config))
    caught_up_at = txn_version(spark, counts_table, stream_app_id)
    assert caught_up_at >= 0, "no batch of the stream is recorded in window_counts"
    send(_wave(int(time.time() * 1000), 30))
    truth = expected_counts(topic, produced)
    wait_for(lambda: window_counts(spark, config, topic) == truth, 300, "a later micro-batch counts the third wave")
    assert txn_version(spark, counts_table, stream_app_id) > caught_up_at, "no later micro-batch merged its counts"
    archived = archive_rows(spark, config, topic)
    assert archived.count() == archived.select("partition", "offset").distinct().count() == len(produced)


@pytest.mark.slow  # ~3.5 min on the 2-core machine: `make test-slow`, not CI (its time budget)
@pytest.mark.timeout(900)
def test_hourly_dag_corrects_records_too_late_for_the_stream(spark, local_stack, airflow_local) -> None:
    config = airflow_local.config
    topic = f"{airflow_local.prefix}-orders"
    local_stack.kafka.create_topic(topic, partitions=3)
    if stream_process(config).process() is None:  # run alone: the supervisor starts the stream
        dags_test(airflow_local.airflow, "kdq_stream_supervisor", datetime.now(UTC))
    produced: list[tuple[int, bool]] = []

    def send(records: list[tuple[int, bool, int]]) -> None:
        produce(config.kafka_bootstrap(), topic, [(p, GOOD if ok else BAD, ts) for p, ok, ts in records])
        produced.extend((ts, ok) for _, ok, ts in records)

    # PRODUCT.md's example, and a record a minute later that moves the topic's event time on.
    send([(0, True, W0 + 10), (0, True, W0 + 20), (0, True, W0 + 30), (0, False, W0 + 40)]
         + [(2, True, W0 + 500), (2, True, W0 + 900), (1, False, W0 + 1500), (0, True, W60 + 5)])
    on_time = expected_counts(topic, produced)
    wait_for(lambda: window_counts(spark, config, topic) == on_time, 300, "the stream counts the on-time records")

    # Beyond the allowed lateness (10 s): archived, not counted.
    send([(2, True, W0 + 800), (1, False, W1 + 200), (0, True, W2 + 500)])
    late = wait_for(
        lambda: [r["ingest_time"] for r in archive_rows(spark, config, topic).where(~F.col("counted")).collect()]
        if archive_rows(spark, config, topic).where(~F.col("counted")).count() == 3 else None,
        300, "the stream archives the late records",
    )
    assert window_counts(spark, config, topic) == on_time, "the speed layer must leave closed windows alone"
    hours = {t.replace(tzinfo=UTC).replace(minute=0, second=0, microsecond=0) for t in late}
    assert len(hours) == 1, late
    [hour] = hours

    # A manual run (what `dags test` makes) recomputes the last full hour before its logical date.
    output = dags_test(airflow_local.airflow, "kdq_hourly_recompute", hour + timedelta(hours=1))
    truth = expected_counts(topic, produced)
    assert window_counts(spark, config, topic) == truth == {
        (topic, W0, "valid"): 6, (topic, W0, "invalid"): 1, (topic, W1, "invalid"): 2,
        (topic, W2, "valid"): 1, (topic, W60, "valid"): 1,
    }
    corrections = (
        spark.read.format("delta").load(str(config.tables_dir / "corrections")).where(F.col("topic") == topic)
        .select(F.unix_millis("window_start").alias("w"), "status", "old_count", "new_count", "reason", "run_id",
                F.unix_millis("interval_start").alias("s"), F.unix_millis("interval_end").alias("e"))
        .collect()
    )
    start_ms = int(hour.timestamp() * 1000)
    run_ids = {r["run_id"] for r in corrections}
    assert len(run_ids) == 1 and next(iter(run_ids)).startswith("manual__"), run_ids
    assert sorted((r["w"], r["status"], r["old_count"], r["new_count"], r["reason"], r["s"], r["e"])
                  for r in corrections) == [
        (W0, "valid", 5, 6, "late_data", start_ms, start_ms + 3_600_000),
        (W1, "invalid", 1, 2, "late_data", start_ms, start_ms + 3_600_000),
        (W2, "valid", 0, 1, "late_data", start_ms, start_ms + 3_600_000),
    ]
    # The push task sent the corrected windows: both fields of every window in InfluxDB, the new
    # absolute counts on the metrics topic.
    assert influx_points(config, topic) == {W0: (6, 1), W1: (0, 2), W2: (1, 0), W60: (1, 0)}
    assert {k: v for k, v in latest_metrics(config).items() if k[0] == topic} == truth
    # Nothing was pending for InfluxDB, so the catch-up task submitted no Spark job.
    assert "no InfluxDB push pending" in output, output[-3000:]
