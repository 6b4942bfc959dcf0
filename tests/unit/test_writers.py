"""Writer functions on static DataFrames: idempotent per (app id, version), absolute read-back."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from kdq.spark.push_reads import counts_version, read_merge_output, read_range_at
from kdq.spark.tables import ensure_tables
from kdq.spark.writers import append_archive, merge_window_increments
from tests.conftest import make_config

W0 = 1_700_000_000_000


def _counts(spark, config) -> dict:
    df = spark.read.format("delta").load(str(config.tables_dir / "window_counts"))
    return {
        (r["topic"], r["w"], r["status"]): (r["count"], r["updated_by"])
        for r in df.select("topic", F.unix_millis("window_start").alias("w"), "status", "count", "updated_by").collect()
    }


def test_merge_increments_is_applied_once_per_version(spark, tmp_path) -> None:
    config = make_config(tmp_path)
    ensure_tables(spark, config)
    batch = [
        {"topic": "orders", "window_start_ms": W0, "status": "valid", "count": 5, "rules_version": "v1"},
        {"topic": "orders", "window_start_ms": W0, "status": "invalid", "count": 1, "rules_version": "v1"},
    ]
    merge_window_increments(spark, batch, config, "app-a", 0)
    merge_window_increments(spark, batch, config, "app-a", 0)  # replay of batch 0: skipped
    assert _counts(spark, config) == {("orders", W0, "valid"): (5, "stream"), ("orders", W0, "invalid"): (1, "stream")}

    late = [{"topic": "orders", "window_start_ms": W0, "status": "valid", "count": 1, "rules_version": "v1"}]
    merge_window_increments(spark, late, config, "app-a", 1)
    merge_window_increments(spark, late, config, "app-a", 0)  # an older version never re-applies
    # A new checkpoint has a new app id: its batch 0 is applied, not skipped.
    merge_window_increments(spark, late, config, "app-b", 0)
    assert _counts(spark, config)[("orders", W0, "valid")] == (7, "stream")

    keys = [("orders", W0), ("orders", W0 + 1000), ("other", W0)]
    back = read_range_at(spark, config, keys, counts_version(spark, config))  # the stream's read-back
    assert back == [
        {"topic": "orders", "window_start_ms": W0, "valid": 7, "invalid": 1},
        {"topic": "orders", "window_start_ms": W0 + 1000, "valid": 0, "invalid": 0},
        {"topic": "other", "window_start_ms": W0, "valid": 0, "invalid": 0},
    ]


def test_the_stream_reads_its_absolute_counts_from_its_merge_commit(spark, tmp_path) -> None:
    """The MERGE's own files hold every stored row of the windows it touched (both statuses), so the stream's
    read-back needs no scan: the same values and version as the scan, and nothing stored changes for a status
    the batch did not count."""
    config = make_config(tmp_path)
    ensure_tables(spark, config)
    first = [
        {"topic": "orders", "window_start_ms": W0, "status": "valid", "count": 5, "rules_version": "v1"},
        {"topic": "orders", "window_start_ms": W0, "status": "invalid", "count": 1, "rules_version": "v1"},
        {"topic": "orders", "window_start_ms": W0 + 1000, "status": "valid", "count": 2, "rules_version": "v1"},
    ]
    merge_window_increments(spark, first, config, "app", 0)
    keys = [("orders", W0), ("orders", W0 + 1000)]
    version, rows = read_merge_output(spark, config, "app", 0, keys)
    assert (version, rows) == (counts_version(spark, config), read_range_at(spark, config, keys, version))
    assert rows == [{"topic": "orders", "window_start_ms": W0, "valid": 5, "invalid": 1},
                    {"topic": "orders", "window_start_ms": W0 + 1000, "valid": 2, "invalid": 0}]
    stored_before = _counts(spark, config)
    assert ("orders", W0 + 1000, "invalid") not in stored_before  # a zero increment inserts no row

    # Batch 1 counts only valid records of W0: its commit still carries W0's invalid count, unchanged.
    merge_window_increments(spark, [{"topic": "orders", "window_start_ms": W0, "status": "valid", "count": 3,
                                     "rules_version": "v2"}], config, "app", 1)
    # Another writer commits after it: the stream finds its own commit behind that one.
    merge_window_increments(spark, [{"topic": "other", "window_start_ms": W0, "status": "valid", "count": 9,
                                     "rules_version": "v1"}], config, "other-app", 0)
    version, rows = read_merge_output(spark, config, "app", 1, [("orders", W0)])
    assert version == counts_version(spark, config) - 1
    assert rows == [{"topic": "orders", "window_start_ms": W0, "valid": 8, "invalid": 1}]
    assert rows == read_range_at(spark, config, [("orders", W0)], version)
    invalid = spark.read.format("delta").load(str(config.tables_dir / "window_counts")).where(
        "status = 'invalid'").select("count", "rules_version", F.unix_millis("updated_at").alias("at")).collect()
    assert [(r["count"], r["rules_version"]) for r in invalid] == [(1, "v1")]  # the zero increment set nothing
    before = spark.read.format("delta").option("versionAsOf", 1).load(str(config.tables_dir / "window_counts"))
    assert invalid[0]["at"] == before.where("status = 'invalid'").select(F.unix_millis("updated_at")).first()[0]

    # A replay whose MERGE had landed (the guard skips it): no commit of its own, so the caller scans.
    merge_window_increments(spark, first, config, "app", 0)
    assert read_merge_output(spark, config, "app", 0, keys) is None
    assert read_merge_output(spark, config, "app", 1, []) is None


def test_merge_rejects_nothing_and_empty_is_a_no_op(spark, tmp_path) -> None:
    config = make_config(tmp_path)
    ensure_tables(spark, config)
    merge_window_increments(spark, [], config, "app", 0)
    assert _counts(spark, config) == {}


def test_archive_append_is_idempotent_and_checks_columns(spark, tmp_path) -> None:
    config = make_config(tmp_path)
    ensure_tables(spark, config)
    rows = spark.createDataFrame(
        [("orders", 0, 7, b'{"a":1}', True, None, True, "2023-11-14-22")],
        "topic STRING, partition INT, offset BIGINT, value BINARY, valid BOOLEAN, reason STRING, counted BOOLEAN, event_hour STRING",
    )
    full = rows.select(
        "*",
        F.timestamp_millis(F.lit(W0)).alias("kafka_timestamp"),
        F.timestamp_millis(F.lit(W0)).alias("event_time"),
        F.timestamp_millis(F.lit(W0)).alias("window_start"),
        F.lit(None).cast("binary").alias("key"),
        F.current_timestamp().alias("ingest_time"),
        F.lit("none").alias("rules_version"),
    )
    append_archive(full, config, "app", 3, 3, "stream")
    append_archive(full, config, "app", 3, 3, "stream")
    archive = spark.read.format("delta").load(str(config.tables_dir / "raw_archive"))
    assert archive.count() == 1
    assert archive.first()["source"] == "stream" and archive.first()["batch_id"] == 3
    # The archive's files are Snappy (ARCHIVE_WRITE_OPTIONS), read by Spark and pyarrow.
    files = list((config.tables_dir / "raw_archive").rglob("*.parquet"))
    assert len(files) == 1 and ".snappy." in files[0].name, files
    parquet = pq.ParquetFile(files[0])
    assert {parquet.metadata.row_group(0).column(i).compression for i in range(parquet.metadata.num_columns)} == {"SNAPPY"}
    assert parquet.read(columns=["value"]).column("value").to_pylist() == [b'{"a":1}']

    try:
        append_archive(rows.drop("counted"), config, "app", 4, 4, "stream")
    except ValueError as exc:
        assert "raw_archive" in str(exc) and "counted" in str(exc)
    else:
        raise AssertionError("a frame without 'counted' must be rejected with the missing column named")


def test_a_replay_reads_a_big_batch_back_from_the_archive_by_offset_range(spark, tmp_path) -> None:
    # A stream replay reads its batch's archived records by batch id and offset range (SpeedLayer._archived_aggregates).
    # Four partitions' records with 3,000 offsets each in one file: the offset column stays dictionary-encoded, its
    # dictionary page is ~24 KB, and Parquet's dictionary filter reads it. Written in LZ4_RAW, parquet-java 1.17 failed
    # that read every time ("all input must be consumed"; the chaos run's replays). The archive keeps Snappy even where
    # the session's codec is LZ4_RAW.
    config = make_config(tmp_path)
    ensure_tables(spark, config)
    records = spark.range(12_000).select(
        F.lit("orders").alias("topic"), (F.col("id") % 4).cast("int").alias("partition"),
        (F.col("id") / 4).cast("bigint").alias("offset"),
        F.concat(F.lit('{"n":'), F.col("id").cast("string"), F.lit("}")).cast("binary").alias("value"),
        (F.col("id") % 7 != 0).alias("valid"), F.when(F.col("id") % 7 == 0, F.lit("schema")).alias("reason"),
        F.lit(True).alias("counted"), F.lit("2023-11-14-22").alias("event_hour"),
        F.timestamp_millis(F.lit(W0)).alias("kafka_timestamp"), F.timestamp_millis(F.lit(W0)).alias("event_time"),
        F.timestamp_millis(F.lit(W0)).alias("window_start"), F.lit(None).cast("binary").alias("key"),
        F.current_timestamp().alias("ingest_time"), F.lit("none").alias("rules_version"),
    ).coalesce(1)
    codec = spark.conf.get("spark.sql.parquet.compression.codec")
    spark.conf.set("spark.sql.parquet.compression.codec", "lz4_raw")
    try:
        append_archive(records, config, "app", 5, 5, "stream")
    finally:
        spark.conf.set("spark.sql.parquet.compression.codec", codec)
    archive = spark.read.format("delta").load(str(config.tables_dir / "raw_archive"))
    replayed = archive.where(
        (F.col("batch_id") == 5) & (F.col("source") == "stream") & (F.col("topic") == "orders")
        & (F.col("partition") == 1) & F.col("offset").between(100, 2899)
    )
    assert replayed.count() == 2800
    assert replayed.where(~F.col("valid")).count() == len([o for o in range(100, 2900) if (4 * o + 1) % 7 == 0])


def test_tables_work_under_a_data_dir_with_quotes_and_spaces(spark, tmp_path) -> None:
    """No path reaches SQL text: creating, registering and querying by name work
    wherever the data directory is; the one character Delta cannot take (a backtick) fails at start."""
    from kdq.config import ConfigError
    from kdq.spark.tables import register_tables

    config = make_config(tmp_path / "it's a \"strange\" dir", spark={"database": "kdq_odd_path"})
    register_tables(spark, config)
    batch = [{"topic": "orders", "window_start_ms": W0, "status": "valid", "count": 3, "rules_version": "v1"}]
    merge_window_increments(spark, batch, config, "app", 0)
    rows = spark.sql("SELECT topic, count FROM kdq_odd_path.window_counts").collect()
    assert [(r["topic"], r["count"]) for r in rows] == [("orders", 3)]
    assert (tmp_path / "it's a \"strange\" dir" / "delta" / "window_counts" / "_delta_log").is_dir()
    with pytest.raises(ConfigError, match="backtick"):
        make_config(tmp_path / "a `quoted` dir")


def test_invalid_samples_view_keeps_the_first_records_per_reason_window(spark, tmp_path) -> None:
    """The samples of invalid messages are a view over the archive: per (topic, reasons window, reason),
    the first ``stream.quarantine_per_window`` by (partition, offset), with a readable preview."""
    from kdq.spark.tables import register_tables

    config = make_config(tmp_path, spark={"database": "kdq_samples"}, stream={"quarantine_per_window": 3})
    register_tables(spark, config)
    rows = [("orders", p, o, b"{oops" + bytes([o]), False, "not_json", W0 + 1000 * o) for p in (1, 0) for o in range(10)]
    rows += [("orders", 0, 100, b'{"ok":1}', True, None, W0), ("orders", 0, 101, b"\xff", False, "not_utf8", W0 + 70_000)]
    df = spark.createDataFrame(rows, "topic STRING, partition INT, offset BIGINT, value BINARY, valid BOOLEAN, reason STRING, w BIGINT")
    full = df.select(
        "topic", "partition", "offset", "value", "valid", "reason",
        F.lit(True).alias("counted"),
        F.date_format(F.timestamp_millis("w"), "yyyy-MM-dd-HH").alias("event_hour"),
        F.timestamp_millis("w").alias("kafka_timestamp"),
        F.timestamp_millis("w").alias("event_time"),
        F.timestamp_millis("w").alias("window_start"),
        F.lit(None).cast("binary").alias("key"),
        F.current_timestamp().alias("ingest_time"),
        F.lit("none").alias("rules_version"),
    )
    append_archive(full, config, "app", 0, 0, "stream")
    samples = spark.table("kdq_samples.invalid_samples").collect()
    got = sorted((r["reason"], r["partition"], r["offset"], r["window_start"].timestamp() * 1000) for r in samples)
    coarse = W0 // 60_000 * 60_000
    assert got == [("not_json", 0, 0, coarse), ("not_json", 0, 1, coarse), ("not_json", 0, 2, coarse),
                   ("not_utf8", 0, 101, coarse + 60_000)]
    first = next(r for r in samples if r["offset"] == 0)
    assert first["value_preview"].startswith("{oops") and first["value_bytes"] == 6
