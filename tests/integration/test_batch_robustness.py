"""The batch layer never counts a record twice and never recomputes early, against the real broker, Spark and Delta.

Scenarios: a record archived twice (a restored backup), archive-from-Kafka run while the stream has not
yet read the newest records, and an hourly recompute while a crashed micro-batch waits for its replay.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections import Counter

import psutil
import pytest
from pyspark.sql import functions as F
from spark_jobs import archive_from_kafka, batch_recompute
from spark_jobs import rebuild as rebuild_job

from kdq.rules import load_rules
from kdq.spark.batch_layer import stream_caught_up
from kdq.spark.recompute import StreamBehind
from kdq.spark.speed_layer import SpeedLayer
from kdq.spark.stream_process import start_stream, stop_stream, stream_process
from kdq.spark.writers import now_ms
from tests.integration.helpers import (
    W0,
    archived_offsets,
    expected_counts,
    isolated_config,
    produce,
    wait_for,
    window_counts,
    write_config_file,
)
from tests.integration.test_speed_layer_example import run_available_now

OK = b'{"ok":1}'


def _recompute_args(start: int, end: int, run_id: str) -> argparse.Namespace:
    return argparse.Namespace(start=start, end=end, run_id=run_id, reason="late_data", skip_push=True)


def test_a_record_archived_twice_is_counted_once_by_recompute_and_rebuild(spark, local_stack, tmp_path) -> None:
    prefix = f"dup{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}-orders"
    config = isolated_config(local_stack, tmp_path, prefix)
    local_stack.kafka.create_topic(topic, partitions=2)
    sent = [(i % 2, OK if i % 4 else b"{bad", W0 + i * 150) for i in range(16)]
    produce(config.kafka_bootstrap(), topic, sent)
    run_available_now(SpeedLayer(spark, config, load_rules(config.rules_dir)))
    truth = expected_counts(topic, [(ts, value == OK) for _, value, ts in sent])
    assert window_counts(spark, config, topic) == truth

    # Six records appear a second time in the archive, as a restored backup or a second load would leave
    # them: uncounted rows of another source, ingested now, so the hourly recompute looks at their windows.
    archive_path = str(config.tables_dir / "raw_archive")
    copies = (
        spark.read.format("delta").load(archive_path)
        .where((F.col("topic") == topic) & (F.col("offset") < 3))
        .withColumn("counted", F.lit(False))
        .withColumn("source", F.lit("archive_from_kafka"))
        .withColumn("ingest_time", F.current_timestamp())
    )
    ingest_from = now_ms()
    copies.write.format("delta").mode("append").save(archive_path)
    ingest_to = now_ms() + 1
    assert sum(archived_offsets(spark, config, topic).values()) == 16 + 6

    summary = batch_recompute.run(spark, config, _recompute_args(ingest_from, ingest_to, "dup-1"))
    assert summary["late_windows"] > 0 and summary["corrections"] == 0, summary
    assert window_counts(spark, config, topic) == truth

    rebuilt = rebuild_job.run(
        spark, config,
        argparse.Namespace(from_ms=W0, to_ms=W0 + 10_000, topics=[topic], run_id="dup-rb", skip_push=True, keep_archive=False),
    )
    assert rebuilt["corrections"] == 0, rebuilt
    assert window_counts(spark, config, topic) == truth


def test_archive_from_kafka_never_loads_what_the_stream_has_not_passed(spark, local_stack, tmp_path) -> None:
    prefix = f"ahead{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}-orders"
    config = isolated_config(local_stack, tmp_path, prefix)
    local_stack.kafka.create_topic(topic, partitions=2)
    args = argparse.Namespace(
        topics=[topic], pattern=None, starting_offsets="earliest", start_time=None,
        ending_offsets="latest", end_time=None, run_id=None,
    )

    # Before the stream has read anything: nothing is the backfill's to load.
    produce(config.kafka_bootstrap(), topic, [(i % 2, OK, W0 + i) for i in range(10)])
    before = archive_from_kafka.run(spark, config, args)
    assert (before["rows_read"], before["rows_loaded"]) == (0, 0)
    assert sum(r["held_back_for_stream"] for r in before["partitions"]) == 10
    assert all(r["stream_passed"] is None for r in before["partitions"])

    layer = SpeedLayer(spark, config, load_rules(config.rules_dir))
    run_available_now(layer)
    # Five newer records the stream has not read yet: held back, and archived by the stream alone.
    produce(config.kafka_bootstrap(), topic, [(i % 2, OK, W0 + 100 + i) for i in range(5)])
    report = archive_from_kafka.run(spark, config, args)
    assert (report["rows_read"], report["rows_loaded"], report["rows_skipped_already_archived"]) == (10, 0, 10)
    assert sum(r["held_back_for_stream"] for r in report["partitions"]) == 5
    assert {r["partition"]: r["stream_passed"] for r in report["partitions"]} == {0: 5, 1: 5}
    run_available_now(layer)
    assert archived_offsets(spark, config, topic) == Counter([(0, o) for o in range(8)] + [(1, o) for o in range(7)])
    assert window_counts(spark, config, topic) == {(topic, W0, "valid"): 15}


@pytest.mark.timeout(900)
def test_hourly_recompute_fails_while_a_crashed_batch_awaits_its_replay(spark, local_stack, tmp_path) -> None:
    prefix = f"behind{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}-orders"
    config = write_config_file(isolated_config(local_stack, tmp_path / "data", prefix), tmp_path / "kdq.toml")
    local_stack.kafka.create_topic(topic, partitions=1)
    ingest_from = now_ms()
    produce(config.kafka_bootstrap(), topic, [(0, OK, W0 + i) for i in range(5)])
    marker = tmp_path / "crashed"
    env = {"KDQ_FAULT_POINT": "after_ledger", "KDQ_FAULT_MARKER": str(marker)}
    try:
        # The micro-batch is in the ledger (its ingest time fixed) and dies before it commits.
        pid = start_stream(config, extra_env=env)
        assert psutil.Process(pid).wait(timeout=300) == 137, stream_process(config).log_tail(40)
        assert marker.exists()
        interval_end = now_ms() + 1
        with pytest.raises(StreamBehind, match="has not committed every micro-batch"):
            batch_recompute.run(spark, config, _recompute_args(ingest_from, interval_end, "behind-1"))

        # Replayed (same batch, same ingest time) and committed: now the interval can be recomputed.
        start_stream(config, extra_env=env)
        wait_for(lambda: window_counts(spark, config, topic) == {(topic, W0, "valid"): 5}, 240, "the replayed batch")
        wait_for(lambda: stream_caught_up(spark, config, interval_end) is True, 60, "the replay's commit")
        summary = batch_recompute.run(spark, config, _recompute_args(ingest_from, interval_end, "behind-2"))
        assert summary["stream_caught_up"] is True and summary["corrections"] == 0
        assert json.loads(summary.to_json())["ok"]  # the report as the job prints it
    finally:
        stop_stream(config, timeout=60)


@pytest.mark.slow  # ~4.5 min on the 2-core machine: `make test-slow`, not CI (its time budget)
@pytest.mark.timeout(1200)
def test_lost_checkpoint_is_refused_then_resumed_from_the_archive(spark, local_stack, tmp_path) -> None:
    """The stream dies right after archiving a batch (its MERGE may or may not have landed), then its checkpoint
    is lost: a plain restart refuses; resuming from the archive counts every record exactly once."""
    import shutil

    prefix = f"lostcp{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}-orders"
    config = write_config_file(isolated_config(local_stack, tmp_path / "data", prefix), tmp_path / "kdq.toml")
    local_stack.kafka.create_topic(topic, partitions=2)
    produce(config.kafka_bootstrap(), topic, [(i % 2, OK, W0 + i) for i in range(10)])
    marker = tmp_path / "crashed"

    def run_once(**env: str) -> int:
        pid = start_stream(config, job_args=["--available-now"], extra_env=env)
        return psutil.Process(pid).wait(timeout=300)

    try:
        assert run_once(KDQ_FAULT_POINT="after_archive", KDQ_FAULT_MARKER=str(marker)) == 137
        assert sum(archived_offsets(spark, config, topic).values()) == 10
        shutil.rmtree(config.checkpoints_dir / "speed_layer")

        assert run_once() != 0
        log = stream_process(config).log_tail(200)
        assert "is new, but the raw archive" in log and "resume_from_archive" in log, log
        assert sum(archived_offsets(spark, config, topic).values()) == 10, "a refused start reads nothing"

        produce(config.kafka_bootstrap(), topic, [(i % 2, OK, W0 + 100 + i) for i in range(5)])
        assert run_once(KDQ_STREAM__ON_FRESH_CHECKPOINT="resume_from_archive") == 0, stream_process(config).log_tail(60)
        assert window_counts(spark, config, topic) == {(topic, W0, "valid"): 15}
        assert archived_offsets(spark, config, topic) == Counter([(0, o) for o in range(8)] + [(1, o) for o in range(7)])

        # From now on the checkpoint exists again: a normal restart just continues.
        produce(config.kafka_bootstrap(), topic, [(0, OK, W0 + 200)])
        assert run_once() == 0
        assert window_counts(spark, config, topic) == {(topic, W0, "valid"): 16}
    finally:
        stop_stream(config, timeout=60)
