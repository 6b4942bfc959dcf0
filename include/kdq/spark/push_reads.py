"""Reading the counts a push sends, with their order: the ``window_counts`` version they were read at.

See :mod:`kdq.push_order`. :func:`counts_version` is the table's latest version (from its Delta log, no
Spark job); the reads pin it with ``versionAsOf``, so the values and the version always belong together.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq.config import Config
from kdq.push_order import Window
from kdq.spark.tables import table_path
from kdq.spark.writers import delta_snapshot
from kdq.sql_literals import date_literal, timestamp_literal
from kdq.tables import WINDOW_COUNTS


def counts_version(spark: SparkSession, config: Config) -> int:
    """The latest committed version of ``window_counts`` (from its Delta log: no Spark job on the stream's
    path)."""
    return int(delta_snapshot(spark, table_path(config, WINDOW_COUNTS)).version())


def counts_at(spark: SparkSession, config: Config, version: int) -> DataFrame:
    return spark.read.format("delta").option("versionAsOf", int(version)).load(table_path(config, WINDOW_COUNTS))


def _absolute(rows, keys: Sequence[Window]) -> list[dict]:
    found: dict[Window, dict[str, int]] = {}
    for row in rows:
        found.setdefault((row["topic"], int(row["ms"])), {"valid": 0, "invalid": 0})[row["status"]] = int(row["count"])
    return [
        {"topic": t, "window_start_ms": ms, **found.get((t, ms), {"valid": 0, "invalid": 0})}
        for t, ms in sorted(set(keys))
    ]


def read_range_at(spark: SparkSession, config: Config, keys: Sequence[Window], version: int) -> list[dict]:
    """Absolute (valid, invalid) per (topic, window_start_ms) at ``version``, by one range scan over the keys'
    span (the stream's read-back: its changed windows are close together)."""
    if not keys:
        return []
    lo = min(ms for _, ms in keys)
    hi = max(ms for _, ms in keys)
    table = (
        counts_at(spark, config, version)
        .where(
            f"window_date BETWEEN {date_literal(lo)} AND {date_literal(hi)} "
            f"AND window_start BETWEEN {timestamp_literal(lo)} AND {timestamp_literal(hi)}"
        )
        .where(F.col("topic").isin(sorted({t for t, _ in keys})))
    )
    return _absolute(table.select("topic", F.unix_millis("window_start").alias("ms"), "status", "count").collect(), keys)


def read_windows_at(spark: SparkSession, config: Config, keys: Sequence[Window], version: int) -> list[dict]:
    """The same by a semi-join on the wanted windows within their ``window_date`` partitions (batch pushes:
    windows may lie far apart)."""
    keys = sorted(set((t, int(ms)) for t, ms in keys))
    if not keys:
        return []
    wanted = spark.createDataFrame(keys, "topic STRING, window_start_ms BIGINT").select(
        "topic", F.timestamp_millis("window_start_ms").alias("window_start")
    )
    dates = sorted({date_literal(ms) for _, ms in keys})
    table = (
        counts_at(spark, config, version)
        .where(f"window_date IN ({', '.join(dates)})")
        .join(F.broadcast(wanted), ["topic", "window_start"], "left_semi")
    )
    return _absolute(table.select("topic", F.unix_millis("window_start").alias("ms"), "status", "count").collect(), keys)


def latest_reader(spark: SparkSession, config: Config):
    """A :data:`kdq.push_order.CountsReader` reading at the latest version (batch pushes, under the lock)."""

    def read(keys: Sequence[Window]) -> tuple[int, list[dict]]:
        version = counts_version(spark, config)
        return version, read_windows_at(spark, config, keys, version)

    return read
