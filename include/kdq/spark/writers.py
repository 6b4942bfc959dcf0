"""Side effects on the Delta tables: small writer functions, each idempotent per (app id, version).

Delta's idempotent-write guard (``txnAppId``/``txnVersion``) records, in the
table's own log and atomically with the data, the last version an app id
committed; a write with a version not above it is skipped. The stream uses
(its checkpoint's app id, the micro-batch id), so a replayed batch is a
no-op on every table it already reached, and MERGEs of per-window
*increments* are safe: they are applied exactly once per table.

Tables are addressed by path, not by catalog name: the name is a per-session
convenience for users' SQL, the path is the table's identity.

All times cross the Python boundary as epoch millis (BIGINT), never as
Python datetimes, whose conversion depends on the process time zone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq.config import Config
from kdq.spark.tables import table_path
from kdq.tables import BATCH_LEDGER, INVALID_REASONS, QUARANTINE, RAW_ARCHIVE, WINDOW_COUNTS, TableSpec

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


@contextmanager
def idempotent_write(spark: SparkSession, app_id: str, version: int) -> Iterator[None]:
    """Session-wide guard for DML (MERGE). Session-wide means one writer thread per session."""
    spark.conf.set(TXN_APP_ID, app_id)
    spark.conf.set(TXN_VERSION, str(version))
    try:
        yield
    finally:
        spark.conf.unset(TXN_APP_ID)
        spark.conf.unset(TXN_VERSION)


def _require_columns(df: DataFrame, spec: TableSpec, required: Sequence[str]) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"{spec.name}: input lacks columns {missing}; expected {list(required)}, got {df.columns}")


def _ts_literal(ms: int) -> str:
    return "TIMESTAMP'" + datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f") + "'"


def _date_literal(ms: int) -> str:
    return "DATE'" + datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d") + "'"


def append_archive(df: DataFrame, config: Config, app_id: str, version: int, batch_id: int, source: str) -> None:
    """Append classified records to the raw archive exactly once per (app_id, version)."""
    _require_columns(df, RAW_ARCHIVE, ["topic", "partition", "offset", "valid", "reason", "counted", "event_hour"])
    out = df.withColumn("batch_id", F.lit(batch_id).cast("bigint")).withColumn("source", F.lit(source))
    (
        out.select(*RAW_ARCHIVE.column_names)
        .write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", version)
        .save(table_path(config, RAW_ARCHIVE))
    )


def merge_window_increments(
    spark: SparkSession, rows: Sequence[Mapping], config: Config, app_id: str, version: int, updated_by: str = "stream"
) -> None:
    """Add per-window increments (topic, window_start_ms, status, count, rules_version) once per version.

    One MERGE per micro-batch over pre-aggregated rows; the literal
    window_date/window_start range lets Delta prune partitions and files.
    """
    if not rows:
        return
    size = config.stream.window_seconds
    source = spark.createDataFrame(
        [(r["topic"], int(r["window_start_ms"]), r["status"], int(r["count"]), r["rules_version"]) for r in rows],
        "topic STRING, window_start_ms BIGINT, status STRING, count BIGINT, rules_version STRING",
    ).select(
        "topic",
        F.timestamp_millis("window_start_ms").alias("window_start"),
        F.timestamp_millis(F.col("window_start_ms") + size * 1000).alias("window_end"),
        "status",
        "count",
        F.current_timestamp().alias("updated_at"),
        F.lit(updated_by).alias("updated_by"),
        "rules_version",
        F.to_date(F.timestamp_millis("window_start_ms")).alias("window_date"),
    )
    lo = min(int(r["window_start_ms"]) for r in rows)
    hi = max(int(r["window_start_ms"]) for r in rows)
    condition = (
        f"t.window_date BETWEEN {_date_literal(lo)} AND {_date_literal(hi)} "
        f"AND t.window_start BETWEEN {_ts_literal(lo)} AND {_ts_literal(hi)} "
        "AND t.topic = s.topic AND t.window_start = s.window_start AND t.status = s.status"
    )
    from delta.tables import DeltaTable

    target = DeltaTable.forPath(spark, table_path(config, WINDOW_COUNTS)).alias("t")
    with idempotent_write(spark, app_id, version):
        (
            target.merge(source.alias("s"), condition)
            .whenMatchedUpdate(
                set={
                    "count": "t.count + s.count",
                    "updated_at": "s.updated_at",
                    "updated_by": "s.updated_by",
                    "rules_version": "s.rules_version",
                }
            )
            .whenNotMatchedInsertAll()
            .execute()
        )


def read_window_counts(spark: SparkSession, config: Config, keys: Sequence[tuple[str, int]]) -> list[dict]:
    """Absolute (valid, invalid) per (topic, window_start_ms); a status without a row reads as 0."""
    if not keys:
        return []
    lo = min(ms for _, ms in keys)
    hi = max(ms for _, ms in keys)
    wanted = spark.createDataFrame(list(set(keys)), "topic STRING, window_start_ms BIGINT")
    table = spark.read.format("delta").load(table_path(config, WINDOW_COUNTS)).where(
        f"window_date BETWEEN {_date_literal(lo)} AND {_date_literal(hi)} "
        f"AND window_start BETWEEN {_ts_literal(lo)} AND {_ts_literal(hi)}"
    )
    counts = (
        table.select("topic", F.unix_millis("window_start").alias("window_start_ms"), "status", "count")
        .groupBy("topic", "window_start_ms")
        .agg(
            F.sum(F.when(F.col("status") == "valid", F.col("count")).otherwise(0)).alias("valid"),
            F.sum(F.when(F.col("status") == "invalid", F.col("count")).otherwise(0)).alias("invalid"),
        )
    )
    joined = wanted.join(F.broadcast(counts), ["topic", "window_start_ms"], "left").fillna(0, ["valid", "invalid"])
    return [row.asDict() for row in joined.collect()]


def merge_reason_increments(
    spark: SparkSession, increments: DataFrame, config: Config, app_id: str, version: int
) -> None:
    _require_columns(increments, INVALID_REASONS, ["topic", "window_start", "reason", "count"])
    from delta.tables import DeltaTable

    source = increments.withColumn("updated_at", F.current_timestamp())
    target = DeltaTable.forPath(spark, table_path(config, INVALID_REASONS)).alias("t")
    with idempotent_write(spark, app_id, version):
        (
            target.merge(
                source.alias("s"), "t.topic = s.topic AND t.window_start = s.window_start AND t.reason = s.reason"
            )
            .whenMatchedUpdate(set={"count": "t.count + s.count", "updated_at": "s.updated_at"})
            .whenNotMatchedInsertAll()
            .execute()
        )


def append_quarantine(sample: DataFrame, config: Config, app_id: str, version: int, batch_id: int) -> None:
    _require_columns(sample, QUARANTINE, ["topic", "partition", "offset", "reason", "value_preview"])
    (
        sample.withColumn("batch_id", F.lit(batch_id).cast("bigint"))
        .select(*QUARANTINE.column_names)
        .write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", version)
        .save(table_path(config, QUARANTINE))
    )


def read_ledger(spark: SparkSession, config: Config, app_id: str, batch_id: int) -> tuple[dict | None, dict | None]:
    """(this batch's ledger row if it was already written, the latest earlier row)."""
    rows = (
        spark.read.format("delta").load(table_path(config, BATCH_LEDGER))
        .where((F.col("app_id") == app_id) & (F.col("batch_id") <= batch_id))
        .orderBy(F.col("batch_id").desc())
        .limit(2)
        .collect()
    )
    current = next((r.asDict() for r in rows if r["batch_id"] == batch_id), None)
    previous = next((r.asDict() for r in rows if r["batch_id"] < batch_id), None)
    return current, previous


def append_ledger(spark: SparkSession, config: Config, app_id: str, entry: Mapping) -> None:
    row = {name: entry.get(name) for name in BATCH_LEDGER.column_names}
    row["app_id"] = app_id
    row["started_at"] = datetime.now(UTC).replace(tzinfo=None) if row.get("started_at") is None else row["started_at"]
    df = spark.createDataFrame([row], ", ".join(f"`{n}` {t}" for n, t in BATCH_LEDGER.columns))
    (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", int(entry["batch_id"]))
        .save(table_path(config, BATCH_LEDGER))
    )


def now_ms() -> int:
    return int(time.time() * 1000)
