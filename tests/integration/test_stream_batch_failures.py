"""Failing and hung micro-batches against the real broker, Spark and Delta: a micro-batch that fails deterministically, and one
that hangs, as the stream supervisor's check (``ensure_stream_running``, the function the Airflow task runs)
sees them. The stream is the real spark-submit process; test-only switches (KDQ_FAULT_FAIL_VALUE,
KDQ_FAULT_HANG_SECONDS) reach it through the supervisor's ``extra_env``. Ground truth comes from what the
test produced."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from kdq.spark.stream_process import describe_stream, stop_stream, stream_process
from kdq.stream import failures
from tests.integration.helpers import (
    expected_counts,
    isolated_config,
    produce,
    wait_for,
    window_counts,
    write_config_file,
)

PLUGINS_FOLDER = Path(__file__).resolve().parents[2] / "plugins"
if str(PLUGINS_FOLDER) not in sys.path:
    sys.path.insert(0, str(PLUGINS_FOLDER))

from airflow.sdk.exceptions import AirflowException  # noqa: E402

from kdq_airflow.stream import ensure_stream_running  # noqa: E402

pytestmark = pytest.mark.integration

GOOD = json.dumps({"ok": True}).encode()
BAD = b"\xff not json"
POISON = b'{"ok": true, "note": "POISON"}'


@pytest.fixture
def supervised(local_stack, tmp_path):
    prefix = f"bf{tmp_path.name[-6:].replace('_', '')}"
    config = isolated_config(
        local_stack, tmp_path / "data", prefix,
        stream={"allowed_lateness_seconds": 3600, "max_batch_failures": 2, "max_batch_seconds": 20,
                "hung_stop_grace_seconds": 10},
        spark={"conf": {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}},
    )
    config = write_config_file(config, tmp_path / "kdq.toml")
    try:
        yield prefix, config
    finally:
        stop_stream(config, timeout=30)


def _wave(start_ms: int, n: int, partitions: int) -> list[tuple[int, bool, int]]:
    return [(i % partitions, i % 5 != 2, start_ms + (i * 397) % 2000) for i in range(n)]


def _send(config, topic: str, records: list[tuple[int, bool, int]], produced: list) -> None:
    produce(config.kafka_bootstrap(), topic, [(p, GOOD if ok else BAD, ts) for p, ok, ts in records])
    produced.extend((ts, ok) for _, ok, ts in records)


def _job_died(config, attempts: int) -> bool:
    failure = failures.read_failure(config)
    return not stream_process(config).running() and failure is not None and failure["attempts"] == attempts


@pytest.mark.timeout(1500)
def test_deterministic_batch_failure_blocks_with_offsets_then_quarantine_counts_everything_once(
    spark, local_stack, supervised
) -> None:
    prefix, config = supervised
    good, bad = f"{prefix}-good", f"{prefix}-bad"
    local_stack.kafka.create_topic(good, partitions=3)
    local_stack.kafka.create_topic(bad, partitions=2)
    now = int(time.time() * 1000)
    truth_good: list[tuple[int, bool]] = []
    truth_bad: list[tuple[int, bool]] = []
    _send(config, good, _wave(now, 60, 3), truth_good)
    _send(config, bad, [(p, ok, ts) for p, ok, ts in _wave(now, 20, 2) if p == 1][:7], truth_bad)  # offsets 0..6
    poison_ts = now + 1234
    produce(config.kafka_bootstrap(), bad, [(1, POISON, poison_ts)])  # partition 1, offset 7
    truth_bad.append((poison_ts, False))  # counted once, invalid
    _send(config, bad, _wave(now, 20, 2), truth_bad)  # partition 0: 0..9, partition 1: 8..17

    env = {"KDQ_FAULT_FAIL_VALUE": "POISON"}
    assert ensure_stream_running(config, extra_env=env) == "restarted"
    wait_for(lambda: _job_died(config, 1), 400, "the job dies on the poisoned batch (attempt 1)", interval=2)
    assert ensure_stream_running(config, extra_env=env) == "restarted"
    wait_for(lambda: _job_died(config, 2), 400, "the job dies on the poisoned batch (attempt 2)", interval=2)

    with pytest.raises(AirflowException) as failed:
        ensure_stream_running(config, extra_env=env)
    message = str(failed.value)
    batch = failures.read_failure(config)["batch_id"]
    assert f"micro-batch {batch} failed 2 times in a row" in message, message
    assert f"KDQ_FAULT_FAIL_VALUE: cannot process record {bad} partition 1 offset 7" in message, message
    assert f"{bad} partition 1: offsets 0..17" in message and f"{good} partition 2: offsets 0..19" in message, message
    assert "kdq quarantine-offsets" in message and f"kdq quarantine-batch {batch}" in message
    assert not stream_process(config).running(), "blocked: no restart"
    assert window_counts(spark, config, good) == {}, "every topic waits for the failing batch"
    status = "\n".join(describe_stream(config))
    assert f"batch {batch} failed 2x in a row - BLOCKED" in status, status

    # The way out: quarantine the offending record with the CLI.
    out = subprocess.run(
        [".venv/bin/kdq", "quarantine-offsets", "--topic", bad, "--partition", "1", "--from", "7", "--to", "7",
         "--reason", "test: poisoned record"],
        capture_output=True, text=True, env={"KDQ_CONFIG": config.source}, timeout=60,
    )
    assert out.returncode == 0 and f"batch {batch} will be retried" in out.stdout, out.stdout + out.stderr
    assert ensure_stream_running(config, extra_env=env) == "restarted"
    expected_good, expected_bad = expected_counts(good, truth_good), expected_counts(bad, truth_bad)
    wait_for(lambda: window_counts(spark, config, good) == expected_good, 400, "the good topic counted", interval=3)
    wait_for(lambda: window_counts(spark, config, bad) == expected_bad, 60, "the bad topic counted", interval=3)

    # The stream moves on: a later wave is counted too, and nothing is counted twice.
    later = int(time.time() * 1000) + 10_000
    _send(config, good, _wave(later, 30, 3), truth_good)
    _send(config, bad, _wave(later, 10, 2), truth_bad)
    expected_good, expected_bad = expected_counts(good, truth_good), expected_counts(bad, truth_bad)
    wait_for(lambda: window_counts(spark, config, good) == expected_good, 300, "the next wave counted", interval=3)
    # The two topics' records may land in different micro-batches.
    wait_for(lambda: window_counts(spark, config, bad) == expected_bad, 120, "the bad topic's next wave", interval=3)

    archive = spark.read.format("delta").load(str(config.tables_dir / "raw_archive"))
    for topic, truth in ((good, truth_good), (bad, truth_bad)):
        rows = archive.where(F.col("topic") == topic)
        assert rows.count() == rows.select("partition", "offset").distinct().count() == len(truth)
    quarantined = archive.where(F.col("reason") == "internal_error:quarantined").select(
        "topic", "partition", "offset", "valid").collect()
    assert [tuple(r) for r in quarantined] == [(bad, 1, 7, False)]

    def quarantined_reasons() -> int | None:
        return (spark.read.format("delta").load(str(config.tables_dir / "invalid_reasons"))
                .where(F.col("reason") == "internal_error:quarantined").agg(F.sum("count")).first()[0])

    # The stream appends its reasons once a minute, also while idle (kdq.spark.reasons_flush).
    wait_for(lambda: quarantined_reasons() == 1, 150, "the quarantined record's reason appended", interval=3)
    assert failures.read_failure(config) is None, "the committed batch clears its failure record"
    assert ensure_stream_running(config, extra_env=env) == "healthy"


@pytest.mark.slow  # ~2.5 min on the 2-core machine: `make test-slow`, not CI (its time budget)
@pytest.mark.timeout(1200)
def test_hung_batch_is_detected_by_the_supervisor_and_the_job_restarted(
    spark, local_stack, supervised, tmp_path
) -> None:
    prefix, config = supervised
    topic = f"{prefix}-hang"
    local_stack.kafka.create_topic(topic, partitions=3)
    truth: list[tuple[int, bool]] = []
    _send(config, topic, _wave(int(time.time() * 1000), 40, 3), truth)
    marker = tmp_path / "hang-marker"
    env = {"KDQ_FAULT_HANG_SECONDS": "3600", "KDQ_FAULT_MARKER": str(marker)}

    assert ensure_stream_running(config, extra_env=env) == "restarted"
    wait_for(lambda: marker.exists() and failures.running_batch(config), 400, "the batch hangs", interval=2)
    first = stream_process(config).process()
    assert ensure_stream_running(config, extra_env=env) == "healthy", "not hung yet: under 20 s"
    hung = wait_for(lambda: failures.hung_batch(config, 20), 60, "past stream.max_batch_seconds")
    status = "\n".join(describe_stream(config))
    assert f"batch {hung['batch_id']} HUNG (> stream.max_batch_seconds = 20s)" in status, status

    assert ensure_stream_running(config, extra_env=env) == "restarted_hung"
    assert not first.is_running() or first.status() == "zombie", "the hung job was stopped"
    second = stream_process(config).process()
    assert second is not None and second.pid != first.pid
    failure = failures.read_failure(config)
    assert failure["kind"] == "hung" and failure["batch_id"] == hung["batch_id"] and failure["attempts"] == 1

    expected = expected_counts(topic, truth)
    wait_for(lambda: window_counts(spark, config, topic) == expected, 400, "the restarted job counts", interval=3)
    archive = spark.read.format("delta").load(str(config.tables_dir / "raw_archive")).where(F.col("topic") == topic)
    assert archive.count() == archive.select("partition", "offset").distinct().count() == len(truth)
    wait_for(lambda: failures.read_failure(config) is None, 30, "the committed batch clears the record")
    assert ensure_stream_running(config, extra_env=env) == "healthy"
