"""Expectations declared beside the rules, in ``topics.toml``: what opens an incident for a topic.

Parsed and checked by :func:`kdq.rules.load_rules` with the rest of ``topics.toml``, so a typo stops the stream
at start with the file and the key, like a broken rule. Expectations are *not* part of any rule version: they
judge the counts, they do not change them, so editing one never triggers a rebuild.

Shape (the full reference is docs/expectations.md)::

    [expectations]                       # defaults for every monitored topic
    clear_after_minutes = 10             # an incident resolves after its condition was clear this long
    invalid_ratio = { above = 0.05, over_minutes = 5, min_records = 20, worsen_at = [0.2, 0.5] }
    silence = { below = 1, over_minutes = 15, active_within_minutes = 10080 }
    anomaly = { weeks = 2, false_per_week = 0.5 }    # kdq.anomaly.AnomalySettings fields
    latency = { above_seconds = 120 }     # the stream's, not a topic's
    lag = { above_records = 1000000 }
    batch_failing = { attempts_above = 0 }  # a micro-batch failed (and is being retried) that many times
    batch_running = { above_seconds = 600 } # the micro-batch in flight has run that long (hung or blocked)
    recompute = { above_minutes = 150 }     # minutes since the hourly recompute last ended well
    unruled_topic = true                  # a monitored topic that no rule matches

    [[expectations.reason]]
    reason = "schema:/properties/amount"  # this reason and every reason under it (.../minimum, .../type)
    count_above = 100
    over_minutes = 1

    [[expectations.topic]]                # first matching entry wins, like [[topic]]
    match = "re:payments-.*"
    invalid_ratio = { above = 0.01 }      # merged over the default, key by key
    silence = false                       # off for these topics

Pure Python; must not import :mod:`kdq.rules` (which imports this module).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kdq.anomaly import AnomalySettings, alpha_for_budget

PATTERN_PREFIX = "re:"  # the same convention as kdq.rules.PATTERN_PREFIX (not imported: rules imports us)
DEFAULT_CLEAR_AFTER_MINUTES = 10
MINUTES_PER_WEEK = 7 * 24 * 60

# Per kind: allowed keys with their default (None = required). Common to every check: worsen_at, clear_after_minutes.
_COMMON = {"worsen_at": (), "clear_after_minutes": None}
_TABLE_KEYS: dict[str, dict[str, Any]] = {
    "invalid_ratio": {"above": None, "over_minutes": 5, "min_records": 20},
    "silence": {"below": 1, "over_minutes": 15, "active_within_minutes": MINUTES_PER_WEEK},
    "latency": {"above_seconds": None},
    "lag": {"above_records": None},
    "batch_failing": {"attempts_above": 0},
    "batch_running": {"above_seconds": None},
    "recompute": {"above_minutes": None},
    "reason": {"reason": None, "count_above": None, "share_above": None, "over_minutes": 1, "min_records": None},
    "anomaly": {f.name: f.default for f in dataclasses.fields(AnomalySettings)},
}
_TOP_KEYS = ("invalid_ratio", "silence", "anomaly", "latency", "lag", "batch_failing", "batch_running", "recompute",
             "unruled_topic", "reason", "topic", "clear_after_minutes")
# About the stream, so only in the defaults: its end-to-end latency and consumer lag (from its progress), a
# micro-batch failing again and again or running too long (kdq.stream.failures' files, what the supervisor reads).
# And the batch layer's: minutes since the hourly recompute last ended well (kdq.writers_journal).
_STREAM_KINDS = ("latency", "lag", "batch_failing", "batch_running", "recompute")
_ENTRY_KEYS = ("match", "invalid_ratio", "silence", "anomaly", "unruled_topic", "reason", "clear_after_minutes")
# Where a smaller value is the worse one (fewer records; a smaller p-value).
LOWER_IS_WORSE = ("silence", "anomaly")


class ExpectationError(ValueError):
    """A broken expectation; :func:`kdq.rules.load_rules` re-raises it as a RuleError naming the file."""


@dataclass(frozen=True)
class Expectation:
    """One check as it applies to a topic (or to the stream). ``name`` is the incident's ``expectation`` column."""

    # invalid_ratio | silence | anomaly | latency | lag | batch_failing | batch_running | recompute | unruled_topic |
    # reason_count:<r> | reason_share:<r>
    name: str
    kind: str
    threshold: float  # violated beyond it: above, or below for the kinds in LOWER_IS_WORSE
    over_minutes: int = 1  # the sliding period a minute's value is computed over (that minute and the ones before)
    min_records: int = 0  # fewer records in the period: no verdict against the topic (a 3-record minute pages nobody)
    reason: str | None = None
    active_within_minutes: int = 0  # silence: the topic had records this recently before the period
    anomaly: AnomalySettings | None = None
    worsen_at: tuple[float, ...] = ()  # levels past the threshold; crossing one notifies again
    clear_after_minutes: int = DEFAULT_CLEAR_AFTER_MINUTES

    @property
    def lower_is_worse(self) -> bool:
        return self.kind in LOWER_IS_WORSE

    def worse(self, a: float, b: float) -> float:
        return min(a, b) if self.lower_is_worse else max(a, b)

    def violated(self, value: float) -> bool:
        return value < self.threshold if self.lower_is_worse else value > self.threshold

    def level(self, worst: float) -> int:
        """How many worsen_at levels ``worst`` is past (0: only the threshold)."""
        return sum(1 for lvl in self.worsen_at if (worst < lvl if self.lower_is_worse else worst > lvl))


@dataclass(frozen=True)
class TopicExpectations:
    """A ``[[expectations.topic]]`` entry with the defaults merged in."""

    match: str
    is_pattern: bool
    checks: tuple[Expectation, ...]
    unruled_topic: bool
    clear_after_minutes: int = DEFAULT_CLEAR_AFTER_MINUTES

    def matches(self, topic: str) -> bool:
        return re.fullmatch(self.match, topic) is not None if self.is_pattern else topic == self.match


@dataclass(frozen=True)
class ExpectationSet:
    """Every expectation of a rules folder; empty (nothing checked) without an ``[expectations]`` table."""

    defaults: tuple[Expectation, ...] = ()
    unruled_topic: bool = False
    entries: tuple[TopicExpectations, ...] = ()
    stream: tuple[Expectation, ...] = ()  # latency, lag, batch_failing, batch_running, recompute
    clear_after_minutes: int = DEFAULT_CLEAR_AFTER_MINUTES

    def unruled_check(self, topic: str) -> Expectation | None:
        """The unruled_topic check of ``topic``, None where it is off."""
        entry = self._entry(topic)
        on, clear_after = (entry.unruled_topic, entry.clear_after_minutes) if entry else (self.unruled_topic, self.clear_after_minutes)
        return Expectation("unruled_topic", "unruled_topic", 0.0, clear_after_minutes=clear_after) if on else None

    def _entry(self, topic: str) -> TopicExpectations | None:
        return next((e for e in self.entries if e.matches(topic)), None)

    def for_topic(self, topic: str) -> tuple[Expectation, ...]:
        entry = self._entry(topic)
        return entry.checks if entry is not None else self.defaults

    def reads_reasons(self) -> bool:
        """Whether any check judges invalid reasons (``[[expectations.reason]]``): only then is an evaluation's
        read of ``invalid_reasons`` needed."""
        return any(c.kind == "reason" for c in (*self.defaults, *(c for e in self.entries for c in e.checks)))

    def ratio_breaches(self, invalid_by_topic: Mapping[str, int], input_by_topic: Mapping[str, int]) -> set[str]:
        """The topics whose invalid share in these counts alone (one micro-batch's) is above their invalid_ratio
        check's threshold, with at least its ``min_records`` records: a hint that the next evaluation may
        open an incident, which a repeating run acts on at once instead of at its next regular look. Only a hint:
        the evaluation judges the sliding period's counts, not a batch's."""
        breached = set()
        for topic, invalid in invalid_by_topic.items():
            total = int(input_by_topic.get(topic) or 0)
            if invalid <= 0 or total <= 0:
                continue
            for check in self.for_topic(topic):
                if check.kind == "invalid_ratio" and total >= check.min_records and check.violated(invalid / total):
                    breached.add(topic)
        return breached

    def lookback_minutes(self) -> int:
        """How many minutes before the first evaluated one the counts must reach (sliding periods, silence,
        anomaly baselines): what the caller reads from window_counts."""
        checks = [*self.defaults, *(c for e in self.entries for c in e.checks)]
        need = 0
        for c in checks:
            need = max(need, c.over_minutes + c.active_within_minutes)
            if c.anomaly is not None:
                s = c.anomaly
                need = max(need, s.weeks * MINUTES_PER_WEEK + s.pool_minutes + s.persist_n + s.clear_minutes)
        return need


def _close(key: str, allowed: Any) -> str:
    close = difflib.get_close_matches(key, list(allowed), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unknown(where: str, key: str, allowed: Any) -> ExpectationError:
    return ExpectationError(f"{where}: unknown key {key!r}{_close(key, allowed)}; allowed keys: {', '.join(allowed)}")


def _number(where: str, key: str, value: Any, *, integer: bool, low: float, high: float | None = None,
            low_open: bool = False) -> float:
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or value < low or (low_open and value == low) or (
        high is not None and value >= high
    ):
        what = "an integer" if integer else "a number"
        bound = f"{'>' if low_open else '>='} {low}" + (f" and < {high}" if high is not None else "")
        raise ExpectationError(f"{where}: {key} must be {what} {bound}, got {value!r}")
    return value


def _clear_after(where: str, table: dict, inherited: int) -> int:
    value = table.get("clear_after_minutes")
    return inherited if value is None else int(_number(where, "clear_after_minutes", value, integer=True, low=1))


def _worsen_at(where: str, table: dict, threshold: float, lower_is_worse: bool) -> tuple[float, ...]:
    levels = table.get("worsen_at", ())
    if not isinstance(levels, list | tuple):
        raise ExpectationError(f"{where}: worsen_at must be a list of numbers, got {levels!r}")
    previous = threshold
    for lvl in levels:
        _number(where, "worsen_at", lvl, integer=False, low=float("-inf"))
        if (lvl >= previous) if lower_is_worse else (lvl <= previous):
            order = "decreasing, below" if lower_is_worse else "increasing, above"
            raise ExpectationError(f"{where}: worsen_at must be strictly {order} the threshold {threshold}, got {levels!r}")
        previous = lvl
    return tuple(float(v) for v in levels)


def _build(kind: str, where: str, table: dict, clear_after: int) -> Expectation:
    """One check from its (merged) table; every key and value checked."""
    allowed = {**_TABLE_KEYS[kind], **_COMMON}
    for key in table:
        if key not in allowed:
            raise _unknown(where, key, allowed)
    values = {k: (table[k] if k in table else default) for k, default in _TABLE_KEYS[kind].items()}
    common = {"clear_after_minutes": _clear_after(where, table, clear_after)}

    def num(key: str, **bounds: Any) -> Any:
        if values[key] is None:
            raise ExpectationError(f"{where}: {key} is required")
        return _number(where, key, values[key], **bounds)

    if kind == "invalid_ratio":
        above = num("above", integer=False, low=0, high=1)
        return Expectation("invalid_ratio", kind, float(above), num("over_minutes", integer=True, low=1),
                           num("min_records", integer=True, low=1), worsen_at=_worsen_at(where, table, above, False),
                           **common)
    if kind == "silence":
        below = num("below", integer=True, low=1)
        return Expectation("silence", kind, float(below), num("over_minutes", integer=True, low=1),
                           active_within_minutes=num("active_within_minutes", integer=True, low=1),
                           worsen_at=_worsen_at(where, table, below, True), **common)
    if kind in ("latency", "lag", "batch_running", "recompute"):
        key = {"lag": "above_records", "recompute": "above_minutes"}.get(kind, "above_seconds")
        above = num(key, integer=kind == "lag", low=0, low_open=True)
        return Expectation(kind, kind, float(above), worsen_at=_worsen_at(where, table, above, False), **common)
    if kind == "batch_failing":
        above = num("attempts_above", integer=True, low=0)
        return Expectation(kind, kind, float(above), worsen_at=_worsen_at(where, table, above, False), **common)
    if kind == "reason":
        reason = values["reason"]
        if not isinstance(reason, str) or not reason:
            raise ExpectationError(f"{where}: reason is required, a kdq reason such as 'schema:/properties/amount'")
        if (values["count_above"] is None) == (values["share_above"] is None):
            raise ExpectationError(f"{where}: exactly one of count_above and share_above is required")
        if values["count_above"] is not None:
            name, above = f"reason_count:{reason}", num("count_above", integer=True, low=0)
            values["min_records"] = 0 if values["min_records"] is None else values["min_records"]
        else:
            name, above = f"reason_share:{reason}", num("share_above", integer=False, low=0, high=1)
            values["min_records"] = 20 if values["min_records"] is None else values["min_records"]
        return Expectation(name, "reason", float(above), num("over_minutes", integer=True, low=1),
                           num("min_records", integer=True, low=0), reason=reason,
                           worsen_at=_worsen_at(where, table, above, False), **common)
    # anomaly: kdq.anomaly's own settings; the threshold is its per-test level (a p-value: smaller is worse).
    settings_values = {}
    for f in dataclasses.fields(AnomalySettings):
        integer = isinstance(f.default, int)
        settings_values[f.name] = (int if integer else float)(
            _number(where, f.name, values[f.name], integer=integer, low=0, low_open=f.name != "pool_minutes")
        )
    settings = AnomalySettings(**settings_values)
    if settings.persist_m > settings.persist_n:
        raise ExpectationError(f"{where}: persist_m must be <= persist_n")
    return Expectation("anomaly", kind, alpha_for_budget(settings), anomaly=settings,
                       worsen_at=_worsen_at(where, table, alpha_for_budget(settings), True), **common)


def _merged(where: str, key: str, default: Any, override: Any) -> dict | None:
    """A check's table for an entry: ``false`` turns it off, a table is merged over the default key by key."""
    if override is False:
        return None
    if not isinstance(override, dict):
        raise ExpectationError(f"{where}: {key} must be a table (e.g. {key} = {{ ... }}) or false, got {override!r}")
    return {**(default or {}), **override}


def _checks(where: str, tables: dict[str, dict | None], reasons: list, clear_after: int) -> tuple[Expectation, ...]:
    checks = [_build(kind, f"{where}: {kind}", table, clear_after) for kind, table in tables.items() if table is not None]
    if not isinstance(reasons, list):
        raise ExpectationError(f"{where}: reason must be an array of tables ([[...reason]])")
    names: set[str] = set()
    for index, table in enumerate(reasons, start=1):
        if not isinstance(table, dict):
            raise ExpectationError(f"{where}: reason #{index} must be a table")
        check = _build("reason", f"{where}: reason #{index}", table, clear_after)
        if check.name in names:
            raise ExpectationError(f"{where}: reason #{index}: {check.name!r} is declared twice")
        names.add(check.name)
        checks.append(check)
    return tuple(checks)


def parse_expectations(data: Any, where: str = "[expectations]") -> ExpectationSet:
    """The ``[expectations]`` table of topics.toml (already parsed TOML) as an :class:`ExpectationSet`."""
    if not isinstance(data, dict):
        raise ExpectationError(f"{where}: must be a table")
    for key in data:
        if key not in _TOP_KEYS:
            raise _unknown(where, key, _TOP_KEYS)
    clear_after = _clear_after(where, data, DEFAULT_CLEAR_AFTER_MINUTES)
    tables: dict[str, dict | None] = {}
    for kind in ("invalid_ratio", "silence", "anomaly", *_STREAM_KINDS):
        if kind in data:
            tables[kind] = _merged(where, kind, None, data[kind])
    unruled = data.get("unruled_topic", False)
    if not isinstance(unruled, bool):
        raise ExpectationError(f"{where}: unruled_topic must be true or false, got {unruled!r}")
    all_checks = _checks(where, tables, data.get("reason", []), clear_after)
    defaults = tuple(c for c in all_checks if c.kind not in _STREAM_KINDS)
    stream = tuple(c for c in all_checks if c.kind in _STREAM_KINDS)

    entries_data = data.get("topic", [])
    if not isinstance(entries_data, list):
        raise ExpectationError(f"{where}: topic must be an array of tables ([[expectations.topic]])")
    entries = []
    for index, entry in enumerate(entries_data, start=1):
        match = entry.get("match") if isinstance(entry, dict) else None
        name = f"[[expectations.topic]] entry #{index}" + (f" (match = {match!r})" if isinstance(match, str) else "")
        if not isinstance(entry, dict):
            raise ExpectationError(f"{name}: must be a table")
        for key in entry:
            if key not in _ENTRY_KEYS:
                hint = " (the stream's checks are set in [expectations] only)" if key in _STREAM_KINDS else ""
                raise ExpectationError(str(_unknown(name, key, _ENTRY_KEYS)) + hint)
        if not isinstance(match, str) or not match:
            raise ExpectationError(f"{name}: 'match' is required (an exact topic name or 're:<regex>')")
        is_pattern = match.startswith(PATTERN_PREFIX)
        if is_pattern:
            match = match[len(PATTERN_PREFIX):]
            try:
                re.compile(match)
            except re.error as exc:
                raise ExpectationError(f"{name}: bad regex {match!r}: {exc}") from None
        entry_clear = _clear_after(name, entry, clear_after)
        merged = {k: v for k, v in tables.items() if k not in _STREAM_KINDS}
        for kind in ("invalid_ratio", "silence", "anomaly"):
            if kind in entry:
                merged[kind] = _merged(name, kind, tables.get(kind), entry[kind])
        entry_unruled = entry.get("unruled_topic", unruled)
        if not isinstance(entry_unruled, bool):
            raise ExpectationError(f"{name}: unruled_topic must be true or false, got {entry_unruled!r}")
        # An entry's reason list replaces the defaults' (reason = [] turns them off for its topics).
        checks = _checks(name, merged, entry.get("reason", data.get("reason", [])), entry_clear)
        entries.append(TopicExpectations(match, is_pattern, checks, entry_unruled, entry_clear))
    return ExpectationSet(defaults, unruled, tuple(entries), stream, clear_after)
