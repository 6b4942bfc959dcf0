"""The stream supervisor under long faults, without Airflow or Spark: a capped backoff, a
start-up longer than the start grace, transient failures that never block, a hung-batch limit that grows per
attempt, and an OS lock that dies with its holder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PLUGINS_FOLDER = Path(__file__).resolve().parents[2] / "plugins"
if str(PLUGINS_FOLDER) not in sys.path:
    sys.path.insert(0, str(PLUGINS_FOLDER))

from airflow.sdk.exceptions import AirflowException  # noqa: E402

from kdq.stream import failures as batch_failures  # noqa: E402
from kdq.supervisor import LockHeld, supervisor_lock  # noqa: E402
from kdq_airflow.stream import ensure_stream_running  # noqa: E402
from tests.conftest import make_config  # noqa: E402
from tests.dags.test_stream_supervisor_batches import FakeStream, write_offset_log  # noqa: E402


@pytest.fixture
def config(tmp_path: Path):
    config = make_config(tmp_path / "data", stream={"max_batch_failures": 2, "max_batch_seconds": 30})
    checkpoint = Path(batch_failures.checkpoint_of(config))
    write_offset_log(checkpoint, 6, {"a": {"0": 10}}, committed=True)
    write_offset_log(checkpoint, 7, {"a": {"0": 15}})
    return config


def _state(config) -> Path:
    folder = batch_failures.state_dir(config)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "supervisor_state.json"


# -- (a) the backoff is capped ---------------------------------------------------------------------------


def test_backoff_after_a_long_outage_is_capped(config, monkeypatch) -> None:
    stream = FakeStream(monkeypatch, config)
    assert config.stream.supervisor_max_backoff_seconds == 600
    # Ten failed restarts in a row (a multi-hour Kafka outage): uncapped, the next attempt would be
    # 120 * 2^7 s = 4 h 16 min after the last one.
    _state(config).write_text(json.dumps({"restarts": 10, "last_restart": time.time() - 500}))
    with pytest.raises(AirflowException, match=r"next attempt in 1\d\ds"):
        ensure_stream_running(config, max_restarts=3, backoff_seconds=120)
    assert stream.starts == []
    _state(config).write_text(json.dumps({"restarts": 10, "last_restart": time.time() - 601}))
    with pytest.raises(AirflowException, match="restarted 11 times in a row"):
        ensure_stream_running(config, max_restarts=3, backoff_seconds=120)
    assert len(stream.starts) == 1, "restarted once the capped backoff had passed"


def test_the_backoff_cap_is_a_config_key(tmp_path: Path, monkeypatch) -> None:
    config = make_config(tmp_path / "data", stream={"supervisor_max_backoff_seconds": 60})
    stream = FakeStream(monkeypatch, config)
    _state(config).write_text(json.dumps({"restarts": 10, "last_restart": time.time() - 61}))
    with pytest.raises(AirflowException, match="restarted 11 times"):
        ensure_stream_running(config, max_restarts=3, backoff_seconds=120)
    assert len(stream.starts) == 1


# -- (b) a long start-up beats "starting" ----------------------------------------------------------------


def test_a_fresh_starting_beat_of_the_running_job_is_not_killed_after_the_grace(config, monkeypatch) -> None:
    stream = FakeStream(monkeypatch, config)
    stream.alive = True
    # Started 400 s ago (past the 180 s grace), still in its start-up (a long lost-checkpoint scan), beating.
    _state(config).write_text(json.dumps({"restarts": 1, "last_restart": time.time() - 400}))
    now = int(time.time() * 1000)
    stream.beat(state="starting", started_ms=now - 395_000, phase="lost_checkpoint")
    assert ensure_stream_running(config) == "starting"
    assert stream.stops == [] and stream.starts == []
    assert json.loads(_state(config).read_text())["restarts"] == 1, "not healthy yet"


def test_a_stale_starting_beat_is_restarted(config, monkeypatch) -> None:
    stream = FakeStream(monkeypatch, config)
    stream.alive = True
    _state(config).write_text(json.dumps({"restarts": 0, "last_restart": time.time() - 400}))
    now = int(time.time() * 1000)
    stream.beat(state="starting", started_ms=now - 395_000, phase="rules")
    beat = batch_failures.state_dir(config) / "heartbeat.json"
    stale = {**json.loads(beat.read_text()), "time_ms": now - 300_000}  # its beating thread is gone
    beat.write_text(json.dumps(stale))
    assert ensure_stream_running(config) == "restarted"
    assert len(stream.stops) == 1 and len(stream.starts) == 1


def test_a_start_up_past_max_startup_seconds_is_restarted(tmp_path: Path, monkeypatch) -> None:
    config = make_config(tmp_path / "data", stream={"max_startup_seconds": 600})
    stream = FakeStream(monkeypatch, config)
    stream.alive = True
    _state(config).write_text(json.dumps({"restarts": 0, "last_restart": time.time() - 700}))
    stream.beat(state="starting", started_ms=int(time.time() * 1000) - 650_000, phase="lost_checkpoint")
    assert ensure_stream_running(config) == "restarted"
    assert len(stream.stops) == 1


# -- (c) transient failures never block; the hung limit grows --------------------------------------------


def test_transient_failures_are_recorded_but_never_block(config, monkeypatch) -> None:
    stream = FakeStream(monkeypatch, config)
    error = "java.io.IOException: No space left on device\n\tat java.base/java.io.FileOutputStream.writeBytes"
    for attempt in range(1, 6):  # max_batch_failures = 2
        failure = batch_failures.record_failure(config, 7, error)
        assert failure["kind"] == "transient" and failure["transient_attempts"] == attempt
        assert batch_failures.blocked(config, 2) is None
        stream.alive = False
        assert ensure_stream_running(config, max_restarts=100) == "restarted"
    from kdq.spark.stream_process import describe_stream

    monkeypatch.setattr("kdq.spark.stream_process.stream_process", lambda cfg: stream)
    stream.beat()
    status = "\n".join(describe_stream(config))
    assert "batch 7 failed transiently 5x" in status and "never blocks" in status, status
    # A deterministic failure of the same batch still counts toward the limit.
    batch_failures.record_failure(config, 7, "KDQ_FAULT_FAIL_VALUE: cannot process record t partition 0 offset 3")
    batch_failures.record_failure(config, 7, "KDQ_FAULT_FAIL_VALUE: cannot process record t partition 0 offset 3")
    stream.alive = False
    with pytest.raises(AirflowException, match="failed 2 times in a row"):
        ensure_stream_running(config)


def test_the_hung_limit_doubles_per_attempt_of_the_same_batch(config, monkeypatch) -> None:
    stream = FakeStream(monkeypatch, config)
    stream.alive = True
    # Attempt 2 of batch 7 (attempt 1 hung past 30 s): its limit is 60 s.
    batch_failures.record_failure(config, 7, "HUNG: ...", kind="hung")
    assert batch_failures.hung_limit(config, 7, 30) == 60
    assert batch_failures.hung_limit(config, 8, 30) == 30, "another batch starts at the configured limit"
    folder = batch_failures.state_dir(config)
    now = int(time.time() * 1000)
    (folder / "current_batch.json").write_text(
        json.dumps({"batch_id": 7, "state": "running", "started_ms": now - 45_000, "pid": os.getpid()})
    )
    stream.beat()
    _state(config).write_text(json.dumps({"restarts": 1, "last_restart": time.time() - 50}))
    assert ensure_stream_running(config) == "healthy", "45 s: slow, but under attempt 2's 60 s"
    (folder / "current_batch.json").write_text(
        json.dumps({"batch_id": 7, "state": "running", "started_ms": now - 65_000, "pid": os.getpid()})
    )
    _state(config).write_text(json.dumps({"restarts": 1, "last_restart": time.time() - 70}))
    with pytest.raises(AirflowException, match="hung"):  # attempt 2 of 2 hung: blocked
        ensure_stream_running(config, hung_stop_grace_seconds=1)


# -- (d) the supervisor lock is an OS lock ---------------------------------------------------------------

HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, str(os.getpid()).encode())
print("locked", flush=True)
time.sleep(600)
"""


def test_a_lock_held_by_a_live_process_is_refused_and_freed_when_it_dies(tmp_path: Path) -> None:
    lock = tmp_path / "stream" / "supervisor.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LockHeld, match=str(holder.pid)):
            with supervisor_lock(lock):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)  # dies without cleaning up: the kernel releases the lock
        holder.wait()
    with supervisor_lock(lock):
        pass


def test_a_lock_file_naming_a_live_pid_but_unlocked_is_taken(tmp_path: Path) -> None:
    """pid reuse: the file names a pid that is alive (here: this test's parent), but nobody holds the lock."""
    lock = tmp_path / "supervisor.lock"
    lock.write_text(str(os.getppid()))
    with supervisor_lock(lock):
        pass


# -- another driver owns the checkpoint ------------------------------------------------------------------


def test_a_live_lease_of_another_driver_is_owned_elsewhere_not_a_crash(config, monkeypatch) -> None:
    from kdq.driver_lease import DriverLease
    from kdq.storage import LOCAL_FILES

    stream = FakeStream(monkeypatch, config)
    _state(config).write_text(json.dumps({"restarts": 3, "last_restart": time.time() - 10_000}))
    other = DriverLease(LOCAL_FILES, batch_failures.checkpoint_of(config),
                        host={"host": "other-host", "boot_id": "b"}, pid=4321)
    other.acquire()  # a `kdq stream` on another host
    for _ in range(5):
        assert ensure_stream_running(config, max_restarts=3) == "owned_elsewhere"
    assert stream.starts == [], "nothing started beside it"
    state = json.loads(_state(config).read_text())
    assert state["restarts"] == 0 and "pid 4321 on host other-host" in state["owned_elsewhere"]
    other.release()
    # Readable here, the lease decides: a refusal recorded earlier does not hold the start back.
    from kdq.stream.state import record_refusal

    record_refusal(config, "refused: pid 4321 on host other-host", {"pid": 4321})
    assert ensure_stream_running(config) == "restarted"


def test_a_refused_driver_is_owned_elsewhere_for_a_backoff_then_tried_again(config, monkeypatch) -> None:
    """A remote checkpoint: the supervisor cannot read the lease, the refused driver's record tells it."""
    from kdq import driver_lease
    from kdq.storage import RemoteStorageUnavailable
    from kdq.stream.state import record_refusal

    def unreadable(cfg, now_ms=None):
        raise RemoteStorageUnavailable("s3a://b/kdq/checkpoints/speed_layer: no Spark session here")

    monkeypatch.setattr(driver_lease, "checkpoint_owner", unreadable)
    stream = FakeStream(monkeypatch, config)
    assert ensure_stream_running(config) == "restarted"
    stream.alive = False  # the driver refused and exited
    record_refusal(config, "another driver holds the checkpoint s3a://b/kdq/checkpoints/speed_layer: pid 9 on "
                   "host h", {"pid": 9})
    assert ensure_stream_running(config, backoff_seconds=120) == "owned_elsewhere"
    assert len(stream.starts) == 1
    assert json.loads(_state(config).read_text())["restarts"] == 0
    refusal = batch_failures.state_dir(config) / "driver_refused.json"
    aged = {**json.loads(refusal.read_text()), "time_ms": int(time.time() * 1000) - 121_000}
    refusal.write_text(json.dumps(aged))
    state = {**json.loads(_state(config).read_text()), "last_restart": time.time() - 130}
    _state(config).write_text(json.dumps(state))
    assert ensure_stream_running(config, backoff_seconds=120) == "restarted", "the owner may be gone: try again"


def test_the_starting_beat_defers_to_a_live_driver_until_it_owns_the_lease(config) -> None:
    from kdq.stream.state import StartingBeat

    beat_file = batch_failures.state_dir(config) / "heartbeat.json"
    beat_file.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        running = {"state": "running", "pid": holder.pid, "time_ms": int(time.time() * 1000)}
        beat_file.write_text(json.dumps(running))
        starting = StartingBeat(config, interval=0.05).start()
        time.sleep(0.3)
        assert json.loads(beat_file.read_text()) == running, "a second driver does not hide the running one"
        starting.own()  # it holds the lease now: the other is gone
        assert json.loads(beat_file.read_text())["state"] == "starting"
        starting.phase("rules")
        time.sleep(0.2)
        latest = json.loads(beat_file.read_text())
        assert latest["phase"] == "rules" and latest["pid"] == os.getpid()
        assert time.time() * 1000 - latest["time_ms"] < 1000, "beats keep coming"
        starting.stop()
        beat_file.write_text(json.dumps(running))
        time.sleep(0.2)
        assert json.loads(beat_file.read_text()) == running, "no beat after stop()"
    finally:
        holder.kill()
        holder.wait()
