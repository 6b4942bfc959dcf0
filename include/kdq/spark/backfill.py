"""Archive from Kafka: load raw records of an offset or time range into the raw archive, skipping archived ones.

For a new deployment (history the stream never saw) or a gap in the archive.
The range is first **resolved to concrete offsets** per partition with the
Kafka client (watermarks, ``offsets_for_times``), so the Spark batch Kafka
source (``assign`` + ``startingOffsets``/``endingOffsets`` JSON) reads exactly
that range, whatever arrives meanwhile, and the report can say per partition
what Kafka no longer had (requested start below the earliest available offset:
deleted by retention or ``delete_records``).

Records are classified with the shared :func:`kdq.spark.transforms.classify`
(ingest time = the job's start), archived with ``counted = false`` and
``source = 'archive_from_kafka'``, through a Delta MERGE that only inserts
rows whose (topic, partition, offset) is not archived yet. The MERGE match
reads the loaded topics' rows in the loaded offset span (file skipping on the
``offset`` statistics), not by ``event_hour``: an archived row's window may
differ from the new classification (a rule changed since), and matching by
partition would then duplicate it. Re-running the job inserts nothing.

**Never ahead of the stream.** Each partition's range ends at the end offset of
the stream's last committed micro-batch (read from its checkpoint); the rest
is reported as ``held_back_for_stream``, and a partition the stream has not read
yet loads nothing. That, not Delta, is what keeps the two from archiving the
same record: the stream's archive writes are blind appends, and under Delta's
default WriteSerializable isolation a MERGE does not conflict with a concurrent
blind append, even of rows its match condition would have found. Should a
record still be archived twice (an archive restored from a backup, a job run
against another checkpoint), the recompute and the rebuild count each
(topic, partition, offset) once (:func:`kdq.spark.transforms.one_row_per_record`).

The hourly recompute (``spark_jobs/batch_recompute.py``) then counts the
loaded windows: it recomputes every window with archive rows ingested in its
interval whose ``source`` is not ``stream``. Run it for the interval that
contains this job's run (the report's ``ingest_time``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from functools import reduce
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq.config import Config
from kdq.job_reports import ArchiveReport
from kdq.rules import RuleSet
from kdq.spark import transforms
from kdq.spark.kafka_fallback import KAFKA_SOURCE_SCHEMA, is_record_conversion_error, read_ranges
from kdq.spark.tables import ensure_tables, table_path
from kdq.spark.writers import now_ms, retry_on_conflict
from kdq.stream.checkpoint_offsets import OffsetRange, passed_offsets, speed_layer_checkpoint
from kdq.tables import RAW_ARCHIVE
from kdq.windows import topic_selected

log = logging.getLogger("kdq.backfill")

SOURCE = "archive_from_kafka"
EARLIEST, LATEST = -2, -1


def _consumer(config: Config):
    from confluent_kafka import Consumer

    return Consumer({**config.kafka_client_conf(), "group.id": "kdq-archive-from-kafka", "enable.auto.commit": False})


def list_topics(config: Config, topics: Sequence[str] | None = None, pattern: str | None = None) -> list[str]:
    """The explicit ``topics``, or every topic of the cluster matching ``pattern`` (default: the stream's
    include/exclude settings, never internal or kdq's own output topics)."""
    if topics:
        return sorted(set(topics))
    consumer = _consumer(config)
    try:
        names = consumer.list_topics(timeout=15).topics
    finally:
        consumer.close()
    kafka = config.kafka
    if pattern:
        return sorted(t for t in names if re.fullmatch(pattern, t) and not t.startswith("_"))
    return sorted(t for t in names if topic_selected(t, kafka.topic_include, kafka.topic_exclude, (kafka.metrics_topic,)))


def _bound(spec: Any, topic: str, partition: int, low: int, high: int, by_time: dict) -> int:
    """One end of the range for one partition: 'earliest'/'latest', a JSON offsets object, or epoch millis."""
    if spec in (None, "earliest"):
        return low
    if spec == "latest":
        return high
    if isinstance(spec, int):  # a time: the first offset at or after it (none: the end)
        offset = by_time.get((topic, partition), -1)
        return high if offset < 0 else offset
    value = spec.get(topic, {}).get(str(partition))
    if value is None or value == EARLIEST:
        return low
    if value == LATEST:
        return high
    return int(value)


def resolve_ranges(
    config: Config,
    topics: Sequence[str],
    start: str | int | dict | None = "earliest",
    end: str | int | dict | None = "latest",
    stop_at_stream: bool = False,
) -> list[dict]:
    """Per partition: requested [start, end), Kafka's [earliest, latest), and the part Kafka no longer has.

    ``stop_at_stream``: end no later than the stream's last committed micro-batch (what archive-from-Kafka
    may load); the end of the stream's checkpoint is reported either way (``stream_passed``).

    ``start``/``end``: 'earliest'/'latest', a dict (or JSON text) like Spark's
    ``{"topic": {"0": 42}}`` (-2 earliest, -1 latest), or epoch millis (record time).
    """
    from confluent_kafka import TopicPartition

    start = json.loads(start) if isinstance(start, str) and start.startswith("{") else start
    end = json.loads(end) if isinstance(end, str) and end.startswith("{") else end
    # Never past what the stream has passed: a record at or above the stream's position is the
    # stream's to archive, and a concurrent stream append would not stop this insert (see module doc).
    passed = passed_offsets(speed_layer_checkpoint(config))
    consumer = _consumer(config)
    try:
        metadata = consumer.list_topics(timeout=15).topics
        partitions = [
            (t, p) for t in topics if t in metadata and metadata[t].error is None for p in sorted(metadata[t].partitions)
        ]
        watermarks = {tp: consumer.get_watermark_offsets(TopicPartition(*tp), timeout=15) for tp in partitions}
        by_time: dict = {}
        for which, spec in (("start", start), ("end", end)):
            if isinstance(spec, int) and partitions:
                found = consumer.offsets_for_times([TopicPartition(t, p, spec) for t, p in partitions], timeout=15)
                by_time[which] = {(tp.topic, tp.partition): tp.offset for tp in found}
    finally:
        consumer.close()
    ranges = []
    for topic, partition in partitions:
        low, high = watermarks[(topic, partition)]
        s = _bound(start, topic, partition, low, high, by_time.get("start", {}))
        requested_end = min(_bound(end, topic, partition, low, high, by_time.get("end", {})), high)
        stream_passed = passed.get((topic, partition))
        if stop_at_stream:
            e = min(requested_end, stream_passed if stream_passed is not None else min(s, low))
        else:
            e = requested_end
        ranges.append(
            {
                "topic": topic,
                "partition": partition,
                "requested_start": s,
                "requested_end": requested_end,
                # The end of the stream's last committed batch (None: the stream has not read this partition).
                "stream_passed": stream_passed,
                "held_back_for_stream": max(0, requested_end - max(e, s, low)),
                "kafka_earliest": low,
                "kafka_latest": high,
                "start": max(s, low),
                "end": e,
                # Offsets requested but gone from Kafka (retention, delete_records): [from, to).
                "missing_in_kafka": [s, min(low, requested_end)] if s < low and s < requested_end else None,
            }
        )
    return ranges


def read_kafka_range(spark: SparkSession, config: Config, ranges: Sequence[dict]) -> DataFrame | None:
    """The records of the resolved ranges with Spark's batch Kafka source (None: nothing to read)."""
    todo = [r for r in ranges if r["start"] < r["end"]]
    if not todo:
        return None
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for r in todo:
        assign.setdefault(r["topic"], []).append(r["partition"])
        starting.setdefault(r["topic"], {})[str(r["partition"])] = r["start"]
        ending.setdefault(r["topic"], {})[str(r["partition"])] = r["end"]
    reader = (
        spark.read.format("kafka")
        .options(**config.spark_kafka_options())
        .option("assign", json.dumps(assign))
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        # Records deleted between resolving and reading are reported by a re-run, not fatal.
        .option("failOnDataLoss", "false")
    )
    return reader.load()


def archive_records(
    spark: SparkSession, config: Config, records: DataFrame, rules: RuleSet, ingest_ms: int, run_id: str
) -> dict[str, int]:
    """Classify Kafka records and insert those not archived yet; returns {"read", "loaded", "skipped"}."""
    from delta.tables import DeltaTable

    classified = transforms.classify(records, rules, config.stream, ingest_ms).select(
        *transforms.CLASSIFIED_COLUMNS,
        F.lit(False).alias("counted"),
        F.lit(int(ingest_ms)).cast("bigint").alias("batch_id"),
        F.lit(SOURCE).alias("source"),
    ).select(*RAW_ARCHIVE.column_names)
    span = records.groupBy("topic").agg(F.min("offset").alias("lo"), F.max("offset").alias("hi"), F.count("*").alias("n")).collect()
    read = sum(int(r["n"]) for r in span)
    if not read:
        return {"read": 0, "loaded": 0, "skipped": 0}
    # A Column, not SQL text: topic names are data, never spliced into SQL.
    bounds = reduce(
        lambda a, b: a | b,
        [(F.col("t.topic") == F.lit(r["topic"])) & F.col("t.offset").between(int(r["lo"]), int(r["hi"])) for r in span],
    )
    condition = (
        bounds
        & (F.col("t.topic") == F.col("s.topic"))
        & (F.col("t.partition") == F.col("s.partition"))
        & (F.col("t.offset") == F.col("s.offset"))
    )
    metadata = f"kdq-archive-from-kafka {run_id}"
    path = table_path(config, RAW_ARCHIVE)
    def insert_new() -> None:
        spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", metadata)
        try:
            DeltaTable.forPath(spark, path).alias("t").merge(classified.alias("s"), condition).whenNotMatchedInsertAll().execute()
        finally:
            spark.conf.unset("spark.databricks.delta.commitInfo.userMetadata")

    retry_on_conflict(insert_new, "archive insert")
    history = DeltaTable.forPath(spark, path).history(20).where(F.col("userMetadata") == metadata).first()
    loaded = int((history["operationMetrics"] or {}).get("numTargetRowsInserted", 0)) if history else 0
    return {"read": read, "loaded": loaded, "skipped": read - loaded}


def archive_from_kafka(
    spark: SparkSession,
    config: Config,
    rules: RuleSet,
    topics: Sequence[str] | None = None,
    pattern: str | None = None,
    start: str | int | dict | None = "earliest",
    end: str | int | dict | None = "latest",
    run_id: str = "archive-from-kafka",
) -> ArchiveReport:
    """Resolve, read, classify and insert; returns the report (see the module doc; ``ok``: nothing missing)."""
    ensure_tables(spark, config)
    ingest_ms = now_ms()
    names = list_topics(config, topics, pattern)
    ranges = resolve_ranges(config, names, start, end, stop_at_stream=True)
    records = read_kafka_range(spark, config, ranges)
    counts = {"read": 0, "loaded": 0, "skipped": 0}
    if records is not None:
        try:
            counts = archive_records(spark, config, records, rules, ingest_ms, run_id)
        except Exception as exc:
            # A record Spark's Kafka source cannot convert (an absurd Kafka timestamp) fails the whole read,
            # as it would a stream batch: read the same ranges with the fallback reader instead (through the
            # driver, so a large range needs the driver memory for it).
            if not is_record_conversion_error(exc):
                raise
            todo = [OffsetRange(r["topic"], r["partition"], r["start"], r["end"]) for r in ranges if r["start"] < r["end"]]
            log.warning("Spark's Kafka source could not convert a record; reading %d ranges directly", len(todo))
            rows = read_ranges(config, todo)
            counts = archive_records(
                spark, config, spark.createDataFrame(rows, KAFKA_SOURCE_SCHEMA), rules, ingest_ms, run_id
            )
    missing = [
        {"topic": r["topic"], "partition": r["partition"], "from_offset": r["missing_in_kafka"][0], "to_offset": r["missing_in_kafka"][1]}
        for r in ranges
        if r["missing_in_kafka"]
    ]
    return ArchiveReport(
        ok=not missing,
        run_id=run_id,
        topics=names,
        ingest_time_ms=ingest_ms,
        rows_read=counts["read"],
        rows_loaded=counts["loaded"],
        rows_skipped_already_archived=counts["skipped"],
        missing_in_kafka=missing,
        partitions=ranges,
    )
