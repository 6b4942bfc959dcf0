"""The speed layer's state folder, ``<data_dir>/stream/``: every file in it is named, read and written here.

Pure Python (no Spark import): the stream writes its heartbeat, progress and push state through these
helpers; the supervisor, the CLI, the batch jobs and the failing/hung-batch handling
(:mod:`kdq.stream.failures`) read them. Writes are atomic (temporary file + rename), so a reader never
sees half a file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from kdq.config import Config

HEARTBEAT = "heartbeat.json"  # the stream's liveness, written by its query listener
PROGRESS = "progress.json"  # the last micro-batch's progress
PROGRESS_LOG = "progress.jsonl"  # recent micro-batches, one JSON line each
INFLUX_PUSH_STATE = "influx_push_state.json"  # the earliest window InfluxDB may be missing (InfluxPushState)
CURRENT_BATCH = "current_batch.json"  # the micro-batch in flight (kdq.stream.failures: hung batches)
BATCH_FAILURE = "batch_failure.json"  # the micro-batch that keeps failing (kdq.stream.failures)
QUARANTINED_OFFSETS = "quarantined_offsets.json"  # the operator's quarantined offset ranges
STREAM_PID = "stream.pid"
STREAM_LOG = "stream.log"
SUPERVISOR_LOCK = "supervisor.lock"
SUPERVISOR_STATE = "supervisor_state.json"
DRIVER_REFUSED = "driver_refused.json"  # the last driver that refused to start (or stopped): another owned the lease
WRITERS_JOURNAL = "writers.jsonl"  # the batch jobs that wrote beside the stream, and their waits (kdq.writers_journal)


def state_dir(config: Any) -> Path:
    return config.data_dir / "stream"


def read_json(path: Path) -> Any:
    """A state file's content; None when it is missing or (mid-replacement by an old writer) unreadable."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def private_tmp(path: Path) -> Path:
    """A temporary name beside ``path`` that no other writer uses: other processes and other threads of this
    one (the stream's foreachBatch thread and its query listener both write current_batch.json)."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}-{threading.get_ident()}")


def atomic_write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = private_tmp(path)
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    os.replace(tmp, path)


class InfluxPushState:
    """Durable record of windows the stream (or a batch push) could not send to InfluxDB.

    ``pending_since_ms``: every window-count row updated at or after this time
    may be missing from InfluxDB; the batch layer's catch-up pushes them and
    clears it. ``open``: the failures not yet covered by a catch-up, as
    ``[recorded_ms, since_ms]`` pairs (at most :data:`MAX_OPEN` entries: the
    oldest are merged, conservatively), so a catch-up clears exactly the
    failures recorded before it started and keeps one recorded while it ran.

    The stream and the batch jobs update the file from different processes: every read-modify-write
    holds an exclusive ``fcntl`` lock on ``.influx_push_state.lock`` beside it.
    """

    MAX_OPEN = 64

    def __init__(self, config: Any) -> None:
        self.path = state_dir(config) / INFLUX_PUSH_STATE
        self.lock_path = self.path.with_name(f".{INFLUX_PUSH_STATE.removesuffix('.json')}.lock")

    def read(self) -> dict:
        return read_json(self.path) or {"pending_since_ms": None, "failures": 0}

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @staticmethod
    def _open(state: dict) -> list[list[int]]:
        entries = [[int(r), int(s)] for r, s in state.get("open") or []]
        pending = state.get("pending_since_ms")
        if pending is not None and not entries:  # a file written before ``open`` existed: recorded long ago
            entries = [[0, int(pending)]]
        return entries

    def record_failure(self, since_ms: int, error: str, now_ms: int | None = None) -> None:
        recorded = int(time.time() * 1000) if now_ms is None else int(now_ms)
        with self._locked():
            state = self.read()
            entries = self._open(state) + [[recorded, int(since_ms)]]
            entries.sort()
            while len(entries) > self.MAX_OPEN:  # keep the later recorded time and the earlier since
                (r1, s1), (r2, s2) = entries[0], entries[1]
                entries[:2] = [[max(r1, r2), min(s1, s2)]]
            state["open"] = entries
            state["pending_since_ms"] = min(s for _, s in entries)
            state["failures"] = int(state.get("failures", 0)) + 1
            state["last_error"] = error
            atomic_write_json(self.path, state)

    def clear(self, up_to_ms: int, covered_from_ms: int | None = None) -> bool:
        """After a catch-up that started at ``up_to_ms`` and pushed every row updated at or after
        ``covered_from_ms`` (None: every row): forget the failures it covered, those recorded before it
        started (and, with ``covered_from_ms``, pending from then on). Returns whether nothing stays pending."""
        with self._locked():
            state = self.read()
            kept = [
                [r, s] for r, s in self._open(state)
                if r >= up_to_ms or (covered_from_ms is not None and s < covered_from_ms)
            ]
            state["open"] = kept
            state["pending_since_ms"] = min(s for _, s in kept) if kept else None
            state["last_catch_up_ms"] = up_to_ms
            atomic_write_json(self.path, state)
            return not kept


def stream_status(config: Config) -> dict:
    """Every state file's content (None when missing)."""
    folder = state_dir(config)
    return {
        "heartbeat": read_json(folder / HEARTBEAT),
        "progress": read_json(folder / PROGRESS),
        "influx_push": read_json(folder / INFLUX_PUSH_STATE) or {"pending_since_ms": None},
        "current_batch": read_json(folder / CURRENT_BATCH),
        "batch_failure": read_json(folder / BATCH_FAILURE),
    }


def heartbeat_age_seconds(config: Config, pids: Collection[int] | None = None) -> float | None:
    """Seconds since the stream's last "running" heartbeat (None: none). With ``pids`` (the running job's
    process and its children), a heartbeat another process wrote does not count: right after a restart the
    file still holds the dead job's recent beat, which says nothing about the new one."""
    beat = stream_status(config)["heartbeat"]
    if not beat or beat.get("state") != "running":
        return None
    if pids is not None and beat.get("pid") not in pids:
        return None
    return max(0.0, time.time() - beat["time_ms"] / 1000)


def last_batch_id(config: Config) -> int | None:
    """The id of the stream's last completed micro-batch (its progress file), None before the first."""
    progress = stream_status(config)["progress"]
    return int(progress["batch_id"]) if progress and progress.get("batch_id") is not None else None


def starting_beat(config: Config, pids: Collection[int]) -> dict | None:
    """The "starting" heartbeat of one of ``pids`` (the running job's processes), with its ``age`` and the
    driver's ``startup_seconds`` so far; None when the beat is not a starting one of those processes."""
    beat = stream_status(config)["heartbeat"]
    if not beat or beat.get("state") != "starting" or beat.get("pid") not in pids:
        return None
    now = time.time()
    return {
        **beat,
        "age": max(0.0, now - beat["time_ms"] / 1000),
        "startup_seconds": max(0.0, now - int(beat.get("started_ms") or beat["time_ms"]) / 1000),
    }


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    return True


class StartingBeat:
    """The driver's heartbeat with state ``starting`` from its first Python line until its query runs: written
    at once and then every ``interval`` seconds from a daemon thread, so the supervisor can tell a long start-up
    (rules compile, the lost-checkpoint scan, a large first plan) from a hang. :meth:`phase` names the step.

    Until :meth:`own` (the driver holds the checkpoint's lease, ``kdq.driver_lease``) it does not overwrite a
    fresh beat of another live process: a second driver started beside a running one (and refused) must not
    make the running one look silent to the supervisor. :meth:`stop` ends it before the query's own
    "running" beats take over; no beat is written after it returns."""

    def __init__(self, config: Any, interval: float = 5.0) -> None:
        self.path = state_dir(config) / HEARTBEAT
        self.interval = interval
        self.started_ms = int(time.time() * 1000)
        self.current_phase = "boot"
        self.owned = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> StartingBeat:
        self._write()
        self._thread = threading.Thread(target=self._run, name="kdq-starting-beat", daemon=True)
        self._thread.start()
        return self

    def phase(self, name: str) -> None:
        self.current_phase = name
        self._write()

    def own(self) -> None:
        self.owned = True
        self._write()

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._write()

    def _write(self) -> bool:
        with self._lock:
            if self._stop.is_set() or (not self.owned and self._defer()):
                return False
            try:
                atomic_write_json(
                    self.path,
                    {"state": "starting", "pid": os.getpid(), "time_ms": int(time.time() * 1000),
                     "started_ms": self.started_ms, "phase": self.current_phase},
                )
            except OSError:  # a full disk must not kill the start-up; the supervisor sees no beat
                return False
            return True

    def _defer(self) -> bool:
        beat = read_json(self.path) or {}
        pid = int(beat.get("pid") or 0)
        fresh = int(beat.get("time_ms") or 0) >= time.time() * 1000 - 60_000
        return (
            beat.get("state") in ("running", "starting") and fresh and pid not in (0, os.getpid()) and pid_alive(pid)
        )


def record_refusal(config: Any, message: str, owner: dict | None, kind: str = "refused") -> None:
    """A driver did not start (``refused``) or stopped itself (``fenced``) because another driver holds the
    checkpoint's lease: the supervisor reads it (:func:`read_refusal`) and counts no crash."""
    atomic_write_json(
        state_dir(config) / DRIVER_REFUSED,
        {"kind": kind, "time_ms": int(time.time() * 1000), "pid": os.getpid(), "message": message, "owner": owner},
    )


def read_refusal(config: Any) -> dict | None:
    return read_json(state_dir(config) / DRIVER_REFUSED)
