"""window_counts and summaries: hour partitions with deletion vectors, so the stream's MERGE costs what it touches.

On real Delta tables: a MERGE of a few windows into a table holding many copies none of the rows it does not
change (deletion vectors, not a rewrite of the touched file); a table of the earlier layout (one partition per
day, no deletion vectors) is rewritten once, keeping its rows, its table properties and the idempotent-write
versions of its writers; the hourly batch layer's compaction makes each closed hour one file and leaves open
hours alone.
"""

from __future__ import annotations

import datetime as dt

from delta.tables import DeltaTable
from pyspark.sql import functions as F

from kdq.spark.maintenance import compact_closed_hours
from kdq.spark.tables import ensure_tables, table_path
from kdq.spark.writers import merge_window_increments, txn_version
from kdq.tables import AUTO_COMPACT_MIN_FILES, SUMMARIES, WINDOW_COUNTS, WINDOW_PARTITIONS, WINDOW_SECONDS_PROPERTY
from tests.conftest import make_config

DAY_MS = int(dt.datetime(2026, 11, 24, tzinfo=dt.UTC).timestamp() * 1000)
HOUR_MS = 3_600_000


def _config(tmp_path):
    return make_config(tmp_path, spark={"master": "local[2]", "shuffle_partitions": 2})


def _rows(start_ms: int, seconds: int, count: int = 1) -> list[dict]:
    return [{"topic": topic, "window_start_ms": start_ms + s * 1000, "status": "valid", "count": count,
             "rules_version": "r1"} for s in range(seconds) for topic in ("a", "b")]


def _table(spark, config):
    return DeltaTable.forPath(spark, table_path(config, WINDOW_COUNTS))


def _counts(spark, config) -> dict:
    frame = spark.read.format("delta").load(table_path(config, WINDOW_COUNTS))
    return {(r["topic"], r["ms"], r["window_date"], r["window_hour"]): r["count"] for r in frame.select(
        "topic", F.unix_millis("window_start").alias("ms"), "window_date", "window_hour", "count").collect()}


def _files_per_hour(spark, config) -> dict[int, int]:
    files: dict[int, int] = {}
    for name in spark.read.format("delta").load(table_path(config, WINDOW_COUNTS)).inputFiles():
        hour = int(name.split("window_hour=")[1].split("/")[0])
        files[hour] = files.get(hour, 0) + 1
    return files


def test_a_merge_marks_changed_rows_instead_of_rewriting_the_day(spark, tmp_path) -> None:
    config = _config(tmp_path)
    ensure_tables(spark, config)
    detail = _table(spark, config).detail().first()
    assert tuple(detail["partitionColumns"]) == WINDOW_PARTITIONS
    assert detail["properties"]["delta.enableDeletionVectors"] == "true"

    merge_window_increments(spark, _rows(DAY_MS + 9 * HOUR_MS, 600), config, "layout", 1)  # 1,200 rows, one file
    merge_window_increments(spark, _rows(DAY_MS + 9 * HOUR_MS + 599_000, 3, count=2), config, "layout", 2)
    metrics = _table(spark, config).history(1).first()["operationMetrics"]
    # Two windows of the 1,200 rows' file changed (a and b at the last second), two new ones inserted: nothing
    # else is copied; the changed rows are marked deleted in the old file by a deletion vector.
    assert metrics["numTargetRowsUpdated"] == "2" and metrics["numTargetRowsInserted"] == "4"
    assert metrics["numTargetRowsCopied"] == "0", metrics
    assert int(metrics["numTargetDeletionVectorsAdded"]) >= 1, metrics
    counts = _counts(spark, config)
    assert len(counts) == 1_204 and sum(counts.values()) == 1_200 + 12
    assert counts[("a", DAY_MS + 9 * HOUR_MS + 599_000, dt.date(2026, 11, 24), 9)] == 3


def test_the_writer_keeps_the_open_hour_in_few_files(spark, tmp_path) -> None:
    """One small file per micro-batch would pile up in the open hour until the hourly compaction; Delta's auto
    compaction after the writer's own MERGE folds them whenever the hour holds AUTO_COMPACT_MIN_FILES, keeping every
    count and the writer's idempotent-write version (a replayed batch is still skipped)."""
    config = _config(tmp_path)
    ensure_tables(spark, config)
    assert _table(spark, config).detail().first()["properties"]["delta.autoOptimize.autoCompact"] == "true"
    batches = 2 * AUTO_COMPACT_MIN_FILES + 3
    most = 0
    for version in range(1, batches + 1):
        # 5 new seconds per batch, and the first second of the hour again: a MERGE that updates an older file too.
        rows = _rows(DAY_MS + 5 * HOUR_MS + version * 10_000, 5) + _rows(DAY_MS + 5 * HOUR_MS, 1)
        merge_window_increments(spark, rows, config, "open-hour", version)
        most = max(most, _files_per_hour(spark, config)[5])
    assert most <= AUTO_COMPACT_MIN_FILES, most
    operations = [r["operation"] for r in _table(spark, config).history().collect()]
    assert operations.count("OPTIMIZE") >= 2, operations
    counts = _counts(spark, config)
    assert len(counts) == 2 * (5 * batches + 1)
    assert counts[("a", DAY_MS + 5 * HOUR_MS, dt.date(2026, 11, 24), 5)] == batches
    assert sum(counts.values()) == 2 * 6 * batches
    merge_window_increments(spark, _rows(DAY_MS + 5 * HOUR_MS, 1), config, "open-hour", batches)  # a replay
    assert _counts(spark, config) == counts
    assert txn_version(spark, table_path(config, WINDOW_COUNTS), "open-hour") == batches


def test_a_table_of_the_earlier_layout_is_rewritten_once_keeping_everything(spark, tmp_path) -> None:
    config = _config(tmp_path)
    path = table_path(config, WINDOW_COUNTS)
    columns = [c for c in WINDOW_COUNTS.columns if c[0] != "window_hour"]
    (DeltaTable.create(spark).location(path).addColumns(
        spark.createDataFrame([], ", ".join(f"{n} {t}" for n, t in columns)).schema)
        .partitionedBy("window_date").property(WINDOW_SECONDS_PROPERTY, "1").execute())
    rows = [("a", DAY_MS + h * HOUR_MS + 5_000, "valid", 7 + h) for h in (0, 13, 23)]
    source = spark.createDataFrame(rows, "topic STRING, ms BIGINT, status STRING, count BIGINT").select(
        "topic", F.timestamp_millis("ms").alias("window_start"), F.timestamp_millis(F.col("ms") + 1000).alias("window_end"),
        "status", "count", F.current_timestamp().alias("updated_at"), F.lit("stream").alias("updated_by"),
        F.lit("r1").alias("rules_version"), F.to_date(F.timestamp_millis("ms")).alias("window_date"))
    source.write.format("delta").mode("append").option("txnAppId", "old-stream").option("txnVersion", 41).save(path)

    ensure_tables(spark, config)
    detail = _table(spark, config).detail().first()
    assert tuple(detail["partitionColumns"]) == WINDOW_PARTITIONS
    assert detail["properties"]["delta.enableDeletionVectors"] == "true"
    assert detail["properties"]["delta.autoOptimize.autoCompact"] == "true"
    assert detail["properties"][WINDOW_SECONDS_PROPERTY] == "1"
    assert txn_version(spark, path, "old-stream") == 41  # a replayed batch of the old stream is still skipped
    assert _counts(spark, config) == {("a", DAY_MS + h * HOUR_MS + 5_000, dt.date(2026, 11, 24), h): 7 + h
                                      for h in (0, 13, 23)}
    versions = _table(spark, config).history().count()
    ensure_tables(spark, config)  # once: the next start finds the layout and leaves the table alone
    assert _table(spark, config).history().count() == versions
    summaries = DeltaTable.forPath(spark, table_path(config, SUMMARIES)).detail().first()
    assert tuple(summaries["partitionColumns"]) == WINDOW_PARTITIONS


def test_closed_hours_are_compacted_and_open_ones_left_to_the_stream(spark, tmp_path) -> None:
    config = _config(tmp_path)
    ensure_tables(spark, config)
    for version, hour in enumerate((2, 2, 2, 3, 3, 5, 5), start=1):
        merge_window_increments(spark, _rows(DAY_MS + hour * HOUR_MS + version * 10_000, 5), config, "hours", version)
    before = _counts(spark, config)
    now = DAY_MS + 5 * HOUR_MS + 20 * 60_000  # 05:20: hour 05 open (and 04 for the summaries: 30 min lateness)

    result = compact_closed_hours(spark, config, now_ms=now)
    assert result["window_counts"]["partitions"] == ["2026-11-24-02", "2026-11-24-03"], result
    assert result["window_counts"]["files_added"] == 2 and result["window_counts"]["files_removed"] >= 5
    assert result["summaries"] == {"skipped": "no closed hour has files added since it was compacted"}
    files = _files_per_hour(spark, config)
    assert files[2] == files[3] == 1 and files[5] >= 2, files
    assert _counts(spark, config) == before
    again = compact_closed_hours(spark, config, now_ms=now)
    assert again["window_counts"] == {"skipped": "no closed hour has files added since it was compacted"}


def test_compaction_beside_the_streams_merges_loses_nothing(spark, tmp_path) -> None:
    """Overlap: the hourly compaction runs while the stream MERGEs, into the open hour and (a late correction
    would) into the very hour being compacted. Each writer has its own session, as its own job would (Delta's
    txn guard is session-wide). Every increment lands exactly once; the compaction finishes (retrying a
    conflict if it met one), and the closed hour ends as one file when nothing wrote it after."""
    import threading

    config = _config(tmp_path)
    ensure_tables(spark, config)
    for version, hour in enumerate((2, 2, 2, 3, 3, 3), start=1):
        merge_window_increments(spark, _rows(DAY_MS + hour * HOUR_MS + version * 10_000, 5), config, "setup", version)
    expected = sum(_counts(spark, config).values())
    stream_session, compaction_session = spark.newSession(), spark.newSession()
    errors: list[BaseException] = []
    added = []

    def stream() -> None:
        try:
            for version in range(1, 9):
                # Odd versions into the open hour 05, even ones into hour 03 (a window the compaction is rewriting).
                hour = 5 if version % 2 else 3
                rows = _rows(DAY_MS + hour * HOUR_MS + 600_000 + version * 1000, 3, count=version)
                merge_window_increments(stream_session, rows, config, "stream", version)
                added.append(sum(r["count"] for r in rows))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    writer = threading.Thread(target=stream)
    writer.start()
    result = compact_closed_hours(compaction_session, config, now_ms=DAY_MS + 5 * HOUR_MS + 20 * 60_000)
    writer.join(timeout=600)
    assert not writer.is_alive() and not errors, errors
    assert "error" not in result["window_counts"], result
    assert sum(_counts(spark, config).values()) == expected + sum(added)  # every increment once
    assert txn_version(spark, table_path(config, WINDOW_COUNTS), "stream") == 8
    final = compact_closed_hours(compaction_session, config, now_ms=DAY_MS + 5 * HOUR_MS + 20 * 60_000)
    files = _files_per_hour(spark, config)
    assert files[2] == files[3] == 1, (files, final)
    assert sum(_counts(spark, config).values()) == expected + sum(added)
