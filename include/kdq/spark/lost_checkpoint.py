"""A stream that starts with a fresh checkpoint over tables that already hold counts.

The checkpoint is the stream's memory of what it has read. Lost (a deleted
folder, a new path in the config, a restored backup without it), Spark would
start again from ``kafka.starting_offsets`` (default ``earliest``) and count
every record a second time. So a fresh checkpoint over a non-empty raw archive
is refused at start, unless the operator chose what to do
(``stream.on_fresh_checkpoint``):

* ``refuse`` (default): stop with a message naming the checkpoint, the archive
  and both ways out;
* ``resume_from_archive``: the archive is the record of what was counted, so
  the stream starts each partition right after the last offset the archive
  holds (earliest for partitions it has none of). The last micro-batch before
  the loss may have reached the archive but not its window-count MERGE (the
  two are separate commits), so the windows of the archive's most recent
  ingest time are recomputed from the archive first (a ``corrections`` row
  each, reason ``lost_checkpoint``): every archived record is then counted
  exactly once;
* ``starting_offsets``: an explicit reset: start at ``kafka.starting_offsets``
  as configured, accepting what that means (``earliest`` counts again).
"""

from __future__ import annotations

import json
import logging

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from kdq import storage
from kdq.checkpoint_offsets import batch_ids
from kdq.config import Config, ConfigError
from kdq.intervals import iso
from kdq.spark.tables import table_path
from kdq.storage import Location
from kdq.tables import RAW_ARCHIVE
from kdq.windows import topic_selected

log = logging.getLogger("kdq.stream")

EARLIEST = -2


class LostCheckpoint(ConfigError):
    """The stream's checkpoint is new but the tables hold counts; the message says what to do."""


def checkpoint_is_fresh(checkpoint: Location) -> bool:
    """No micro-batch was ever planned with this checkpoint (Spark's offset log is empty)."""
    return not batch_ids(storage.join(checkpoint, "offsets"))


def _archive(spark: SparkSession, config: Config):
    from delta.tables import DeltaTable

    path = table_path(config, RAW_ARCHIVE)
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    return spark.read.format("delta").load(path)


def _subscribed_partitions(config: Config) -> dict[str, list[int]]:
    """Every partition of the topics the stream subscribes to now (Spark needs them all in a JSON start)."""
    from confluent_kafka.admin import AdminClient

    kafka = config.kafka
    metadata = AdminClient(config.kafka_client_conf()).list_topics(timeout=30).topics
    return {
        topic: sorted(meta.partitions)
        for topic, meta in metadata.items()
        if meta.error is None and topic_selected(topic, kafka.topic_include, kafka.topic_exclude, (kafka.metrics_topic,))
    }


def archive_resume_offsets(spark: SparkSession, config: Config) -> dict[str, dict[str, int]]:
    """Spark ``startingOffsets`` JSON: one past the archive's last offset per partition, earliest where it has none."""
    archive = _archive(spark, config)
    last = {}
    if archive is not None:
        rows = archive.groupBy("topic", "partition").agg(F.max("offset").alias("last")).collect()
        last = {(r["topic"], int(r["partition"])): int(r["last"]) for r in rows}
    return {
        topic: {str(p): last[(topic, p)] + 1 if (topic, p) in last else EARLIEST for p in partitions}
        for topic, partitions in sorted(_subscribed_partitions(config).items())
    }


def recount_last_ingest(spark: SparkSession, config: Config, run_id: str) -> int:
    """Recompute the windows of the archive's most recent micro-batch from the archive; returns corrections."""
    from kdq.spark import batch_layer as bl
    from kdq.spark.retention import read_retired

    archive = _archive(spark, config)
    if archive is None:
        return 0
    latest = archive.agg(F.unix_millis(F.max("ingest_time")).alias("ms")).first()["ms"]
    if latest is None:
        return 0
    windows = archive.where(F.col("ingest_time") == F.timestamp_millis(F.lit(int(latest)))).select(
        "topic", "window_start"
    ).distinct()
    counts = bl.recompute_counts(archive, windows, config.stream.window_seconds, read_retired(spark, config))
    changed = bl.apply_corrections(spark, config, counts, run_id, (int(latest), int(latest) + 1), "lost_checkpoint")
    log.warning(
        "lost checkpoint: windows of the last archived micro-batch (ingest %s) recomputed from the archive: "
        "%d correction(s)", iso(int(latest)), len(changed),
    )
    return len(changed)


def starting_offsets(spark: SparkSession, config: Config, checkpoint: Location) -> str | None:
    """The ``startingOffsets`` this start must use instead of the configured one (None: keep it), or
    :class:`LostCheckpoint` when a fresh checkpoint meets a non-empty archive and nothing was chosen."""
    if not checkpoint_is_fresh(checkpoint):
        return None
    archive = _archive(spark, config)
    if archive is None or not archive.limit(1).count():
        return None  # a first start: nothing has been counted yet
    policy = config.stream.on_fresh_checkpoint
    if policy == "starting_offsets":
        log.warning(
            "fresh checkpoint %s over a non-empty archive: starting at kafka.starting_offsets = %s as configured "
            "(stream.on_fresh_checkpoint = starting_offsets)", checkpoint, config.kafka.starting_offsets,
        )
        return None
    if policy == "resume_from_archive":
        recount_last_ingest(spark, config, run_id=f"lost-checkpoint-{storage.name_of(checkpoint)}")
        offsets = archive_resume_offsets(spark, config)
        log.warning("fresh checkpoint %s: resuming from the archive's offsets %s", checkpoint, offsets)
        return json.dumps(offsets, sort_keys=True)
    raise LostCheckpoint(
        f"the stream's checkpoint {checkpoint} is new, but the raw archive {table_path(config, RAW_ARCHIVE)} "
        f"already holds records: starting from kafka.starting_offsets = {config.kafka.starting_offsets!r} "
        "would count them again. If the checkpoint was lost, set stream.on_fresh_checkpoint = "
        '"resume_from_archive" (env KDQ_STREAM__ON_FRESH_CHECKPOINT) to start each partition after the last '
        'archived offset; to start over deliberately, set it to "starting_offsets" (and kafka.starting_offsets '
        "to what you want)"
    )
