"""Without Airflow or Spark: failing and hung micro-batches as the supervisor check sees them
(``ensure_stream_running`` with the stream's process start/stop replaced), the failure record, and the
quarantine list (kdq.stream.failures)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

PLUGINS_FOLDER = Path(__file__).resolve().parents[2] / "plugins"
if str(PLUGINS_FOLDER) not in sys.path:
    sys.path.insert(0, str(PLUGINS_FOLDER))

from airflow.sdk.exceptions import AirflowException  # noqa: E402

from kdq.stream import failures  # noqa: E402
from kdq_airflow.stream import ensure_stream_running  # noqa: E402
from tests.conftest import make_config  # noqa: E402

OFFSETS_HEADER = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n'


def write_offset_log(checkpoint: Path, batch_id: int, offsets: dict, committed: bool = False) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(batch_id)).write_text(OFFSETS_HEADER + json.dumps(offsets) + "\n")
    if committed:
        (checkpoint / "commits" / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


@pytest.fixture
def config(tmp_path: Path):
    config = make_config(tmp_path / "data", stream={"max_batch_failures": 2, "max_batch_seconds": 30})
    checkpoint = Path(failures.checkpoint_of(config))
    write_offset_log(checkpoint, 6, {"a": {"0": 10, "1": 20}, "b": {"0": 5}}, committed=True)
    write_offset_log(checkpoint, 7, {"a": {"0": 15, "1": 20}, "b": {"0": 9}})
    return config


class FakeStream:
    """Replaces kdq.spark.stream_process's start/stop/process for the supervisor: a 'process' that runs or not."""

    def __init__(self, monkeypatch, config) -> None:
        import kdq.spark.stream_process as sp

        self.config = config
        self.alive = False
        self.starts: list[dict | None] = []
        self.stops: list[float] = []
        monkeypatch.setattr(sp, "start_stream", self.start)
        monkeypatch.setattr(sp, "stop_stream", self.stop)
        monkeypatch.setattr(sp, "stream_process", lambda cfg: self)

    def start(self, config, job_args=None, extra_env=None) -> int:
        self.alive = True
        self.starts.append(extra_env)
        return 4242

    def stop(self, config, timeout: float = 150.0) -> bool:
        self.stops.append(timeout)
        was, self.alive = self.alive, False
        return was

    def running(self) -> bool:
        return self.alive

    def pids(self) -> set[int]:
        """The job's processes: this test process stands for the running job (see ``beat``)."""
        return {os.getpid()} if self.alive else set()

    def log_tail(self, lines: int = 30) -> str:
        return "(log tail)"

    def beat(self, **extra) -> None:
        """A fresh heartbeat of this (live) test process, as the running job writes it."""
        folder = failures.state_dir(self.config)
        folder.mkdir(parents=True, exist_ok=True)
        beat = {"state": "running", "pid": os.getpid(), "time_ms": int(time.time() * 1000), **extra}
        (folder / "heartbeat.json").write_text(json.dumps(beat))


def test_pending_batch_and_its_offset_ranges(config) -> None:
    checkpoint = Path(failures.checkpoint_of(config))
    assert failures.pending_batch(checkpoint) == 7
    assert failures.offset_ranges(checkpoint, 7) == [
        {"topic": "a", "partition": 0, "from": 10, "to": 14, "from_earliest": False},
        {"topic": "b", "partition": 0, "from": 5, "to": 8, "from_earliest": False},
    ]
    write_offset_log(checkpoint, 7, {"a": {"0": 15, "1": 20}, "b": {"0": 9}}, committed=True)
    assert failures.pending_batch(checkpoint) is None


def test_failed_batch_blocks_the_supervisor_after_max_failures_with_offsets_and_the_way_out(
    config, monkeypatch
) -> None:
    fake = FakeStream(monkeypatch, config)
    error = "py4j.protocol.Py4JJavaError: boom\n\tat org.x.Y(Y.java:1)\nRuntimeError: classifier bug on a record"
    assert ensure_stream_running(config) == "restarted"  # never ran: started
    fake.alive = False
    failures.record_failure(config, 7, error)  # what the job does when its query dies
    assert ensure_stream_running(config) == "restarted"  # attempt 1 of 2: restarted
    fake.alive = False
    assert failures.record_failure(config, 7, error)["attempts"] == 2
    with pytest.raises(AirflowException) as failed:
        ensure_stream_running(config)
    message = str(failed.value)
    assert "micro-batch 7 failed 2 times in a row" in message
    assert "RuntimeError: classifier bug on a record" in message and "Y.java" not in message
    assert "a partition 0: offsets 10..14" in message and "b partition 0: offsets 5..8" in message
    assert "kdq quarantine-offsets" in message and "kdq quarantine-batch 7" in message
    assert len(fake.starts) == 2, "no restart once blocked"
    with pytest.raises(AirflowException):  # stays blocked
        ensure_stream_running(config)

    # The operator quarantines the offending record: the supervisor restarts the stream.
    added = failures.add_quarantine(config, [{"topic": "b", "partition": 0, "from": 6, "to": 6}], "bug #1")
    assert [(e["id"], e["from_offset"], e["to_offset"]) for e in added] == [(1, 6, 6)]
    assert ensure_stream_running(config) == "restarted"
    fake.alive = False
    # A failure after the quarantine counts from 1 again.
    assert failures.record_failure(config, 7, error)["attempts"] == 1
    # The batch commits: its failure record goes away.
    failures.batch_finished(config, 7)
    assert failures.read_failure(config) is None


def test_stream_failure_clear_lets_the_supervisor_retry(config, monkeypatch) -> None:
    fake = FakeStream(monkeypatch, config)
    for _ in range(2):
        failures.record_failure(config, 7, "Error: x")
    with pytest.raises(AirflowException):
        ensure_stream_running(config)
    failures.clear_failure(config)
    assert ensure_stream_running(config) == "restarted"
    assert fake.alive


def test_hung_batch_is_reported_recorded_and_the_stream_restarted(config, monkeypatch) -> None:
    fake = FakeStream(monkeypatch, config)
    assert ensure_stream_running(config) == "restarted"
    fake.beat()
    time.sleep(0.01)
    failures.batch_started(config, 7)  # by this (live) process
    assert ensure_stream_running(config) == "healthy"
    assert failures.hung_batch(config, 30) is None

    # 31 seconds later the heartbeat still ticks, but the batch has not finished.
    current = failures.state_dir(config) / failures.CURRENT_BATCH
    state = json.loads(current.read_text())
    current.write_text(json.dumps({**state, "started_ms": state["started_ms"] - 31_000}))
    fake.beat()
    hung = failures.hung_batch(config, 30)
    assert hung is not None and hung["batch_id"] == 7 and hung["seconds"] > 30
    assert ensure_stream_running(config, hung_stop_grace_seconds=5) == "restarted_hung"
    assert fake.stops == [5] and len(fake.starts) == 2 and fake.alive
    failure = failures.read_failure(config)
    assert failure["kind"] == "hung" and failure["attempts"] == 1 and "HUNG: micro-batch 7" in failure["error"]
    # The record of the killed batch does not make the restarted process look hung.
    fake.beat()
    assert ensure_stream_running(config) == "healthy"


def test_a_batch_record_of_a_dead_process_is_not_hung(config, tmp_path) -> None:
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    path = failures.state_dir(config) / failures.CURRENT_BATCH
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"batch_id": 3, "state": "running", "started_ms": 1, "pid": proc.pid}))
    assert failures.hung_batch(config, 30) is None


def test_a_trigger_stuck_before_its_batch_counts_as_hung(config, monkeypatch) -> None:
    fake = FakeStream(monkeypatch, config)
    fake.alive = True
    fake.beat(trigger_active=True, trigger_active_since_ms=int(time.time() * 1000) - 40_000)
    hung = failures.hung_batch(config, 30)
    assert hung is not None and hung["source"] == "trigger" and hung["batch_id"] == 7


def test_hanging_max_failures_times_fails_the_task_instead_of_restarting(config, monkeypatch) -> None:
    fake = FakeStream(monkeypatch, config)
    fake.alive = True
    failures.record_failure(config, 7, "HUNG: earlier", kind="hung")
    fake.beat()
    failures.batch_started(config, 7)
    current = failures.state_dir(config) / failures.CURRENT_BATCH
    state = json.loads(current.read_text())
    # attempt 2 of batch 7 may run 2 x 30 s (failures.hung_limit): 65 s is past it
    current.write_text(json.dumps({**state, "started_ms": state["started_ms"] - 65_000}))
    with pytest.raises(AirflowException, match="micro-batch 7 hung"):
        ensure_stream_running(config)
    assert not fake.alive and fake.starts == []


def test_quarantine_list_and_overlap(config) -> None:
    with pytest.raises(ValueError, match="reason"):
        failures.add_quarantine(config, [{"topic": "a", "partition": 0, "from": 1, "to": 2}], " ")
    with pytest.raises(ValueError, match="from <= to"):
        failures.add_quarantine(config, [{"topic": "a", "partition": 0, "from": 3, "to": 2}], "x")
    assert not failures.quarantine_in_use(config)
    failures.add_quarantine(config, [{"topic": "a", "partition": 0, "from": 100, "to": 200}], "x")
    failures.add_quarantine(config, [{"topic": "b", "partition": 0, "from": 8, "to": 8}], "y")
    entries = failures.read_quarantine(config)
    assert [e["id"] for e in entries] == [1, 2]
    ranges = failures.offset_ranges(failures.checkpoint_of(config), 7)
    assert [e["id"] for e in failures.overlapping(entries, ranges)] == [2]


def test_error_summary_keeps_the_lines_that_say_what_failed() -> None:
    text = (
        "[STREAM_FAILED] Query [id = 1] terminated with exception: An exception was raised by the Python Proxy.\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n'
        "    raise ValueError('bad')\n"
        "org.apache.spark.SparkRuntimeException: KDQ_FAULT_FAIL_VALUE: cannot process record t partition 0 offset 3\n"
        "\tat org.apache.spark.Foo(Foo.scala:1)\n"
        "ValueError: bad\n"
    )
    summary = failures.error_summary(text)
    assert summary.splitlines()[0].startswith("[STREAM_FAILED]")
    assert "offset 3" in summary and "ValueError: bad" in summary and "Foo.scala" not in summary


def progress(config, batch_id: int) -> None:
    """The stream's progress file after micro-batch ``batch_id`` completed."""
    folder = failures.state_dir(config)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "progress.json").write_text(json.dumps({"batch_id": batch_id}))


def test_a_heartbeat_left_by_a_killed_job_does_not_make_its_successor_healthy(config, monkeypatch) -> None:
    stream = FakeStream(monkeypatch, config)
    stream.alive = True
    folder = failures.state_dir(config)
    folder.mkdir(parents=True, exist_ok=True)
    # A fresh "running" beat, but written by a pid that is not the running job nor one of its children.
    dead = {"state": "running", "pid": 2**22 + 17, "time_ms": int(time.time() * 1000)}
    (folder / "heartbeat.json").write_text(json.dumps(dead))
    (folder / "supervisor_state.json").write_text(json.dumps({"restarts": 1, "last_restart": time.time() - 5}))
    assert ensure_stream_running(config, startup_grace_seconds=60) == "starting"
    assert json.loads((folder / "supervisor_state.json").read_text())["restarts"] == 1  # not reset as healthy
    stream.beat()
    assert ensure_stream_running(config, startup_grace_seconds=60) == "healthy"
    assert json.loads((folder / "supervisor_state.json").read_text())["restarts"] == 0


def test_restarts_of_a_stream_that_completes_batches_in_between_are_not_a_crash_loop(config, monkeypatch) -> None:
    stream = FakeStream(monkeypatch, config)
    folder = failures.state_dir(config)
    state = folder / "supervisor_state.json"
    # Killed again and again, never seen healthy by a check, but every run completed batches.
    for batch in range(10, 16):
        progress(config, batch)
        stream.alive = False
        assert ensure_stream_running(config, max_restarts=2, backoff_seconds=600) == "restarted"
        assert json.loads(state.read_text())["restarts"] == 1
        assert json.loads(state.read_text())["batch_at_restart"] == batch
    assert len(stream.starts) == 6
    # The same killed runs without a completed batch in between are a crash loop: the task fails and backs off.
    stream.alive = False
    assert ensure_stream_running(config, max_restarts=2, backoff_seconds=600) == "restarted"  # 2nd in a row
    stream.alive = False
    with pytest.raises(AirflowException, match="consecutive restarts"):
        ensure_stream_running(config, max_restarts=2, backoff_seconds=600)
    assert len(stream.starts) == 7
