"""One evaluation run of the expectations: stored incidents and counts in, changed rows out.

The run keeps nothing between runs but the ``kdq.incidents`` rows: each run re-evaluates every minute from
:func:`kdq.incidents.evaluation_floor` (a horizon back from now, moved back to the first minute of any
incident still open or reaching into it) with the counts as they are now, and derives the incidents again.
So a late record or a batch-layer correction inside the horizon is seen by the next run, and a re-run on the
same counts derives the same incidents: nothing changes, nothing is notified (kdq.incidents' idempotence).

Pure (no Spark): :mod:`kdq.spark.expectations` reads the tables and writes the rows; this module decides.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kdq.expectations import MINUTE_MS, MinuteCounts, StreamFigures, TopicMinutes, evaluate
from kdq.expectations_config import ExpectationSet
from kdq.incidents import (
    OPEN,
    Incident,
    IncidentState,
    Notification,
    apply,
    evaluation_floor,
    incident_row,
    state_from_incidents,
)

# How far back a run re-evaluates by default: late records reach back stream.allowed_lateness_seconds, the
# hourly batch layer's corrections reach the hour before the one it runs in, so three hours hold them all.
DEFAULT_HORIZON_MINUTES = 180
# The expectations judged once per run, at the run's minute (the stream's figures, the topic list).
MEASURED_NOW = ("latency", "lag", "batch_failing", "batch_running", "recompute", "unruled_topic")
RECOMPUTE_JOB = "batch_recompute"  # its name in kdq.writers_journal


@dataclass(frozen=True)
class RunWindow:
    """Which minutes a run judges, and which minutes of counts it must read for them."""

    first_minute: int
    last_minute: int
    read_from_minute: int  # first_minute minus the expectations' lookback (sliding periods, baselines)


def run_window(expectations: ExpectationSet, stored: Iterable[Incident], now_ms: int,
               horizon_minutes: int = DEFAULT_HORIZON_MINUTES) -> RunWindow:
    last = now_ms // MINUTE_MS
    first = evaluation_floor(stored, last - horizon_minutes + 1)
    return RunWindow(first, last, first - expectations.lookback_minutes())


def topic_minutes(
    counts: Iterable[Mapping[str, object]], reasons: Iterable[Mapping[str, object]], state: IncidentState
) -> list[TopicMinutes]:
    """Per-topic :class:`TopicMinutes` from per-minute rows: ``counts`` (topic, minute, valid, invalid,
    max_window_ms: the newest counted window of that minute), ``reasons`` (topic, minute, reason, count).

    A topic's lateness clock is its newest counted window's start: the speed layer's own clock is its newest
    event time, at most one window later, so a verdict turns final at most a window later than the stream's
    own, never earlier (a final verdict the stream could still change would be wrong)."""
    per_topic: dict[str, dict[int, dict]] = {}
    newest: dict[str, int] = {}
    for row in counts:
        topic, minute = str(row["topic"]), int(row["minute"])  # type: ignore[call-overload]
        slot = per_topic.setdefault(topic, {}).setdefault(minute, {"valid": 0, "invalid": 0, "reasons": {}})
        slot["valid"] += int(row["valid"] or 0)  # type: ignore[call-overload]
        slot["invalid"] += int(row["invalid"] or 0)  # type: ignore[call-overload]
        if row.get("max_window_ms") is not None:
            newest[topic] = max(newest.get(topic, 0), int(row["max_window_ms"]))  # type: ignore[call-overload]
    for row in reasons:
        topic, minute = str(row["topic"]), int(row["minute"])  # type: ignore[call-overload]
        slot = per_topic.setdefault(topic, {}).setdefault(minute, {"valid": 0, "invalid": 0, "reasons": {}})
        reason = str(row["reason"])
        slot["reasons"][reason] = slot["reasons"].get(reason, 0) + int(row["count"] or 0)  # type: ignore[call-overload]
    return [
        TopicMinutes(
            topic,
            {m: MinuteCounts(s["valid"], s["invalid"], s["reasons"]) for m, s in sorted(minutes.items())},
            max_event_ms=newest.get(topic),
            excluded_minutes=state.excluded_minutes(topic),
        )
        for topic, minutes in sorted(per_topic.items())
    ]


def minutes_since_recompute(journal: Iterable[Mapping[str, object]], now_ms: int) -> float | None:
    """Minutes since the hourly recompute last ended well, from kdq.writers_journal's entries (a day of them):
    since its last ``ok`` end; with runs but none ok, at least since the first of them started (failing, or
    never ending); None when the journal holds no recompute run (a new data folder: not measured)."""
    ok_ends = [int(e["end_ms"]) for e in journal  # type: ignore[call-overload]
               if e.get("job") == RECOMPUTE_JOB and e.get("phase") == "end" and e.get("outcome") == "ok"]
    if ok_ends:
        return max(0.0, (now_ms - max(ok_ends)) / MINUTE_MS)
    starts = [int(e["start_ms"]) for e in journal  # type: ignore[call-overload]
              if e.get("job") == RECOMPUTE_JOB and e.get("start_ms") is not None]
    return max(0.0, (now_ms - min(starts)) / MINUTE_MS) if starts else None


def stream_figures(
    progress: Mapping | None,
    failure: Mapping | None = None,
    running: Mapping | None = None,
    now_ms: int | None = None,
    recompute_minutes: float | None = None,
) -> list[StreamFigures]:
    """The stream's latency (its last batch's oldest record: produce → counts visible) and consumer lag (summed
    over topics) from ``progress.json``, judged at the minute the batch's progress was taken; with ``now_ms``,
    the failed attempts of the micro-batch that keeps failing (``failure``: kdq.stream.failures.read_failure, 0
    when none) and how long the batch in flight has run (``running``: kdq.stream.failures.running_batch, 0 when
    none), and the minutes since the hourly recompute last ended well (:func:`minutes_since_recompute`), judged
    at now's minute."""
    health = []
    if now_ms is not None:
        health = [StreamFigures(
            now_ms // MINUTE_MS,
            failed_attempts=int((failure or {}).get("attempts") or 0),
            running_seconds=float((running or {}).get("seconds") or 0.0),
            recompute_minutes=recompute_minutes,
        )]
    if not progress or not progress.get("timestamp"):
        return health
    at = datetime.fromisoformat(str(progress["timestamp"]).replace("Z", "+00:00"))
    minute = int(at.replace(tzinfo=at.tzinfo or UTC).timestamp() * 1000) // MINUTE_MS
    latency = (progress.get("end_to_end_latency_ms") or {}).get("oldest")
    lag = progress.get("consumer_lag")
    return [StreamFigures(
        minute,
        latency_seconds=None if latency is None else latency / 1000,
        lag_records=None if not isinstance(lag, dict) else sum(int(v) for v in lag.values()),
    ), *health]


def batches_breaching(
    expectations: ExpectationSet, progress: Iterable[Mapping[str, object]], after_batch_id: int | None,
    stored: Iterable[Incident],
) -> set[str]:
    """The topics of the stream's micro-batches after ``after_batch_id`` (its progress records) whose own counts
    put an invalid_ratio check over its threshold (:meth:`ExpectationSet.ratio_breaches`) and that have no open
    invalid_ratio incident yet: what a repeating run evaluates for at once, so an incident opens seconds after
    its records are counted instead of at the next regular look. A topic already in an open incident waits for
    the regular looks (its incident is updated there), so a topic that stays bad costs no extra evaluations."""
    already = {i.topic for i in stored if i.status == OPEN and i.expectation == "invalid_ratio"}
    breached: set[str] = set()
    for record in progress:
        batch_id = record.get("batch_id")
        if not isinstance(batch_id, int) or (after_batch_id is not None and batch_id <= after_batch_id):
            continue
        invalid = record.get("invalid_rows_by_topic")
        inputs = record.get("input_rows_by_topic")
        if isinstance(invalid, Mapping) and isinstance(inputs, Mapping):
            breached |= expectations.ratio_breaches(
                {str(t): int(n) for t, n in invalid.items()}, {str(t): int(n) for t, n in inputs.items()}
            )
    return breached - already


@dataclass
class RunResult:
    window: RunWindow
    verdicts: int = 0
    violated: int = 0
    changed: list[Incident] = field(default_factory=list)  # rows to MERGE (each with its new version)
    notifications: list[Notification] = field(default_factory=list)
    open_incidents: int = 0  # after the run
    counts_version: int | None = None  # the window_counts version judged (set by the Spark side)


def run_evaluation(
    expectations: ExpectationSet,
    stored: list[Incident],
    window: RunWindow,
    topics: list[TopicMinutes] | None,
    *,
    now_ms: int,
    as_of: int,
    allowed_lateness_seconds: int,
    stream: Sequence[StreamFigures] = (),
    has_rule: Mapping[str, bool] | None = None,
    counts: Iterable[Mapping[str, object]] = (),
    reasons: Iterable[Mapping[str, object]] = (),
    reasons_lag_seconds: int = 0,
) -> RunResult:
    """Evaluate the window's minutes and apply them to the stored incidents; what changed.

    ``as_of`` is the ``window_counts`` version the counts were read at: kdq.incidents orders evaluations by it.
    ``topics`` may be given directly; else it is built from ``counts`` / ``reasons`` (:func:`topic_minutes`)."""
    measured_now = {(i.topic, i.expectation) for i in stored if i.expectation in MEASURED_NOW}
    state = state_from_incidents(stored, window.first_minute, measured_now)
    if topics is None:
        topics = topic_minutes(counts, reasons, state)
    verdicts = evaluate(
        expectations, topics, window.first_minute, window.last_minute, now_ms=now_ms,
        allowed_lateness_seconds=allowed_lateness_seconds, stream=stream,
        monitored_topics=sorted(has_rule or ()), has_rule=has_rule, reasons_lag_seconds=reasons_lag_seconds,
    )
    new_state, notes = apply(state, verdicts, now_ms, as_of=as_of)
    before = {i.key: i for i in stored}
    changed = [i for k, i in sorted(new_state.incidents.items()) if before.get(k) != i]
    return RunResult(window, len(verdicts), sum(v.violated for v in verdicts), changed, notes,
                     len(new_state.open_incidents()), as_of)


def notification_row(note: Notification, created_ms: int, sample: str | None = None) -> dict[str, object]:
    """A row of :data:`kdq.tables.INCIDENT_NOTIFICATIONS`: the outbox the notifier reads."""
    row = incident_row(note.incident, sample)
    payload = {
        "id": note.id, "event": note.event,
        **{k: (v.isoformat().replace("+00:00", "Z") if isinstance(v, datetime) else v) for k, v in row.items()},
    }
    return {
        "notification_id": note.id, "incident_key": note.incident.key, "version": note.incident.version,
        "event": note.event, "topic": note.incident.topic, "expectation": note.incident.expectation,
        "payload": json.dumps(payload, sort_keys=True), "created_at": datetime.fromtimestamp(created_ms / 1000, tz=UTC),
    }
