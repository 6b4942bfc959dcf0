"""One driver per checkpoint with the real broker, Spark and Delta: a second driver started
while one runs on the same checkpoint refuses, naming the first; the supervisor reads that as "another driver
owns it" (no start, no crash loop); the first keeps counting exactly; once it stops gracefully its lease is gone
and the supervisor's start takes over at once. Ground truth comes from what the test produced."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from pyspark.sql import functions as F

from kdq import driver_lease
from kdq.spark.stream_process import child_env, start_stream, stop_stream, stream_process
from kdq.spark.submit import submit_command
from kdq.storage import LOCAL_FILES
from kdq.stream import failures
from tests.integration.helpers import (
    expected_counts,
    isolated_config,
    process_cmdline,
    produce,
    wait_for,
    window_counts,
    write_config_file,
)

PLUGINS_FOLDER = Path(__file__).resolve().parents[2] / "plugins"
if str(PLUGINS_FOLDER) not in sys.path:
    sys.path.insert(0, str(PLUGINS_FOLDER))

from kdq_airflow.stream import ensure_stream_running  # noqa: E402

pytestmark = pytest.mark.integration

GOOD = json.dumps({"ok": True}).encode()
BAD = b"\xff not json"


def _wave(config, topic: str, start_ms: int, n: int, truth: list) -> None:
    records = [(i % 3, i % 4 != 1, start_ms + (i * 397) % 3000) for i in range(n)]
    produce(config.kafka_bootstrap(), topic, [(p, GOOD if ok else BAD, ts) for p, ok, ts in records])
    truth.extend((ts, ok) for _, ok, ts in records)


def _driver(process: psutil.Process) -> psutil.Process:
    """spark-submit's Python driver (the process that holds the lease)."""
    for child in process.children(recursive=True):
        # The command line names the driver script; its executable is python (spark-submit's JVM names it too).
        # A child that exits or turns zombie meanwhile gives "" (the CI run of 6b55af7 failed on one).
        command = process_cmdline(child)
        if "stream_counts.py" in command and "python" in command.split()[0]:
            return child
    raise AssertionError("no Python driver under spark-submit yet")


@pytest.mark.timeout(1500)
def test_a_second_driver_refuses_and_the_first_keeps_counting(spark, local_stack, tmp_path) -> None:
    prefix = f"dl{tmp_path.name[-6:].replace('_', '')}"
    config = isolated_config(
        local_stack, tmp_path / "data", prefix,
        stream={"allowed_lateness_seconds": 3600, "driver_lease_seconds": 20},
        spark={"conf": {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}},
    )
    config = write_config_file(config, tmp_path / "kdq.toml")
    topic = f"{prefix}-t"
    local_stack.kafka.create_topic(topic, partitions=3)
    checkpoint = failures.checkpoint_of(config)
    truth: list[tuple[int, bool]] = []

    # The first driver: a foreground `kdq stream` the supervisor did not start (an operator's, another host's).
    with open(tmp_path / "first.log", "ab") as log:
        first = subprocess.Popen(
            submit_command(config, "stream_counts", [], app_name="kdq-speed-layer"),
            env={**os.environ, **child_env(config)}, cwd=config.base_dir, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wave(config, topic, int(time.time() * 1000), 60, truth)
        wait_for(lambda: window_counts(spark, config, topic) == expected_counts(topic, truth), 400,
                 "the first driver counts", interval=3)
        owner = _driver(psutil.Process(first.pid))
        leases = driver_lease.read_leases(LOCAL_FILES, checkpoint)
        assert [(lease["pid"], lease["state"]) for lease in leases] == [(owner.pid, "active")]

        # A second driver, started as `kdq stream --detach` starts it: it refuses, naming the first.
        start_stream(config)
        wait_for(lambda: not stream_process(config).running(), 300, "the second driver gives up", interval=2)
        tail = stream_process(config).log_tail(400)
        assert "REFUSED to start: another driver holds the checkpoint" in tail, tail
        assert f"pid {owner.pid} on host {socket.gethostname()}" in tail, tail
        assert '"ok": false' in tail and "refused: another driver" in tail, tail
        assert [lease["pid"] for lease in driver_lease.read_leases(LOCAL_FILES, checkpoint)] == [owner.pid]

        # The supervisor: another driver owns the checkpoint. Nothing started, no restart counted, no failure.
        for _ in range(2):
            assert ensure_stream_running(config) == "owned_elsewhere"
            assert not stream_process(config).running()

        # The first keeps counting, exactly.
        _wave(config, topic, int(time.time() * 1000) + 10_000, 45, truth)
        wait_for(lambda: window_counts(spark, config, topic) == expected_counts(topic, truth), 300,
                 "the first driver counts the next wave", interval=3)
        assert first.poll() is None and owner.is_running()

        # A graceful stop releases the lease: the supervisor starts the stream at once, and it counts on.
        owner.send_signal(signal.SIGTERM)
        assert first.wait(timeout=300) == 0
        assert driver_lease.read_leases(LOCAL_FILES, checkpoint) == []
        assert ensure_stream_running(config) == "restarted"
        _wave(config, topic, int(time.time() * 1000) + 20_000, 30, truth)
        wait_for(lambda: window_counts(spark, config, topic) == expected_counts(topic, truth), 400,
                 "the supervisor's driver counts", interval=3)
        archive = spark.read.format("delta").load(str(config.tables_dir / "raw_archive")).where(F.col("topic") == topic)
        assert archive.count() == archive.select("partition", "offset").distinct().count() == len(truth)
        assert ensure_stream_running(config) == "healthy"
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        stop_stream(config, timeout=30)
