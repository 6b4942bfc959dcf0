"""Reconciliation: does the archive hold every Kafka offset, and do window_counts match the archive?

Two checks, one report (:class:`kdq.job_reports.ReconcileReport`; ``spark_jobs/reconcile.py``
exits 1, a failed Airflow task, when either finds a problem):

* **Offsets**, per partition: the time range (Kafka record time) is resolved
  to an offset range ``[first, end)`` with the Kafka client
  (``offsets_for_times``, watermarks; without a range: everything Kafka still
  has). The archive's offsets of that range are compared with it: archived
  count, duplicates, and every **gap** (missing offsets ``[from, to]``,
  inclusive). Run it on a range the stream has finished (like the hourly
  recompute): offsets the stream has not reached yet show as a trailing gap.
  Offsets are not contiguous on every topic: transaction markers, records of
  aborted transactions and compaction leave holes no reader ever sees. Each
  gap of up to ``VERIFY_GAP_OFFSETS`` offsets is therefore read back from
  Kafka with a read_committed consumer; only the records Kafka actually
  returns in it count as missing, and a gap where it returns none is no gap.
* **Counts**: ``window_counts`` vs absolute counts recomputed from every
  archive row (counted or not, like the batch layer) for windows starting in
  the range (event time; the Kafka time of the range when no event-time field
  is configured). Every (topic, window, status) that differs is a mismatch
  (the first 100 are listed). After an hourly recompute of the ingest
  interval [from, to) (``after_recompute``, the hourly DAG's check), rows
  too late for the stream that arrived after ``to`` are left out (the next
  interval's recompute counts them; a window may already count some of them,
  when a rebuild or a later recompute ran before the check: its count must
  then lie between its rows without them and with them), and the windows its
  late rows touched outside [from, to) are checked too.
  Both sides are read at one cut of the stream's work (:mod:`kdq.spark.stream_cut`):
  the stored counts at one version and the archive rows they may hold, so a
  micro-batch archived but not yet MERGEd is no mismatch.

Reads only the ``topic``/``partition``/``offset`` columns of the archive for
the offset check, and the range's ``event_hour`` partitions for the counts.
"""

from __future__ import annotations

import logging

from pyspark.sql import SparkSession

from kdq.config import Config
from kdq.intervals import iso
from kdq.job_reports import ReconcileReport

log = logging.getLogger("kdq.reconcile")

MAX_LISTED = 100
# Gaps up to this size are read back from Kafka to tell real gaps from legitimate holes; larger ones
# (the stream is far behind, or never ran) are reported as they are.
VERIFY_GAP_OFFSETS = 50_000


def offset_gaps(spark, config: Config, ranges: list[dict]) -> list[dict]:
    """Per partition: expected offset range, archived count, duplicates and gaps ([from, to] inclusive)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from kdq.spark.tables import table_path
    from kdq.tables import RAW_ARCHIVE

    todo = [r for r in ranges if r["start"] < r["end"]]
    result = {
        (r["topic"], r["partition"]): {
            "topic": r["topic"],
            "partition": r["partition"],
            "first_offset": r["start"],
            "end_offset": r["end"],
            "expected": max(r["end"] - r["start"], 0),
            "archived": 0,
            "duplicates": 0,
            "gaps": [],
            "missing": 0,
        }
        for r in ranges
    }
    if todo:
        bounds = spark.createDataFrame(
            [(r["topic"], r["partition"], r["start"], r["end"]) for r in todo], "topic STRING, partition INT, lo BIGINT, hi BIGINT"
        )
        archived = (
            spark.read.format("delta")
            .load(table_path(config, RAW_ARCHIVE))
            .where(F.col("topic").isin(sorted({r["topic"] for r in todo})))
            .select("topic", "partition", "offset")
            .join(F.broadcast(bounds), ["topic", "partition"])
            .where((F.col("offset") >= F.col("lo")) & (F.col("offset") < F.col("hi")))
        ).persist()
        try:
            for row in archived.groupBy("topic", "partition").agg(
                F.count("*").alias("n"), F.countDistinct("offset").alias("d")
            ).collect():
                entry = result[(row["topic"], row["partition"])]
                entry["archived"] = int(row["d"])
                entry["duplicates"] = int(row["n"]) - int(row["d"])
            # Interior gaps: consecutive distinct offsets more than 1 apart; edges against [lo, hi).
            distinct = archived.select("topic", "partition", "offset", "lo", "hi").distinct()
            order = Window.partitionBy("topic", "partition").orderBy("offset")
            with_prev = distinct.select(
                "*",
                F.lag("offset").over(order).alias("prev"),
                F.lead("offset").over(order).alias("next"),
            )
            gaps = with_prev.select(
                "topic",
                "partition",
                F.explode(
                    F.array(
                        F.when(F.col("prev").isNull() & (F.col("offset") > F.col("lo")), F.array(F.col("lo"), F.col("offset") - 1)),
                        F.when(F.col("offset") - F.col("prev") > 1, F.array(F.col("prev") + 1, F.col("offset") - 1)),
                        F.when(F.col("next").isNull() & (F.col("offset") < F.col("hi") - 1), F.array(F.col("offset") + 1, F.col("hi") - 1)),
                    )
                ).alias("gap"),
            ).where(F.col("gap").isNotNull())
            for row in gaps.orderBy("topic", "partition", F.col("gap")[0]).limit(10 * MAX_LISTED).collect():
                result[(row["topic"], row["partition"])]["gaps"].append([int(row["gap"][0]), int(row["gap"][1])])
        finally:
            archived.unpersist()
    for entry in result.values():
        entry["missing"] = entry["expected"] - entry["archived"]
        if entry["expected"] and not entry["archived"]:
            entry["gaps"] = [[entry["first_offset"], entry["end_offset"] - 1]]
        entry["gaps"] = entry["gaps"][:MAX_LISTED]
    return sorted(result.values(), key=lambda e: (e["topic"], e["partition"]))


def verify_gaps(config: Config, partitions: list[dict]) -> list[dict]:
    """Keep only the gaps (and the missing count) of offsets Kafka returns to a read_committed reader."""
    from kdq.spark.kafka_fallback import read_ranges
    from kdq.stream.checkpoint_offsets import OffsetRange

    for entry in partitions:
        if not entry["gaps"]:
            continue
        lo, hi = entry["gaps"][0][0], entry["gaps"][-1][1]
        if hi - lo + 1 > VERIFY_GAP_OFFSETS:
            continue
        # One read per partition (a consumer takes each partition once), then only the gaps' offsets.
        read = read_ranges(config, [OffsetRange(entry["topic"], entry["partition"], lo, hi + 1)])
        present = sorted(o for o in (int(row[4]) for row in read) if any(a <= o <= b for a, b in entry["gaps"]))
        entry["holes_without_records"] = entry["missing"] - len(present)
        entry["missing"] = len(present)
        entry["gaps"] = _runs(present)
    return partitions


def _runs(offsets: list[int]) -> list[list[int]]:
    """[3, 4, 5, 9] → [[3, 5], [9, 9]]."""
    runs: list[list[int]] = []
    for offset in offsets:
        if runs and offset == runs[-1][1] + 1:
            runs[-1][1] = offset
        else:
            runs.append([offset, offset])
    return runs[:MAX_LISTED]


def per_window_status(rows, name: str):
    """Archive rows counted per (topic, window_start, status), each record once, in column ``name``."""
    from pyspark.sql import functions as F

    from kdq.spark import transforms

    status = F.when(F.col("valid"), F.lit(transforms.VALID)).otherwise(F.lit(transforms.INVALID)).alias("status")
    return (
        transforms.one_row_per_record(rows)
        .select("topic", "window_start", status)
        .groupBy("topic", "window_start", "status")
        .agg(F.count(F.lit(1)).alias(name))
    )


def within_pending(stored: int, archived: int, pending: int) -> bool:
    """A window's stored count matches its archive rows when it counts all of them and, of the rows a later
    interval's recompute counts (``pending``), none, some or all: another job may have counted them already."""
    return archived <= stored <= archived + pending


def count_mismatches(
    spark, config: Config, topics: list[str], from_ms: int | None, to_ms: int | None, after_recompute: bool = False
) -> tuple[int, list[dict], dict]:
    """(number of differing (topic, window, status), the first MAX_LISTED, what the check covered) between
    window_counts and the archive.

    ``after_recompute`` (the hourly DAG's check of the ingest interval [from, to) its recompute just
    finished): rows a later interval's recompute will count are left out (see
    :func:`kdq.spark.recount.awaiting_recompute`), and the windows outside [from, to) that the interval's
    late rows touched are checked too, so every correction the recompute made is checked.
    """
    from pyspark.sql import functions as F

    from kdq.spark import batch_layer as bl
    from kdq.spark import transforms
    from kdq.spark.recount import archive_rows_of, awaiting_recompute, late_windows, recompute_counts
    from kdq.spark.retention import counts_with_retired, read_retired
    from kdq.spark.stream_cut import archive_at, counts_at, stream_cut
    from kdq.windows import range_dates, range_hours

    covered = {"pending_rows": 0, "late_windows_checked": 0}
    if not topics:
        return 0, [], covered
    # One consistent cut of the stream's work (kdq.spark.stream_cut): the stored counts at one version, and the
    # archive rows they may hold. Without it a micro-batch whose archive append landed but whose MERGE had not
    # yet (it runs after) was a mismatch of every window it touched (seen in the chaos run).
    cut = stream_cut(spark, config)
    whole_archive = archive_at(spark, config, cut).where(F.col("topic").isin(topics))
    archive = whole_archive
    stored = counts_at(spark, config, cut).where(F.col("topic").isin(topics))
    whole_retired = read_retired(spark, config).where(F.col("topic").isin(topics))
    retired = whole_retired
    in_range = F.lit(True)
    if from_ms is not None:
        in_range = (F.col("window_start") >= F.timestamp_millis(F.lit(from_ms))) & (
            F.col("window_start") < F.timestamp_millis(F.lit(to_ms))
        )
        archive = archive.where(F.col("event_hour").isin(range_hours(from_ms, to_ms))).where(in_range)
        stored = stored.where(f"window_date IN ({', '.join(range_dates(from_ms, to_ms))})").where(in_range)
        retired = retired.where(F.col("event_hour").isin(range_hours(from_ms, to_ms))).where(in_range)
    late: list[dict] = []
    # Per (topic, window, status), archived rows a later interval's recompute counts (after_recompute only).
    pending_counts = None
    if after_recompute and from_ms is not None:
        # Rows too late for the stream that arrived after the interval ended are archived but not counted
        # yet: the next interval's recompute counts them. They are no mismatch of this interval. Another job
        # may have counted some of them already: a rebuild, a backfill's recompute or a later interval's
        # recompute that ran before this check (they count every row archived when they read). So a window
        # matches when its count lies between its rows without them and its rows with them; each of those
        # rows lies in a later ingest interval, whose own check counts it exactly.
        pending = awaiting_recompute(to_ms)
        covered["pending_rows"] = archive.where(pending).count()
        pending_counts = per_window_status(archive.where(pending), "pending")
        archive = archive.where(~pending)
        windows = late_windows(whole_archive, from_ms, to_ms).where(~in_range).persist()
        try:
            covered["late_windows_checked"] = windows.count()
            if covered["late_windows_checked"]:
                recounted = recompute_counts(
                    whole_archive.where(~pending), windows, config.stream.window_seconds, whole_retired
                )
                differences = bl.count_differences(spark, config, recounted, cut.counts_version)
                waiting = {}
                if differences:
                    late_pending = archive_rows_of(whole_archive.where(pending), windows)
                    waiting = {
                        (r["topic"], int(r["ms"]), r["status"]): int(r["pending"])
                        for r in per_window_status(late_pending, "pending")
                        .select("topic", F.unix_millis("window_start").alias("ms"), "status", "pending")
                        .collect()
                    }
                late = [
                    {k: r[k] for k in ("topic", "window_start_ms", "status")}
                    | {"window_counts": r["old_count"], "archive": r["new_count"]}
                    for r in differences
                    if not within_pending(
                        r["old_count"], r["new_count"], waiting.get((r["topic"], int(r["window_start_ms"]), r["status"]), 0)
                    )
                ]
        finally:
            windows.unpersist()
    # Rows archive retention deleted count through their retired counts (kdq.spark.retention).
    recomputed = counts_with_retired(transforms.one_row_per_record(archive), retired, retired, config.stream).select(
        "topic", "window_start", "status", F.col("count").alias("archive_count")
    )
    compared = stored.select("topic", "window_start", "status", F.col("count").alias("table_count")).join(
        recomputed, ["topic", "window_start", "status"], "full_outer"
    )
    if pending_counts is not None:
        compared = compared.join(pending_counts, ["topic", "window_start", "status"], "left")
    else:
        compared = compared.withColumn("pending", F.lit(0))
    joined = (
        compared.select(
            "topic",
            F.unix_millis("window_start").alias("window_start_ms"),
            "status",
            F.coalesce("table_count", F.lit(0)).alias("window_counts"),
            F.coalesce("archive_count", F.lit(0)).alias("archive"),
            F.coalesce("pending", F.lit(0)).alias("pending"),
        )
        .where((F.col("window_counts") < F.col("archive")) | (F.col("window_counts") > F.col("archive") + F.col("pending")))
        .drop("pending")
    ).persist()
    try:
        total = joined.count()
        listed = [r.asDict() for r in joined.orderBy("topic", "window_start_ms", "status").limit(MAX_LISTED).collect()]
    finally:
        joined.unpersist()
    listed = sorted(listed + late, key=lambda m: (m["topic"], m["window_start_ms"], m["status"]))[:MAX_LISTED]
    return total + len(late), listed, covered


def reconcile(
    spark: SparkSession,
    config: Config,
    topics: list[str] | None = None,
    pattern: str | None = None,
    from_ms: int | None = None,
    to_ms: int | None = None,
    after_recompute: bool = False,
) -> ReconcileReport:
    """Both checks for ``topics`` (or ``pattern``; default: the configured topic selection) over the record
    time range [from, to) (both None: everything Kafka still has); ``ok`` is false on any problem.
    ``after_recompute``: [from, to) is also the ingest interval an hourly recompute has just finished
    (:func:`count_mismatches`)."""
    from kdq.spark.backfill import list_topics, resolve_ranges
    from kdq.spark.tables import ensure_tables

    if after_recompute and from_ms is None:
        raise ValueError("after_recompute needs the interval (from, to)")
    ensure_tables(spark, config)
    names = list_topics(config, topics, pattern)
    if from_ms is None:
        ranges = resolve_ranges(config, names, "earliest", "latest")
    else:
        ranges = resolve_ranges(config, names, int(from_ms), int(to_ms))
    partitions = verify_gaps(config, offset_gaps(spark, config, ranges))
    total, mismatches, covered = count_mismatches(spark, config, names, from_ms, to_ms, after_recompute)
    problems = [p for p in partitions if p["gaps"] or p["duplicates"]]
    return ReconcileReport(
        ok=not problems and total == 0,
        from_=iso(from_ms) if from_ms is not None else None,
        to=iso(to_ms) if to_ms is not None else None,
        topics=names,
        partitions_checked=len(partitions),
        partitions_with_gaps=len([p for p in partitions if p["gaps"]]),
        missing_offsets=sum(p["missing"] for p in partitions),
        duplicate_offsets=sum(p["duplicates"] for p in partitions),
        count_mismatches=total,
        mismatches=mismatches,
        after_recompute=after_recompute,
        pending_rows=covered["pending_rows"],
        late_windows_checked=covered["late_windows_checked"],
        problems=problems[:MAX_LISTED],
        partitions=partitions,
    )
