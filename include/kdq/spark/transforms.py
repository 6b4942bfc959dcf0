"""Pure DataFrame → DataFrame transforms shared by the speed and the batch layer.

parse → validate → event time → window → (late?) → count. Both layers call
these same functions, so a window recomputed by the batch layer from the raw
archive equals what the stream would have counted, by construction.

Everything here is a native Spark expression (no Python UDF) except rules
the compiler cannot translate, which fall back to a pandas UDF for their
topics only (see :mod:`kdq.spark.rule_compiler`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kdq.config import StreamConfig
from kdq.rules import NO_RULE_VERSION, RuleSet, TopicRule
from kdq.spark.rule_compiler import parse_value, select_by_topic, value_reason

VALID = "valid"
INVALID = "invalid"
BAD_TIMESTAMP = "bad_timestamp"
FUTURE_TIMESTAMP = "future_timestamp"

# The event times a record may carry: 1970-01-01T00:00:00.000Z to
# 9999-12-31T23:59:59.999Z in epoch millis. Outside it a value is a unit
# mistake (epoch micro- or nanoseconds), a sentinel or garbage, and would
# overflow Spark's microsecond timestamps; such records are bad_timestamp.
MIN_EVENT_MS = 0
MAX_EVENT_MS = 253_402_300_799_999

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


def _by_topic(topic: Column, rules: RuleSet, pick, default: Column) -> Column:
    """First-match-wins CASE over the topic column (see rule_compiler.select_by_topic), with a default."""
    selected = select_by_topic(topic, rules, pick)
    return default if selected is None else F.coalesce(selected, default)


def _in_range_millis(millis: Column) -> Column:
    """Epoch millis as a timestamp, or null outside [MIN_EVENT_MS, MAX_EVENT_MS] (never an overflow)."""
    return F.timestamp_millis(F.when(millis.between(MIN_EVENT_MS, MAX_EVENT_MS), millis))


def _event_time_from_field(rule: TopicRule) -> Column:
    """The configured JSON field as a timestamp, or null when it cannot be read.

    Reads the ``__parsed`` VARIANT column of :func:`classify` by name.
    epoch_millis: a JSON number (or a string of digits); iso8601: a string
    such as 2023-11-14T22:13:20.123Z; auto: numbers as epoch millis, strings
    as ISO-8601 (digit-only strings as epoch millis).
    """
    path = rule.event_time_path
    as_number = F.expr(f"try_variant_get(__parsed, '{path}', 'bigint')")
    as_string = F.expr(f"try_variant_get(__parsed, '{path}', 'string')")
    # Numbers: reject doubles silently truncated to bigint by requiring an integral JSON number.
    is_number = F.expr(f"schema_of_variant(variant_get(__parsed, '{path}')) = 'BIGINT'")
    millis = F.when(is_number, as_number)
    digits = F.when(as_string.rlike(r"^-?[0-9]{1,15}$"), as_string.cast("bigint"))
    iso = F.when(~is_number & as_string.contains("-"), F.expr(f"try_to_timestamp(try_variant_get(__parsed, '{path}', 'string'))"))
    fmt = rule.event_time_format
    if fmt == "epoch_millis":
        result = _in_range_millis(F.coalesce(millis, F.when(~is_number, digits)))
    elif fmt == "iso8601":
        result = iso
    else:
        result = F.coalesce(_in_range_millis(millis), _in_range_millis(F.when(~is_number, digits)), iso)
    # Range-checked once more as a timestamp: ISO strings may name year 0 or a
    # year before 1970.
    in_range = F.unix_millis(result).between(MIN_EVENT_MS, MAX_EVENT_MS)
    result = F.when(in_range, result)
    return result.alias("event_time_field")


def classify(
    records: DataFrame,
    rules: RuleSet,
    stream: StreamConfig,
    ingest_time: int | Column,
) -> DataFrame:
    """Kafka records (key, value, topic, partition, offset, timestamp) → one classified row per record.

    ``ingest_time`` is epoch millis fixed per micro-batch (recorded in the
    batch ledger, so a replayed batch is classified identically) or, for the
    batch layer, the archived timestamp column.
    """
    ingest = ingest_time if isinstance(ingest_time, Column) else F.timestamp_millis(F.lit(int(ingest_time)))
    size_ms = stream.window_seconds * 1000
    topic = F.col("topic")
    # Few wide projections rather than a withColumn chain: every projection
    # re-analyses the (large) compiled rule expressions, and that analysis,
    # not the data, dominated small micro-batches.
    parsed = records.select(
        topic,
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("key"),
        F.col("value"),
        ingest.alias("ingest_time"),
        parse_value(F.col("value")).alias("__parsed"),
    )
    no_time = F.lit(None).cast("timestamp")
    field_time = _by_topic(topic, rules, lambda r: _event_time_from_field(r) if r.event_time_field else None, no_time)
    has_field_rule = _by_topic(topic, rules, lambda r: F.lit(bool(r.event_time_field)), F.lit(False))
    checked = parsed.select(
        "*",
        field_time.alias("__field_time"),
        has_field_rule.alias("__has_field_rule"),
        value_reason(topic, F.col("value"), F.col("__parsed"), rules, stream.max_value_bytes).alias("__value_problem"),
    )
    bad_ts = (F.col("__has_field_rule") & F.col("__field_time").isNull()) | F.col("kafka_timestamp").isNull()
    event_time = F.when(bad_ts, F.col("kafka_timestamp")).otherwise(F.coalesce(F.col("__field_time"), F.col("kafka_timestamp")))
    future = event_time > F.col("ingest_time") + F.expr(f"INTERVAL {stream.future_margin_seconds} SECONDS")
    problem = F.col("__value_problem")
    # One reason per record, so reason counts add up to the invalid count.
    # Priority: what is wrong with the bytes (too_large, not_utf8, not_json, ...)
    # first; then the clock, because it decides the window; then the schema.
    reason = (
        F.when(problem.isNotNull() & ~problem.startswith("schema:"), problem)
        .when(bad_ts, F.lit(BAD_TIMESTAMP))
        .when(future, F.lit(FUTURE_TIMESTAMP))
        .otherwise(problem)
    )
    timed = checked.select(
        *[c for c in ("topic", "partition", "offset", "kafka_timestamp", "key", "value", "ingest_time")],
        event_time.alias("event_time"),
        reason.alias("reason"),
    )
    # A record from a clock far in the future counts in the window of its ingest
    # time: counting it in its own (future) window would publish numbers for a
    # second that has not happened yet.
    counted_time = F.when(F.col("reason") == FUTURE_TIMESTAMP, F.col("ingest_time")).otherwise(F.col("event_time"))
    window_start = F.timestamp_millis((F.floor(F.unix_millis(counted_time) / size_ms) * size_ms).cast("bigint"))
    versions = _by_topic(topic, rules, lambda r: F.lit(r.version), F.lit(NO_RULE_VERSION))
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
        versions.alias("rules_version"),
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
    watermarks = F.create_map(
        *[item for topic, ms in sorted(max_event_ms_before.items()) for item in (F.lit(topic), F.timestamp_millis(F.lit(int(ms))))]
    )
    limit = F.element_at(watermarks, F.col("topic")) - F.expr(f"INTERVAL {stream.allowed_lateness_seconds} SECONDS")
    window_end = F.col("window_start") + F.expr(f"INTERVAL {stream.window_seconds} SECONDS")
    late = F.coalesce(window_end <= limit, F.lit(False))
    return classified.withColumn("counted", ~late)


def batch_aggregates(classified: DataFrame) -> DataFrame:
    """Everything a micro-batch needs to know, in one aggregation (one Spark job):
    rows per (topic, window_start, valid, reason, counted), with the largest
    trustworthy event time. :mod:`kdq.batch_summary` turns the (small) result
    into window increments, reason increments and per-topic statistics."""
    trusted = F.col("reason").isNull() | ~F.col("reason").isin(BAD_TIMESTAMP, FUTURE_TIMESTAMP)
    return classified.groupBy("topic", "window_start", "valid", "reason", "counted").agg(
        F.count("*").alias("count"),
        F.unix_millis(F.max(F.when(trusted, F.col("event_time")))).alias("max_event_ms"),
        F.max("rules_version").alias("rules_version"),
    ).select(
        "topic",
        F.unix_millis("window_start").alias("window_start_ms"),
        "valid",
        "reason",
        "counted",
        "count",
        "max_event_ms",
        "rules_version",
    )


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


def invalid_candidates(classified: DataFrame, limit: int) -> DataFrame:
    """Up to ``limit`` invalid records with a readable preview: the candidates for the quarantine sample.

    A sample, not a copy (the archive holds every record), so the batch only
    looks at a bounded number of rows, however many are invalid.
    """
    return (
        classified.where(~F.col("valid"))
        .select(
            "topic",
            "partition",
            "offset",
            F.unix_millis("window_start").alias("window_start_ms"),
            "reason",
            F.substring(F.expr("CAST(value AS STRING)"), 1, 512).alias("value_preview"),
            F.coalesce(F.length("value"), F.lit(0)).cast("bigint").alias("value_bytes"),
        )
        .limit(limit)
    )


def union_all(frames: list[DataFrame]) -> DataFrame:
    return reduce(DataFrame.unionByName, frames)
