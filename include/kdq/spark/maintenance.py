"""Daily Delta maintenance: compaction of closed partitions, raw-archive retention, VACUUM.

Only partitions older than today (UTC) are compacted: the stream MERGEs into today's ``window_date`` /
``event_hour`` partitions every few seconds, and an OPTIMIZE that rewrote the files a MERGE read would
make one of them fail with a concurrent-modification conflict. Late data older than
``stream.allowed_lateness_seconds`` never reaches a closed partition, so yesterday's are settled by the
time this runs (a stream or summary lateness over a day moves the boundary back accordingly).
Unpartitioned tables are only vacuumed. The stream trims its own ledger and progress files and Spark
cleans its checkpoint metadata (``spark.sql.streaming.minBatchesToRetain``), so neither is done here.

**Retention keeps every count.** Raw rows older than ``archive_retention_days`` are *retired* before
they are deleted: their counts go to ``retired_counts``, and every later recompute of their windows
counts retired + archived rows, so a record arriving after its hour was deleted adds to the full count
instead of replacing it (:mod:`kdq.spark.retention`). Retirement waits while the stream has an
uncommitted micro-batch ingested before the retirement instant (its rows would escape it).

Every step goes through Delta's table API: no path or other config value is spliced into SQL text.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from kdq.job_reports import MaintenanceReport

log = logging.getLogger("kdq.maintenance")

MIN_VACUUM_RETAIN_HOURS = 168  # Delta's default safety check: readers and the stream may hold older snapshots


@dataclass(frozen=True)
class Step:
    """One maintenance action on one table: ``optimize`` (``where``: the closed partitions),
    ``retire`` (raw archive: rows of hours before ``cutoff``, ingested before ``retire_before_ms``)
    or ``vacuum``."""

    action: str
    table: str
    where: str | None = None
    cutoff: dt.date | None = None
    retire_before_ms: int | None = None
    retain_hours: int | None = None

    def describe(self) -> str:
        if self.action == "optimize":
            return f"OPTIMIZE {self.table} WHERE {self.where}"
        if self.action == "retire":
            before = dt.datetime.fromtimestamp(self.retire_before_ms / 1000, tz=dt.UTC).isoformat()
            return f"RETIRE+DELETE {self.table} WHERE event_hour < '{self.cutoff:%Y-%m-%d}-00' AND ingest_time < '{before}'"
        return f"VACUUM {self.table} RETAIN {self.retain_hours} HOURS"


def closed_before(config: Any, today: dt.date) -> dt.date:
    """First date still open to writes: today, or earlier when allowed lateness exceeds a day."""
    summaries = getattr(config, "summaries", None) or ()
    lateness = max([int(config.stream.allowed_lateness_seconds), *(int(s.allowed_lateness_seconds) for s in summaries)])
    lateness_days = -(-lateness // 86400)  # ceil
    return today - dt.timedelta(days=max(lateness_days - 1, 0))


def maintenance_plan(
    config: Any, today: dt.date, archive_retention_days: int, vacuum_retain_hours: int = MIN_VACUUM_RETAIN_HOURS
) -> list[Step]:
    """The steps the maintenance run executes, in order (pure, so tests can check the partition bounds)."""
    from kdq.spark.retention import retirement_instant
    from kdq.tables import ALL_TABLES, RAW_ARCHIVE, SUMMARIES, WINDOW_COUNTS

    if vacuum_retain_hours < MIN_VACUUM_RETAIN_HOURS:
        raise ValueError(f"vacuum_retain_hours must be >= {MIN_VACUUM_RETAIN_HOURS}, got {vacuum_retain_hours}")
    if archive_retention_days < 1:
        raise ValueError(f"archive_retention_days must be >= 1, got {archive_retention_days}")
    open_from = closed_before(config, today)
    steps = [
        Step("optimize", RAW_ARCHIVE.name, where=f"event_hour < '{open_from:%Y-%m-%d}-00'"),
        Step("optimize", WINDOW_COUNTS.name, where=f"window_date < DATE'{open_from:%Y-%m-%d}'"),
        # The stream MERGEs summaries once per micro-batch as well: many small files per day.
        Step("optimize", SUMMARIES.name, where=f"window_date < DATE'{open_from:%Y-%m-%d}'"),
    ]
    cutoff = min(today - dt.timedelta(days=archive_retention_days), open_from)
    steps.append(Step("retire", RAW_ARCHIVE.name, cutoff=cutoff, retire_before_ms=retirement_instant(today)))
    steps += [Step("vacuum", spec.name, retain_hours=vacuum_retain_hours) for spec in ALL_TABLES]
    return steps


def run_step(spark: Any, config: Any, step: Step) -> Any:
    """Execute one step; returns what it reports (collected rows, or the retention summary)."""
    from delta.tables import DeltaTable

    from kdq.spark.batch_layer import stream_caught_up
    from kdq.spark.retention import retire_and_delete
    from kdq.spark.tables import table_path
    from kdq.tables import ALL_TABLES

    spec = next(s for s in ALL_TABLES if s.name == step.table)
    table = DeltaTable.forPath(spark, table_path(config, spec))
    if step.action == "optimize":
        return [row.asDict(recursive=True) for row in table.optimize().where(step.where).executeCompaction().collect()]
    if step.action == "vacuum":
        table.vacuum(float(step.retain_hours))
        return "vacuumed"
    if stream_caught_up(spark, config, step.retire_before_ms) is False:
        from kdq.writers_journal import WAITS

        WAITS.stream_behind()  # the writers journal: skipped because the stream is behind
        log.warning(
            "archive retention skipped: the stream has a micro-batch ingested before %s that has not committed "
            "(its rows would escape the retirement); the next maintenance run retires them", step.describe(),
        )
        return {"skipped": "stream behind the retirement instant"}
    return retire_and_delete(spark, config, step.cutoff, step.retire_before_ms)


def run_maintenance(
    spark: Any, config: Any, archive_retention_days: int, vacuum_retain_hours: int, today: dt.date
) -> MaintenanceReport:
    """Run the plan's steps in ``spark``; returns what each did (spark_jobs/maintenance.py prints it)."""
    from kdq.spark.tables import ensure_tables

    steps = maintenance_plan(config, today, archive_retention_days, vacuum_retain_hours)
    ensure_tables(spark, config)
    results = {}
    for step in steps:
        log.info("maintenance: %s", step.describe())
        results[step.describe()] = run_step(spark, config, step)
    return MaintenanceReport(today=today.isoformat(), steps=len(steps), results=results)
