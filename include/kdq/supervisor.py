"""Keep the speed layer running: one supervisor check that (re)starts it detached.

The Airflow operator (``kdq_airflow.stream``) only calls :func:`ensure_stream_running`; nothing here imports
Airflow, so the CLI and the tests run the same check.

The stream runs detached (``kdq.spark.stream_process.start_stream``) so no worker slot is held for its
lifetime; the supervisor task only looks at its heartbeat and process. Two safeguards live next to the
heartbeat in ``<data_dir>/stream/``: ``supervisor.lock`` (an OS lock, ``flock``, held while a check runs
and released by the kernel when its holder exits or dies, so a crashed supervisor never blocks the next
one, a reused pid never looks like a live holder, and two live ones never start two streams; the file
names the holder's pid for humans only) and ``supervisor_state.json`` (consecutive restarts without a
healthy check in between; past ``max_restarts`` the task fails visibly and restarts are spaced out,
``backoff_seconds * 2^(n - max_restarts)`` capped at ``stream.supervisor_max_backoff_seconds``).

Start-up: the driver beats ``starting`` from its first Python line until its query runs (rules compile,
the lost-checkpoint scan, the first batch's plan can take minutes); a fresh ``starting`` beat of the
running process is left alone for up to ``stream.max_startup_seconds``. ``startup_grace_seconds`` only
covers the JVM's boot before that first beat.

One driver per checkpoint (``kdq.driver_lease``): a driver refuses to start while another holds the
checkpoint's lease (another host, an operator's foreground run). The supervisor reads the lease before a
start when the checkpoint is local, and otherwise learns it from the refused driver's record; either way
it returns ``owned_elsewhere`` without counting a restart, and tries again after ``backoff_seconds``.

Health is judged by batch progress, not by the heartbeat alone (``kdq.stream.failures``):

* a micro-batch running longer than ``stream.max_batch_seconds`` is **hung**: the check logs it, records it
  as a failed attempt of that batch, stops the stream (SIGTERM, SIGKILL after
  ``stream.hung_stop_grace_seconds``) and starts it again;
* a micro-batch that failed (or hung) ``stream.max_batch_failures`` times in a row is not restarted again:
  the task fails with the error, the batch's offset ranges and the commands out (``kdq quarantine-offsets``,
  ``kdq quarantine-batch``, ``kdq stream-failure --clear``) instead of a restart loop that silently blocks
  every topic. Adding a quarantine entry unblocks it;
* a transient failure (disk full, a storage, S3, DynamoDB or Kafka outage: ``batch_failures.classify_failure``)
  is recorded but never blocks: the stream is restarted with the capped backoff until the outage ends;
* attempt N of a batch may run ``max_batch_seconds * 2^(N-1)`` before it counts as hung
  (``batch_failures.hung_limit``): a slow flush gets more time on every retry.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from kdq.config import Config
from kdq.stream.state import SUPERVISOR_LOCK as LOCK_NAME
from kdq.stream.state import SUPERVISOR_STATE as STATE_NAME


class Log(Protocol):
    """What the check logs through: a ``logging.Logger``, an Airflow task's ``self.log``."""

    def info(self, msg: str, *args: Any) -> Any: ...

    def warning(self, msg: str, *args: Any) -> Any: ...

    def error(self, msg: str, *args: Any) -> Any: ...


class StreamDown(RuntimeError):
    """The speed layer is down and the check will not (or no longer) restart it: a crash loop past
    ``max_restarts``, or one micro-batch that failed ``max_batch_failures`` times. The message says why and what to
    do; the Airflow operator fails its task with it."""


class LockHeld(RuntimeError):
    """Another live supervisor holds the lock."""


@contextlib.contextmanager
def supervisor_lock(path: Path) -> Iterator[None]:
    """An exclusive OS lock (``flock``) on ``path``, or :class:`LockHeld` at once. The kernel releases it when
    the holder exits or dies, so a dead supervisor never blocks the next one, whatever became of its pid (a pid
    in the file said "alive" for as long as any process reused it). The file stays (unlinking a flock file
    lets a third process lock a new inode while the second still holds the old one); it names the holder's
    pid, for the message only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise LockHeld(f"{path} is held by pid {holder}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def read_state(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {"restarts": 0, "last_restart": None}


def write_state(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


def ensure_stream_running(
    config: Config,
    stale_after_seconds: float = 120.0,
    startup_grace_seconds: float = 180.0,
    max_restarts: int = 3,
    backoff_seconds: float = 120.0,
    log: Log | None = None,
    max_batch_failures: int | None = None,
    max_batch_seconds: float | None = None,
    hung_stop_grace_seconds: float | None = None,
    extra_env: dict[str, str] | None = None,
    max_backoff_seconds: float | None = None,
    max_startup_seconds: float | None = None,
) -> str:
    """One supervisor check; returns ``healthy``, ``starting``, ``restarted``, ``restarted_hung``, ``locked`` or
    ``owned_elsewhere`` (another driver holds the checkpoint's lease: nothing started, no restart counted).

    Raises :class:`StreamDown` (after restarting, unless backing off) once ``max_restarts`` consecutive
    restarts did not bring a healthy heartbeat: the crash loop shows as a failed task. Raises it without
    restarting when one micro-batch failed ``max_batch_failures`` times in a row (see the module doc).
    The batch limits, the backoff cap and the start-up limit default to the config's ``stream.*`` keys;
    ``extra_env`` goes to the started job.
    """
    from kdq.spark.stream_process import start_stream, stop_stream, stream_process
    from kdq.stream import failures as batch_failures
    from kdq.stream.state import heartbeat_age_seconds, last_batch_id, starting_beat, state_dir

    stream = config.stream
    max_batch_failures = stream.max_batch_failures if max_batch_failures is None else max_batch_failures
    max_batch_seconds = stream.max_batch_seconds if max_batch_seconds is None else max_batch_seconds
    grace = stream.hung_stop_grace_seconds if hung_stop_grace_seconds is None else hung_stop_grace_seconds
    max_backoff = stream.supervisor_max_backoff_seconds if max_backoff_seconds is None else max_backoff_seconds
    max_startup = stream.max_startup_seconds if max_startup_seconds is None else max_startup_seconds

    folder = state_dir(config)
    state_file = folder / STATE_NAME
    try:
        with supervisor_lock(folder / LOCK_NAME):
            process = stream_process(config)
            running = process.running()
            pids = process.pids() if running else set()
            # Only the running job's own heartbeat counts (not the beat a killed job left behind).
            age = heartbeat_age_seconds(config, pids)
            state = read_state(state_file)
            not_before_ms = int((state.get("last_restart") or 0) * 1000)
            hung = (
                batch_failures.hung_batch(config, max_batch_seconds, not_before_ms=not_before_ms) if running else None
            )
            if running and hung is None and age is not None and age <= stale_after_seconds:
                if state.get("restarts"):
                    write_state(state_file, {"restarts": 0, "last_restart": None})
                return "healthy"
            if hung is not None:
                return _restart_hung(
                    config, hung, max_batch_seconds, max_batch_failures, grace, state, state_file, extra_env, log
                )
            # The driver beats "starting" from its first line until its query runs: a long start-up (the
            # lost-checkpoint scan, the rules compile, the first plan) is no hang, up to max_startup_seconds.
            beat = starting_beat(config, pids) if running else None
            if beat is not None and beat["age"] <= stale_after_seconds:
                if beat["startup_seconds"] <= max_startup:
                    return "starting"
                if log is not None:
                    log.error(
                        "speed layer still starting after %.0fs (phase %s), longer than stream.max_startup_seconds "
                        "= %.0f: restarting it", beat["startup_seconds"], beat.get("phase"), max_startup,
                    )
            failure = None if running else batch_failures.blocked(config, max_batch_failures)
            if failure is not None:
                raise StreamDown(batch_failures.failure_message(failure, max_batch_failures))
            if not running:
                owner = _owned_elsewhere(config, state, state_file, backoff_seconds, log)
                if owner is not None:
                    return "owned_elsewhere"
            since_restart = time.time() - (state.get("last_restart") or 0)
            if running and age is None and beat is None and since_restart < startup_grace_seconds:
                return "starting"  # the JVM boots before the driver's first ("starting") beat
            restarts = int(state.get("restarts") or 0)
            batch_now = last_batch_id(config)
            if restarts and _progressed(state.get("batch_at_restart"), batch_now):
                # The job started last time completed micro-batches before it died: a stream that is
                # killed now and then (an OOM, a host reboot) but counts in between is no crash loop.
                if log is not None:
                    log.info("the previous start completed batches up to %s: restart count reset", batch_now)
                restarts = 0
            if restarts >= max_restarts:
                wait = backoff_wait(backoff_seconds, restarts - max_restarts, max_backoff)
                if since_restart < wait:
                    raise StreamDown(
                        f"speed layer down after {restarts} consecutive restarts; next attempt in "
                        f"{wait - since_restart:.0f}s. Log tail:\n{process.log_tail()}"
                    )
            if running:  # alive but silent: a hung job, stop it before starting a fresh one
                stop_stream(config)
            pid = start_stream(config, extra_env=extra_env)
            restarts += 1
            write_state(
                state_file,
                {"restarts": restarts, "last_restart": time.time(), "pid": pid, "batch_at_restart": batch_now},
            )
            if log is not None:
                log.info("speed layer (re)started as pid %s (restart %s in a row)", pid, restarts)
            if restarts > max_restarts:
                raise StreamDown(
                    f"speed layer restarted {restarts} times in a row without a healthy heartbeat. "
                    f"Log tail:\n{process.log_tail()}"
                )
            return "restarted"
    except LockHeld as exc:
        if log is not None:
            log.info("another supervisor is at work: %s", exc)
        return "locked"


def backoff_wait(backoff_seconds: float, doublings: int, max_backoff_seconds: float) -> float:
    """``backoff_seconds * 2^doublings``, at most ``max_backoff_seconds``: after a multi-hour outage the next
    restart must not be hours away (uncapped, the tenth failed restart in a row waited 4 h 16 min)."""
    return min(float(max_backoff_seconds), float(backoff_seconds) * 2 ** min(max(doublings, 0), 64))


def _owned_elsewhere(config: Config, state: dict, state_file: Path, backoff_seconds: float, log: Log | None) -> str | None:
    """Another driver holds the checkpoint's lease (``kdq.driver_lease``): its description, else None.

    Read directly when the checkpoint is local. On remote storage (no Spark here to read it) the refusal the
    last started driver recorded says so, for ``backoff_seconds`` after it (then a start is tried again: the
    owner may be gone). Either way the restart count is reset: a refused start is no crash."""
    from kdq import driver_lease
    from kdq.storage import RemoteStorageUnavailable
    from kdq.stream.state import read_refusal

    try:
        owner = driver_lease.checkpoint_owner(config)  # the lease itself, when this process can read it
    except RemoteStorageUnavailable:
        owner = None
        refusal = read_refusal(config)
        last_restart_ms = int((state.get("last_restart") or 0) * 1000)
        if (
            refusal is not None
            and int(refusal.get("time_ms") or 0) >= last_restart_ms
            and time.time() - int(refusal["time_ms"]) / 1000 < backoff_seconds
        ):
            owner = str(refusal.get("message") or "another driver holds the checkpoint's lease")
    if owner is None:
        return None
    if state.get("restarts") or state.get("owned_elsewhere") != owner:
        write_state(state_file, {**state, "restarts": 0, "owned_elsewhere": owner})
    if log is not None:
        log.warning("not starting the speed layer: another driver owns its checkpoint: %s", owner)
    return owner


def _progressed(batch_at_restart: int | None, batch_now: int | None) -> bool:
    """Whether the stream completed a micro-batch since the last restart (recorded in the state file)."""
    if batch_now is None:
        return False
    return batch_at_restart is None or batch_now > int(batch_at_restart)


def _restart_hung(
    config: Config,
    hung: dict,
    max_batch_seconds: float,
    max_batch_failures: int,
    grace: float,
    state: dict,
    state_file: Path,
    extra_env: dict[str, str] | None,
    log: Log | None,
) -> str:
    """A batch runs past ``max_batch_seconds``: record it as a failed attempt, stop the job, start it again
    (or, at ``max_batch_failures`` attempts, fail the task with the batch's offsets instead)."""
    from kdq.spark.stream_process import start_stream, stop_stream
    from kdq.stream import failures as batch_failures
    from kdq.stream.state import last_batch_id

    batch_id = hung["batch_id"]
    what = f"micro-batch {batch_id}" if batch_id is not None else "a trigger (before its batch started)"
    limit = hung.get("limit", max_batch_seconds)
    attempt = "" if limit == max_batch_seconds else f" x 2^{round(math.log2(limit / max_batch_seconds))} (this attempt's limit)"
    message = (
        f"HUNG: {what} has been running for {hung['seconds']:.0f}s, longer than "
        f"stream.max_batch_seconds = {max_batch_seconds:.0f}{attempt}; stopping the stream (SIGKILL after "
        f"{grace:.0f}s) and starting it again"
    )
    if log is not None:
        log.error(message)
    failure = None
    if batch_id is not None:
        failure = batch_failures.record_failure(config, batch_id, message, kind="hung")
    stop_stream(config, timeout=grace)
    if failure is not None and failure["attempts"] >= max_batch_failures:
        raise StreamDown(batch_failures.failure_message(failure, max_batch_failures))
    pid = start_stream(config, extra_env=extra_env)
    restarts = int(state.get("restarts") or 0) + 1
    write_state(
        state_file,
        {
            "restarts": restarts,
            "last_restart": time.time(),
            "pid": pid,
            "hung_batch": batch_id,
            "batch_at_restart": last_batch_id(config),
        },
    )
    if log is not None:
        log.info("speed layer restarted as pid %s after the hung batch", pid)
    return "restarted_hung"
