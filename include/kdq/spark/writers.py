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

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import TypeVar

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq.background_session import session_priority_at_least
from kdq.config import Config
from kdq.procs import SERVICE_NICENESS
from kdq.spark.tables import table_path
from kdq.spark.transforms import INVALID, VALID, reason_differences, window_partition_columns
from kdq.sql_literals import date_literal, timestamp_literal
from kdq.tables import INVALID_REASONS, RAW_ARCHIVE, WINDOW_COUNTS, TableSpec
from kdq.writers_journal import WAITS

log = logging.getLogger("kdq.writers")
T = TypeVar("T")

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


# The compare-and-set of an absolute write found a stored value other than the one its job read (another
# writer got there in between): raised inside the MERGE, so nothing of it is committed.
STALE_READ = "KDQ_STALE_READ"


def is_stale_read(exc: Exception) -> bool:
    return STALE_READ in str(exc)


def is_conflict(exc: Exception) -> bool:
    """A Delta optimistic-concurrency conflict (another writer committed to the same files first), or a
    compare-and-set that found the stored value changed since it was read (:data:`STALE_READ`)."""
    text = f"{type(exc).__name__} {exc}"
    return (
        "Concurrent" in text or "DELTA_CONCURRENT" in text or STALE_READ in text
        # a table's layout or properties brought up to date by another job's start (kdq.spark.tables)
        or "DELTA_METADATA_CHANGED" in text or "DELTA_PROTOCOL_CHANGED" in text
    )


def retry_on_conflict(
    action: Callable[[], T], what: str = "Delta write", attempts: int = 5, stale_reads: bool = True
) -> T:
    """Run a Delta write again when another writer (the stream, the batch layer, maintenance)
    committed first to the same files. Safe because every kdq write is idempotent per
    (app id, version): a retry after a commit that did land is skipped by Delta. ``stale_reads``: also
    when a compare-and-set found its read outdated (only useful when ``action`` reads again); False
    raises that at once, for a caller that starts over itself."""
    for attempt in range(1, attempts + 1):
        # A batch job whose session runs at a low CPU weight (kdq.background_session) lost this race because its
        # commit took longer than the stream's interval between commits; it retries at the stream's weight.
        raise_priority = session_priority_at_least(SERVICE_NICENESS) if attempt > 1 else nullcontext(False)
        try:
            with raise_priority as raised:
                if raised:
                    log.info("%s: attempt %d at the stream's CPU weight (session niceness %d)", what, attempt,
                             SERVICE_NICENESS)
                return action()
        except Exception as exc:  # py4j surfaces Delta's conflict exceptions generically
            if attempt == attempts or not is_conflict(exc) or (not stale_reads and is_stale_read(exc)):
                raise
            log.warning("%s conflicted with a concurrent commit (attempt %d): %s", what, attempt, str(exc)[:300])
            pause = min(2.0 * attempt, 10.0)
            WAITS.retried(stale_read=is_stale_read(exc), slept_seconds=pause)  # the writers journal's counters
            time.sleep(pause)
    raise AssertionError("unreachable")


def append_once(
    df: DataFrame, path: str, app_id: str, version: int, options: Mapping[str, str] | None = None
) -> None:
    """Append ``df`` to the Delta table at ``path`` unless ``app_id`` already committed ``version`` (or a
    later one) there: Delta's idempotent write, with the guard as write options (not the session-wide
    settings), so it is safe on any thread. ``options``: further write options (the Parquet writer's)."""
    (
        df.write.format("delta")
        .mode("append")
        .options(**(options or {}))
        .option("txnAppId", app_id)
        .option("txnVersion", int(version))
        .save(path)
    )


# The raw archive's files in Snappy, whatever spark.sql.parquet.compression.codec says. Not LZ4_RAW, although its warm
# pass was ~3.5 % cheaper (benchmarks/PERF_NOTES.md, "twenty-second pass"): parquet-java 1.17 (pyspark 4.2's) cannot
# read back an LZ4_RAW page over ~8 KB through its lazy path, which its dictionary filter takes (apache/parquet-java
# GH-3478, fixed after 1.17). A stream replay reads its batch's archived records by offset range, so a batch of more
# than ~1,000 records per file failed every attempt ("all input must be consumed"; the chaos run, twenty-fifth pass).
ARCHIVE_WRITE_OPTIONS = {"compression": "snappy"}


def _require_columns(df: DataFrame, spec: TableSpec, required: Sequence[str]) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"{spec.name}: input lacks columns {missing}; expected {list(required)}, got {df.columns}")


def append_archive(df: DataFrame, config: Config, app_id: str, version: int, batch_id: int, source: str) -> None:
    """Append classified records to the raw archive exactly once per (app_id, version)."""
    _require_columns(df, RAW_ARCHIVE, ["topic", "partition", "offset", "valid", "reason", "counted", "event_hour"])
    out = df.withColumn("batch_id", F.lit(batch_id).cast("bigint")).withColumn("source", F.lit(source))
    append_once(out.select(*RAW_ARCHIVE.column_names), table_path(config, RAW_ARCHIVE), app_id, version,
                ARCHIVE_WRITE_OPTIONS)


def with_other_statuses(rows: Sequence[Mapping]) -> list[Mapping]:
    """``rows`` plus a zero increment for each status of a touched window that ``rows`` lack (same
    ``rules_version`` as the window's row), in a stable order."""
    present = {(r["topic"], int(r["window_start_ms"]), r["status"]): r for r in rows}
    out: list[Mapping] = list(rows)
    for (topic, ms, status), row in list(present.items()):
        for other in (VALID, INVALID):
            if other != status and (topic, ms, other) not in present:
                present[(topic, ms, other)] = {**row, "status": other, "count": 0}
                out.append(present[(topic, ms, other)])
    return out


def merge_window_increments(
    spark: SparkSession, rows: Sequence[Mapping], config: Config, app_id: str, version: int, updated_by: str = "stream"
) -> None:
    """Add per-window increments (topic, window_start_ms, status, count, rules_version) once per version.

    One MERGE per micro-batch over pre-aggregated rows; the literal
    window_date/window_start range lets Delta prune partitions and files.

    Every touched window's other status goes in too, as a zero increment that updates nothing (``count``
    stays, ``updated_at`` too) and inserts nothing: the rows a MERGE writes are then every stored row of the
    touched windows, so the stream reads its absolute counts from the MERGE's own commit
    (:func:`kdq.spark.push_reads.read_merge_output`) instead of scanning the table.
    """
    if not rows:
        return
    size = config.stream.window_seconds
    source = spark.createDataFrame(
        [(r["topic"], int(r["window_start_ms"]), r["status"], int(r["count"]), r["rules_version"])
         for r in with_other_statuses(rows)],
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
        *window_partition_columns("window_start_ms"),
    )
    lo = min(int(r["window_start_ms"]) for r in rows)
    hi = max(int(r["window_start_ms"]) for r in rows)
    condition = (
        f"t.window_date BETWEEN {date_literal(lo)} AND {date_literal(hi)} "
        f"AND t.window_start BETWEEN {timestamp_literal(lo)} AND {timestamp_literal(hi)} "
        "AND t.topic = s.topic AND t.window_start = s.window_start AND t.status = s.status"
    )
    from delta.tables import DeltaTable

    def merge() -> None:
        target = DeltaTable.forPath(spark, table_path(config, WINDOW_COUNTS)).alias("t")
        with idempotent_write(spark, app_id, version):
            (
                target.merge(source.alias("s"), condition)
                # One matched clause (two cost ~5 % more per MERGE): a zero increment rewrites its row unchanged.
                .whenMatchedUpdate(
                    set={
                        "count": "t.count + s.count",
                        **{c: f"CASE WHEN s.count <> 0 THEN s.{c} ELSE t.{c} END"
                           for c in ("updated_at", "updated_by", "rules_version")},
                    }
                )
                .whenNotMatchedInsertAll(condition="s.count <> 0")
                .execute()
            )

    retry_on_conflict(merge, "window-count MERGE")


def append_reason_increments(
    spark: SparkSession, rows: Sequence[Mapping], config: Config, app_id: str, batch_id: int
) -> None:
    """Append (topic, window_start_ms, reason, count) increments once per (app id, batch)."""
    append_reason_rows(spark, config, rows, batch_id, app_id, batch_id)


def append_reason_rows(
    spark: SparkSession, config: Config, rows: Sequence[Mapping], batch_id: int | None, app_id: str, version: int
) -> None:
    """Append (topic, window_start_ms, reason, count) rows to invalid_reasons with ``batch_id``, once per
    (app id, version): the stream's per-batch increments and the batch layer's corrections."""
    if not rows:
        return
    df = spark.createDataFrame(
        [(r["topic"], int(r["window_start_ms"]), r["reason"], int(r["count"])) for r in rows],
        "topic STRING, window_start_ms BIGINT, reason STRING, count BIGINT",
    )
    rows_out = df.select(
        "topic",
        F.timestamp_millis("window_start_ms").alias("window_start"),
        "reason",
        "count",
        F.lit(batch_id).cast("bigint").alias("batch_id"),
        F.current_timestamp().alias("updated_at"),
    )
    append_once(rows_out, table_path(config, INVALID_REASONS), app_id, version)


def stream_reason_frame(spark: SparkSession, rows: Sequence[Mapping]) -> DataFrame:
    """The stream's reason rows of several micro-batches ((topic, window_start_ms, reason, count, batch_id,
    ingest_time_ms), :mod:`kdq.spark.reasons_flush`) as ``invalid_reasons`` rows: each with its batch's id and
    its ingest time as ``updated_at``."""
    df = spark.createDataFrame(
        [(r["topic"], int(r["window_start_ms"]), r["reason"], int(r["count"]), int(r["batch_id"]), int(r["ingest_time_ms"]))
         for r in rows],
        "topic STRING, window_start_ms BIGINT, reason STRING, count BIGINT, batch_id BIGINT, ingest_time_ms BIGINT",
    )
    return df.select(
        "topic",
        F.timestamp_millis("window_start_ms").alias("window_start"),
        "reason",
        "count",
        "batch_id",
        F.timestamp_millis("ingest_time_ms").alias("updated_at"),
    )


def append_stream_reason_rows(
    spark: SparkSession, config: Config, rows: Sequence[Mapping], app_id: str, version: int
) -> None:
    """Append :func:`stream_reason_frame` of ``rows`` once per (app id, version). Commits even with no rows: the
    table's txn version then records how far the stream's ledger is flushed."""
    append_once(stream_reason_frame(spark, rows), table_path(config, INVALID_REASONS), app_id, version)


def adjust_invalid_reasons(
    spark: SparkSession,
    config: Config,
    target: DataFrame,
    scope: Column,
    batch_id: int | None,
    app_id: str,
    table: Callable[[], DataFrame] | None = None,
) -> int:
    """Append the (topic, window, reason) increments that make the ``invalid_reasons`` rows matching
    ``scope`` sum to ``target`` ((topic, window_start, reason, count)); returns how many were appended.

    Computed against what the table holds (``table()``, default: its latest version; a rebuild passes the
    rows of its stream cut, :mod:`kdq.spark.stream_cut`), so a re-run appends nothing; Delta's idempotent
    write (``app_id``, next version) makes two concurrent runs append once.
    """
    path = table_path(config, INVALID_REASONS)

    def once() -> int:
        version = txn_version(spark, path, app_id)
        current = (
            (table() if table is not None else spark.read.format("delta").load(path)).where(scope)
            .groupBy("topic", "window_start", "reason").agg(F.sum("count").alias("count"))
        )
        rows = [r.asDict() for r in reason_differences(target, current).collect()]
        append_reason_rows(spark, config, rows, batch_id, app_id, version + 1)
        return len(rows)

    return retry_on_conflict(once, f"invalid_reasons ({app_id})")


def insert_absent(spark: SparkSession, config: Config, spec: TableSpec, rows: Sequence[tuple], key: Sequence[str]) -> None:
    """Insert the ``rows`` (tuples in ``spec``'s column order) whose ``key`` columns are not in the table yet: a
    MERGE with inserts only, so a re-run, or a retry after a conflict, inserts nothing twice."""
    if not rows:
        return
    from delta.tables import DeltaTable

    source = spark.createDataFrame(list(rows), spec.ddl_columns)
    target = DeltaTable.forPath(spark, table_path(config, spec))
    on = " AND ".join(f"t.`{c}` = s.`{c}`" for c in key)
    retry_on_conflict(lambda: target.alias("t").merge(source.alias("s"), on).whenNotMatchedInsertAll().execute(),
                      spec.name)


def txn_version(spark: SparkSession, path: str, app_id: str) -> int:
    """The last idempotent-write version ``app_id`` committed to the table at ``path`` (-1: none).

    Read from the Delta log's transaction actions, the same record Delta
    checks to skip a write: there is no Python API for it, hence the JVM call.
    """
    version = delta_snapshot(spark, path).transactions().get(app_id)
    return int(version.get()) if version.isDefined() else -1


def delta_snapshot(spark: SparkSession, path: str):
    """The table's latest Delta snapshot (JVM object: ``version()``, ``transactions()``), read from its log
    without a Spark job (cheaper than ``DeltaTable.history``, which plans and runs one)."""
    jvm = spark._jvm
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    return delta_log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())


def now_ms() -> int:
    return int(time.time() * 1000)
