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
  holds (earliest for partitions it has none of). See "Recovery" below;
* ``starting_offsets``: an explicit reset: start at ``kafka.starting_offsets``
  as configured, accepting what that means (``earliest`` counts again).

Recovery (:func:`recover_lost_batch`). The lost stream's micro-batch N appends its records to the archive,
then MERGEs its window counts, each guarded by (its app id, N); batch N+1 starts only after all of N landed. So
only the last batch can be partial. Its reasons wait in the ledger entries for the once-a-minute append
(:mod:`kdq.spark.reasons_flush`) and are lost with the checkpoint: those of the archived batches after the
reasons table's txn version ``r`` are recomputed from the archive first (under either start policy that counts
on). The checkpoint (and
its app id, its ledger) is gone, but the tables' Delta logs know: their txn actions list every app id with
its last version and when it was written. The lost stream is the ``kdq-stream-*`` app id written last; its
versions ``c`` (window_counts), ``a`` (raw archive), ``r`` (invalid_reasons) say what landed:

* ``c == a + 1``: the MERGE of batch ``c`` landed without its archive rows. Its records are neither archived
  nor skipped by the new stream (which starts after the archive's offsets), but the counts hold them: the
  windows that MERGE changed (the diff of its Delta commit, found by its txn action in the JSON log) are set
  to the archive's absolute counts (what the new stream will add to), and when its reasons landed too they
  are taken back (negative rows, once under ``<app id>-lost-checkpoint``);
* ``a > c``: batch ``a`` is archived, its MERGE missing (or it had none: late records only). The windows of
  its archived rows are recomputed from the archive; its reasons, if missing, are appended under the lost
  stream's own guard (a no-op if they had landed);
* ``a == c``: every table holds the last batch: nothing to do;
* ``c > a + 1`` (never left by the stream), or the MERGE's commit no longer in the Delta log: refused
  (:class:`LostCheckpoint`), nothing written: correcting blind could count a batch twice.

Absolute writes are compare-and-sets (:func:`kdq.spark.batch_layer._merge_absolute`), and a second run finds
nothing to change. Not covered: the streaming summaries' MERGE of that batch (``summaries`` config).

A checkpoint restored from an older backup keeps its app id (:func:`check_against_tables`, at every start
with an existing checkpoint): when a table's txn version for that app id is past the checkpoint's last
commit K, the start is refused (:class:`CheckpointBehindTables`), except a batch in flight: tables at K+1
with ``offsets/K+1`` and its ledger entry (a crash between the writes and the commit; the replay completes
it, Delta skipping what landed).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq import storage
from kdq.config import Config, ConfigError
from kdq.spark.stream_cut import _txn, read_at
from kdq.spark.tables import table_path
from kdq.spark.writers import append_reason_rows, append_stream_reason_rows, delta_snapshot
from kdq.storage import Location
from kdq.stream.checkpoint_offsets import batch_ids
from kdq.tables import INVALID_REASONS, RAW_ARCHIVE, WINDOW_COUNTS
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


STREAM_APP_PREFIX = "kdq-stream-"  # kdq.spark.speed_layer.app_id_for
LOG_SCAN_LIMIT = 5000  # Delta commits searched, newest first, for the lost stream's last commit


class CheckpointBehindTables(ConfigError):
    """A checkpoint restored from an older backup: the tables hold batches of its app id it never committed."""


@dataclass(frozen=True)
class LostStream:
    """The stream whose checkpoint was lost, as the tables' Delta logs know it (see the module doc).

    ``app_id``: the newest ``kdq-stream-*`` app id of the tables' txn actions; ``counts`` / ``archive`` /
    ``reasons``: its last txn version in ``window_counts`` / the raw archive / ``invalid_reasons`` (-1: none).
    """

    app_id: str
    counts: int
    archive: int
    reasons: int
    updated_ms: int  # the newest lastUpdated of its txn actions (names the recovery's corrections)


def _transactions(snapshot) -> dict[str, tuple[int, int]]:
    """app id → (last version, last updated ms; -1 when Delta did not record it) of a snapshot's txn actions."""
    found = {}
    txns = snapshot.setTransactions()
    for i in range(txns.size()):
        txn = txns.apply(i)
        updated = txn.lastUpdated()
        found[str(txn.appId())] = (int(txn.version()), int(updated.get()) if updated.isDefined() else -1)
    return found


def lost_stream(spark: SparkSession, config: Config) -> LostStream | None:
    """The stream app id that wrote last (by the txn actions' ``lastUpdated``) and its versions; None when no
    stream ever wrote these tables."""
    from delta.tables import DeltaTable

    snapshots = {}
    for spec in (WINDOW_COUNTS, RAW_ARCHIVE, INVALID_REASONS):
        path = table_path(config, spec)
        snapshots[spec.name] = delta_snapshot(spark, path) if DeltaTable.isDeltaTable(spark, path) else None
    txns = {name: (_transactions(s) if s is not None else {}) for name, s in snapshots.items()}
    newest: dict[str, int] = {}
    for found in txns.values():
        for app_id, (_, updated) in found.items():
            if app_id.startswith(STREAM_APP_PREFIX):
                newest[app_id] = max(newest.get(app_id, -1), updated)
    if not newest:
        return None
    app_id = max(newest, key=lambda a: (newest[a], a))
    if list(newest.values()).count(newest[app_id]) > 1:
        raise LostCheckpoint(
            f"lost checkpoint: the tables were last written by more than one stream app id at the same time "
            f"({sorted(a for a in newest if newest[a] == newest[app_id])}); cannot tell which checkpoint was lost"
        )

    def version(name: str) -> int:
        return txns[name].get(app_id, (-1, -1))[0]

    return LostStream(
        app_id, version(WINDOW_COUNTS.name), version(RAW_ARCHIVE.name), version(INVALID_REASONS.name), newest[app_id]
    )


def _commit_of(config: Config, spec, app_id: str, version: int, newest: int) -> int | None:
    """The Delta commit of ``spec``'s table whose txn action is (app_id, version): read from the JSON commit
    files, newest first (None: not among the last :data:`LOG_SCAN_LIMIT`, or the log was cleaned up)."""
    log_dir = storage.join(table_path(config, spec), "_delta_log")
    files = storage.files_for(log_dir)
    for v in range(newest, max(-1, newest - LOG_SCAN_LIMIT), -1):
        path = storage.join(log_dir, f"{v:020d}.json")
        try:
            text = files.read_bytes(path).decode("utf-8")
        except FileNotFoundError:
            return None
        for line in text.splitlines():
            if '"txn"' not in line:
                continue
            txn = json.loads(line).get("txn")
            if txn and txn.get("appId") == app_id and int(txn.get("version", -1)) == version:
                return v
    return None


def _added_keys(spark: SparkSession, config: Config, spec, commit: int, keys: list[str]) -> DataFrame:
    """The rows (``keys`` columns) commit ``commit`` added or changed: its version minus the one before, read
    in the partitions the commit wrote only."""
    log_dir = storage.join(table_path(config, spec), "_delta_log")
    text = storage.files_for(log_dir).read_bytes(storage.join(log_dir, f"{commit:020d}.json")).decode("utf-8")
    partitions: set[tuple] = set()
    for line in text.splitlines():
        add = json.loads(line).get("add") if '"add"' in line else None
        if add is not None:
            partitions.add(tuple(sorted((add.get("partitionValues") or {}).items())))
    after = read_at(spark, config, spec, commit)
    before = read_at(spark, config, spec, commit - 1) if commit > 0 else None
    scope = F.lit(False)
    for values in partitions:
        one = F.lit(True)
        for column, value in values:
            one = one & (F.col(column).cast("string") == F.lit(value)) if value is not None else one & F.col(column).isNull()
        scope = scope | one
    after = after.where(scope).select(*keys)
    if before is None:
        return after
    return after.exceptAll(before.where(scope).select(*keys))


def recover_lost_batch(spark: SparkSession, config: Config, run_id: str) -> int:
    """Make the tables hold exactly the archived records of the lost stream's last micro-batch, whatever
    subset of its writes landed (see the module doc); returns the ``window_counts`` corrections.
    :class:`LostCheckpoint` when that cannot be done safely."""
    from kdq.spark import batch_layer as bl
    from kdq.spark.recount import recompute_counts
    from kdq.spark.retention import read_retired

    archive = _archive(spark, config)
    if archive is None:
        return 0
    lost = lost_stream(spark, config)
    if lost is None:
        log.warning("lost checkpoint: no stream app id in the tables' Delta logs: nothing of a stream to recover")
        return 0
    log.warning("lost checkpoint: the last stream to write was %s", lost)
    size = config.stream.window_seconds
    if lost.counts > lost.archive + 1:
        raise LostCheckpoint(
            f"lost checkpoint: window_counts holds micro-batch {lost.counts} of the lost stream {lost.app_id} but the "
            f"raw archive only up to batch {lost.archive}: more than one MERGE without its archive rows, which the "
            "stream never leaves behind (its batches commit only after their appends). Not resuming: the counts "
            "cannot be tied to archived records. Restore the checkpoint, or rebuild the affected range with "
            '`kdq job rebuild` and start with stream.on_fresh_checkpoint = "starting_offsets" at chosen offsets'
        )
    _append_unflushed_reasons(spark, config, archive, lost)
    if lost.counts > lost.archive:
        # The MERGE of batch `counts` landed, its archive append did not: the windows hold increments for
        # records the archive lacks, which the new stream reads again. Set those windows to the archive's count.
        missing = lost.counts
        counts_path = table_path(config, WINDOW_COUNTS)
        commit = _commit_of(config, WINDOW_COUNTS, lost.app_id, missing, int(delta_snapshot(spark, counts_path).version()))
        if commit is None:
            raise LostCheckpoint(
                f"lost checkpoint: window_counts holds micro-batch {missing} of the lost stream {lost.app_id} without "
                f"its archive rows (archive at batch {lost.archive}), and its commit is no longer in the Delta log "
                f"({counts_path}/_delta_log): the windows it changed are unknown. Not resuming (it would count that "
                "batch twice). Restore the checkpoint, or rebuild the range with `kdq job rebuild` first"
            )
        windows = _added_keys(spark, config, WINDOW_COUNTS, commit, ["topic", "window_start"]).distinct()
        counts = recompute_counts(archive, windows, size, read_retired(spark, config))
        changed = bl.apply_corrections(
            spark, config, _with_empty_windows(counts, windows, size), run_id, (lost.updated_ms, lost.updated_ms + 1),
            "lost_checkpoint",
        )
        if lost.reasons >= missing:  # its reasons landed too: take them back (the new stream appends them again)
            reasons_path = table_path(config, INVALID_REASONS)
            at = _commit_of(config, INVALID_REASONS, lost.app_id, missing, int(delta_snapshot(spark, reasons_path).version()))
            if at is None:
                raise LostCheckpoint(
                    f"lost checkpoint: invalid_reasons holds micro-batch {missing} of the lost stream {lost.app_id} "
                    "without its archive rows, and its commit is no longer in the Delta log: not resuming"
                )
            rows = _added_keys(spark, config, INVALID_REASONS, at, ["topic", "window_start", "reason", "count", "batch_id"])
            taken_back = [
                {"topic": r["topic"], "window_start_ms": r["ms"], "reason": r["reason"], "count": -int(r["count"])}
                for r in rows.where(F.col("batch_id") == missing)
                .select("topic", F.unix_millis("window_start").alias("ms"), "reason", "count").collect()
            ]
            append_reason_rows(spark, config, taken_back, None, f"{lost.app_id}-lost-checkpoint", missing)
        log.warning(
            "lost checkpoint: micro-batch %d of %s reached window_counts but not the archive: its windows set to "
            "the archive's counts (%d correction(s)); the new stream counts its records", missing, lost.app_id, len(changed),
        )
        return len(changed)
    if lost.archive > lost.counts:
        # The archive append of batch `archive` landed, maybe not its MERGE (a batch of late records only has
        # none): its windows recomputed from the archive; the new stream starts after its records.
        batch = lost.archive
        rows = archive.where((F.col("source") == "stream") & (F.col("batch_id") == batch))
        latest = rows.agg(F.max("ingest_time").alias("t")).first()["t"]
        if latest is None:
            return 0
        rows = rows.where(F.col("ingest_time") == F.lit(latest))  # this stream's batch, not an older stream's
        windows = rows.select("topic", "window_start").distinct()
        counts = recompute_counts(archive, windows, size, read_retired(spark, config))
        ms = int(rows.agg(F.unix_millis(F.max("ingest_time")).alias("ms")).first()["ms"])
        changed = bl.apply_corrections(spark, config, counts, run_id, (ms, ms + 1), "lost_checkpoint")
        log.warning(
            "lost checkpoint: micro-batch %d of %s is archived (its MERGE: %s): its windows recomputed from the "
            "archive: %d correction(s)", batch, lost.app_id, "landed" if lost.counts >= batch else "missing", len(changed),
        )
        return len(changed)
    log.warning("lost checkpoint: the last micro-batch of %s (%d) reached every table: nothing to recompute", lost.app_id, lost.counts)
    return 0


def _append_unflushed_reasons(spark: SparkSession, config: Config, archive: DataFrame, lost: LostStream) -> int:
    """The reasons of the lost stream's archived batches ``(reasons, archive]``, recomputed from their archived
    rows: the stream appends a minute of batches' reasons at a time from their ledger entries
    (:mod:`kdq.spark.reasons_flush`), and those entries were lost with the checkpoint. Appended as the stream would
    have (a row per batch, topic, coarse window and reason, its ingest time as ``updated_at``) under the lost
    stream's own guard at ``archive``: a second run, or a flush that did land, makes it a no-op. Returns the rows."""
    from kdq.spark import transforms

    first, last = lost.reasons + 1, lost.archive
    if last < first:
        return 0
    rows = archive.where((F.col("source") == "stream") & F.col("batch_id").between(first, last) & F.col("counted"))
    # An older checkpoint's batches have the same ids: each id's newest rows are the lost stream's (every batch of
    # it archived its records, and it wrote last).
    newest = archive.where((F.col("source") == "stream") & F.col("batch_id").between(first, last)).groupBy(
        "batch_id").agg(F.max("ingest_time").alias("ingest_time"))
    rows = rows.join(newest, ["batch_id", "ingest_time"]).withColumn("ingest_time_ms", F.unix_millis("ingest_time"))
    reasons = transforms.reason_counts(rows, config.stream.reasons_window_seconds, by=("batch_id", "ingest_time_ms"))
    found = [
        {"topic": r["topic"], "window_start_ms": r["ms"], "reason": r["reason"], "count": int(r["count"]),
         "batch_id": int(r["batch_id"]), "ingest_time_ms": int(r["ingest_time_ms"])}
        for r in reasons.select(
            "batch_id", "ingest_time_ms", "topic", F.unix_millis("window_start").alias("ms"), "reason", "count"
        ).collect()
    ]
    append_stream_reason_rows(spark, config, found, lost.app_id, last)
    log.warning(
        "lost checkpoint: the reasons of micro-batches %d..%d of %s (not appended before the checkpoint was lost) "
        "recomputed from the archive: %d row(s)", first, last, lost.app_id, len(found),
    )
    return len(found)


def _with_empty_windows(counts: DataFrame, windows: DataFrame, window_seconds: int) -> DataFrame:
    """``counts`` plus a 0 row per status of a window the archive has no record of (the correction deletes it)."""
    size = window_seconds * 1000
    statuses = windows.crossJoin(
        counts.sparkSession.createDataFrame([("valid",), ("invalid",)], "status STRING")
    ).join(counts.select("topic", "window_start", "status"), ["topic", "window_start", "status"], "left_anti")
    zeros = statuses.select(
        "topic", "window_start",
        F.timestamp_millis(F.unix_millis("window_start") + size).alias("window_end"),
        "status", F.lit(0).cast("bigint").alias("count"), F.lit(None).cast("string").alias("rules_version"),
    )
    return counts.unionByName(zeros.select(*counts.columns))


def check_against_tables(spark: SparkSession, config: Config, checkpoint: Location) -> None:
    """:class:`CheckpointBehindTables` when the tables hold micro-batches of this checkpoint's app id that the
    checkpoint never committed, except one batch in flight (planned in ``offsets/``, with its archive append
    alone or its ledger entry written: a crash between the writes and the commit, which the replay completes)."""
    from delta.tables import DeltaTable

    path = storage.join(checkpoint, "kdq_app_id")
    try:
        app_id = storage.files_for(path).read_bytes(path).decode().strip()
    except FileNotFoundError:
        return  # the stream makes a new app id: nothing of it is in the tables
    if not app_id:
        return
    committed = batch_ids(storage.join(checkpoint, "commits"))
    planned = batch_ids(storage.join(checkpoint, "offsets"))
    last = committed[-1] if committed else -1
    versions = {}
    for spec in (WINDOW_COUNTS, RAW_ARCHIVE, INVALID_REASONS):
        table = table_path(config, spec)
        versions[spec.name] = _txn(delta_snapshot(spark, table), app_id) if DeltaTable.isDeltaTable(spark, table) else -1
    ahead = max(versions.values())
    if ahead <= last:
        return
    in_flight = storage.join(checkpoint, "kdq_ledger", last + 1)
    # The batch in flight: planned, and either its ledger entry written (every write may have landed) or only
    # its archive append landed (the speed layer's first write, before the ledger entry).
    only_archived = all(v <= last for name, v in versions.items() if name != RAW_ARCHIVE.name)
    if ahead == last + 1 and (last + 1) in planned and (only_archived or storage.files_for(in_flight).exists(in_flight)):
        log.info("micro-batch %d of %s is in the tables but not committed: the replay completes it", ahead, app_id)
        return
    raise CheckpointBehindTables(
        f"the stream's checkpoint {checkpoint} (app id {app_id}) is behind the tables: its last committed "
        f"micro-batch is {last} (planned: {planned[-1] if planned else -1}), but the tables hold later batches of "
        f"that app id ({', '.join(f'{k} at batch {v}' for k, v in versions.items())}). It looks restored from an "
        "older backup: replaying would re-plan those batches with other offsets and Delta would skip their writes "
        "(records lost or counted twice). Restore the newest checkpoint; or, if it is gone, move this checkpoint "
        'aside and start with a fresh one and stream.on_fresh_checkpoint = "resume_from_archive" '
        "(env KDQ_STREAM__ON_FRESH_CHECKPOINT), which resumes after the archive's offsets"
    )


def starting_offsets(spark: SparkSession, config: Config, checkpoint: Location) -> str | None:
    """The ``startingOffsets`` this start must use instead of the configured one (None: keep it), or
    :class:`LostCheckpoint` when a fresh checkpoint meets a non-empty archive and nothing was chosen."""
    if not checkpoint_is_fresh(checkpoint):
        check_against_tables(spark, config, checkpoint)
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
        lost = lost_stream(spark, config)
        if lost is not None:  # its counted batches keep their reasons, whatever is counted again now
            _append_unflushed_reasons(spark, config, archive, lost)
        return None
    if policy == "resume_from_archive":
        recover_lost_batch(spark, config, run_id=f"lost-checkpoint-{storage.name_of(checkpoint)}")
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
