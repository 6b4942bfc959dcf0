"""The stream's table upkeep between micro-batches (kdq.spark.stream_upkeep), on real Delta tables.

The stream's own MERGEs neither compact nor checkpoint inside their commits; the upkeep does both while the stream
waits for its next trigger: the open hour's files folded once the stream's MERGEs added AUTO_COMPACT_MIN_FILES,
a checkpoint every CHECKPOINT_EVERY commits, every count and the stream's idempotent-write version kept.
"""

from __future__ import annotations

import datetime as dt

from delta.tables import DeltaTable
from pyspark.sql import functions as F

from kdq.spark.session import small_query_session
from kdq.spark.stream_upkeep import (
    CHECKPOINT_EVERY,
    MAINTENANCE_IDLE_MS,
    HourFiles,
    StreamUpkeep,
    hours_predicate,
    window_hours,
)
from kdq.spark.tables import ensure_tables, table_path
from kdq.spark.writers import delta_snapshot, merge_window_increments, txn_version
from kdq.tables import AUTO_COMPACT_MIN_FILES, RAW_ARCHIVE, STREAM_CHECKPOINT_INTERVAL, WINDOW_COUNTS
from tests.conftest import make_config

DAY_MS = int(dt.datetime(2026, 11, 24, tzinfo=dt.UTC).timestamp() * 1000)
HOUR_MS = 3_600_000


def test_window_hours_are_the_tables_partitions() -> None:
    assert window_hours([DAY_MS, DAY_MS + 5 * HOUR_MS + 59_999, DAY_MS - 1]) == {
        ("2026-11-24", 0), ("2026-11-24", 5), ("2026-11-23", 23)}
    assert hours_predicate([("2026-11-24", 5), ("2026-11-23", 23)]) == (
        "(window_date = DATE'2026-11-23' AND window_hour = 23) OR (window_date = DATE'2026-11-24' AND window_hour = 5)")


def test_hour_files_are_taken_once_due_and_given_back_when_not_compacted() -> None:
    files = HourFiles()
    for _ in range(3):
        files.merged([("d", 1), ("d", 2)])
    files.merged([("d", 2)])
    assert files.take(4) == [("d", 2)]
    assert files.take(4) == []  # taken: not again until more files come
    files.give_back([("d", 2)], 4)
    assert files.take(3) == [("d", 1), ("d", 2)]


def _files_in_hour(spark, path: str, hour: int) -> int:
    return sum(1 for name in spark.read.format("delta").load(path).inputFiles() if f"window_hour={hour}/" in name)


def _counts(spark, path: str) -> dict:
    frame = spark.read.format("delta").load(path)
    return {(r["topic"], r["ms"]): r["count"] for r in frame.select(
        "topic", F.unix_millis("window_start").alias("ms"), "count").collect()}


def test_the_upkeep_compacts_and_checkpoints_between_batches(spark, tmp_path) -> None:
    config = make_config(tmp_path, spark={"master": "local[2]", "shuffle_partitions": 2})
    ensure_tables(spark, config)
    path = table_path(config, WINDOW_COUNTS)
    archive = table_path(config, RAW_ARCHIVE)
    for table in (path, archive):
        assert DeltaTable.forPath(spark, table).detail().first()["properties"]["delta.checkpointInterval"] == str(
            STREAM_CHECKPOINT_INTERVAL)
    writer = small_query_session(spark)
    writer.conf.set("spark.databricks.delta.autoCompact.enabled", "false")  # as the speed layer's session
    upkeep = StreamUpkeep(writer, spark, "stream-app", [archive, path], [path])
    hour = DAY_MS + 7 * HOUR_MS
    batches = AUTO_COMPACT_MIN_FILES + 2
    for version in range(1, batches + 1):
        rows = [{"topic": t, "window_start_ms": hour + version * 1000, "status": "valid", "count": version,
                 "rules_version": "r1"} for t in ("a", "b")]
        with upkeep.merging():
            merge_window_increments(writer, rows, config, "stream-app", version)
        upkeep.merged(r["window_start_ms"] for r in rows)
        if version == AUTO_COMPACT_MIN_FILES - 1:
            assert _files_in_hour(spark, path, 7) == version  # nothing compacted inside the MERGEs' commits
            upkeep.between_batches(MAINTENANCE_IDLE_MS - 1)  # too short a pause: snapshots only
            assert _files_in_hour(spark, path, 7) == version
    before = _counts(spark, path)
    assert delta_snapshot(spark, path).checkpointProvider().version() < 0  # no checkpoint inside the commits

    upkeep.between_batches(MAINTENANCE_IDLE_MS)  # one compaction or checkpoint per pause: the compaction first
    assert _files_in_hour(spark, path, 7) == 1
    assert _counts(spark, path) == before and len(before) == 2 * batches
    assert delta_snapshot(spark, path).checkpointProvider().version() < 0
    upkeep.between_batches(MAINTENANCE_IDLE_MS)  # the archive has too few commits: window_counts' checkpoint
    assert delta_snapshot(spark, path).checkpointProvider().version() >= CHECKPOINT_EVERY
    upkeep.between_batches(MAINTENANCE_IDLE_MS)  # nothing left to do
    assert txn_version(writer, path, "stream-app") == batches  # a replayed batch is still skipped
    merge_window_increments(writer, [{"topic": "a", "window_start_ms": hour + 1000, "status": "valid", "count": 5,
                                      "rules_version": "r1"}], config, "stream-app", batches)
    assert _counts(spark, path) == before
