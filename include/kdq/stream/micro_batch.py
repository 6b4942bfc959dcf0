"""From a micro-batch's aggregate rows to what its writers need: the increments and the per-topic
input, late-row and watermark figures (pure Python, no Spark).

Input rows (one per topic, window_start_ms, valid, reason, counted) come from
:func:`kdq.spark.transforms.batch_aggregates`; they are few (topics × windows ×
reasons), so deriving the outputs here costs microseconds instead of Spark jobs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass
class MicroBatchReport:
    batch_id: int
    input_rows: int = 0
    input_rows_by_topic: dict[str, int] = field(default_factory=dict)
    invalid_rows: int = 0
    invalid_rows_by_topic: dict[str, int] = field(default_factory=dict)
    late_rows: dict[str, int] = field(default_factory=dict)
    max_event_ms: dict[str, int] = field(default_factory=dict)
    changed_windows: int = 0
    influx_ok: bool = True
    replayed: bool = False
    durations_ms: dict[str, int] = field(default_factory=dict)
    oldest_kafka_ms: int | None = None  # the batch's oldest and newest Kafka record timestamps
    newest_kafka_ms: int | None = None
    visible_ms: int | None = None  # when its counts became visible in window_counts (its MERGE committed)

    def end_to_end_latency_ms(self) -> dict[str, int] | None:
        """Produce → counts visible in Delta for the batch's oldest and newest records (never below 0: a
        producer clock ahead of this one)."""
        if self.visible_ms is None or self.oldest_kafka_ms is None or self.newest_kafka_ms is None:
            return None
        return {"oldest": max(0, self.visible_ms - self.oldest_kafka_ms),
                "newest": max(0, self.visible_ms - self.newest_kafka_ms)}


@dataclass
class MicroBatchIncrements:
    """One micro-batch, reduced: rows in per topic, rows left to the batch layer (late) per topic, invalid
    rows, the largest event time per topic (the watermark's input), and the increments the stream MERGEs
    into window_counts (per topic, window, status) and appends to invalid_reasons (per coarse window)."""

    input_rows_by_topic: dict[str, int] = field(default_factory=dict)
    late_rows: dict[str, int] = field(default_factory=dict)
    invalid_rows: int = 0
    invalid_rows_by_topic: dict[str, int] = field(default_factory=dict)  # counted invalid rows (not late ones)
    max_event_ms: dict[str, int] = field(default_factory=dict)
    window_increments: list[dict] = field(default_factory=list)
    reason_increments: list[dict] = field(default_factory=list)
    # The oldest and newest Kafka timestamps (ms) of the records the batch counts: their produce → counted latency.
    oldest_kafka_ms: int | None = None
    newest_kafka_ms: int | None = None

    @property
    def input_rows(self) -> int:
        return sum(self.input_rows_by_topic.values())


def increments_of(rows: Iterable[Mapping], reasons_window_seconds: int) -> MicroBatchIncrements:
    """Reduce the micro-batch's aggregate rows (see the module doc). Rows not ``counted`` are too late for the
    stream: they count as input, late rows and toward the watermark, never as increments."""
    batch = MicroBatchIncrements()
    inputs: dict[str, int] = defaultdict(int)
    late: dict[str, int] = defaultdict(int)
    windows: dict[tuple[str, int, str], list] = {}
    reasons: dict[tuple[str, int, str], int] = defaultdict(int)
    coarse_ms = reasons_window_seconds * 1000
    for row in rows:
        topic, count = row["topic"], int(row["count"])
        inputs[topic] += count
        if row["max_event_ms"] is not None:
            batch.max_event_ms[topic] = max(row["max_event_ms"], batch.max_event_ms.get(topic, row["max_event_ms"]))
        if not row["counted"]:
            late[topic] += count  # archived, left to the batch layer
            continue
        # The latency figure is the counts': a record too late for the stream waits for the batch layer by design
        # (its Kafka timestamp is often its event time, minutes old).
        oldest, newest = row.get("oldest_kafka_ms"), row.get("newest_kafka_ms")
        if oldest is not None:
            batch.oldest_kafka_ms = min(oldest, batch.oldest_kafka_ms if batch.oldest_kafka_ms is not None else oldest)
        if newest is not None:
            batch.newest_kafka_ms = max(newest, batch.newest_kafka_ms if batch.newest_kafka_ms is not None else newest)
        status = "valid" if row["valid"] else "invalid"
        key = (topic, int(row["window_start_ms"]), status)
        entry = windows.setdefault(key, [0, row["rules_version"]])
        entry[0] += count
        if not row["valid"]:
            batch.invalid_rows += count
            batch.invalid_rows_by_topic[topic] = batch.invalid_rows_by_topic.get(topic, 0) + count
            reasons[(topic, int(row["window_start_ms"]) // coarse_ms * coarse_ms, row["reason"])] += count
    batch.input_rows_by_topic = dict(inputs)
    batch.late_rows = {t: n for t, n in late.items() if n}
    batch.window_increments = [
        {"topic": t, "window_start_ms": w, "status": s, "count": n, "rules_version": v}
        for (t, w, s), (n, v) in sorted(windows.items())
    ]
    batch.reason_increments = [
        {"topic": t, "window_start_ms": w, "reason": r, "count": n} for (t, w, r), n in sorted(reasons.items())
    ]
    return batch


def merge_maxima(before: Mapping[str, int], batch: Mapping[str, int]) -> dict[str, int]:
    """Per-topic watermark state after a batch: it only moves forward."""
    after = dict(before)
    for topic, ms in batch.items():
        after[topic] = max(ms, after.get(topic, ms))
    return after


def idle_ms_before_next_trigger(started_ms: int, now_ms: int, trigger_ms: int) -> int:
    """How long the stream will wait, at ``now_ms``, for the trigger after the batch that started at ``started_ms``.

    Spark's processing-time trigger fires at the multiples of its interval (``ProcessingTimeExecutor.nextBatchTime``)
    and starts the next batch at once when one outlasts it; ``trigger_ms`` 0 (back to back, or ``availableNow``)
    never waits."""
    if trigger_ms <= 0:
        return 0
    next_trigger_ms = (started_ms // trigger_ms + 1) * trigger_ms
    return max(0, next_trigger_ms - now_ms)
