"""Evaluate expectations: per-minute counts, the stream's figures and the topic list in, verdicts out.

Pure functions, no Spark: the caller reads per-minute counts from ``window_counts`` (valid, invalid) and
``invalid_reason_counts`` (per reason), the stream's latency and lag from its progress, and the monitored topics
from Kafka, and hands them here; :mod:`kdq.incidents` turns the verdicts into incidents and notifications.

A **verdict** is one expectation's judgement of one minute: for the sliding checks, the period of
``over_minutes`` minutes ending with it. Every evaluated minute gets a verdict, clear ones included, so that a
re-evaluation after late data or a batch-layer correction can also *clear* a minute that was violated.

**Provisional or final.** A minute's verdict is provisional while the speed layer may still change its counts,
i.e. until the minute's end is older than the allowed lateness on the topic's own clock (its newest event time,
exactly :func:`kdq.windows.is_late`); final after. Silence is judged on the wall clock instead: a silent topic's
own clock stops, and "nothing arrived" must become a verdict some time. A batch-layer correction can still
change a final verdict: that is an amendment (:mod:`kdq.incidents`), not a contradiction.

Minutes are epoch minutes (``epoch_ms // 60_000``), the unit of every period here.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kdq.anomaly import detect
from kdq.expectations_config import Expectation, ExpectationSet
from kdq.windows import is_late

MINUTE_MS = 60_000
# The topic of product-wide incidents (the stream's latency, lag, failing or long micro-batches; the batch
# layer's recompute). Parentheses are not allowed in Kafka topic names
# ([a-zA-Z0-9._-]), so it can never be mistaken for a real topic.
STREAM_TOPIC = "(stream)"


@dataclass(frozen=True)
class MinuteCounts:
    """One topic's records of one minute of event time."""

    valid: int = 0
    invalid: int = 0
    reasons: Mapping[str, int] = field(default_factory=dict)  # invalid records per reason

    @property
    def records(self) -> int:
        return self.valid + self.invalid


@dataclass(frozen=True)
class TopicMinutes:
    """A topic's per-minute counts. ``counts`` must reach :meth:`ExpectationSet.lookback_minutes` before the
    first evaluated minute; a minute missing from it had no records."""

    topic: str
    counts: Mapping[int, MinuteCounts]
    max_event_ms: int | None = None  # the topic's newest event time: the speed layer's lateness clock
    last_active_minute: int | None = None  # newest minute with records before what ``counts`` holds (silence)
    excluded_minutes: frozenset[int] = frozenset()  # kept out of anomaly baselines (past incidents)


@dataclass(frozen=True)
class StreamFigures:
    """The stream's health at one wall-clock minute: end-to-end latency and consumer lag (from its progress), the
    failed attempts of a micro-batch that keeps failing and how long the batch in flight has run (from
    kdq.stream.failures' files). None: not measured."""

    minute: int
    latency_seconds: float | None = None
    lag_records: int | None = None
    failed_attempts: int | None = None
    running_seconds: float | None = None
    recompute_minutes: float | None = None  # since the hourly recompute last ended well

    def value(self, kind: str) -> float | None:
        value = {"latency": self.latency_seconds, "lag": self.lag_records, "batch_failing": self.failed_attempts,
                 "batch_running": self.running_seconds, "recompute": self.recompute_minutes}[kind]
        return None if value is None else float(value)


@dataclass(frozen=True)
class Verdict:
    topic: str
    expectation: str  # the incident's expectation: Expectation.name, or anomaly:<kind>
    minute: int
    violated: bool
    value: float | None  # None: not enough records for a value (never a violation)
    final: bool
    check: Expectation


@dataclass(frozen=True)
class Violation:
    """Consecutive violated minutes of one (topic, expectation) in one evaluation."""

    topic: str
    expectation: str
    first_minute: int
    last_minute: int
    worst_value: float
    final: bool  # every minute of it is final

    @property
    def window_range_ms(self) -> tuple[int, int]:
        return self.first_minute * MINUTE_MS, (self.last_minute + 1) * MINUTE_MS


def _final(minute: int, reference_ms: int, allowed_lateness_seconds: int) -> bool:
    return is_late(minute * MINUTE_MS, 60, reference_ms, allowed_lateness_seconds)


def _sums(values: Mapping[int, float], first: int, last: int, over: int) -> dict[int, float]:
    """Sliding sums over ``over`` minutes ending at each minute first..last (missing minutes are 0)."""
    out, total = {}, sum(values.get(m, 0) for m in range(first - over + 1, first))
    for m in range(first, last + 1):
        total += values.get(m, 0)
        out[m] = total
        total -= values.get(m - over + 1, 0)
    return out


def _reason_count(counts: MinuteCounts, reason: str) -> int:
    # A reason names itself and every reason under it: schema:/properties/amount covers .../amount/minimum.
    return sum(n for r, n in counts.reasons.items() if r == reason or r.startswith(reason + "/"))


def _topic_verdicts(
    tm: TopicMinutes, checks: Sequence[Expectation], first: int, last: int, now_ms: int, lateness: int,
    reasons_lag: int = 0,
) -> list[Verdict]:
    reference = tm.max_event_ms if tm.max_event_ms is not None else now_ms
    records = {m: c.records for m, c in tm.counts.items()}
    invalid = {m: c.invalid for m, c in tm.counts.items()}
    out: list[Verdict] = []

    def verdict(check: Expectation, name: str, m: int, value: float | None, ref: int = reference, later: int = 0) -> None:
        violated = value is not None and check.violated(value)
        out.append(Verdict(tm.topic, name, m, violated, value, _final(m, ref, lateness + later), check))

    for check in checks:
        if check.kind == "invalid_ratio":
            total = _sums(records, first, last, check.over_minutes)
            bad = _sums(invalid, first, last, check.over_minutes)
            for m in range(first, last + 1):
                enough = total[m] >= check.min_records and total[m] > 0
                verdict(check, check.name, m, bad[m] / total[m] if enough else None)
        elif check.kind == "reason":
            assert check.reason is not None
            hits = {m: _reason_count(c, check.reason) for m, c in tm.counts.items()}
            count = _sums(hits, first, last, check.over_minutes)
            total = _sums(records, first, last, check.over_minutes)
            for m in range(first, last + 1):
                if total[m] < check.min_records or total[m] == 0:
                    value = None if check.name.startswith("reason_share:") else float(count[m])
                else:
                    value = count[m] / total[m] if check.name.startswith("reason_share:") else float(count[m])
                # The stream's reasons reach invalid_reasons up to reasons_lag after its counts: final that much later.
                verdict(check, check.name, m, value, later=reasons_lag)
        elif check.kind == "silence":
            total = _sums(records, first, last, check.over_minutes)
            active = sorted(m for m, n in records.items() if n > 0)
            for m in range(first, last + 1):
                start = m - check.over_minutes + 1
                i = bisect_left(active, start)  # active[i - 1]: the topic's last minute with records before the period
                candidates = ([active[i - 1]] if i else []) + (
                    [tm.last_active_minute] if tm.last_active_minute is not None else []
                )
                last_active = max(candidates, default=None)
                # "A topic that usually has traffic": it had records within active_within_minutes before the
                # period. One silent for longer is taken as retired, and its silence incident resolves.
                usual = last_active is not None and start - last_active <= check.active_within_minutes
                verdict(check, check.name, m, float(total[m]) if usual else None, ref=now_ms)
        elif check.kind == "anomaly":
            out.extend(_anomaly_verdicts(tm, check, first, last, reference, lateness))
    return out


def _anomaly_verdicts(
    tm: TopicMinutes, check: Expectation, first: int, last: int, reference: int, lateness: int
) -> list[Verdict]:
    """kdq.anomaly over the topic's history; a minute inside a detected anomaly is violated (value: its p)."""
    settings = check.anomaly
    assert settings is not None
    base = first - (settings.weeks * 10_080 + settings.pool_minutes)
    # Start detecting a little before `first`: m-of-n persistence needs the minutes before it.
    start = max(0, first - settings.persist_n - settings.clear_minutes - base)
    span = last - base + 1
    records = np.zeros(span, dtype=np.int64)
    invalid = np.zeros(span, dtype=np.int64)
    excluded = np.zeros(span, dtype=bool)
    for m, c in tm.counts.items():
        if base <= m <= last:
            records[m - base], invalid[m - base] = c.records, c.invalid
    for m in tm.excluded_minutes:
        if base <= m <= last:
            excluded[m - base] = True
    found: dict[tuple[str, int], float] = {}
    for anomaly in detect(records, invalid, start, settings, excluded):
        for i in range(anomaly.first_minute, anomaly.last_minute + 1):
            found[(anomaly.kind, base + i)] = anomaly.worst_p
    out = []
    for kind in ("spike", "drop", "invalid_ratio"):
        for m in range(first, last + 1):
            p = found.get((kind, m))
            # A clear minute's value is 1.0 (no evidence); a violated one's the anomaly's smallest p-value.
            out.append(Verdict(tm.topic, f"anomaly:{kind}", m, p is not None, p if p is not None else 1.0,
                               _final(m, reference, lateness), check))
    return out


def evaluate(
    expectations: ExpectationSet,
    topics: Iterable[TopicMinutes],
    first_minute: int,
    last_minute: int,
    *,
    now_ms: int,
    allowed_lateness_seconds: int,
    stream: Sequence[StreamFigures] = (),
    monitored_topics: Iterable[str] = (),
    has_rule: Mapping[str, bool] | None = None,
    reasons_lag_seconds: int = 0,
) -> list[Verdict]:
    """Every verdict of the minutes ``first_minute..last_minute`` (inclusive).

    The counts-based checks judge every minute of the range (a re-evaluation of a past range after late data
    passes that range). The stream's figures and the topic list are facts about *now*: they are judged at the
    minute of ``now_ms`` only, final at once (nothing late can change a measurement already taken).
    ``has_rule``: per monitored topic, whether a rule matches it (``RuleSet.rule_for(topic) is not None``).
    ``reasons_lag_seconds``: how long after its counts the stream's reasons may reach ``invalid_reasons``
    (:func:`kdq.spark.reasons_flush.reasons_lag_seconds`); a reason check's verdict stays provisional that much longer.
    """
    verdicts: list[Verdict] = []
    for tm in topics:
        checks = expectations.for_topic(tm.topic)
        verdicts.extend(_topic_verdicts(tm, checks, first_minute, last_minute, now_ms, allowed_lateness_seconds,
                                        reasons_lag_seconds))
    now_minute = now_ms // MINUTE_MS
    for figures in stream:
        for check in expectations.stream:
            value = figures.value(check.kind)
            if value is not None:
                verdicts.append(Verdict(STREAM_TOPIC, check.name, figures.minute, check.violated(value),
                                        float(value), True, check))
    for topic in monitored_topics:
        check = expectations.unruled_check(topic)
        if check is not None and has_rule is not None and topic in has_rule:
            value = 0.0 if has_rule[topic] else 1.0
            verdicts.append(Verdict(topic, check.name, now_minute, value > 0, value, True, check))
    return verdicts


def violations(verdicts: Iterable[Verdict]) -> list[Violation]:
    """The violated minutes grouped into runs of consecutive minutes per (topic, expectation)."""
    by_key: dict[tuple[str, str], list[Verdict]] = {}
    for v in verdicts:
        if v.violated:
            by_key.setdefault((v.topic, v.expectation), []).append(v)
    out: list[Violation] = []
    for (topic, name), run in sorted(by_key.items()):
        run.sort(key=lambda v: v.minute)
        current: Violation | None = None
        for v in run:
            assert v.value is not None
            if current is not None and v.minute == current.last_minute + 1:
                current = Violation(topic, name, current.first_minute, v.minute,
                                    v.check.worse(current.worst_value, v.value), current.final and v.final)
            else:
                if current is not None:
                    out.append(current)
                current = Violation(topic, name, v.minute, v.minute, v.value, v.final)
        if current is not None:
            out.append(current)
    return out
