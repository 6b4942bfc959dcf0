"""Failing and hung micro-batches of the speed layer, and the operator's way out. No Spark import.

Three small JSON files next to the heartbeat in ``<data_dir>/stream/``:

``current_batch.json``
    ``{batch_id, state: running|done, started_ms, pid}``: written by the speed layer at the start of every
    micro-batch and marked done when Spark reports the batch's progress. The supervisor judges health by
    it: a batch running longer than ``stream.max_batch_seconds`` is hung, even while the heartbeat ticks.
``batch_failure.json``
    The last micro-batch that failed (or hung): batch id, consecutive attempts, the error's first lines, the
    batch's offset ranges (from Spark's offset log) and whether the batch's ledger entry existed. Written by
    the job when its query dies (``spark_jobs/stream_counts.py``) or by the supervisor when it kills a hung
    batch; cleared once a batch at or past it completes. After ``stream.max_batch_failures`` attempts the
    supervisor stops restarting the stream and fails its task with :func:`failure_message`.

    Only failures that would happen again on a replay count toward that limit. A failure whose error says the
    environment failed, not the batch (a full disk, a storage, S3, DynamoDB or Kafka outage, a connection
    refused or timed out: :func:`classify_failure`), is recorded with kind ``transient`` (``transient_attempts``)
    and never blocks: the supervisor keeps restarting the stream with its capped backoff until the outage ends.
    A hang cannot be told from a slow batch (a slow flush to a struggling store), so it counts, but the limit
    grows per hung attempt of the same batch (:func:`hung_limit`: ``max_batch_seconds * 2^(hung attempts so
    far)``), so a slow but progressing batch gets 1x, 2x, 4x ... the time and eventually completes.
``quarantined_offsets.json``
    The operator's quarantine list, append-only: ``{id, topic, partition, from_offset, to_offset
    (inclusive), reason, added_ms}``. Records of these ranges skip classification and are counted invalid
    with reason ``internal_error:quarantined`` (archived like any other record). A JSON file rather than a
    Delta table: the CLI appends to it without starting a JVM, the driver reads it at a batch's start
    without a Spark job, the supervisor and ``kdq status`` read it too, and it holds a handful of entries.
    Replays do not read it: which entries a batch applied is recorded per batch in the checkpoint (see
    ``SpeedLayer._decide_quarantine``), so a range added while a batch runs never changes a replay of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from kdq import storage
from kdq.storage import Location
from kdq.stream.state import BATCH_FAILURE as FAILURE
from kdq.stream.state import CURRENT_BATCH, HEARTBEAT, pid_alive, state_dir
from kdq.stream.state import QUARANTINED_OFFSETS as QUARANTINE
from kdq.stream.state import atomic_write_json as _write
from kdq.stream.state import read_json as _read

QUARANTINED_REASON = "internal_error:quarantined"
ERROR_LINES = 12


def _now_ms() -> int:
    return int(time.time() * 1000)


def checkpoint_of(config: Any) -> str:
    """The speed layer's checkpoint (the same location as ``kdq.spark.speed_layer.checkpoint_dir``)."""
    from kdq.stream.checkpoint_offsets import speed_layer_checkpoint

    return speed_layer_checkpoint(config)


@contextlib.contextmanager
def _locked(config: Any) -> Iterator[None]:
    """Serialises read-modify-write of these files between the job, the supervisor and the CLI."""
    folder = state_dir(config)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".batch_failures.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# -- batch progress (hung batches) ---------------------------------------------------------------------


# The stream's foreachBatch thread starts batch N+1 while its query listener's thread may still be marking batch N
# done: the listener's read-check-write must not put "N done" over "N+1 running".
_CURRENT_BATCH_LOCK = threading.Lock()


def batch_started(config: Any, batch_id: int) -> None:
    with _CURRENT_BATCH_LOCK:
        _write(
            state_dir(config) / CURRENT_BATCH,
            {"batch_id": int(batch_id), "state": "running", "started_ms": _now_ms(), "pid": os.getpid()},
        )


def batch_finished(config: Any, batch_id: int) -> None:
    """Batch ``batch_id`` committed: mark it done and clear a failure record of it or of an earlier batch."""
    path = state_dir(config) / CURRENT_BATCH
    with _CURRENT_BATCH_LOCK:
        current = _read(path) or {}
        if current.get("batch_id") is None or int(current["batch_id"]) <= batch_id:
            _write(path, {**current, "batch_id": int(batch_id), "state": "done", "finished_ms": _now_ms()})
    failure = read_failure(config)
    if failure is not None and int(failure["batch_id"]) <= batch_id:
        with _locked(config):
            failure = read_failure(config)
            if failure is not None and int(failure["batch_id"]) <= batch_id:
                (state_dir(config) / FAILURE).unlink(missing_ok=True)


def running_batch(config: Any, now_ms: int | None = None, not_before_ms: int = 0) -> dict | None:
    """The micro-batch a live stream process is running now, with its age in seconds; None if none.

    Only batches of a live driver started at or after ``not_before_ms`` count: a record left by a killed
    process says nothing about the process running now. Falls back to the heartbeat's
    ``trigger_active_since_ms`` (a trigger stuck before the batch reaches kdq's code, e.g. in Spark's
    offset fetch or planning).
    """
    now = _now_ms() if now_ms is None else now_ms
    current = _read(state_dir(config) / CURRENT_BATCH)
    if (
        current
        and current.get("state") == "running"
        and int(current.get("started_ms") or 0) >= not_before_ms
        and pid_alive(int(current.get("pid") or 0))
    ):
        return {
            "batch_id": int(current["batch_id"]),
            "seconds": max(0.0, (now - int(current["started_ms"])) / 1000),
            "source": "batch",
        }
    beat = _read(state_dir(config) / HEARTBEAT) or {}
    since = beat.get("trigger_active_since_ms")
    if beat.get("state") == "running" and since and int(since) >= not_before_ms and pid_alive(int(beat.get("pid") or 0)):
        return {"batch_id": pending_batch(checkpoint_of(config)), "seconds": max(0.0, (now - int(since)) / 1000),
                "source": "trigger"}
    return None


def hung_limit(config: Any, batch_id: int | None, max_seconds: float) -> float:
    """How long attempt N of ``batch_id`` may run: ``max_seconds * 2^(N-1)``, N - 1 being the hangs of that batch
    recorded so far (failures of other kinds do not make it grow). A batch that is slow rather than stuck (a slow
    flush to a struggling store) gets twice the time on each retry, so it completes instead of being killed at
    the same point forever (``stream.max_batch_failures`` still bounds the attempts)."""
    failure = read_failure(config)
    if batch_id is None or failure is None or failure.get("batch_id") != batch_id:
        return float(max_seconds)
    return float(max_seconds) * 2 ** int(failure.get("hung_attempts") or 0)


def hung_batch(config: Any, max_seconds: float, now_ms: int | None = None, not_before_ms: int = 0) -> dict | None:
    """The running batch when it runs past its :func:`hung_limit` (``limit``: that limit), else None."""
    running = running_batch(config, now_ms, not_before_ms)
    if running is None:
        return None
    limit = hung_limit(config, running["batch_id"], max_seconds)
    return {**running, "limit": limit} if running["seconds"] > limit else None


# -- transient or deterministic -----------------------------------------------------------------------------

# Errors that say the environment failed, not the batch: the same batch succeeds once it recovers, so they never
# count toward stream.max_batch_failures (a person clearing the block after every outage is no way to run it).
# Matched anywhere in the error text, so a cause under Spark's "Job aborted" / "Caused by:" wrappers counts.
TRANSIENT_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"No space left on device|ENOSPC|Errno 28\b|Disk quota exceeded|EDQUOT",
     "disk full: space comes back (retention, maintenance, an operator); the batch itself is fine"),
    (r"Connection refused|ConnectException|ECONNREFUSED|Errno 111\b|NoRouteToHostException|UnknownHostException"
     r"|Connection reset|Broken pipe|Errno 32\b|Errno 104\b",
     "a service (S3, HDFS, DynamoDB, Kafka, a proxy) down, restarting or unreachable"),
    (r"SocketTimeoutException|connect timed out|read timed out|ETIMEDOUT|Errno 110\b|ConnectTimeoutException",
     "a service too slow to answer: overloaded or partly down"),
    (r"kafka\.common\.errors\.(TimeoutException|NetworkException|DisconnectException|NotLeaderOrFollowerException"
     r"|LeaderNotAvailableException|BrokerNotAvailableException|NotEnoughReplicasException)",
     "a Kafka broker down, or a leader election under way"),
    (r"AWSServiceThrottledException|AWSStatus500Exception|AWSStatus503|AWSClientIOException|AWSNoResponseException"
     r"|SdkClientException|Unable to execute HTTP request|Service Unavailable|SlowDown|Status Code: 5\d\d"
     r"|RequestTimeout\b",
     "S3 (S3A) throttling, a 5xx or no answer: an S3 outage"),
    (r"ProvisionedThroughputExceededException|ThrottlingException|RequestLimitExceeded"
     r"|InternalServerErrorException|LimitExceededException",
     "DynamoDB (kdq's log store) throttling or a server error"),
    (r"ConcurrentAppendException|ConcurrentDeleteReadException|ConcurrentDeleteDeleteException"
     r"|ConcurrentTransactionException|ConcurrentWriteException",
     "a Delta commit conflict with another writer of the table: the retry commits"),
)
# Checked first: the same batch fails the same way again however the environment behaves.
DETERMINISTIC_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"OutOfMemoryError|StackOverflowError",
     "the batch is too big for the driver or an executor: it fails again until memory or "
     "kafka.max_offsets_per_trigger changes"),
    (r"failOnDataLoss|data loss|data may have been lost|Some data may have been missed",
     "Kafka no longer has offsets the checkpoint needs: no retry brings them back"),
)
_TRANSIENT = [re.compile(p, re.IGNORECASE) for p, _ in TRANSIENT_PATTERNS]
_DETERMINISTIC = [re.compile(p, re.IGNORECASE) for p, _ in DETERMINISTIC_PATTERNS]


def classify_failure(error: str) -> str:
    """``transient`` when the error text names an environment failure (:data:`TRANSIENT_PATTERNS`, each with
    why), else ``deterministic``: anything unrecognised counts toward the limit, as before."""
    text = str(error or "")
    if any(p.search(text) for p in _DETERMINISTIC):
        return "deterministic"
    return "transient" if any(p.search(text) for p in _TRANSIENT) else "deterministic"


# -- failures --------------------------------------------------------------------------------------------


def pending_batch(checkpoint: Location) -> int | None:
    """The batch Spark planned but did not commit (its offsets are logged, its commit is not), if any. None
    too when the checkpoint is on remote storage and this process has no Spark session to read it."""
    from kdq.stream.checkpoint_offsets import batch_ids

    try:
        planned = batch_ids(storage.join(checkpoint, "offsets"))
        if not planned:
            return None
        last = planned[-1]
        return None if last in batch_ids(storage.join(checkpoint, "commits")) else last
    except storage.RemoteStorageUnavailable:
        return None


def offset_ranges(checkpoint: Location, batch_id: int) -> list[dict]:
    """Batch ``batch_id``'s offset ranges from Spark's offset log, ``to`` inclusive; [] if unreadable (also a
    remote checkpoint in a process without a Spark session)."""
    from kdq.stream.checkpoint_offsets import batch_offset_ranges

    try:
        ranges = batch_offset_ranges(checkpoint, batch_id)
    except (OSError, ValueError):
        return []
    return [
        {"topic": r.topic, "partition": r.partition, "from": max(r.start, 0), "to": r.end - 1,
         "from_earliest": r.start == -2}
        for r in ranges
    ]


def error_summary(text: str, max_lines: int = ERROR_LINES) -> str:
    """The lines of a (Py4J / Spark / Python) error that say what went wrong, at most ``max_lines``.

    The first line, then the lines naming an exception or error (the Python traceback's last line, Spark's
    ``Caused by``), without the stack frames in between.
    """
    lines = [line.rstrip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return "(no error message)"
    keep = [lines[0]]
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith(("at ", "File ", "...", "^", "~")) or stripped in keep:
            continue
        if any(word in stripped for word in ("Error", "Exception", "error:", "Caused by", "KDQ_FAULT")):
            keep.append(stripped[:500])
        if len(keep) >= max_lines:
            break
    return "\n".join(keep)


def read_failure(config: Any) -> dict | None:
    return _read(state_dir(config) / FAILURE)


def record_failure(
    config: Any,
    batch_id: int,
    error: str,
    kind: str = "error",
    checkpoint: Location | None = None,
) -> dict:
    """Record one more failed attempt of ``batch_id`` (attempts restart at 1 for another batch, or when the
    quarantine list changed since the last attempt: the operator acted).

    ``kind`` ``error`` becomes ``transient`` when :func:`classify_failure` says so: counted in
    ``transient_attempts`` only, never in ``attempts`` (what :func:`blocked` compares with the limit). ``hung``
    counts in ``attempts`` and in ``hung_attempts`` (what :func:`hung_limit` grows with)."""
    if kind == "error" and classify_failure(error) == "transient":
        kind = "transient"
    checkpoint = checkpoint or checkpoint_of(config)
    ranges = offset_ranges(checkpoint, batch_id)
    quarantine_size = len(read_quarantine(config))
    with _locked(config):
        previous = read_failure(config) or {}
        same = previous.get("batch_id") == batch_id and previous.get("quarantine_size") == quarantine_size

        def count(field: str, counted: bool) -> int:
            return (int(previous.get(field) or 0) if same else 0) + (1 if counted else 0)

        failure = {
            "batch_id": int(batch_id),
            "attempts": count("attempts", kind != "transient"),
            "transient_attempts": count("transient_attempts", kind == "transient"),
            "hung_attempts": count("hung_attempts", kind == "hung"),
            "kind": kind,
            "error": error_summary(error),
            "time_ms": _now_ms(),
            "first_time_ms": previous.get("first_time_ms") if same else _now_ms(),
            "ranges": ranges,
            # The batch's ledger entry existed: some outputs may have landed, and a replay keeps the
            # quarantine decision recorded with it, so a range added now does not apply to this batch.
            "ledger_written": _exists(storage.join(checkpoint, "kdq_ledger", batch_id)),
            "quarantine_size": quarantine_size,
        }
        _write(state_dir(config) / FAILURE, failure)
    return failure


def _exists(location: Location) -> bool | None:
    """Whether a file exists; None when it is on remote storage this process cannot read."""
    try:
        return storage.files_for(location).exists(location)
    except storage.RemoteStorageUnavailable:
        return None


def clear_failure(config: Any) -> dict | None:
    """Forget the recorded failure (``kdq stream-failure --clear``): the supervisor retries the batch as is."""
    with _locked(config):
        failure = read_failure(config)
        (state_dir(config) / FAILURE).unlink(missing_ok=True)
    return failure


def blocked(config: Any, max_failures: int) -> dict | None:
    """The failure that stops the supervisor from restarting the stream, if any: ``max_failures``
    consecutive attempts of one batch, with no quarantine entry added since the last one."""
    failure = read_failure(config)
    if failure is None or int(failure.get("attempts") or 0) < max_failures:
        return None
    if len(read_quarantine(config)) != failure.get("quarantine_size"):
        return None  # the operator quarantined something since: try again
    return failure


def format_ranges(ranges: Iterable[dict]) -> list[str]:
    return [
        f"  {r['topic']} partition {r['partition']}: offsets {r['from']}..{r['to']}"
        + (" (from the partition's earliest)" if r.get("from_earliest") else "")
        for r in ranges
    ]


def failure_message(failure: dict, max_failures: int) -> str:
    batch = failure["batch_id"]
    what = "hung (ran past stream.max_batch_seconds)" if failure.get("kind") == "hung" else "failed"
    lines = [
        f"speed layer: micro-batch {batch} {what} {failure['attempts']} times in a row "
        f"(stream.max_batch_failures = {max_failures}). The supervisor no longer restarts the stream: "
        "no topic advances until this is resolved.",
        "Error of the last attempt:",
        *[f"  {line}" for line in failure["error"].splitlines()],
        f"Offset ranges of batch {batch} (inclusive):",
        *(format_ranges(failure.get("ranges") or []) or ["  (unknown: the offset log could not be read)"]),
    ]
    if failure.get("ledger_written"):
        lines += [
            "The batch failed after its classification was recorded in the micro-batch ledger (outputs may have "
            "landed), so quarantining its records cannot change this batch. Fix the cause, deploy, then:",
            "  kdq stream-failure --clear      # the next supervisor run retries the batch",
        ]
    else:
        lines += [
            'Way out (docs/operations.md, "When a batch keeps failing"):',
            "  kdq quarantine-offsets --topic T --partition P --from A --to B --reason '...'"
            "   # only the offending records",
            f"  kdq quarantine-batch {batch} [--topic T ...] --reason '...'"
            "   # every record of the batch's ranges (of those topics)",
            "  kdq stream-failure --clear      # or, after deploying a fix: retry the batch as is",
            "Quarantined records are archived once and counted once as invalid, reason "
            f"{QUARANTINED_REASON}; everything else of the batch is counted normally. "
            "The next supervisor run restarts the stream.",
        ]
    return "\n".join(lines)


# -- the quarantine list -----------------------------------------------------------------------------------


def read_quarantine(config: Any) -> list[dict]:
    return list((_read(state_dir(config) / QUARANTINE) or {}).get("ranges") or [])


def quarantine_in_use(config: Any) -> bool:
    """Whether a quarantine list was ever written (cheap: one stat per micro-batch otherwise)."""
    return (state_dir(config) / QUARANTINE).exists()


def add_quarantine(config: Any, ranges: Iterable[dict], reason: str) -> list[dict]:
    """Append ``ranges`` ({topic, partition, from, to}, ``to`` inclusive) with ``reason``; returns the new entries."""
    if not reason.strip():
        raise ValueError("a reason is required (it is kept with the entry)")
    with _locked(config):
        entries = read_quarantine(config)
        next_id = max((int(e["id"]) for e in entries), default=0) + 1
        added = []
        for r in ranges:
            start, end = int(r["from"]), int(r["to"])
            if start < 0 or end < start:
                raise ValueError(f"{r['topic']} partition {r['partition']}: expected 0 <= from <= to, got {start}..{end}")
            added.append({"id": next_id, "topic": str(r["topic"]), "partition": int(r["partition"]),
                          "from_offset": start, "to_offset": end, "reason": reason, "added_ms": _now_ms()})
            next_id += 1
        if added:
            _write(state_dir(config) / QUARANTINE, {"ranges": entries + added})
    return added


def overlapping(entries: Iterable[dict], ranges: Iterable[dict]) -> list[dict]:
    """The quarantine entries that overlap a batch's offset ranges (``to`` inclusive on both sides)."""
    ranges = list(ranges)
    return [
        e for e in entries
        if any(
            e["topic"] == r["topic"] and int(e["partition"]) == int(r["partition"])
            and int(e["from_offset"]) <= int(r["to"]) and int(r["from"]) <= int(e["to_offset"])
            for r in ranges
        )
    ]
