"""Daily Delta maintenance: compaction of closed partitions, VACUUM, raw-archive retention.

Only partitions older than today (UTC) are compacted or deleted: the stream MERGEs into today's
``window_date`` / ``event_hour`` partitions every few seconds, and an OPTIMIZE that rewrote the files a
MERGE read would make one of them fail with a concurrent-modification conflict. Late data older than
``stream.allowed_lateness_seconds`` never reaches a closed partition, so yesterday's are settled by the
time this runs (a stream or summary lateness over a day moves the boundary back accordingly). Unpartitioned tables are only
vacuumed. The stream trims its own ledger and progress files and Spark cleans its checkpoint metadata
(``spark.sql.streaming.minBatchesToRetain``), so neither is done here.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

MIN_VACUUM_RETAIN_HOURS = 168  # Delta's default safety check: readers and the stream may hold older snapshots


def closed_before(config: Any, today: dt.date) -> dt.date:
    """First date still open to writes: today, or earlier when allowed lateness exceeds a day."""
    summaries = getattr(config, "summaries", None) or ()
    lateness = max([int(config.stream.allowed_lateness_seconds), *(int(s.allowed_lateness_seconds) for s in summaries)])
    lateness_days = -(-lateness // 86400)  # ceil
    return today - dt.timedelta(days=max(lateness_days - 1, 0))


def maintenance_statements(
    config: Any, today: dt.date, archive_retention_days: int, vacuum_retain_hours: int = MIN_VACUUM_RETAIN_HOURS
) -> list[str]:
    """The SQL the maintenance run executes, in order (pure, so tests can check the partition bounds)."""
    from kdq.spark.tables import table_path
    from kdq.tables import ALL_TABLES, RAW_ARCHIVE, SUMMARIES, WINDOW_COUNTS

    if vacuum_retain_hours < MIN_VACUUM_RETAIN_HOURS:
        raise ValueError(f"vacuum_retain_hours must be >= {MIN_VACUUM_RETAIN_HOURS}, got {vacuum_retain_hours}")
    if archive_retention_days < 1:
        raise ValueError(f"archive_retention_days must be >= 1, got {archive_retention_days}")
    open_from = closed_before(config, today)
    archive = f"delta.`{table_path(config, RAW_ARCHIVE)}`"
    statements = [
        f"OPTIMIZE {archive} WHERE event_hour < '{open_from:%Y-%m-%d}-00'",
        f"OPTIMIZE delta.`{table_path(config, WINDOW_COUNTS)}` WHERE window_date < DATE'{open_from:%Y-%m-%d}'",
        # The stream MERGEs summaries once per micro-batch as well: many small files per day.
        f"OPTIMIZE delta.`{table_path(config, SUMMARIES)}` WHERE window_date < DATE'{open_from:%Y-%m-%d}'",
    ]
    cutoff = min(today - dt.timedelta(days=archive_retention_days), open_from)
    statements.append(f"DELETE FROM {archive} WHERE event_hour < '{cutoff:%Y-%m-%d}-00'")
    statements += [
        f"VACUUM delta.`{table_path(config, spec)}` RETAIN {vacuum_retain_hours} HOURS" for spec in ALL_TABLES
    ]
    return statements


def run_maintenance(
    config: Any,
    archive_retention_days: int = 30,
    vacuum_retain_hours: int = MIN_VACUUM_RETAIN_HOURS,
    today: dt.date | None = None,
) -> dict:
    """Run the statements in one local session; returns what each did."""
    from kdq.spark.session import build_session
    from kdq.spark.tables import ensure_tables

    today = today or dt.datetime.now(dt.UTC).date()
    statements = maintenance_statements(config, today, archive_retention_days, vacuum_retain_hours)
    spark = build_session(config, app_name="kdq-maintenance")
    try:
        ensure_tables(spark, config)
        results = {}
        for statement in statements:
            results[statement] = [row.asDict(recursive=True) for row in spark.sql(statement).collect()]
        return {"statements": len(statements), "results": results}
    finally:
        spark.stop()
