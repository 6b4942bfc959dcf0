"""The batch layer's pure transforms: which windows an interval's late rows touched, every archived record of
those windows, and their absolute counts (the batch layer's steps 1 and 2, :mod:`kdq.spark.batch_layer`).

DataFrame → DataFrame (Column for the predicates): nothing here writes. The counts are the stream's own
(:func:`kdq.spark.transforms.count_windows`), so both layers agree by construction; the Delta side (the
corrections, the compare-and-set MERGE) is :mod:`kdq.spark.batch_layer`, the pushes :mod:`kdq.spark.outputs`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kdq.config import StreamConfig
from kdq.spark import transforms
from kdq.spark.retention import counts_with_retired
from kdq.windows import event_hour

STREAM_SOURCE = "stream"


def _ts(ms: int):
    return F.timestamp_millis(F.lit(int(ms)))


def late_windows(archive_df: DataFrame, start_ms: int, end_ms: int) -> DataFrame:
    """(topic, window_start) of archive rows ingested in [start, end) that the stream did not count.

    Also rows another job loaded (``source <> 'stream'``): their windows were
    never counted by the stream at all. The ``ingest_time`` range is a literal
    predicate, so Delta skips every file whose ingest_time statistics miss it.
    """
    return (
        archive_df.where((F.col("ingest_time") >= _ts(start_ms)) & (F.col("ingest_time") < _ts(end_ms)))
        .where(counted_by_batch_layer())
        .select("topic", "window_start")
        .distinct()
    )


def counted_by_batch_layer() -> Column:
    """Archive rows the hourly recompute of their ingest interval counts: those the stream did not count
    (too late), and those another job loaded (``source <> 'stream'``)."""
    return ~F.col("counted") | (F.coalesce(F.col("source"), F.lit("")) != STREAM_SOURCE)


def awaiting_recompute(recomputed_before_ms: int) -> Column:
    """Rows a later interval's recompute will count, once every interval before ``recomputed_before_ms``
    is recomputed: those :func:`counted_by_batch_layer` picks, ingested at or after that instant."""
    return counted_by_batch_layer() & (F.col("ingest_time") >= _ts(recomputed_before_ms))


def _window_hours(windows_df: DataFrame) -> list[str]:
    starts = windows_df.select(F.unix_millis("window_start").alias("ms")).distinct().collect()
    return sorted({event_hour(row["ms"]) for row in starts})


def archive_rows_of(archive_df: DataFrame, windows_df: DataFrame, hours: Sequence[str] | None = None) -> DataFrame:
    """Every archived record of the given windows once, reading only their ``event_hour`` partitions.

    ``event_hour`` is the UTC hour of window_start (the session factory pins
    the session time zone to UTC, which is how the stream wrote it).
    """
    windows = windows_df.select("topic", "window_start").distinct()
    hours = _window_hours(windows) if hours is None else list(hours)
    if not hours:
        return archive_df.where(F.lit(False))
    rows = archive_df.where(F.col("event_hour").isin(hours)).join(
        F.broadcast(windows), ["topic", "window_start"], "left_semi"
    )
    return transforms.one_row_per_record(rows)


def recompute_counts(
    archive_df: DataFrame, windows_df: DataFrame, window_seconds: int, retired: DataFrame | None = None
) -> DataFrame:
    """Absolute (topic, window_start, window_end, status, count, rules_version) of the given windows.

    Counts every archived row of each window, whether the stream counted it
    or not, with the stream's own count transform: the archive carries the
    valid flag and window_start the shared classifier computed, so both
    layers agree by construction. Statuses with a zero count have no row.
    With ``retired`` (the ``retired_counts`` table), rows archive retention
    deleted count through their retired counts (:mod:`kdq.spark.retention`):
    a late record for a retired window adds to its full count.
    """
    rows = archive_rows_of(archive_df, windows_df)
    stream = StreamConfig(window_seconds=window_seconds)
    if retired is None:
        return transforms.count_windows(rows.drop("counted"), stream)
    return counts_with_retired(rows, retired, windows_df, stream)


def late_reason_counts(archive_df: DataFrame, start_ms: int, end_ms: int, reasons_window_seconds: int) -> DataFrame:
    """Reasons of the invalid rows ingested in [start, end) that the stream did not count (the rows
    :func:`late_windows` picks), per (topic, coarse window, reason), each record once."""
    rows = (
        archive_df.where((F.col("ingest_time") >= _ts(start_ms)) & (F.col("ingest_time") < _ts(end_ms)))
        .where(counted_by_batch_layer())
    )
    return transforms.reason_counts(transforms.one_row_per_record(rows), reasons_window_seconds)
