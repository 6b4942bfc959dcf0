"""Daily Delta maintenance: compaction of closed partitions, raw-archive retention, VACUUM, each only where
something changed.

Only partitions older than today (UTC) are compacted: the stream MERGEs into today's ``window_date`` /
``event_hour`` partitions every few seconds, and an OPTIMIZE that rewrote the files a MERGE read would
make one of them fail with a concurrent-modification conflict. Late data older than
``stream.allowed_lateness_seconds`` never reaches a closed partition, so yesterday's are settled by the
time this runs (a stream or summary lateness over a day moves the boundary back accordingly).
Unpartitioned tables are only vacuumed. The stream trims its own ledger and progress files and Spark
cleans its checkpoint metadata (``spark.sql.streaming.minBatchesToRetain``), so neither is done here.

**Work proportional to what changed**. Before planning, the run reads each table's current
snapshot from its Delta log (:func:`table_state`: the file list of the last checkpoint plus the commits
after it, what every read of the table loads anyway; no directory listing, no data file read) and its
last commits (``DeltaTable.history(32)``), and :func:`maintenance_plan` (pure) decides from that:

* **OPTIMIZE** only the closed partitions that hold two or more files below OPTIMIZE's minimum size
  (``spark.databricks.delta.optimize.minFileSize``): the partitions that received files since they were
  last compacted (a compacted small partition is one file), with a ``WHERE`` naming exactly them
  (``window_date IN (DATE'…', …)``, ``event_hour IN ('…', …)``); no OPTIMIZE at all when there are none.
  A snapshot's file list rather than the commits since the last OPTIMIZE: an hour partition written
  before the last run's OPTIMIZE while it was still open (00:00-03:00 of that day) would be missed by the
  latter, and a day of the stream's 5-second micro-batches is ~17,000 commit files to read per table.
* **Retention** only when the archive has a partition (``event_hour``) before the cutoff.
* **VACUUM** ``LITE`` (Delta reads the removed files from the log since the last VACUUM instead of listing
  the table's directory), a ``FULL`` one (listing, also removes files of writes that died before their
  commit) once a week (:data:`FULL_VACUUM_WEEKDAY`) or when ``LITE`` cannot run (the log since the last
  VACUUM was cleaned up); no ``LITE`` one on a table whose last data commit was vacuumed at least the
  retention later (every file it removed is gone; only VACUUM commits since), and none, ``FULL`` included, on
  a table created less than the retention ago (no file in its folder can be old enough yet: a new
  deployment's first week, the local run's demo tables, vacuumed nothing and took most of the run's minutes).

**Retention keeps every count.** Raw rows older than ``archive_retention_days`` are *retired* before
they are deleted: their counts go to ``retired_counts``, and every later recompute of their windows
counts retired + archived rows, so a record arriving after its hour was deleted adds to the full count
instead of replacing it (:mod:`kdq.spark.retention`). Retirement waits while the stream has an
uncommitted micro-batch ingested before the retirement instant (its rows would escape it).

No path or other config value is spliced into SQL text: OPTIMIZE and retention go through Delta's table
API, VACUUM ``LITE`` (SQL only) names the table as registered in the session's catalog (the validated
``spark.database`` and the table's constant name); the ``WHERE`` literals are dates and hours parsed and
re-formatted by this module.

The job runs beside the stream and the SQL endpoint without taking their cores: one core
(``local[1]``, ``spark.cores.max=1``) at a lower CPU priority (:func:`kdq.spark.submit.capped_master`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kdq.delta_log import HISTORY_LOOKBACK, WINDOW_HOUR, TableMissing, TableState, partition_key_column, readable
from kdq.job_reports import MaintenanceReport
from kdq.tables import ALL_TABLES, RAW_ARCHIVE, SUMMARIES, WINDOW_COUNTS

log = logging.getLogger("kdq.maintenance")

MIN_VACUUM_RETAIN_HOURS = 168  # Delta's default safety check: readers and the stream may hold older snapshots
FULL_VACUUM_WEEKDAY = 6  # Sunday (date.weekday()): the weekly VACUUM that lists the directories

_HOUR = re.compile(r"\d{4}-\d{2}-\d{2}-\d{2}")
# The tables whose file lists the plan reads (compaction, retention); the others only their last commits.
_PLANNED_FROM_FILES = frozenset({RAW_ARCHIVE.name, WINDOW_COUNTS.name, SUMMARIES.name})


@dataclass(frozen=True)
class Step:
    """One maintenance action on one table: ``optimize`` (``where``: the closed partitions),
    ``retire`` (raw archive: rows of hours before ``cutoff``, ingested before ``retire_before_ms``)
    or ``vacuum`` (``mode``: LITE or FULL). ``skipped``: why the step does nothing this run (None: it runs)."""

    action: str
    table: str
    where: str | None = None
    cutoff: dt.date | None = None
    retire_before_ms: int | None = None
    retain_hours: int | None = None
    mode: str = "LITE"
    skipped: str | None = None
    partitions: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.action == "optimize":
            return f"OPTIMIZE {self.table} WHERE {self.where}" if self.where else f"OPTIMIZE {self.table}"
        if self.action == "retire":
            before = dt.datetime.fromtimestamp(self.retire_before_ms / 1000, tz=dt.UTC).isoformat()
            return f"RETIRE+DELETE {self.table} WHERE event_hour < '{self.cutoff:%Y-%m-%d}-00' AND ingest_time < '{before}'"
        return f"VACUUM {self.table} {self.mode} RETAIN {self.retain_hours} HOURS"


def closed_before(config: Any, today: dt.date) -> dt.date:
    """First date still open to writes: today, or earlier when allowed lateness exceeds a day."""
    summaries = getattr(config, "summaries", None) or ()
    lateness = max([int(config.stream.allowed_lateness_seconds), *(int(s.allowed_lateness_seconds) for s in summaries)])
    lateness_days = -(-lateness // 86400)  # ceil
    return today - dt.timedelta(days=max(lateness_days - 1, 0))


def _partition_literal(column: str, value: str) -> tuple[str, str] | None:
    """(sort key, SQL literal) of a partition value read from the log, or None when it is not one kdq writes
    (so nothing but a re-formatted date or hour reaches the SQL text)."""
    try:
        if column == "window_date":
            day = dt.date.fromisoformat(value)
            return f"{day:%Y-%m-%d}", f"DATE'{day:%Y-%m-%d}'"
        if column in ("event_hour", WINDOW_HOUR) and _HOUR.fullmatch(value):
            hour = dt.datetime.strptime(value, "%Y-%m-%d-%H")
            return f"{hour:%Y-%m-%d-%H}", f"'{hour:%Y-%m-%d-%H}'" if column == "event_hour" else f"{hour.hour}"
    except (TypeError, ValueError):
        pass
    return None


def _open_key(column: str, open_from: dt.date | str) -> str:
    """The first partition key still open to writes: ``open_from`` is a date (its first hour) or an hour key."""
    if isinstance(open_from, str):
        return open_from if column != "window_date" else open_from[:10]
    return f"{open_from:%Y-%m-%d}" if column == "window_date" else f"{open_from:%Y-%m-%d}-00"


def compaction_where(
    column: str, compactable: Iterable[str], open_from: dt.date | str
) -> tuple[str | None, tuple[str, ...]]:
    """The OPTIMIZE predicate naming exactly the closed ones of ``compactable`` (partition values of
    ``column``; hour keys for :data:`WINDOW_HOUR`), and those values, sorted; (None, ()) when there are none.
    ``open_from``: the first date, or hour key ("%Y-%m-%d-%H"), still open to writes."""
    parsed = sorted({p for value in compactable if (p := _partition_literal(column, value)) is not None})
    first_open = _open_key(column, open_from)
    chosen = [(key, literal) for key, literal in parsed if key < first_open]
    if not chosen:
        return None, ()
    if column == WINDOW_HOUR:
        by_date: dict[str, list[str]] = {}
        for key, literal in chosen:
            by_date.setdefault(key[:10], []).append(literal)
        where = " OR ".join(
            f"(window_date = DATE'{day}' AND window_hour IN ({', '.join(hours)}))" for day, hours in by_date.items()
        )
    else:
        where = f"{column} IN ({', '.join(literal for _, literal in chosen)})"
    return where, tuple(key for key, _ in chosen)


def first_open_hour(lateness_seconds: int, now_ms: int) -> str:
    """The hour key ("%Y-%m-%d-%H") of the first hour whose windows may still get a record counted by the stream
    with this allowed lateness at ``now_ms``: earlier hours are closed."""
    return dt.datetime.fromtimestamp((now_ms - lateness_seconds * 1000) / 1000, tz=dt.UTC).strftime("%Y-%m-%d-%H")


def closed_hours_plan(config: Any, tables: Mapping[str, TableState], now_ms: int) -> list[Step]:
    """OPTIMIZE steps for the closed hours of today (and earlier) with files to compact, in the archive and the
    window tables: run by the hourly batch layer (:func:`compact_closed_hours`) so that the stream's micro-batch
    files do not pile up until the nightly maintenance (each live file costs every snapshot of the table, and
    every reader of the day). An hour is closed once its last window is past the allowed lateness of what
    the stream writes there: the counts' (``stream.allowed_lateness_seconds``) in the archive and
    ``window_counts``, the longest summary's in ``summaries``. The stream's archive appends never conflict with
    a compaction; the batch layer's late corrections into a compacted hour are compacted by a later run."""

    counts_lateness = int(config.stream.allowed_lateness_seconds)
    summaries = getattr(config, "summaries", None) or ()
    summaries_lateness = max([counts_lateness, *(int(s.allowed_lateness_seconds) for s in summaries)])
    steps = []
    for spec, lateness in ((RAW_ARCHIVE, counts_lateness), (WINDOW_COUNTS, counts_lateness), (SUMMARIES, summaries_lateness)):
        open_hour = first_open_hour(lateness, now_ms)
        where, chosen = compaction_where(partition_key_column(spec), tables[spec.name].compactable, open_hour)
        skipped = None if where else "no closed hour has files added since it was compacted"
        steps.append(Step("optimize", spec.name, where=where, partitions=chosen, skipped=skipped))
    return steps


def vacuum_mode(today: dt.date) -> str:
    return "FULL" if today.weekday() == FULL_VACUUM_WEEKDAY else "LITE"


def younger_than(state: TableState, retain_hours: int, now_ms: int | None) -> bool:
    """The table was created less than ``retain_hours`` before ``now_ms`` (False when either is unknown)."""
    return state.created_ms is not None and now_ms is not None and now_ms - state.created_ms < retain_hours * 3_600_000


def vacuum_needed(state: TableState, retain_hours: int, now_ms: int | None = None) -> bool:
    """False when every file the table's data commits removed was already eligible at a completed VACUUM
    (the newest data commit is at least ``retain_hours`` older than a VACUUM after it), or when the table was
    created less than ``retain_hours`` before ``now_ms`` (nothing it removed is old enough to go)."""
    if younger_than(state, retain_hours, now_ms):
        return False
    if state.last_data_commit_ms is None or state.last_vacuum_ms is None:
        return True
    return state.last_vacuum_ms - state.last_data_commit_ms < retain_hours * 3_600_000


def maintenance_plan(
    config: Any,
    today: dt.date,
    archive_retention_days: int,
    vacuum_retain_hours: int = MIN_VACUUM_RETAIN_HOURS,
    tables: Mapping[str, TableState] | None = None,
    now_ms: int | None = None,
) -> list[Step]:
    """The steps the maintenance run executes, in order (pure, so tests can check the partition bounds).

    ``tables`` (:func:`table_state` of each table): what changed; without it every step runs on its whole
    range (every closed partition, a full retention pass, a VACUUM of every table). ``now_ms``: the run's
    instant, for the tables' ages (None: ages unknown, every table old enough)."""
    from kdq.spark.retention import retirement_instant

    if vacuum_retain_hours < MIN_VACUUM_RETAIN_HOURS:
        raise ValueError(f"vacuum_retain_hours must be >= {MIN_VACUUM_RETAIN_HOURS}, got {vacuum_retain_hours}")
    if archive_retention_days < 1:
        raise ValueError(f"archive_retention_days must be >= 1, got {archive_retention_days}")
    open_from = closed_before(config, today)
    # The stream MERGEs summaries once per micro-batch as well: many small files per day.
    compacted = ((RAW_ARCHIVE, f"event_hour < '{open_from:%Y-%m-%d}-00'"),
                 (WINDOW_COUNTS, f"window_date < DATE'{open_from:%Y-%m-%d}'"),
                 (SUMMARIES, f"window_date < DATE'{open_from:%Y-%m-%d}'"))
    steps = []
    for spec, everything in compacted:
        if tables is None:
            steps.append(Step("optimize", spec.name, where=everything))
            continue
        where, chosen = compaction_where(partition_key_column(spec), tables[spec.name].compactable, open_from)
        skipped = None if where else "no closed partition has files added since it was compacted"
        steps.append(Step("optimize", spec.name, where=where, partitions=chosen, skipped=skipped))
    cutoff = min(today - dt.timedelta(days=archive_retention_days), open_from)
    retire = Step("retire", RAW_ARCHIVE.name, cutoff=cutoff, retire_before_ms=retirement_instant(today))
    if tables is not None and not any(
        (p := _partition_literal("event_hour", value)) and p[0] < f"{cutoff:%Y-%m-%d}-00"
        for value in tables[RAW_ARCHIVE.name].partitions
    ):
        retire = dataclasses.replace(retire, skipped=f"no archive partition before {cutoff:%Y-%m-%d}")
    steps.append(retire)
    mode = vacuum_mode(today)
    for spec in ALL_TABLES:
        skipped = None
        state = tables[spec.name] if tables is not None else None
        if state is not None and younger_than(state, vacuum_retain_hours, now_ms):
            # FULL too: every file in the table's folder was written after the table was created, so none is
            # older than the retention yet (a local run started on a Sunday listed every folder for nothing).
            skipped = f"the table is younger than the {vacuum_retain_hours} hours retention: nothing it removed can go yet"
        elif state is not None and mode == "LITE" and not vacuum_needed(state, vacuum_retain_hours, now_ms):
            skipped = f"no data commit since a VACUUM at least {vacuum_retain_hours} hours after the last one"
        steps.append(Step("vacuum", spec.name, retain_hours=vacuum_retain_hours, mode=mode, skipped=skipped))
    return steps


# -- reading the Delta log ----------------------------------------------------------------------------------


def table_state(spark: Any, config: Any, spec: Any, files: bool = True) -> TableState:
    """:class:`TableState` of ``spec``'s table from its Delta log: the latest snapshot's file list (``files``:
    only for a table the plan compacts or retires from) and its last :data:`HISTORY_LOOKBACK` commits. Read by
    delta-rs where it can read the storage (:mod:`kdq.delta_log`: milliseconds per table), else by ``spark``."""
    from kdq import delta_log

    if readable(config):
        try:
            return delta_log.table_state(config, spec, files)
        except delta_log.LogUnreadable as exc:
            log.warning("%s; reading it with Spark", exc)
    return _spark_table_state(spark, config, spec, files)


def _spark_table_state(spark: Any, config: Any, spec: Any, files: bool) -> TableState:
    """:func:`table_state` through Spark: one small job over the checkpoint and the commits after it, and
    ``DeltaTable.history``."""
    from delta.tables import DeltaTable
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from kdq import delta_log
    from kdq.spark.tables import table_path
    from kdq.spark.writers import delta_snapshot

    path = table_path(config, spec)
    partitions: frozenset[str] = frozenset()
    compactable: frozenset[str] = frozenset()
    if files and spec.partitioned_by:
        min_size = int(spark.conf.get(delta_log.MIN_FILE_SIZE_CONF, str(delta_log.DEFAULT_MIN_FILE_SIZE)))
        snapshot_files = DataFrame(delta_snapshot(spark, path).allFiles().toDF(), spark)
        values = F.col("partitionValues")
        key = (
            F.concat(values["window_date"], F.lit("-"), F.lpad(values["window_hour"], 2, "0"))
            if partition_key_column(spec) == WINDOW_HOUR else values[spec.partitioned_by[0]]
        )
        rows = (
            snapshot_files.groupBy(key.alias("value"))
            .agg(F.sum(F.when(F.col("size") < min_size, 1).otherwise(0)).alias("small"))
            .collect()
        )
        partitions = frozenset(r["value"] for r in rows if r["value"] is not None)
        compactable = frozenset(r["value"] for r in rows if r["value"] is not None and r["small"] >= 2)
    table = DeltaTable.forPath(spark, path)
    created = table.detail().select(F.unix_millis("createdAt").alias("ms")).first()
    last_data = last_vacuum = None
    for commit in table.history(HISTORY_LOOKBACK).select(
        "operation", "operationParameters", F.unix_millis("timestamp").alias("ms")
    ).collect():  # newest first
        millis = int(commit["ms"])
        if commit["operation"] == "VACUUM END":
            if (commit["operationParameters"] or {}).get("status", "COMPLETED") == "COMPLETED" and last_vacuum is None:
                last_vacuum = millis
        elif commit["operation"] != "VACUUM START":
            last_data = millis
            break
    created_ms = int(created["ms"]) if created is not None and created["ms"] is not None else None
    return TableState(partitions, compactable, last_data, last_vacuum, created_ms)


def plan_from_log(
    config: Any, archive_retention_days: int, vacuum_retain_hours: int, today: dt.date, now_ms: int
) -> list[Step] | None:
    """The maintenance plan (:func:`maintenance_plan`) from every table's log read without Spark
    (:mod:`kdq.delta_log`), for deciding before a Spark start whether a run has anything to do; None when it
    cannot tell (storage delta-rs does not read here, a table not created yet: the Spark job creates it)."""
    from kdq import delta_log

    if not readable(config):
        log.info("maintenance plan: delta-rs does not read this storage here")
        return None
    try:
        tables = {spec.name: delta_log.table_state(config, spec, files=spec.name in _PLANNED_FROM_FILES)
                  for spec in ALL_TABLES}
    except TableMissing as exc:
        log.info("maintenance plan: %s; the job plans after creating it", exc)
        return None
    except delta_log.LogUnreadable as exc:
        log.info("maintenance plan: %s; the Spark job plans", exc)
        return None
    return maintenance_plan(config, today, archive_retention_days, vacuum_retain_hours, tables, now_ms)


def describe_plan(steps: Iterable[Step]) -> None:
    """Log each step as it is planned (the lines an operator reads in the task log)."""
    for step in steps:
        log.info("maintenance: %s%s", step.describe(), f" skipped: {step.skipped}" if step.skipped else "")


def maintenance_has_work(config: Any, archive_retention_days: int, vacuum_retain_hours: int,
                         now_ms: int | None = None, today: dt.date | None = None) -> bool:
    """False only when the tables' logs, read without Spark (:func:`plan_from_log`), show that every step of
    the run would be skipped: the maintenance DAG then starts no Spark job at all. True when a step has
    work, or when the plan cannot be read here (the job plans itself). ``now_ms`` / ``today``: the run's
    instant and UTC date (default: now, its date), as the job takes them."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    today = today or dt.datetime.fromtimestamp(now / 1000, tz=dt.UTC).date()
    started = time.monotonic()
    steps = plan_from_log(config, archive_retention_days, vacuum_retain_hours, today, now)
    if steps is None:
        log.info("maintenance plan: not decided without Spark (above); the Spark job plans")
        return True
    describe_plan(steps)
    work = [step for step in steps if not step.skipped]
    log.info("maintenance plan from the Delta logs in %.2f s: %d of %d steps to run%s", time.monotonic() - started,
             len(work), len(steps), "" if work else "; no Spark job today")
    return bool(work)


# -- the side effects ---------------------------------------------------------------------------------------


def _optimize_result(rows: list[Any], step: Step) -> dict:
    metrics = rows[0]["metrics"] if rows else None
    return {
        "partitions": list(step.partitions) if step.partitions else "every closed partition",
        "files_removed": int(metrics["numFilesRemoved"]) if metrics else 0,
        "files_added": int(metrics["numFilesAdded"]) if metrics else 0,
    }


def _vacuum(spark: Any, config: Any, spec: Any, step: Step) -> dict:
    """VACUUM LITE/FULL through the table's name in this session's catalog (registered here by location, as
    :func:`kdq.spark.tables.register_tables` does): no path in the SQL text."""
    from kdq.spark.tables import qualified_name, table_path

    name = qualified_name(config, spec)
    if not spark.catalog.tableExists(name):
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {config.spark.database}")
        spark.catalog.createTable(name, path=table_path(config, spec), source="delta")
    mode = step.mode
    try:
        spark.sql(f"VACUUM {name} {mode} RETAIN {int(step.retain_hours)} HOURS").collect()
    except Exception as exc:  # e.g. DELTA_CANNOT_VACUUM_LITE: the log since the last VACUUM was cleaned up
        if mode != "LITE":
            raise
        log.warning("VACUUM LITE of %s not possible (%s): a FULL one instead", spec.name, str(exc).splitlines()[0])
        mode = "FULL"
        spark.sql(f"VACUUM {name} FULL RETAIN {int(step.retain_hours)} HOURS").collect()
    return {"vacuumed": mode}


def run_step(spark: Any, config: Any, step: Step) -> Any:
    """Execute one step; returns what it reports (what was compacted or vacuumed, the retention summary,
    or why the step was skipped)."""
    from delta.tables import DeltaTable

    from kdq.spark.batch_layer import stream_caught_up
    from kdq.spark.retention import retire_and_delete
    from kdq.spark.tables import table_path

    if step.skipped:
        return {"skipped": step.skipped}
    spec = next(s for s in ALL_TABLES if s.name == step.table)
    if step.action == "optimize":
        table = DeltaTable.forPath(spark, table_path(config, spec))
        return _optimize_result(table.optimize().where(step.where).executeCompaction().collect(), step)
    if step.action == "vacuum":
        return _vacuum(spark, config, spec, step)
    if stream_caught_up(spark, config, step.retire_before_ms) is False:
        from kdq.writers_journal import WAITS

        WAITS.stream_behind()  # the writers journal: skipped because the stream is behind
        log.warning(
            "archive retention skipped: the stream has a micro-batch ingested before %s that has not committed "
            "(its rows would escape the retirement); the next maintenance run retires them", step.describe(),
        )
        return {"skipped": "stream behind the retirement instant"}
    return retire_and_delete(spark, config, step.cutoff, step.retire_before_ms)


def compact_closed_hours(spark: Any, config: Any, now_ms: int | None = None) -> dict[str, Any]:
    """Compact the closed hours (:func:`closed_hours_plan`) of the archive and the window tables that have
    files added since they were last compacted; returns what each table's step did, or why not. A step that
    still conflicts after its retries with another writer of the same hour (a rebuild, a recompute) is
    reported and left to the next run: compaction changes no data, so nothing waits on it."""
    from kdq.spark.writers import is_conflict, retry_on_conflict

    now = int(time.time() * 1000) if now_ms is None else now_ms
    tables = {spec.name: table_state(spark, config, spec) for spec in (RAW_ARCHIVE, WINDOW_COUNTS, SUMMARIES)}
    results: dict[str, Any] = {}
    for step in closed_hours_plan(config, tables, now):
        if step.skipped:
            results[step.table] = {"skipped": step.skipped}
            continue
        log.info("compaction of closed hours: %s", step.describe())
        started = time.monotonic()
        try:
            result = retry_on_conflict(lambda step=step: run_step(spark, config, step), step.describe())
        except Exception as exc:  # py4j: Delta's conflicts arrive as generic errors
            if not is_conflict(exc):
                raise  # anything but a lost race (storage down, a bad table) fails the run, as any write would
            log.warning("compaction of closed hours: %s failed, left to the next run: %s", step.describe(), str(exc)[:300])
            result = {"error": str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}
        results[step.table] = {**result, "seconds": round(time.monotonic() - started, 1)}
    return results


def run_maintenance(
    spark: Any, config: Any, archive_retention_days: int, vacuum_retain_hours: int, today: dt.date,
    now_ms: int | None = None,
) -> MaintenanceReport:
    """Run the plan's steps in ``spark``; returns what each did (with its ``seconds``) or why it was skipped
    (spark_jobs/maintenance.py prints it). ``now_ms``: the instant the tables' ages are measured at (default:
    now)."""
    from kdq.spark.tables import ensure_tables

    ensure_tables(spark, config)
    tables = {spec.name: table_state(spark, config, spec, files=spec.name in _PLANNED_FROM_FILES) for spec in ALL_TABLES}
    steps = maintenance_plan(config, today, archive_retention_days, vacuum_retain_hours, tables,
                             int(time.time() * 1000) if now_ms is None else now_ms)
    results = {}
    for step in steps:
        describe_plan([step])
        started = time.monotonic()
        result = run_step(spark, config, step)
        if not step.skipped and isinstance(result, dict):
            result = {**result, "seconds": round(time.monotonic() - started, 1)}
        results[step.describe()] = result
    return MaintenanceReport(
        today=today.isoformat(), steps=len(steps), skipped=sum(1 for s in steps if s.skipped), results=results
    )
