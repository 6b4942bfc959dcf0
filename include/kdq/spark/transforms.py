"""Pure DataFrame → DataFrame transforms shared by the speed and the batch layer.

parse → validate → event time → window → (late?) → count. Both layers call
these same functions, so a window recomputed by the batch layer from the raw
archive equals what the stream would have counted, by construction.

No Python runs per record: the value is judged by one JVM function
(:mod:`kdq.spark.classifier`), everything else is a native Spark expression.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from kdq.config import StreamConfig
from kdq.rules import RuleSet
from kdq.spark.classifier import ClassifierDocument, classifier
from kdq.sql_literals import string_literal

VALID = "valid"
INVALID = "invalid"
BAD_TIMESTAMP = "bad_timestamp"
FUTURE_TIMESTAMP = "future_timestamp"
SCHEMA_PREFIX = "schema:"
# Records of an operator's quarantined offset ranges (kdq.stream.failures): the speed layer marks
# them with this column; classify never runs the classifier on them and counts them invalid with this reason.
QUARANTINED_COLUMN = "__kdq_quarantined"
QUARANTINED = "internal_error:quarantined"
PATTERN_BUDGET_PREFIX = "pattern_budget:"

# The event times a record may carry: 1970-01-01T00:00:00.000Z to
# 9999-12-31T23:59:59.999Z in epoch millis. Outside it a value is a unit
# mistake (epoch micro- or nanoseconds), a sentinel or garbage, and would
# overflow Spark's microsecond timestamps; such records are bad_timestamp.
MIN_EVENT_MS = 0
MAX_EVENT_MS = 253_402_300_799_999

def window_partition_columns(window_start_ms: Column | str) -> list[Column]:
    """``window_date`` and ``window_hour`` (UTC, whatever the session's time zone) of windows starting at
    ``window_start_ms`` (epoch millis): the partition columns of window_counts and summaries (kdq.tables)."""
    ms = F.col(window_start_ms) if isinstance(window_start_ms, str) else window_start_ms
    return [
        F.date_from_unix_date(F.floor(ms / 86_400_000).cast("int")).alias("window_date"),
        (F.floor(ms / 3_600_000) % 24).cast("int").alias("window_hour"),
    ]


# Columns of the classified frame (and of the raw archive, minus the write-time ones).
CLASSIFIED_COLUMNS = (
    "topic",
    "partition",
    "offset",
    "kafka_timestamp",
    "event_time",
    "window_start",
    "key",
    "value",
    "ingest_time",
    "valid",
    "reason",
    "rules_version",
    "event_hour",
)


def classify(
    records: DataFrame,
    rules: RuleSet | ClassifierDocument,
    stream: StreamConfig,
    ingest_time: int | Column,
) -> DataFrame:
    """Kafka records (key, value, topic, partition, offset, timestamp) → one classified row per record.

    ``ingest_time`` is epoch millis fixed per micro-batch (recorded in the
    micro-batch ledger, so a replayed batch is classified identically) or, for the
    batch layer, the archived timestamp column. The value itself is judged by
    the JVM classifier (:mod:`kdq.spark.classifier`); what remains here is the
    clock: which time a record counts at, and one reason per record. ``rules``
    may be a stored :class:`ClassifierDocument` (the speed layer replaying a batch
    with the rules it was first classified with).
    """
    ingest = ingest_time if isinstance(ingest_time, Column) else F.timestamp_millis(F.lit(int(ingest_time)))
    size_ms = stream.window_seconds * 1000
    verdict = classifier(records.sparkSession, rules, stream)
    quarantined = F.col(QUARANTINED_COLUMN) if QUARANTINED_COLUMN in records.columns else None
    judge = verdict(F.col("topic"), F.col("value"))
    if quarantined is not None:  # null verdict for them: the classifier never sees their bytes
        judge = F.when(~quarantined, judge)
    checked = records.select(
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("key"),
        F.col("value"),
        ingest.alias("ingest_time"),
        judge.alias("__v"),
        *([quarantined.alias(QUARANTINED_COLUMN)] if quarantined is not None else []),
    )
    # A Kafka timestamp outside 1970..9999 (or none) is no clock to count by: such a
    # record is bad_timestamp in the window of its ingest time.
    kafka_time_ok = F.coalesce(F.unix_millis("kafka_timestamp").between(MIN_EVENT_MS, MAX_EVENT_MS), F.lit(False))
    bad_ts = F.col("__v.event_time_bad") | ~kafka_time_ok
    fallback_time = F.when(kafka_time_ok, F.col("kafka_timestamp")).otherwise(F.col("ingest_time"))
    field_time = F.timestamp_millis(F.col("__v.event_ms"))
    event_time = F.when(bad_ts, fallback_time).otherwise(F.coalesce(field_time, F.col("kafka_timestamp")))
    future = event_time > F.col("ingest_time") + F.expr(f"INTERVAL {stream.future_margin_seconds} SECONDS")
    problem = F.col("__v.problem")
    # One reason per record, so reason counts add up to the invalid count.
    # Priority: what is wrong with the bytes (too_large, not_utf8, not_json, ...)
    # first; then the clock, because it decides the window; then the rule.
    judged_by_rule = problem.startswith(SCHEMA_PREFIX) | problem.startswith(PATTERN_BUDGET_PREFIX)
    reason = (
        F.when(problem.isNotNull() & ~judged_by_rule, problem)
        .when(bad_ts, F.lit(BAD_TIMESTAMP))
        .when(future, F.lit(FUTURE_TIMESTAMP))
        .otherwise(problem)
    )
    if quarantined is not None:
        # Counted at their Kafka timestamp when it is a usable clock (not ahead of ingest time by more than
        # the margin), else at ingest time, like bad_timestamp.
        usable = kafka_time_ok & (
            F.col("kafka_timestamp") <= F.col("ingest_time") + F.expr(f"INTERVAL {stream.future_margin_seconds} SECONDS")
        )
        event_time = F.when(quarantined, F.when(usable, F.col("kafka_timestamp")).otherwise(F.col("ingest_time"))).otherwise(
            event_time
        )
        reason = F.when(quarantined, F.lit(QUARANTINED)).otherwise(reason)
    timed = checked.select(
        *[c for c in ("topic", "partition", "offset", "kafka_timestamp", "key", "value", "ingest_time")],
        event_time.alias("event_time"),
        reason.alias("reason"),
        F.col("__v.rules_version").alias("rules_version"),
    )
    # A record from a clock far in the future counts in the window of its ingest
    # time: counting it in its own (future) window would publish numbers for a
    # second that has not happened yet.
    counted_time = F.when(F.col("reason") == FUTURE_TIMESTAMP, F.col("ingest_time")).otherwise(F.col("event_time"))
    window_start = F.timestamp_millis((F.floor(F.unix_millis(counted_time) / size_ms) * size_ms).cast("bigint"))
    return timed.select(
        "topic",
        "partition",
        "offset",
        "kafka_timestamp",
        "event_time",
        window_start.alias("window_start"),
        "key",
        "value",
        "ingest_time",
        F.col("reason").isNull().alias("valid"),
        "reason",
        "rules_version",
        F.date_format(window_start, "yyyy-MM-dd-HH").alias("event_hour"),
    )


def mark_late(
    classified: DataFrame,
    max_event_ms_before: Mapping[str, int],
    stream: StreamConfig,
) -> DataFrame:
    """Add ``counted``: false for records whose window closed for the speed layer.

    Lateness is judged per topic against the maximum event time seen on that
    topic *before* this batch, so one producer's clock never makes another
    topic's records late, and a replayed batch (same ledger entry) decides
    exactly the same.
    """
    if not max_event_ms_before:
        return classified.withColumn("counted", F.lit(True))
    # One SQL map literal, not a Column per topic: each Column is a py4j call, and with a thousand topics those
    # calls took ~1 s of every micro-batch (benchmarks/PERF_NOTES.md, "eighteenth pass").
    watermarks = F.expr(
        "map(" + ", ".join(f"{string_literal(topic)}, {int(ms)}L" for topic, ms in sorted(max_event_ms_before.items())) + ")"
    )
    limit = F.timestamp_millis(F.element_at(watermarks, F.col("topic"))) - F.expr(
        f"INTERVAL {stream.allowed_lateness_seconds} SECONDS")
    window_end = F.col("window_start") + F.expr(f"INTERVAL {stream.window_seconds} SECONDS")
    late = F.coalesce(window_end <= limit, F.lit(False))
    return classified.withColumn("counted", ~late)


def batch_aggregates(classified: DataFrame) -> DataFrame:
    """Everything a micro-batch needs to know, in one aggregation (one Spark job):
    rows per (topic, window_start, valid, reason, counted), with the largest
    trustworthy event time, capped at the ingest time (the watermark's input).
    :mod:`kdq.stream.micro_batch` turns the (small) result
    into window increments, reason increments and per-topic statistics."""
    trusted = _trusted_clock()
    watermark_input = _watermark_input()
    keys = ("topic", "window_start", "valid", "reason", "counted")
    # Two steps because a string max (rules_version) has no fixed-width buffer: Spark would sort every
    # record of the batch for it (a SortAggregate, ~6 % of a batch's CPU in a profile). With the version
    # as a grouping key the per-record step is a hash aggregate; the string max runs on its few rows.
    # The Kafka timestamps' range gives the stream's end-to-end latency (produce → counts visible in Delta).
    per_version = classified.groupBy(*keys, "rules_version").agg(
        F.count("*").alias("count"),
        F.max(F.when(trusted, watermark_input)).alias("max_event_time"),
        F.min("kafka_timestamp").alias("oldest_kafka_timestamp"),
        F.max("kafka_timestamp").alias("newest_kafka_timestamp"),
    )
    return per_version.groupBy(*keys).agg(
        F.sum("count").alias("count"),
        F.unix_millis(F.max("max_event_time")).alias("max_event_ms"),
        F.max("rules_version").alias("rules_version"),
        F.unix_millis(F.min("oldest_kafka_timestamp")).alias("oldest_kafka_ms"),
        F.unix_millis(F.max("newest_kafka_timestamp")).alias("newest_kafka_ms"),
    ).select(
        "topic",
        F.unix_millis("window_start").alias("window_start_ms"),
        "valid",
        "reason",
        "counted",
        "count",
        "max_event_ms",
        "rules_version",
        "oldest_kafka_ms",
        "newest_kafka_ms",
    )


BATCH_COUNTS_FUNCTION = "kdq_batch_counts"


def batch_counts_metric(classified: DataFrame) -> Column:
    """:func:`batch_aggregates` as one aggregate value: a JSON array of the same rows (same groups, same
    figures), computed by the JVM aggregate ``io.kdq.spark.counts.BatchCounts``.

    Why: the speed layer computes it as an observed metric of the pass that writes the micro-batch's
    records to the raw archive (``DataFrame.observe``), so the 1 KB values are read, classified and
    written once and never cached (:mod:`kdq.spark.speed_layer`). Parse the result with
    :func:`batch_counts_rows`. Registered once per session.
    """
    spark = classified.sparkSession
    if not spark.catalog.functionExists(BATCH_COUNTS_FUNCTION):
        spark._jsparkSession.udf().register(BATCH_COUNTS_FUNCTION, spark._jvm.io.kdq.spark.counts.BatchCounts.udaf())
    return F.call_function(
        BATCH_COUNTS_FUNCTION,
        F.col("topic"),
        F.unix_millis("window_start"),
        F.col("valid"),
        F.col("reason"),
        F.col("counted"),
        F.col("rules_version"),
        F.when(_trusted_clock(), F.unix_millis(_watermark_input())),
        F.unix_millis("kafka_timestamp"),
    )


def batch_counts_rows(value: str | None) -> list[dict]:
    """The rows of :func:`batch_aggregates` from the value of :func:`batch_counts_metric` (None: no row)."""
    import json

    return json.loads(value) if value else []


def _trusted_clock() -> Column:
    return F.col("reason").isNull() | ~F.col("reason").isin(BAD_TIMESTAMP, FUTURE_TIMESTAMP)


def _watermark_input() -> Column:
    # The watermark's input is the event time capped at the record's ingest time: a clock ahead by less than
    # the future margin still makes a valid record, counted in its own window, but only a time the stream has
    # itself reached may close windows. Uncapped, one record 240 s ahead closed every window of its topic's
    # next three minutes for the stream (allowed lateness 60 s), and their on-time records went to the batch layer.
    return F.least(F.col("event_time"), F.col("ingest_time"))


def count_windows(classified: DataFrame, stream: StreamConfig) -> DataFrame:
    """(topic, window_start, window_end, status, count, rules_version) over the rows to count."""
    rows = classified.where(F.col("counted")) if "counted" in classified.columns else classified
    return (
        rows.groupBy("topic", "window_start")
        .agg(
            F.count(F.when(F.col("valid"), 1)).alias(VALID),
            F.count(F.when(~F.col("valid"), 1)).alias(INVALID),
            F.max("rules_version").alias("rules_version"),
        )
        .select(
            "topic",
            "window_start",
            (F.col("window_start") + F.expr(f"INTERVAL {stream.window_seconds} SECONDS")).alias("window_end"),
            F.explode(
                F.array(
                    F.struct(F.lit(VALID).alias("status"), F.col(VALID).alias("count")),
                    F.struct(F.lit(INVALID).alias("status"), F.col(INVALID).alias("count")),
                )
            ).alias("s"),
            "rules_version",
        )
        # Zero counts are not stored: a window has a row per status it has seen.
        .where(F.col("s.count") > 0)
        .select("topic", "window_start", "window_end", "s.status", "s.count", "rules_version")
    )


def one_row_per_record(archived: DataFrame) -> DataFrame:
    """Archive rows with each (topic, partition, offset) once: the copy archived first.

    The archive should hold every record once, but a record archived twice
    (a restored backup, a backfill run against another checkpoint) must not be
    counted twice by a recompute or a rebuild. The first copy by ingest time
    (then batch id) is the one the stream or the first load decided on.
    """
    first = Window.partitionBy("topic", "partition", "offset").orderBy(
        F.col("ingest_time").asc_nulls_last(), F.col("batch_id").asc_nulls_last()
    )
    return archived.withColumn("__copy", F.row_number().over(first)).where(F.col("__copy") == 1).drop("__copy")


def reason_counts(rows: DataFrame, reasons_window_seconds: int, by: Sequence[str] = ()) -> DataFrame:
    """(``by`` columns, topic, window_start, reason, count) of the invalid ``rows`` per coarse reasons window: the
    shape of the ``invalid_reasons`` table (the stream sums the same in Python, :mod:`kdq.stream.micro_batch`)."""
    size = int(reasons_window_seconds) * 1000
    return (
        rows.where(~F.col("valid"))
        .select(
            *by,
            "topic",
            F.timestamp_millis(F.floor(F.unix_millis("window_start") / size) * size).alias("window_start"),
            "reason",
        )
        .groupBy(*by, "topic", "window_start", "reason")
        .agg(F.count("*").cast("bigint").alias("count"))
    )


def reason_differences(target: DataFrame, current: DataFrame) -> DataFrame:
    """(topic, window_start_ms, reason, count) increments that turn ``current`` into ``target`` (both
    (topic, window_start, reason, count)); only non-zero ones."""
    return (
        target.withColumnRenamed("count", "__target")
        .join(current.withColumnRenamed("count", "__current"), ["topic", "window_start", "reason"], "full_outer")
        .select(
            "topic",
            F.unix_millis("window_start").alias("window_start_ms"),
            "reason",
            (F.coalesce("__target", F.lit(0)) - F.coalesce("__current", F.lit(0))).cast("bigint").alias("count"),
        )
        .where(F.col("count") != 0)
    )


def union_all(frames: list[DataFrame]) -> DataFrame:
    return reduce(DataFrame.unionByName, frames)
