"""SQL literals of instants (pure Python): the literal predicates Delta prunes partitions and files with.

Only values kdq computes (epoch millis) become SQL text this way; config values never do.
"""

from __future__ import annotations

from datetime import UTC, datetime


def timestamp_literal(ms: int) -> str:
    """``TIMESTAMP'2023-11-14 22:13:20.000000'`` (UTC; sessions pin the time zone to UTC)."""
    return "TIMESTAMP'" + datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f") + "'"


def date_literal(ms: int) -> str:
    """``DATE'2023-11-14'``: the UTC date of ``ms``."""
    return "DATE'" + datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d") + "'"
