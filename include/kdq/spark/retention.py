"""Raw-archive retention that keeps every count: retire the rows, then delete them.

Deleting an hour of raw rows must not make a later recompute of one of its windows count only what is
left: a record arriving a month late for a window of 5,000 would otherwise turn its count into 1. So the
daily maintenance (:mod:`kdq.spark.maintenance`) first **retires** what it is about to delete:

1. :func:`rows_to_retire` — archive rows of the hours before the cutoff, ingested before the retirement
   instant ``T`` (midnight UTC of the day before the run) and not retired by an earlier run (at or after
   their hour's latest ``retired_before``), each record once;
2. :func:`retirement_counts` — their counts per (topic, window, status), appended to ``retired_counts``
   with ``retired_before = T`` (an idempotent Delta write: app id ``kdq-retention``, version ``T``, so a
   retried run appends nothing twice);
3. ``DELETE`` of the archive rows with ``event_hour`` before the cutoff and ``ingest_time < T``.

**Counting a window** (the hourly recompute, reconciliation, the lost-checkpoint recount) is then
:func:`counts_with_retired`: its retired counts plus its archive rows ingested at or after its hour's
latest ``retired_before`` (:func:`unretired`). That exclusion is what makes the two commits safe in any
order of failure: rows retired but not yet deleted are not counted twice, rows deleted are in the
retired counts, and a late row archived after the retirement (ingest time ≥ T) counts on top.

**Why T is a day back.** Step 1 reads the archive once; a row appended afterwards with an ingest time
before ``T`` would be deleted without being retired. The stream stamps its batch's start as ingest
time and commits within minutes, and the maintenance refuses to retire while a stream micro-batch
ingested before ``T`` has not committed (a replayed batch keeps its ingest time); the other writers
(archive-from-Kafka, quarantine) stamp their own start and commit within their run. A day of margin
covers both.

Rebuilding re-judges raw values, which retention deleted: :mod:`kdq.spark.rebuild` refuses a range that
holds retired hours. Reconciliation's *offset* check cannot see retired records either; run it on
ranges inside the archive's retention.
"""

from __future__ import annotations

import datetime as dt
import logging

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq.config import Config, StreamConfig
from kdq.intervals import iso
from kdq.spark import transforms
from kdq.spark.tables import table_path
from kdq.spark.writers import append_once, txn_version
from kdq.tables import RAW_ARCHIVE, RETIRED_COUNTS

log = logging.getLogger("kdq.retention")

RETENTION_APP_ID = "kdq-retention"


def retirement_instant(today: dt.date) -> int:
    """``T`` of a run on ``today``: midnight UTC of the day before (see the module doc), epoch millis."""
    midnight = dt.datetime.combine(today - dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC)
    return int(midnight.timestamp() * 1000)


def read_retired(spark: SparkSession, config: Config) -> DataFrame:
    return spark.read.format("delta").load(table_path(config, RETIRED_COUNTS))


def retired_bounds(retired: DataFrame) -> DataFrame:
    """(event_hour, retired_before): per hour, the instant before which its archive rows are retired."""
    return retired.groupBy("event_hour").agg(F.max("retired_before").alias("__retired_before"))


def unretired(archive_rows: DataFrame, retired: DataFrame) -> DataFrame:
    """The archive rows not covered by a retirement (whether or not the DELETE has run yet)."""
    bounds = F.broadcast(retired_bounds(retired))
    return (
        archive_rows.join(bounds, "event_hour", "left")
        .where(F.col("__retired_before").isNull() | (F.col("ingest_time") >= F.col("__retired_before")))
        .drop("__retired_before")
    )


def counts_with_retired(archive_rows: DataFrame, retired: DataFrame, windows: DataFrame, stream: StreamConfig) -> DataFrame:
    """Absolute (topic, window_start, window_end, status, count, rules_version) of ``windows``:
    :func:`transforms.count_windows` of their unretired archive rows plus their retired counts.

    ``archive_rows`` must already be limited to ``windows`` (each record once); statuses with a zero
    count have no row, as everywhere.
    """
    live = transforms.count_windows(unretired(archive_rows, retired).drop("counted"), stream)
    gone = retired.join(F.broadcast(windows.select("topic", "window_start").distinct()), ["topic", "window_start"], "left_semi")
    both = live.select("topic", "window_start", "status", "count", "rules_version").unionByName(
        gone.select("topic", "window_start", "status", "count", "rules_version")
    )
    return (
        both.groupBy("topic", "window_start", "status")
        .agg(F.sum("count").cast("bigint").alias("count"), F.max("rules_version").alias("rules_version"))
        .where(F.col("count") > 0)
        .select(
            "topic",
            "window_start",
            (F.col("window_start") + F.expr(f"INTERVAL {int(stream.window_seconds)} SECONDS")).alias("window_end"),
            "status",
            "count",
            "rules_version",
        )
    )


def retired_hours(retired: DataFrame, hours: list[str]) -> list[str]:
    """Which of ``hours`` (event_hour values) have had archive rows retired."""
    if not hours:
        return []
    found = retired.where(F.col("event_hour").isin(hours)).select("event_hour").distinct().collect()
    return sorted(row["event_hour"] for row in found)


def rows_to_retire(archive: DataFrame, retired: DataFrame, cutoff: dt.date, before_ms: int) -> DataFrame:
    """Archive rows of hours before ``cutoff``, ingested before ``before_ms``, not retired yet; each record once."""
    old = archive.where(F.col("event_hour") < F.lit(f"{cutoff:%Y-%m-%d}-00")).where(
        F.col("ingest_time") < F.timestamp_millis(F.lit(int(before_ms)))
    )
    return transforms.one_row_per_record(unretired(old, retired))


def retirement_counts(rows: DataFrame, before_ms: int, stream: StreamConfig) -> DataFrame:
    """``retired_counts`` rows for ``rows`` (:func:`rows_to_retire`'s output)."""
    counts = transforms.count_windows(rows.drop("counted"), stream)
    return counts.select(
        "topic",
        "window_start",
        "status",
        "count",
        "rules_version",
        # The archive's partition value of the window: the UTC hour (sessions pin the time zone to UTC).
        F.date_format("window_start", "yyyy-MM-dd-HH").alias("event_hour"),
        F.timestamp_millis(F.lit(int(before_ms))).alias("retired_before"),
        F.current_timestamp().alias("retired_at"),
    )


# -- the side effects -------------------------------------------------------------------------------------


def retire_and_delete(spark: SparkSession, config: Config, cutoff: dt.date, before_ms: int) -> dict:
    """Steps 2 and 3 of the module doc; returns what was retired and deleted."""
    from delta.tables import DeltaTable

    retired_path = table_path(config, RETIRED_COUNTS)
    archive_path = table_path(config, RAW_ARCHIVE)
    done = txn_version(spark, retired_path, RETENTION_APP_ID)
    archive = spark.read.format("delta").load(archive_path)
    counts = retirement_counts(
        rows_to_retire(archive, read_retired(spark, config), cutoff, before_ms), before_ms, config.stream
    ).persist()
    try:
        summary = counts.agg(F.count("*").alias("rows"), F.sum("count").alias("records")).first()
        rows, records = int(summary["rows"]), int(summary["records"] or 0)
        if rows and before_ms <= done:
            # Delta would skip this append (its version is not newer) and the DELETE would lose the rows.
            raise ValueError(
                f"archive retention: {records} rows to retire before {iso(before_ms)}, but retirement already "
                f"ran up to {iso(done)}; run the maintenance for today's date, not an earlier one"
            )
        if rows:
            append_once(counts, retired_path, RETENTION_APP_ID, before_ms)
    finally:
        counts.unpersist()
    condition = (F.col("event_hour") < F.lit(f"{cutoff:%Y-%m-%d}-00")) & (
        F.col("ingest_time") < F.timestamp_millis(F.lit(int(before_ms)))
    )
    table = DeltaTable.forPath(spark, archive_path)
    table.delete(condition)
    metrics = table.history(1).select("operation", "operationMetrics").first()
    deleted = int((metrics["operationMetrics"] or {}).get("numDeletedRows", 0)) if metrics["operation"] == "DELETE" else 0
    log.info(
        "archive retention: %d records of %d windows retired (before %s, hours before %s), %d rows deleted",
        records, rows, iso(before_ms), cutoff, deleted,
    )
    return {
        "retired_before": iso(before_ms),
        "cutoff_hour": f"{cutoff:%Y-%m-%d}-00",
        "retired_windows": rows,
        "retired_records": records,
        "deleted_rows": deleted,
    }
