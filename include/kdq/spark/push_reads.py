"""Reading the counts a push sends, with their order: the ``window_counts`` version they were read at.

See :mod:`kdq.push_order`. :func:`counts_version` is the table's latest version (from its Delta log, no
Spark job); the reads pin it with ``versionAsOf``, so the values and the version always belong together.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Sequence
from urllib.parse import unquote

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq import storage
from kdq.config import Config
from kdq.push_order import Window
from kdq.spark.tables import table_path
from kdq.spark.writers import delta_snapshot
from kdq.sql_literals import date_literal, timestamp_literal
from kdq.tables import WINDOW_COUNTS

log = logging.getLogger("kdq.stream")

# How many commits back from the latest the stream looks for its own MERGE (its own auto compaction, and another
# job's commits, may follow it).
MERGE_COMMIT_LOOKBACK = 8


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


def read_merge_output(
    spark: SparkSession, config: Config, app_id: str, batch_id: int, keys: Sequence[Window]
) -> tuple[int, list[dict]] | None:
    """Absolute (valid, invalid) of the windows ``keys`` as written by the stream's MERGE of ``batch_id``, and the
    version it committed: read from that commit's own data files, with no Spark job.

    :func:`kdq.spark.writers.merge_window_increments` puts both statuses of every touched window in its source, so
    the files the commit adds without a deletion vector (a file re-added with one is an old file marked; a new
    file has none) hold every stored row of those windows, each live at that version. None when the commit is not
    among the last :data:`MERGE_COMMIT_LOOKBACK` (a replay whose MERGE had landed before) or cannot be read as
    expected (a window missing, a column renamed by column mapping): the caller scans instead.
    """
    if not keys:
        return None
    path = table_path(config, WINDOW_COUNTS)
    files = storage.files_for(path)
    latest = counts_version(spark, config)
    try:
        for version in range(latest, max(latest - MERGE_COMMIT_LOOKBACK, -1), -1):
            commit = files.read_bytes(storage.join(path, "_delta_log", f"{version:020d}.json"))
            actions = [json.loads(line) for line in commit.splitlines() if line.strip()]
            txn = next((a["txn"] for a in actions if "txn" in a and a["txn"].get("appId") == app_id), None)
            if txn is None:
                continue
            if int(txn["version"]) != int(batch_id):
                return None  # this app's newest commit is another batch's: the MERGE of this one landed earlier
            rows = _rows_of_added_files(files, path, actions, keys)
            return (version, _absolute(rows, keys)) if rows is not None else None
    except Exception:  # an unexpected log or file layout must not fail the batch: the scan is always right
        log.warning("batch %d: reading the MERGE's own files failed; scanning window_counts instead", batch_id,
                    exc_info=True)
    return None


def _rows_of_added_files(files, path: str, actions: list[dict], keys: Sequence[Window]) -> list[dict] | None:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    wanted = set(keys)
    rows: list[dict] = []
    for action in actions:
        add = action.get("add")
        if add is None or add.get("deletionVector"):
            continue
        relative = unquote(add["path"])
        location = relative if storage.scheme(relative) or relative.startswith("/") else storage.join(path, relative)
        table = pq.read_table(io.BytesIO(files.read_bytes(location)), columns=["topic", "window_start", "status", "count"])
        starts = table.column("window_start")  # INT96 (nanoseconds) or TIMESTAMP_MICROS, as the writer chose
        per_ms = {"ms": 1, "us": 1000, "ns": 1_000_000}[starts.type.unit]
        for topic, start, status, count in zip(table.column("topic").to_pylist(), pc.cast(starts, "int64").to_pylist(),
                                               table.column("status").to_pylist(), table.column("count").to_pylist(), strict=True):
            ms = start // per_ms
            if (topic, ms) in wanted:
                rows.append({"topic": topic, "ms": ms, "status": status, "count": count})
    if {(r["topic"], r["ms"]) for r in rows} != wanted or len({(r["topic"], r["ms"], r["status"]) for r in rows}) != len(rows):
        return None  # each touched window has a row (its non-zero increment's), and no row is there twice
    return rows


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
