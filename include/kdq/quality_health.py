"""The stream's health as the data-quality page shows it: from the stream's state files and its progress log.

The stream's state files (:func:`kdq.stream.state.stream_status`) and its recent progress records
(``progress.jsonl``) become a :class:`StreamHealth`, per topic a :class:`TopicHealth`; the API server reads
them on the same machine. The batch jobs that wrote beside the stream in the last day come from the writers
journal (:mod:`kdq.writers_journal`). The page's model (:mod:`kdq.quality_page`) holds one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kdq.stream.state import PROGRESS_LOG, state_dir
from kdq.windows import HOUR_MS
from kdq.writers_journal import WriterSummary


@dataclass(frozen=True)
class TopicHealth:
    consumer_lag: int | None = None  # messages behind the end of the topic, after the last batch
    event_time_lag_ms: int | None = None  # now minus the topic's largest event time, at the last batch
    late_rows_last_batch: int | None = None
    late_rows_hour: int = 0  # left to the batch layer by the batches of the last hour (progress log)


@dataclass(frozen=True)
class StreamHealth:
    state: str  # running | stopped | never started
    heartbeat_age_s: float | None = None
    last_batch_id: int | None = None
    last_batch_ms: int | None = None
    last_batch_rows: int | None = None
    # Produce → counts visible in Delta for the last batch's oldest and newest records (its Kafka timestamps).
    latency_oldest_ms: int | None = None
    latency_newest_ms: int | None = None
    failure: str | None = None  # the micro-batch that keeps failing (kdq stream-failure)
    influx_pending_since_ms: int | None = None
    topics: Mapping[str, TopicHealth] = field(default_factory=dict)
    # The batch jobs that wrote kdq's tables in the last 24 h, per job: runs, beside the stream, waits
    # (the writers journal, kdq.writers_journal; the same as `kdq status`'s writers section).
    writers: tuple[WriterSummary, ...] = ()


def stream_health(
    status: Mapping[str, Any],
    progress_log: Sequence[Mapping[str, Any]],
    now_ms: int,
    stale_after_s: float = 120.0,
    writers: Sequence[WriterSummary] = (),
) -> StreamHealth:
    """The stream's state files (:func:`kdq.stream.state.stream_status`) and its recent progress records
    (``progress.jsonl``, oldest first) → health. A heartbeat older than ``stale_after_s`` reads as stopped:
    a SIGKILLed driver cannot write "stopped". ``writers``: the writers journal's summary
    (:func:`kdq.writers_journal.summarize`)."""
    beat = status.get("heartbeat") or {}
    progress = status.get("progress") or {}
    age = None
    if beat.get("time_ms"):
        age = max(0.0, (now_ms - int(beat["time_ms"])) / 1000)
    if not beat:
        state = "never started"
    elif beat.get("state") == "running" and age is not None and age <= stale_after_s:
        state = "running"
    elif beat.get("state") == "running":
        state = f"no heartbeat for {age:.0f} s"
    else:
        state = str(beat.get("state") or "unknown")
    late_hour: dict[str, int] = {}
    for record in progress_log:
        if _record_ms(record) >= now_ms - HOUR_MS:
            for topic, rows in (record.get("late_rows") or {}).items():
                late_hour[topic] = late_hour.get(topic, 0) + int(rows or 0)
    lag = progress.get("consumer_lag") or {}
    event_lag = progress.get("event_time_lag_ms") or {}
    last_late = progress.get("late_rows") or {}
    topics = {
        topic: TopicHealth(
            consumer_lag=None if topic not in lag else int(lag[topic]),
            event_time_lag_ms=None if topic not in event_lag else int(event_lag[topic]),
            late_rows_last_batch=int(last_late.get(topic, 0)) if progress else None,
            late_rows_hour=late_hour.get(topic, 0),
        )
        for topic in sorted({*lag, *event_lag, *last_late, *late_hour})
    }
    failure = status.get("batch_failure") or None
    return StreamHealth(
        state=state,
        heartbeat_age_s=age,
        last_batch_id=progress.get("batch_id"),
        last_batch_ms=_record_ms(progress) if progress else None,
        last_batch_rows=progress.get("input_rows"),
        latency_oldest_ms=(progress.get("end_to_end_latency_ms") or {}).get("oldest"),
        latency_newest_ms=(progress.get("end_to_end_latency_ms") or {}).get("newest"),
        failure=(
            f"batch {failure.get('batch_id')} failed {failure.get('attempts', '?')} time(s): "
            f"{str(failure.get('error') or '').strip()[:300]}"
            if failure
            else None
        ),
        influx_pending_since_ms=(status.get("influx_push") or {}).get("pending_since_ms"),
        topics=topics,
        writers=tuple(writers),
    )


def read_progress_log(config: Any, max_bytes: int = 1024 * 1024) -> list[dict[str, Any]]:
    """The stream's recent progress records (``progress.jsonl``, oldest first): the file's last ``max_bytes``
    (an hour of 1-second batches is about 1 MB), a torn or partial line skipped."""
    path = state_dir(config) / PROGRESS_LOG
    try:
        with open(path, "rb") as log:
            log.seek(0, 2)
            size = log.tell()
            log.seek(max(0, size - max_bytes))
            data = log.read()
    except FileNotFoundError:
        return []
    records = []
    lines = data.decode("utf-8", "replace").splitlines()
    for line in lines[1:] if size > max_bytes else lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _record_ms(record: Mapping[str, Any]) -> int:
    """A progress record's time: Spark's ISO-8601 ``timestamp`` of the batch's trigger (UTC)."""
    text = record.get("timestamp")
    if not text:
        return 0
    try:
        return int(datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return 0


def writers_json(stream: StreamHealth, now_ms: int) -> dict[str, Any]:
    """The page's writers table as JSON (``/kdq/quality/writers.json``): per job its runs of the last 24 h."""
    return {
        "as_of_ms": int(now_ms),
        "window_hours": 24,
        "runs": sum(w.runs for w in stream.writers),
        "beside_stream": sum(w.beside_stream for w in stream.writers),
        "waited": sum(w.waited for w in stream.writers),
        "jobs": [w.to_dict() for w in stream.writers],
    }
