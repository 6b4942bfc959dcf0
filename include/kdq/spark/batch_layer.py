"""The batch layer: recompute windows that got records too late for the speed layer, from the raw archive.

One run covers one **interval of ingest time** ``[start, end)`` (Airflow's data
interval, hourly):

1. :func:`kdq.spark.recount.late_windows` — the (topic, window_start) pairs of archive rows
   ingested in the interval that the stream did not count (``counted =
   false``), plus rows loaded by another job (``source <> 'stream'``). The
   late rows can belong to *any* earlier hour, so their ``event_hour``
   partitions cannot be derived from the interval: the scan relies on Delta's
   per-file min/max statistics of ``ingest_time`` instead. The stream writes
   one set of files per micro-batch, each with a single ingest time, so all
   but the interval's files are skipped without being opened.
2. :func:`kdq.spark.recount.recompute_counts` — absolute counts of those windows from *all*
   their archive rows (counted or not), with the same
   :func:`kdq.spark.transforms.count_windows` the stream uses; only the
   ``event_hour`` partitions of those windows are read.
3. :func:`apply_corrections` — compares with ``window_counts``, MERGEs the
   rows that differ (``updated_by = 'batch'``) and appends one ``corrections``
   row per changed (topic, window, status), old → new.
4. :func:`kdq.spark.outputs.push_corrections` — absolute counts of the corrected windows to the
   metrics topic and InfluxDB (both fields).
5. :func:`correct_interval_reasons` — the reasons of the interval's late invalid
   rows into ``invalid_reasons`` (the stream appends those of the rows it counts).

Windows whose oldest raw rows archive retention deleted count those rows
through ``retired_counts`` (:mod:`kdq.spark.retention`): a late record adds
to the full count, never replaces it with a partial one.

:func:`kdq.spark.outputs.influx_catch_up` re-pushes every window updated since the stream last
failed to reach InfluxDB.

Steps 1 and 2 are pure transforms (:mod:`kdq.spark.recount`), step 4 and the catch-up the outputs
(:mod:`kdq.spark.outputs`); this module is the Delta side: the corrections and the window-counts MERGE.

**Zero counts.** The stream never stores a zero: a status a window has not
seen has no row (it reads as 0). The batch layer keeps that invariant: when a
recomputed status is 0 but the table has a row (only possible after a rule
change, or a count the archive does not support), the row is **deleted** and a
correction ``old → 0`` is recorded; the metrics topic gets the value ``0`` for
that key (so compacted consumers converge to 0) and InfluxDB the field 0.

**Why the recompute cannot race the stream.** Lateness is decided per (topic,
window) against the watermark from *before* a micro-batch, and watermarks
only move forward. So once a batch archives a ``counted = false`` row for a
window, every later batch also leaves that window alone, and every earlier
batch (which may have counted rows of it) has finished its MERGE: micro-batches
run one after the other, and the archive append precedes the MERGE within a
batch. Absolute counts read from the archive after a late row is visible
therefore never double-count with a pending stream increment.

**Exactly once** (``app id = kdq-batch-<interval start ms>``): the corrections
append and the window-counts MERGE are two Delta commits guarded by the same
(app id, version), chosen by :func:`kdq.spark.corrections.record_then_apply`
(the protocol the rebuild and the summaries share): a run whose recomputation
equals the table writes nothing, an attempt that died between its two commits
is completed or superseded.

The interval is only complete once the stream has finished every micro-batch
that started before its end (:func:`stream_caught_up`; the job reports it).

Pushes send absolute values of every window the interval's corrections touched
(read from the corrections table, so a run whose push failed can simply be
re-run); they are absolute values, so re-sending them is harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq.config import Config
from kdq.intervals import batch_app_id, iso
from kdq.spark import transforms
from kdq.spark.corrections import latest_attempt, record_then_apply
from kdq.spark.recount import late_reason_counts
from kdq.spark.tables import table_path
from kdq.spark.writers import (
    STALE_READ,
    adjust_invalid_reasons,
    append_once,
    idempotent_write,
    retry_on_conflict,
)
from kdq.sql_literals import date_literal, timestamp_literal
from kdq.tables import CORRECTIONS, WINDOW_COUNTS
from kdq.windows import DAY_MS

log = logging.getLogger("kdq.batch")

STATUSES = (transforms.VALID, transforms.INVALID)
BATCH = "batch"


def _ts(ms: int):
    return F.timestamp_millis(F.lit(int(ms)))


# -- Delta side effects ----------------------------------------------------------------------------


def count_differences(
    spark: SparkSession, config: Config, new_counts: DataFrame, counts_version: int | None = None
) -> list[dict]:
    """Rows of (topic, window, status) whose recomputed count differs from window_counts (its latest version,
    or ``counts_version``).

    Both statuses of every recomputed window are compared, so a status that
    recomputes to 0 while the table has a row shows up as a change to 0.
    """
    new = new_counts.select(
        "topic",
        "window_start",
        "window_end",
        "status",
        F.col("count").alias("new_count"),
        "rules_version",
    ).persist()
    try:
        windows = new.select("topic", "window_start", "window_end").distinct()
        days = windows.select(
            (F.unix_millis("window_start") / DAY_MS).cast("bigint").alias("d"),
            F.unix_millis("window_start").alias("ms"),
        ).groupBy("d").agg(F.min("ms").alias("lo"), F.max("ms").alias("hi"))
        spans = days.collect()
        if not spans:
            return []
        # Per day, only the span of recomputed windows: window_counts files are
        # written per micro-batch with narrow window_start ranges, so Delta skips
        # the rest of the day instead of reading every window of it.
        in_spans = " OR ".join(
            f"(window_date = {date_literal(r['d'] * DAY_MS)} "
            f"AND window_start BETWEEN {timestamp_literal(r['lo'])} AND {timestamp_literal(r['hi'])})"
            for r in sorted(spans, key=lambda r: r["d"])
        )
        statuses = spark.createDataFrame([(s,) for s in STATUSES], "status STRING")
        grid = windows.crossJoin(F.broadcast(statuses)).join(
            new.select("topic", "window_start", "status", "new_count", "rules_version"),
            ["topic", "window_start", "status"],
            "left",
        )
        reader = spark.read.format("delta")
        if counts_version is not None:
            reader = reader.option("versionAsOf", int(counts_version))
        current = (
            reader.load(table_path(config, WINDOW_COUNTS))
            .where(f"window_date IN ({', '.join(date_literal(r['d'] * DAY_MS) for r in spans)})")
            .where(in_spans)
            .select("topic", "window_start", "status", F.col("count").alias("old_count"))
        )
        changed = (
            grid.join(current, ["topic", "window_start", "status"], "left")
            .select(
                "topic",
                F.unix_millis("window_start").alias("window_start_ms"),
                F.unix_millis("window_end").alias("window_end_ms"),
                "status",
                F.coalesce("old_count", F.lit(0)).cast("bigint").alias("old_count"),
                F.coalesce("new_count", F.lit(0)).cast("bigint").alias("new_count"),
                "rules_version",
            )
            .where(F.col("old_count") != F.col("new_count"))
        )
        rows = [r.asDict() for r in changed.collect()]
    finally:
        new.unpersist()
    return sorted(rows, key=lambda r: (r["topic"], r["window_start_ms"], r["status"]))


def _correction_key(r: dict) -> tuple:
    return (r["topic"], int(r["window_start_ms"]), r["status"], int(r["old_count"]), int(r["new_count"]))


def recorded_attempt(
    spark: SparkSession, config: Config, interval: tuple[int, int], reasons: Sequence[str] | None = None
) -> set[tuple]:
    """The (topic, window ms, status, old, new) rows of the latest attempt for this interval, optionally
    only those recorded with one of ``reasons``."""
    start_ms, end_ms = interval
    recorded = (
        spark.read.format("delta")
        .load(table_path(config, CORRECTIONS))
        .where((F.col("interval_start") == _ts(start_ms)) & (F.col("interval_end") == _ts(end_ms)))
    )
    if reasons:
        recorded = recorded.where(F.col("reason").isin(*reasons))
    rows = recorded.select(
        "topic", F.unix_millis("window_start").alias("window_start_ms"), "status", "old_count", "new_count", "corrected_at"
    )
    return latest_attempt(rows, _correction_key)


def append_corrections(
    spark: SparkSession,
    config: Config,
    changed: Sequence[dict],
    run_id: str,
    interval: tuple[int, int],
    app_id: str,
    version: int,
    reason: str | None = None,
) -> None:
    """Record ``changed`` (old → new count per window and status) once per (app id, version);
    ``reason`` for every row, or None to take each row's own ``reason``."""
    start_ms, end_ms = interval
    df = spark.createDataFrame(
        [
            (r["topic"], r["window_start_ms"], r["status"], r["old_count"], r["new_count"], reason or r["reason"])
            for r in changed
        ],
        "topic STRING, window_start_ms BIGINT, status STRING, old_count BIGINT, new_count BIGINT, reason STRING",
    )
    rows = df.select(
        "topic",
        F.timestamp_millis("window_start_ms").alias("window_start"),
        "status",
        "old_count",
        "new_count",
        _ts(start_ms).alias("interval_start"),
        _ts(end_ms).alias("interval_end"),
        F.lit(run_id).alias("run_id"),
        "reason",
        F.current_timestamp().alias("corrected_at"),
    )
    append_once(rows, table_path(config, CORRECTIONS), app_id, version)


def _merge_absolute(spark: SparkSession, config: Config, changed: Sequence[dict], app_id: str, version: int) -> None:
    """Set absolute counts (deleting rows that became 0) for the changed keys, once per (app id, version).

    A compare-and-set: every key's stored count must still be the ``old_count`` its job read (0 for no
    row). Otherwise another writer (a stream micro-batch, another batch job) changed it in between, and
    writing would lose that change: the MERGE fails with :data:`kdq.spark.writers.STALE_READ`, commits
    nothing, and the job reads again (``retry_on_conflict`` treats it as a conflict).
    """
    from delta.tables import DeltaTable

    source = spark.createDataFrame(
        [
            (r["topic"], r["window_start_ms"], r["window_end_ms"], r["status"], r["new_count"], r["old_count"],
             r["rules_version"])
            for r in changed
        ],
        "topic STRING, window_start_ms BIGINT, window_end_ms BIGINT, status STRING, count BIGINT, old_count BIGINT, "
        "rules_version STRING",
    ).select(
        "topic",
        F.timestamp_millis("window_start_ms").alias("window_start"),
        F.timestamp_millis("window_end_ms").alias("window_end"),
        "status",
        "count",
        "old_count",
        F.current_timestamp().alias("updated_at"),
        F.lit(BATCH).alias("updated_by"),
        "rules_version",
        *transforms.window_partition_columns("window_start_ms"),
    )
    stale = (
        f"raise_error(concat('{STALE_READ}: window_counts ', s.topic, ' ', CAST(s.window_start AS STRING), ' ', "
        "s.status, ' changed since it was read (another writer); read again'))"
    )
    dates = sorted({date_literal(r["window_start_ms"]) for r in changed})
    lo = min(r["window_start_ms"] for r in changed)
    hi = max(r["window_start_ms"] for r in changed)
    condition = (
        f"t.window_date IN ({', '.join(dates)}) "
        f"AND t.window_start BETWEEN {timestamp_literal(lo)} AND {timestamp_literal(hi)} "
        "AND t.topic = s.topic AND t.window_start = s.window_start AND t.status = s.status"
    )
    target = DeltaTable.forPath(spark, table_path(config, WINDOW_COUNTS)).alias("t")
    with idempotent_write(spark, app_id, version):
        (
            target.merge(source.alias("s"), condition)
            .whenMatchedDelete(condition="s.count = 0 AND t.count = s.old_count")
            .whenMatchedUpdate(
                set={
                    "count": f"CASE WHEN t.count = s.old_count THEN s.count ELSE {stale} END",
                    "window_end": "s.window_end",
                    "updated_at": "s.updated_at",
                    "updated_by": "s.updated_by",
                    "rules_version": "s.rules_version",
                }
            )
            .whenNotMatchedInsert(
                condition="s.count > 0",
                values={
                    **{c: f"s.{c}" for c in WINDOW_COUNTS.column_names},
                    "count": f"CASE WHEN s.old_count = 0 THEN s.count ELSE {stale} END",
                },
            )
            .execute()
        )


def stream_caught_up(spark: SparkSession, config: Config, end_ms: int) -> bool | None:
    """Whether every stream micro-batch with an ingest time before ``end_ms`` has committed (None: no stream
    ran); :func:`kdq.stream.checkpoint_offsets.finished_batches_before` on the speed layer's checkpoint (``spark``'s
    session reads a remote one). When this is false, rows may still arrive for the interval: run it later."""
    from kdq.stream.checkpoint_offsets import finished_batches_before, speed_layer_checkpoint

    del spark  # the session registered the Hadoop FileSystem remote checkpoints are read with
    return finished_batches_before(speed_layer_checkpoint(config), end_ms)


def apply_corrections(
    spark: SparkSession,
    config: Config,
    new_counts: DataFrame,
    run_id: str,
    interval: tuple[int, int],
    reason: str,
) -> list[dict]:
    """MERGE recomputed absolute counts where they differ from window_counts, recording each change.

    ``new_counts`` is :func:`kdq.spark.recount.recompute_counts`' output; windows absent from it
    are not touched. Returns the changed rows: topic, window_start_ms,
    window_end_ms, status, old_count, new_count (also as ``count``),
    rules_version. Idempotent per interval (see the module docstring); retried
    when a concurrent commit of the stream conflicts.
    """
    missing = [c for c in ("topic", "window_start", "window_end", "status", "count", "rules_version") if c not in new_counts.columns]
    if missing:
        raise ValueError(
            f"apply_corrections: new_counts lacks {missing}; expected recompute_counts' columns "
            f"(topic, window_start, window_end, status, count, rules_version), got {new_counts.columns}"
        )
    app_id = batch_app_id(interval[0])
    return retry_on_conflict(
        lambda: _apply_once(spark, config, new_counts, run_id, interval, reason, app_id), "corrections"
    )


def _apply_once(
    spark: SparkSession,
    config: Config,
    new_counts: DataFrame,
    run_id: str,
    interval: tuple[int, int],
    reason: str,
    app_id: str,
) -> list[dict]:
    changed = count_differences(spark, config, new_counts)
    if not changed:
        log.info("interval %s..%s: window_counts already equal the recomputation", iso(interval[0]), iso(interval[1]))
        return []
    version = record_then_apply(
        spark,
        table_path(config, CORRECTIONS),
        table_path(config, WINDOW_COUNTS),
        app_id,
        (_correction_key(r) for r in changed),
        lambda: recorded_attempt(spark, config, interval),
        lambda v: append_corrections(spark, config, changed, run_id, interval, app_id, v, reason=reason),
        lambda v: _merge_absolute(spark, config, changed, app_id, v),
        "batch run",
    )
    for row in changed:
        row["count"] = row["new_count"]
    log.info("interval %s..%s: %d corrections (version %d)", iso(interval[0]), iso(interval[1]), len(changed), version)
    return changed


# -- invalid reasons ----------------------------------------------------------------------------------


def reasons_marker(interval_start_ms: int) -> int:
    """``batch_id`` of the batch layer's ``invalid_reasons`` rows for an interval: minus its start (the
    stream's batch ids are never negative)."""
    return -int(interval_start_ms)


def correct_interval_reasons(spark: SparkSession, config: Config, archive_df: DataFrame, interval: tuple[int, int]) -> int:
    """Bring ``invalid_reasons`` in line with the interval's late rows; returns the rows appended.

    The stream appends reasons of the rows it counts; the rows it leaves to the batch layer get theirs
    here, as increments marked :func:`reasons_marker`. Each late row belongs to exactly one interval (its
    ingest time), and the increments are computed against what earlier runs of the same interval
    appended, so a re-run appends nothing, and one that finds more rows (an archive-from-Kafka load)
    appends only the difference. Delta's idempotent write (app id ``kdq-batch-reasons-<start>``) makes
    two concurrent runs of one interval append once.
    """
    target = late_reason_counts(archive_df, *interval, config.stream.reasons_window_seconds)
    marker = reasons_marker(interval[0])
    return adjust_invalid_reasons(
        spark, config, target, F.col("batch_id") == marker, marker, f"kdq-batch-reasons-{int(interval[0])}"
    )


# -- reading back ---------------------------------------------------------------------------------------


def interval_corrections(spark: SparkSession, config: Config, interval: tuple[int, int]) -> list[tuple[str, int, str]]:
    """(topic, window_start_ms, status) of every correction ever recorded for this interval."""
    start_ms, end_ms = interval
    rows = (
        spark.read.format("delta")
        .load(table_path(config, CORRECTIONS))
        .where((F.col("interval_start") == _ts(start_ms)) & (F.col("interval_end") == _ts(end_ms)))
        .select("topic", F.unix_millis("window_start").alias("w"), "status")
        .distinct()
        .collect()
    )
    return sorted((r["topic"], int(r["w"]), r["status"]) for r in rows)
