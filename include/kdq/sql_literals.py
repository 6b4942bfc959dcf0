"""SQL literals (pure Python): of instants, the literal predicates Delta prunes partitions and files with, and of
strings, for the expressions a micro-batch builds from its topics' names.

Only values kdq computes (epoch millis) or reads from Kafka (topic names) become SQL text this way; config values
never do.
"""

from __future__ import annotations

from datetime import UTC, datetime


def timestamp_literal(ms: int) -> str:
    """``TIMESTAMP'2023-11-14 22:13:20.000000'`` (UTC; sessions pin the time zone to UTC)."""
    return "TIMESTAMP'" + datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f") + "'"


def date_literal(ms: int) -> str:
    """``DATE'2023-11-14'``: the UTC date of ``ms``."""
    return "DATE'" + datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d") + "'"


def string_literal(text: str) -> str:
    """``'text'`` for Spark SQL, its backslashes and quotes escaped (Kafka's topic names need none; any string
    comes out as itself)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
