"""Incidents from verdicts: open, update, worsen, resolve, amend, retract — a pure state machine.

The incidents of a (topic, expectation) are a function of its per-minute verdicts **in event-time order**, not
of the order evaluations arrived in:

* an incident opens at a violated minute, extends over the violated minutes that follow it until its
  condition has been clear for ``clear_after_minutes`` — the resolving verdict (at least that many minutes after
  its last violated minute) must be *final*, so a late record cannot turn a resolved incident back;
* a violated minute after a resolved incident opens a new one.

:func:`apply` merges an evaluation's verdicts into the state (a minute's verdict from a later evaluation replaces
the earlier one, so late data and batch-layer corrections re-evaluate; one from an older evaluation, replayed
after a restart, is ignored), derives the incidents of the series it touched
again, and compares them with the stored ones. What changed becomes a new row version and, where people must
hear about it, a notification:

* ``open`` — a new incident (also a past window pushed over its threshold by a correction; also one that had
  been retracted and is violated again);
* ``worsen`` — its worst value passed one more ``worsen_at`` level;
* ``resolve`` — its condition has been clear long enough;
* ``amend`` — a change to what was already told: its first window moved (late data before it), a resolved
  incident's range or worst value changed, it went back from resolved to open, or its level went down;
* ``retract`` — its violated minutes are all clear now (late valid records diluted a ratio), or it merged
  into an earlier incident.

Extending an open incident minute by minute updates its row (last seen, worst value) without a notification.

**Idempotent and deterministic.** An incident's key is topic + expectation + its first window as first seen;
its version counts its changes. Applying the same verdicts twice derives the same incidents, changes no row and
notifies nothing; replaying the same evaluations gives the same keys, versions and notifications, so the key
and version committed with the data that caused them tell a restarted notifier what was already sent
(``Notification.id``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kdq.expectations import MINUTE_MS, Verdict
from kdq.expectations_config import Expectation

OPEN, RESOLVED, RETRACTED = "open", "resolved", "retracted"
EVENTS = ("open", "worsen", "resolve", "amend", "retract")

Series = tuple[str, str]  # (topic, expectation)


@dataclass(frozen=True)
class Incident:
    key: str
    topic: str
    expectation: str
    status: str  # open | resolved | retracted
    first_minute: int  # first violated minute (for a sliding check: the last minute of its first period)
    last_minute: int
    period_minutes: int  # the check's sliding period: the counts behind it start period - 1 minutes earlier
    worst_value: float
    threshold: float
    level: int  # worsen_at levels passed
    final: bool  # every violated minute's verdict is final
    resolved_minute: int | None  # the minute whose (final) clear verdict resolved it
    opened_at_ms: int  # the evaluation that first opened it ("first seen")
    last_seen_at_ms: int  # the evaluation that last changed its violated minutes
    updated_at_ms: int
    version: int

    @property
    def window_start_ms(self) -> int:
        """Start of the first window whose counts are behind it."""
        return (self.first_minute - self.period_minutes + 1) * MINUTE_MS

    @property
    def window_end_ms(self) -> int:
        return (self.last_minute + 1) * MINUTE_MS


@dataclass(frozen=True)
class Notification:
    event: str  # one of EVENTS
    incident: Incident  # the row as of this change

    @property
    def id(self) -> str:
        """Unique per incident change and event: a channel that already delivered it skips it."""
        return f"{self.incident.key}#v{self.incident.version}:{self.event}"


@dataclass(frozen=True)
class _Point:
    violated: bool
    value: float | None
    final: bool
    as_of: int = 0  # which counts it judged (apply's as_of): verdicts on older counts never override newer ones


@dataclass(frozen=True)
class IncidentState:
    """Incidents plus the verdicts they were derived from (those not pruned: :func:`prune`)."""

    incidents: dict[str, Incident] = field(default_factory=dict)
    points: dict[Series, dict[int, _Point]] = field(default_factory=dict)
    checks: dict[Series, Expectation] = field(default_factory=dict)
    # Per series, the first minute still held in ``points``: incidents wholly before it are settled.
    floors: dict[Series, int] = field(default_factory=dict)

    def open_incidents(self) -> list[Incident]:
        return sorted((i for i in self.incidents.values() if i.status == OPEN), key=lambda i: (i.first_minute, i.key))

    def excluded_minutes(self, topic: str) -> frozenset[int]:
        """Minutes inside the topic's incidents: kept out of its anomaly baselines (an outage is not normal)."""
        return frozenset(
            m for i in self.incidents.values() if i.topic == topic and i.status != RETRACTED
            for m in range(i.first_minute - i.period_minutes + 1, i.last_minute + 1)
        )


def incident_key(topic: str, expectation: str, first_minute: int) -> str:
    first = datetime.fromtimestamp(first_minute * 60, tz=UTC).strftime("%Y-%m-%dT%H:%MZ")
    return f"{topic}|{expectation}|{first}"


@dataclass
class _Span:
    first: int
    last: int
    worst: float
    final: bool
    resolved: int | None = None


def _derive(points: dict[int, _Point], check: Expectation) -> list[_Span]:
    spans: list[_Span] = []
    current: _Span | None = None
    for minute in sorted(points):
        point = points[minute]
        if point.violated:
            assert point.value is not None
            if current is not None and current.resolved is None:
                current.last, current.final = minute, current.final and point.final
                current.worst = check.worse(current.worst, point.value)
            else:
                current = _Span(minute, minute, point.value, point.final)
                spans.append(current)
        elif (
            current is not None and current.resolved is None and point.final
            and minute >= current.last + check.clear_after_minutes
        ):
            current.resolved = minute
    return spans


def _same(a: Incident, b: Incident) -> bool:
    ignore = {"version", "updated_at_ms", "last_seen_at_ms"}
    return all(getattr(a, f.name) == getattr(b, f.name) for f in dataclasses.fields(Incident) if f.name not in ignore)


def _events(old: Incident | None, new: Incident) -> list[str]:
    if old is None or old.status == RETRACTED:
        return ["open", "resolve"] if new.status == RESOLVED else ["open"]
    events = []
    moved_first = new.first_minute != old.first_minute
    if old.status == RESOLVED and new.status == OPEN:
        events.append("amend")  # reopened: late data violated a minute inside its clear period
    elif old.status == RESOLVED and (moved_first or new.last_minute != old.last_minute or new.worst_value != old.worst_value):
        events.append("amend")
    elif moved_first or new.level < old.level:
        events.append("amend")
    if new.level > old.level:
        events.append("worsen")
    if old.status == OPEN and new.status == RESOLVED:
        events.append("resolve")
    return events


def _reconcile(
    state_incidents: dict[str, Incident], series: Series, spans: list[_Span], check: Expectation, floor: int,
    now_ms: int,
) -> list[Notification]:
    topic, name = series
    mine = sorted(
        (i for i in state_incidents.values() if (i.topic, i.expectation) == series and i.last_minute >= floor),
        key=lambda i: (i.first_minute, i.key),
    )
    live = [i for i in mine if i.status != RETRACTED]
    taken: set[str] = set()
    notes: list[Notification] = []
    for span in spans:
        # Keep the key of the earliest stored incident this span overlaps: late data that moves the first
        # window or bridges two incidents amends the incident people were told about instead of a new one.
        old = next((i for i in live if i.key not in taken and i.first_minute <= span.last and i.last_minute >= span.first),
                   None)
        if old is None:
            old = state_incidents.get(incident_key(topic, name, span.first))  # a retracted one violated again
        key = old.key if old is not None else incident_key(topic, name, span.first)
        taken.add(key)
        new = Incident(
            key=key, topic=topic, expectation=name, status=OPEN if span.resolved is None else RESOLVED,
            first_minute=span.first, last_minute=span.last, period_minutes=check.over_minutes,
            worst_value=span.worst, threshold=check.threshold, level=check.level(span.worst), final=span.final,
            resolved_minute=span.resolved, opened_at_ms=old.opened_at_ms if old is not None else now_ms,
            last_seen_at_ms=now_ms, updated_at_ms=now_ms, version=1,
        )
        if old is not None and _same(old, new):
            continue
        if old is not None:
            seen = old.last_seen_at_ms if (old.first_minute, old.last_minute) == (new.first_minute, new.last_minute) else now_ms
            new = dataclasses.replace(new, version=old.version + 1, last_seen_at_ms=seen)
        state_incidents[key] = new
        notes.extend(Notification(event, new) for event in _events(old, new))
    for old in live:
        if old.key not in taken:
            new = dataclasses.replace(old, status=RETRACTED, version=old.version + 1, updated_at_ms=now_ms)
            state_incidents[old.key] = new
            notes.append(Notification("retract", new))
    return notes


def apply(
    state: IncidentState, verdicts: Iterable[Verdict], now_ms: int, as_of: int | None = None
) -> tuple[IncidentState, list[Notification]]:
    """Merge ``verdicts`` (one evaluation, :func:`kdq.expectations.evaluate`) into ``state``; the new state and
    the notifications of what changed, in a deterministic order. ``state`` itself is not modified.

    ``as_of`` orders evaluations by the counts they judged (default ``now_ms``). The wiring passes the
    ``window_counts`` table version it read, so that the newest counts win whatever the wall clocks of the
    stream and the batch layer say, and a replayed evaluation of older counts changes nothing."""
    as_of = now_ms if as_of is None else as_of
    points = {s: dict(p) for s, p in state.points.items()}
    checks = dict(state.checks)
    touched: set[Series] = set()
    for v in verdicts:
        series = (v.topic, v.expectation)
        if v.minute < state.floors.get(series, v.minute):
            continue  # settled (pruned) history: nothing to compare it with
        point = _Point(v.violated, v.value, v.final, as_of)
        checks[series] = v.check
        stored = points.setdefault(series, {}).get(v.minute)
        if stored is not None and stored.as_of > as_of:
            continue  # a replayed older evaluation: what it said was already superseded
        points[series][v.minute] = point
        if stored is None or (stored.violated, stored.value, stored.final) != (v.violated, v.value, v.final):
            touched.add(series)
    incidents = dict(state.incidents)
    notes: list[Notification] = []
    for series in sorted(touched):
        spans = _derive(points[series], checks[series])
        notes.extend(_reconcile(incidents, series, spans, checks[series], state.floors.get(series, -1), now_ms))
    return IncidentState(incidents, points, checks, dict(state.floors)), notes


def prune(state: IncidentState, before_minute: int) -> IncidentState:
    """Forget verdicts before ``before_minute`` (e.g. older than the batch layer's reach), except those of
    incidents still open or reaching past the cut: those stay re-derivable whole."""
    points: dict[Series, dict[int, _Point]] = {}
    floors = dict(state.floors)
    for series, series_points in state.points.items():
        mine = [i for i in state.incidents.values() if (i.topic, i.expectation) == series and i.status != RETRACTED]
        cut = before_minute
        changed = True
        while changed:  # an incident straddling the cut moves it to the incident's first minute
            changed = False
            for i in mine:
                if (i.status == OPEN or i.last_minute >= cut) and i.first_minute < cut:
                    cut, changed = i.first_minute, True
        points[series] = {m: p for m, p in series_points.items() if m >= cut}
        floors[series] = max(floors.get(series, cut), cut)
    return IncidentState(dict(state.incidents), points, dict(state.checks), floors)


def incident_row(incident: Incident, sample: str | None = None) -> dict[str, object]:
    """The incident as a row of :data:`kdq.tables.INCIDENTS` (column order and names)."""

    def ts(ms: int | None) -> datetime | None:
        return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)

    i = incident
    return {
        "incident_key": i.key, "topic": i.topic, "expectation": i.expectation, "status": i.status,
        "window_start": ts(i.window_start_ms), "window_end": ts(i.window_end_ms),
        "first_window": ts(i.first_minute * MINUTE_MS), "last_window": ts(i.last_minute * MINUTE_MS),
        "worst_value": i.worst_value, "threshold": i.threshold, "level": i.level, "final": i.final,
        "resolved_window": ts(None if i.resolved_minute is None else i.resolved_minute * MINUTE_MS),
        "opened_at": ts(i.opened_at_ms), "last_seen_at": ts(i.last_seen_at_ms), "updated_at": ts(i.updated_at_ms),
        "version": i.version, "sample": sample,
    }


def incident_from_row(row: dict[str, object]) -> Incident:
    """The inverse of :func:`incident_row`: a stored ``kdq.incidents`` row back as an :class:`Incident`."""

    def ms(value: object) -> int | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return int(round(moment.timestamp() * 1000))

    def minute(value: object) -> int | None:
        at = ms(value)
        return None if at is None else at // MINUTE_MS

    first, last = minute(row["first_window"]), minute(row["last_window"])
    start = minute(row["window_start"])
    assert first is not None and last is not None and start is not None
    return Incident(
        key=str(row["incident_key"]), topic=str(row["topic"]), expectation=str(row["expectation"]),
        status=str(row["status"]), first_minute=first, last_minute=last, period_minutes=first - start + 1,
        worst_value=float(row["worst_value"]), threshold=float(row["threshold"]),  # type: ignore[arg-type]
        level=int(row["level"]), final=bool(row["final"]), resolved_minute=minute(row["resolved_window"]),  # type: ignore[call-overload]
        opened_at_ms=ms(row["opened_at"]) or 0, last_seen_at_ms=ms(row["last_seen_at"]) or 0,
        updated_at_ms=ms(row["updated_at"]) or 0, version=int(row["version"]),  # type: ignore[call-overload]
    )


def evaluation_floor(stored: Iterable[Incident], horizon_first_minute: int) -> int:
    """The first minute a stateless run must re-evaluate: ``horizon_first_minute``, moved back to the first
    minute of every incident that is open or reaches past it (the prune rule of :func:`prune`), so that no
    stored incident is re-derived from part of its minutes (it would look moved, or retracted)."""
    live = [i for i in stored if i.status != RETRACTED]
    cut, changed = horizon_first_minute, True
    while changed:
        changed = False
        for i in live:
            if (i.status == OPEN or i.last_minute >= cut) and i.first_minute < cut:
                cut, changed = i.first_minute, True
    return cut


def state_from_incidents(stored: Iterable[Incident], floor_minute: int, measured_now: Iterable[Series] = ()) -> IncidentState:
    """The state of a run that keeps no verdicts between runs: the stored incidents, every series settled
    before ``floor_minute`` (:func:`evaluation_floor`; the run re-evaluates every minute from there).

    The series of ``measured_now`` (the stream's latency and lag, unruled topics) get one verdict per run, at
    the run's minute, so their past cannot be re-evaluated: their incidents' minutes are seeded back as
    violated (at the worst value, final) with the clear minute that resolved them; the run's verdict extends,
    clears or resolves them."""
    incidents = {i.key: i for i in stored}
    now_series = set(measured_now)
    points: dict[Series, dict[int, _Point]] = {}
    floors: dict[Series, int] = {}
    for i in incidents.values():
        series = (i.topic, i.expectation)
        floors[series] = floor_minute
        if series in now_series and i.status != RETRACTED:
            seeded = points.setdefault(series, {})
            for m in range(i.first_minute, i.last_minute + 1):
                seeded[m] = _Point(True, i.worst_value, True, 0)
            if i.resolved_minute is not None:  # and the clear verdict that resolved it
                seeded[i.resolved_minute] = _Point(False, None, True, 0)
    return IncidentState(incidents, points, {}, floors)
