"""Batch-layer transforms and the corrections writer on a hand-written archive (local Spark + Delta).

Expected values are written out by hand from the rows below, never computed
by the code under test.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from kdq.spark import batch_layer as bl
from kdq.spark import recount
from kdq.spark.push_reads import counts_version, read_windows_at
from kdq.spark.recompute import scan_stats, table_totals
from kdq.spark.tables import ensure_tables, table_path
from kdq.spark.transforms import window_partition_columns
from kdq.spark.writers import txn_version
from kdq.tables import CORRECTIONS, RAW_ARCHIVE, WINDOW_COUNTS
from tests.conftest import make_config

W0 = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC
HOUR = 3_600_000
T1 = W0 + 2 * HOUR  # ingest time of the first stream batch
T2 = T1 + HOUR  # ingest time of the late batch


def _archive(spark, config, rows: list[tuple]) -> None:
    """rows: (topic, offset, window_start_ms, valid, counted, ingest_ms, source); one append per ingest time,
    as the stream writes one set of files per micro-batch."""
    by_ingest: dict[int, list[tuple]] = {}
    for row in rows:
        by_ingest.setdefault(row[5], []).append(row)
    for _, group in sorted(by_ingest.items()):
        df = spark.createDataFrame(
            group, "topic STRING, offset BIGINT, w BIGINT, valid BOOLEAN, counted BOOLEAN, ingest BIGINT, source STRING"
        ).select(
            "topic",
            F.lit(0).alias("partition"),
            "offset",
            F.timestamp_millis("w").alias("kafka_timestamp"),
            F.timestamp_millis("w").alias("event_time"),
            F.timestamp_millis("w").alias("window_start"),
            F.lit(None).cast("binary").alias("key"),
            F.lit(b"{}").alias("value"),
            F.timestamp_millis("ingest").alias("ingest_time"),
            "valid",
            F.when(~F.col("valid"), F.lit("not_json")).alias("reason"),
            "counted",
            F.lit("v1").alias("rules_version"),
            F.lit(0).cast("bigint").alias("batch_id"),
            "source",
            F.date_format(F.timestamp_millis("w"), "yyyy-MM-dd-HH").alias("event_hour"),
        )
        df.coalesce(1).write.format("delta").mode("append").save(table_path(config, RAW_ARCHIVE))


def _counts(spark, config) -> dict:
    df = spark.read.format("delta").load(table_path(config, WINDOW_COUNTS))
    return {
        (r["topic"], r["w"], r["status"]): (r["count"], r["updated_by"])
        for r in df.select("topic", F.unix_millis("window_start").alias("w"), "status", "count", "updated_by").collect()
    }


def _insert_counts(spark, config, rows: list[tuple]) -> None:
    """rows: (topic, window_start_ms, status, count) as the stream would have written them."""
    spark.createDataFrame(rows, "topic STRING, w BIGINT, status STRING, count BIGINT").select(
        "topic",
        F.timestamp_millis("w").alias("window_start"),
        F.timestamp_millis(F.col("w") + 1000).alias("window_end"),
        "status",
        "count",
        F.current_timestamp().alias("updated_at"),
        F.lit("stream").alias("updated_by"),
        F.lit("v1").alias("rules_version"),
        *window_partition_columns("w"),
    ).write.format("delta").mode("append").save(table_path(config, WINDOW_COUNTS))


def _corrections(spark, config) -> list[tuple]:
    df = spark.read.format("delta").load(table_path(config, CORRECTIONS))
    return sorted(
        (r["topic"], r["w"], r["status"], r["old_count"], r["new_count"], r["run_id"])
        for r in df.select("topic", F.unix_millis("window_start").alias("w"), "status", "old_count", "new_count", "run_id").collect()
    )


def _version(spark, config, spec) -> int:
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, table_path(config, spec)).history(1).first()["version"]


ROWS = [
    # w0: counted by the stream (2 valid, 1 invalid), then one late valid record
    ("orders", 1, W0, True, True, T1, "stream"),
    ("orders", 2, W0, True, True, T1, "stream"),
    ("orders", 3, W0, False, True, T1, "stream"),
    ("orders", 10, W0, True, False, T2, "stream"),
    # w0 + 1 s: counted, never late: not recomputed
    ("orders", 4, W0 + 1000, True, True, T1, "stream"),
    # two hours later (a partition no late window is in): never read by the recompute
    ("orders", 5, W0 + 2 * HOUR, True, True, T1, "stream"),
    # an hour earlier (another partition): one late invalid record, window without a row yet
    ("orders", 11, W0 - HOUR, False, False, T2, "stream"),
    # loaded by another job (not the stream): always recomputed
    ("payments", 1, W0, True, True, T2, "backfill"),
    # late, but ingested outside the interval
    ("orders", 12, W0 + 2000, True, False, T2 + HOUR, "stream"),
]


def test_late_windows_reads_only_the_interval_and_recompute_counts_every_row(spark, tmp_path) -> None:
    config = make_config(tmp_path)
    ensure_tables(spark, config)
    _archive(spark, config, ROWS)
    archive = spark.read.format("delta").load(table_path(config, RAW_ARCHIVE))

    assert bl.stream_caught_up(spark, config, T2 + HOUR) is None  # no stream has run here
    late = recount.late_windows(archive, T2, T2 + HOUR)
    found = {(r["topic"], r["w"]) for r in late.select("topic", F.unix_millis("window_start").alias("w")).collect()}
    assert found == {("orders", W0), ("orders", W0 - HOUR), ("payments", W0)}
    # Data skipping on ingest_time: only the interval's files (one per partition of that append) are read.
    stats = scan_stats(spark, late)
    total = table_totals(spark, table_path(config, RAW_ARCHIVE))
    assert stats["files"] == 2 and total["files"] == 5, (stats, total)
    assert 0 < stats["bytes"] < total["bytes"]

    counts = recount.recompute_counts(archive, late, window_seconds=1)
    got = {
        (r["topic"], r["w"], r["status"]): (r["count"], r["we"] - r["w"])
        for r in counts.select(
            "topic", F.unix_millis("window_start").alias("w"), F.unix_millis("window_end").alias("we"), "status", "count"
        ).collect()
    }
    assert got == {
        ("orders", W0, "valid"): (3, 1000),
        ("orders", W0, "invalid"): (1, 1000),
        ("orders", W0 - HOUR, "invalid"): (1, 1000),
        ("payments", W0, "valid"): (1, 1000),
    }
    # Only the event_hour partitions of the windows are read (W0's and the hour before).
    rows = recount.archive_rows_of(archive, late)
    assert scan_stats(spark, rows)["files"] == 4


def test_apply_corrections_sets_absolute_counts_once_and_deletes_zeros(spark, tmp_path) -> None:
    config = make_config(tmp_path)
    ensure_tables(spark, config)
    _archive(spark, config, ROWS)
    # What the stream wrote, plus a count the archive does not support: (orders, w0, invalid) = 4.
    _insert_counts(
        spark,
        config,
        [("orders", W0, "valid", 2), ("orders", W0, "invalid", 4), ("orders", W0 + 1000, "valid", 1), ("payments", W0 + 5000, "valid", 9)],
    )
    # A window whose recomputed invalid count is 0 while the table has an invalid row.
    _insert_counts(spark, config, [("orders", W0 - HOUR, "valid", 7)])
    archive = spark.read.format("delta").load(table_path(config, RAW_ARCHIVE))
    interval = (T2, T2 + HOUR)

    new_counts = recount.recompute_counts(archive, recount.late_windows(archive, *interval), 1)
    changed = bl.apply_corrections(spark, config, new_counts, "run-a", interval, "late_data")
    assert [(r["topic"], r["window_start_ms"], r["status"], r["old_count"], r["new_count"]) for r in changed] == [
        ("orders", W0 - HOUR, "invalid", 0, 1),
        ("orders", W0 - HOUR, "valid", 7, 0),
        ("orders", W0, "invalid", 4, 1),
        ("orders", W0, "valid", 2, 3),
        ("payments", W0, "valid", 0, 1),
    ]
    assert _counts(spark, config) == {
        ("orders", W0 - HOUR, "invalid"): (1, "batch"),
        ("orders", W0, "valid"): (3, "batch"),
        ("orders", W0, "invalid"): (1, "batch"),
        ("orders", W0 + 1000, "valid"): (1, "stream"),
        ("payments", W0, "valid"): (1, "batch"),
        ("payments", W0 + 5000, "valid"): (9, "stream"),
    }
    assert _corrections(spark, config) == sorted(
        (t, w, s, old, new, "run-a") for t, w, s, old, new in [(r["topic"], r["window_start_ms"], r["status"], r["old_count"], r["new_count"]) for r in changed]
    )
    assert bl.interval_corrections(spark, config, interval) == sorted(
        (r["topic"], r["window_start_ms"], r["status"]) for r in changed
    )
    # What a batch push reads back (kdq.spark.push_reads, at the latest version).
    wanted = [("orders", W0 - HOUR), ("orders", W0), ("nothing", W0)]
    assert read_windows_at(spark, config, wanted, counts_version(spark, config)) == [
        {"topic": "nothing", "window_start_ms": W0, "valid": 0, "invalid": 0},
        {"topic": "orders", "window_start_ms": W0 - HOUR, "valid": 0, "invalid": 1},
        {"topic": "orders", "window_start_ms": W0, "valid": 3, "invalid": 1},
    ]

    # Re-running the interval: nothing differs, so no commit at all and no new corrections.
    versions = (_version(spark, config, WINDOW_COUNTS), _version(spark, config, CORRECTIONS))
    new_counts = recount.recompute_counts(archive, recount.late_windows(archive, *interval), 1)
    assert bl.apply_corrections(spark, config, new_counts, "run-b", interval, "late_data") == []
    assert (_version(spark, config, WINDOW_COUNTS), _version(spark, config, CORRECTIONS)) == versions
    assert len(_corrections(spark, config)) == 5


def test_an_interrupted_run_is_completed_without_recording_twice(spark, tmp_path) -> None:
    config = make_config(tmp_path)
    ensure_tables(spark, config)
    _archive(spark, config, ROWS[:4])
    _insert_counts(spark, config, [("orders", W0, "valid", 2), ("orders", W0, "invalid", 1)])
    archive = spark.read.format("delta").load(table_path(config, RAW_ARCHIVE))
    interval = (T2, T2 + HOUR)
    app_id = bl.batch_app_id(T2)
    # The first attempt recorded its correction (version 0) and died before its MERGE.
    first = [{"topic": "orders", "window_start_ms": W0, "status": "valid", "old_count": 2, "new_count": 3}]
    bl.append_corrections(spark, config, first, "run-a", interval, app_id, 0, reason="late_data")
    assert _counts(spark, config)[("orders", W0, "valid")] == (2, "stream")

    new_counts = recount.recompute_counts(archive, recount.late_windows(archive, *interval), 1)
    changed = bl.apply_corrections(spark, config, new_counts, "run-b", interval, "late_data")
    assert [(r["status"], r["old_count"], r["new_count"]) for r in changed] == [("valid", 2, 3)]
    assert _counts(spark, config)[("orders", W0, "valid")] == (3, "batch")
    # Recorded once, by the attempt that recorded it first.
    assert _corrections(spark, config) == [("orders", W0, "valid", 2, 3, "run-a")]
    assert txn_version(spark, table_path(config, WINDOW_COUNTS), app_id) == 0
    assert txn_version(spark, table_path(config, CORRECTIONS), app_id) == 0
