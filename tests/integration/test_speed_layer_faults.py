"""Exactly once under crashes, restarts with other parallelism, topics created while running.

The stream runs as its own process through spark-submit (the way it runs in
production); the fault-injection switch kills it with os._exit at each
dangerous point of a micro-batch. Ground truth comes from what the test produced.
"""

from __future__ import annotations

import json
import subprocess
import time

import psutil
import pytest
from pyspark.sql import functions as F

from kdq.spark.stream_process import start_stream, stop_stream, stream_process
from tests.integration.helpers import (
    W0,
    crash_test_config,
    crash_then_restart,
    expected_counts,
    influx_points,
    latest_metrics,
    process_cmdline,
    produce,
    wait_for,
    window_counts,
    write_config_file,
)

GOOD = json.dumps({"ok": True}).encode()


def _wave(topic_seed: int, n: int, start_ms: int) -> list[tuple[int, bytes, int, bool]]:
    """n records over 3 partitions, every 7th invalid, event times spread over ~3 s, out of order."""
    records = []
    for i in range(n):
        valid = i % 7 != 3
        ts = start_ms + ((i * 389 + topic_seed) % 3000)
        records.append((i % 3, GOOD if valid else b"\xff not json", ts, valid))
    return records


@pytest.fixture
def stream_config(local_stack, tmp_path):
    prefix = f"fx{tmp_path.name[-6:].replace('_', '')}"
    config = crash_test_config(local_stack, tmp_path / "data", prefix)
    config = write_config_file(config, tmp_path / "kdq.toml")
    try:
        yield prefix, config
    finally:
        stop_stream(config, timeout=30)


CRASH_POINTS = ["after_ledger", "after_archive", "after_merge", "after_metrics", "before_commit"]


# A kill and a restart cost a minute or two per point: CI kills the stream after its first write (the archive) and
# after its last one (before the commit), and at both parallelisms; `make test-slow` at every point.
@pytest.mark.parametrize("points", [
    pytest.param(["after_archive", "before_commit"], id="first-and-last-write"),
    pytest.param(CRASH_POINTS, id="every-point", marks=pytest.mark.slow),
])
@pytest.mark.timeout(2400)  # two process starts of spark-submit per point on a 2-core machine
def test_exactly_once_through_crashes_and_parallelism_changes(spark, local_stack, stream_config, tmp_path,
                                                              points: list[str]) -> None:
    prefix, config = stream_config
    topic = f"{prefix}-crash"
    local_stack.kafka.create_topic(topic, partitions=3)
    truth: list[tuple[int, bool]] = []
    for n, point in enumerate(points):
        wave = _wave(n, 100, W0 + n * 3000)
        produce(config.kafka_bootstrap(), topic, [(p, v, ts) for p, v, ts, _ in wave])
        truth += [(ts, ok) for _, _, ts, ok in wave]
        # Restart with another parallelism each time (local[1] <-> local[2]).
        crash_then_restart(config, point, tmp_path / f"fault-{point}", "local[1]" if n % 2 == 0 else "local[2]", 240)
        expected = expected_counts(topic, truth)
        wait_for(
            lambda expected=expected: window_counts(spark, config, topic) == expected,
            240,
            f"counts exact after crash at {point}",
            interval=4,
        )
        assert stop_stream(config, timeout=120)

    archive = spark.read.format("delta").load(str(config.tables_dir / "raw_archive")).where(F.col("topic") == topic)
    assert archive.count() == len(truth)
    assert archive.select("partition", "offset").distinct().count() == len(truth)
    expected = expected_counts(topic, truth)
    metrics = latest_metrics(config)
    assert {k: v for k, v in metrics.items() if k[0] == topic} == expected
    influx = influx_points(config, topic)
    for (_, window, status), count in expected.items():
        assert influx[window][0 if status == "valid" else 1] == count


def test_new_topic_is_picked_up_and_sigterm_stops_gracefully(spark, local_stack, stream_config) -> None:
    prefix, config = stream_config
    first = f"{prefix}-first"
    local_stack.kafka.create_topic(first, partitions=2)
    produce(config.kafka_bootstrap(), first, [(0, GOOD, W0), (1, GOOD, W0 + 1)])
    pid = start_stream(config)
    wait_for(lambda: window_counts(spark, config, first) == {(first, W0, "valid"): 2}, 180, "first topic counted")

    later = f"{prefix}-created-later"
    local_stack.kafka.create_topic(later, partitions=3)
    produce(config.kafka_bootstrap(), later, [(p, GOOD, W0 + 5000 + p) for p in range(3)] + [(0, b"x", W0 + 5001)])
    wait_for(
        lambda: window_counts(spark, config, later) == {(later, W0 + 5000, "valid"): 3, (later, W0 + 5000, "invalid"): 1},
        120,
        "topic created while running is counted",
    )
    status = subprocess.run(
        [".venv/bin/kdq", "status"], capture_output=True, text=True, env={"KDQ_CONFIG": config.source}, timeout=60
    )
    assert "stream" in status.stdout and "heartbeat" in status.stdout, status.stdout + status.stderr

    assert stop_stream(config, timeout=120)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    heartbeat = json.loads((config.data_dir / "stream" / "heartbeat.json").read_text())
    assert heartbeat["state"] == "stopped"
    assert "stopping after the current micro-batch" in stream_process(config).log_tail(400)



def test_the_python_driver_exits_when_its_jvm_is_killed_mid_batch(spark, local_stack, stream_config, tmp_path) -> None:
    """SIGKILL of the spark-submit JVM alone (an OOM kill) while the driver's Python runs a micro-batch
    (held there by the hang switch): the driver must exit too, not linger in its batch callback."""
    prefix, config = stream_config
    topic = f"{prefix}-jvm"
    local_stack.kafka.create_topic(topic, partitions=1)
    produce(config.kafka_bootstrap(), topic, [(0, GOOD, W0)])
    hang = {"KDQ_FAULT_HANG_SECONDS": "600", "KDQ_FAULT_BATCH": "0", "KDQ_FAULT_MARKER": str(tmp_path / "hung")}
    jvm = psutil.Process(start_stream(config, extra_env=hang))
    wait_for(lambda: (tmp_path / "hung").exists(), 180, "a micro-batch hanging in the driver's Python")
    drivers = [p for p in jvm.children(recursive=True) if "stream_counts.py" in process_cmdline(p)]
    assert len(drivers) == 1, [process_cmdline(p) for p in jvm.children(recursive=True)]
    jvm.kill()
    driver = drivers[0]

    def exited() -> bool:
        # The orphaned driver is re-parented to this machine's init, which reaps it when it gets to it: a zombie
        # has exited (its pid can outlive it for a while under load, which psutil.wait_procs counts as running).
        try:
            return driver.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + 30
    while not exited() and time.monotonic() < deadline:
        time.sleep(0.5)
    # (No log line to look for: under spark-submit the driver's output goes through the dead JVM.)
    assert exited(), f"the Python driver {driver.pid} still runs 30 s after its JVM was killed ({driver.status()})"
