"""The batch layer's cost against the archive's size: hourly recomputes with a fixed amount of late data
over a raw archive that grows (e.g. 1M → 5M → 20M rows).

The archive is synthesized with Spark straight into a Delta raw-archive table
(kdq's own table spec and ``append_archive`` writer) instead of streaming
millions of records through Kafka: short values, the stream's columns and
``event_hour`` partitioning, files sorted by ingest time (as the stream writes
them, one batch at a time, so per-file ``ingest_time`` statistics are narrow).
window_counts is filled with the counts the stream would have written.

The archive grows the way a real one does: by history. At a constant rate
(``rows_per_hour``), stage k adds older hours. Each stage then archives
``late_rows`` records ingested in its own hour interval ``[E + k h, E + (k+1) h)``
for windows of the two hours before ``E`` (counted = false, as the stream
archives records beyond its allowed lateness), and the real hourly job
(``spark_jobs.batch_recompute.run``) recomputes that interval: its cost should
follow the late data (constant here), not the archive size.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence

from kdq.config import Config
from kdq.windows import HOUR_MS

log = logging.getLogger("kdq.bench")

LATE_SPAN_MS = 2 * HOUR_MS


def _archive_rows(spark, first: int, last: int, end_ms: int, rows_per_hour: int, topics: int, late_interval: int | None = None, late_rows: int = 0):
    """Classified archive rows: history rows ``first..last-1`` (row j at E - (j+1)/rate), or late rows of an interval."""
    from pyspark.sql import functions as F

    if late_interval is None:
        ids = spark.range(first, last)
        # Exact in a double: (rows + 1) * 3.6e6 stays far below 2**53.
        event = F.lit(end_ms) - ((F.col("id") + 1) * HOUR_MS / rows_per_hour).cast("bigint")
        ingest = event + F.lit(500)
        counted = F.lit(True)
        offset = F.col("id")
    else:
        ids = spark.range(0, late_rows)
        event = F.lit(end_ms - 1) - (F.col("id") * F.lit(LATE_SPAN_MS // max(late_rows, 1))).cast("bigint")
        ingest = F.lit(end_ms + late_interval * HOUR_MS) + (F.col("id") * F.lit(HOUR_MS // max(late_rows, 1))).cast("bigint")
        counted = F.lit(False)
        offset = F.lit(10**12 + late_interval * 10**9) + F.col("id")
    valid = (F.col("id") * 7919) % 100 >= 5
    window_start = F.timestamp_millis((F.floor(event / 1000) * 1000).cast("bigint"))
    return ids.select(
        F.concat(F.lit("bench-b-"), (F.col("id") % topics).cast("string")).alias("topic"),
        ((F.col("id") / topics) % 3).cast("int").alias("partition"),
        offset.cast("bigint").alias("offset"),
        F.timestamp_millis(event).alias("kafka_timestamp"),
        F.timestamp_millis(event).alias("event_time"),
        window_start.alias("window_start"),
        F.lit(None).cast("binary").alias("key"),
        F.concat(F.lit('{"id":'), F.col("id").cast("string"), F.lit(',"v":1}')).cast("binary").alias("value"),
        F.timestamp_millis(ingest).alias("ingest_time"),
        valid.alias("valid"),
        F.when(~valid, F.lit("schema:/properties/amount/minimum")).alias("reason"),
        F.lit("bench").alias("rules_version"),
        F.date_format(window_start, "yyyy-MM-dd-HH").alias("event_hour"),
        counted.alias("counted"),
    )


def _append(spark, config: Config, rows, version: int, with_counts: bool) -> None:
    from pyspark.sql import functions as F

    from kdq.config import StreamConfig
    from kdq.spark import transforms
    from kdq.spark.tables import table_path
    from kdq.spark.writers import append_archive
    from kdq.tables import WINDOW_COUNTS

    # One file per event hour per task, rows in ingest order: the layout the stream's appends produce.
    layout = rows.repartition(2, "event_hour").sortWithinPartitions("event_hour", "ingest_time")
    append_archive(layout, config, "kdq-bench-synth", version, version, "stream")
    if with_counts:
        counts = transforms.count_windows(rows.where(F.col("counted")), StreamConfig(window_seconds=1)).select(
            "topic",
            "window_start",
            "window_end",
            "status",
            "count",
            F.current_timestamp().alias("updated_at"),
            F.lit("stream").alias("updated_by"),
            "rules_version",
            *transforms.window_partition_columns(F.unix_millis("window_start")),
        )
        counts.select(*WINDOW_COUNTS.column_names).write.format("delta").mode("append").save(table_path(config, WINDOW_COUNTS))


def run(spark, config: Config, sizes: Sequence[int], late_rows: int, topics: int = 4, rows_per_hour: int | None = None) -> dict:
    """Grow the archive through ``sizes`` and time one hourly recompute with ``late_rows`` late records at each size."""
    from spark_jobs import batch_recompute

    from kdq.spark.tables import ensure_tables

    ensure_tables(spark, config)
    spark.conf.set("spark.sql.files.maxRecordsPerFile", "250000")
    rows_per_hour = rows_per_hour or max(sizes[0] // 4, 1)
    now_ms = int(time.time() * 1000)
    # E: an hour boundary far enough back that every interval [E + k h, E + (k+1) h) lies in the past.
    end_ms = (now_ms // HOUR_MS - len(sizes) - 3) * HOUR_MS
    stages = []
    built = 0
    # Two warm-up runs at the first size (JIT, class loading, Delta log caches), then the measured ones.
    for k, size in enumerate([sizes[0], sizes[0], *sizes], start=0):
        warm_up = k < 2
        if size > built:
            t0 = time.monotonic()
            _append(spark, config, _archive_rows(spark, built, size, end_ms, rows_per_hour, topics), 2 * k + 1, True)
            log.info("archive grown to %d rows in %.1f s", size, time.monotonic() - t0)
            built = size
        n_late = max(late_rows // 10, 1) if warm_up else late_rows
        _append(spark, config, _archive_rows(spark, 0, 0, end_ms, rows_per_hour, topics, late_interval=k, late_rows=n_late), 2 * k + 2, False)
        args = argparse.Namespace(
            start=end_ms + k * HOUR_MS, end=end_ms + (k + 1) * HOUR_MS, run_id=f"bench-{k}", reason="late_data", skip_push=False
        )
        t0 = time.monotonic()
        summary = batch_recompute.run(spark, config, args)
        wall = time.monotonic() - t0
        stage = {
            "archive_rows": built + sum(s["late_rows"] for s in stages) + n_late,
            "late_rows": n_late,
            "warm_up": warm_up,
            "seconds": round(wall, 2),
            "late_windows": summary["late_windows"],
            "corrections": summary["corrections"],
            "scanned_late_rows": summary["scanned_late_rows"],
            "scanned_recompute": summary["scanned_recompute"],
            "archive_total": summary["archive_total"],
            "ok": summary["ok"],
        }
        log.info("recompute at %d archive rows: %.1f s %s", built, wall, stage)
        stages.append(stage)
    measured = [s for s in stages if not s["warm_up"]]
    return {
        "rows_per_hour": rows_per_hour,
        "stages": stages,
        "growth": round(measured[-1]["archive_rows"] / measured[0]["archive_rows"], 1),
        "time_ratio": round(measured[-1]["seconds"] / measured[0]["seconds"], 2),
    }
