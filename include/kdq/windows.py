"""Window arithmetic and topic selection, shared by both layers (pure Python).

Windows are tumbling and aligned to the epoch: window_start = floor(t / size) * size.
Spark code builds the same arithmetic as Column expressions in
:mod:`kdq.spark.transforms`; the tests check both agree.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

HOUR_MS = 3_600_000
DAY_MS = 86_400_000


def window_start_ms(event_ms: int, size_seconds: int) -> int:
    size = size_seconds * 1000
    return (event_ms // size) * size


def window_end_ms(event_ms: int, size_seconds: int) -> int:
    return window_start_ms(event_ms, size_seconds) + size_seconds * 1000


def is_late(window_start: int, size_seconds: int, max_event_ms: int | None, allowed_lateness_seconds: int) -> bool:
    """A record is too late for the speed layer when its whole window ended before
    (max event time seen on its topic) - (allowed lateness)."""
    if max_event_ms is None:
        return False
    return window_start + size_seconds * 1000 <= max_event_ms - allowed_lateness_seconds * 1000


def event_hour(window_start: int) -> str:
    """The raw archive's partition value for a window (UTC hour)."""
    return datetime.fromtimestamp(window_start / 1000, tz=UTC).strftime("%Y-%m-%d-%H")


def range_hours(from_ms: int, to_ms: int) -> list[str]:
    """``event_hour`` partition values of every window starting in [from, to)."""
    first = from_ms // HOUR_MS * HOUR_MS
    return [event_hour(ms) for ms in range(first, to_ms, HOUR_MS)]


def range_dates(from_ms: int, to_ms: int) -> list[str]:
    """``window_date`` literals (``DATE'...'``) of every window starting in [from, to)."""
    from kdq.sql_literals import date_literal

    first = from_ms // DAY_MS * DAY_MS
    return [date_literal(ms) for ms in range(first, to_ms, DAY_MS)]


def subscribe_pattern(include: str, exclude: str, always_excluded: tuple[str, ...] = ()) -> str:
    """One Java regex for Spark's subscribePattern: matches include and not exclude, whole names only.

    Spark's Kafka source (admin-based offset reader) keeps a topic when the
    regex is *found* in its name (Scala ``findFirstIn``), not when it matches
    the whole name, so the pattern is anchored with ``^...$``; the negative
    lookahead is anchored too, to exclude a name, not a prefix.
    ``always_excluded`` are literal names (our own output topics) excluded
    whatever the user's exclude pattern says.
    """
    excluded = [f"(?:{exclude})"] if exclude else []
    excluded += [re.escape(name) for name in always_excluded]
    if not excluded:
        return f"^(?:{include})$"
    return f"^(?!(?:{'|'.join(excluded)})$)(?:{include})$"


def topic_selected(topic: str, include: str, exclude: str, always_excluded: tuple[str, ...] = ()) -> bool:
    # search(), as Spark does: the anchors in the pattern make it a whole-name match.
    return re.search(subscribe_pattern(include, exclude, always_excluded), topic) is not None
