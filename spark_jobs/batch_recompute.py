"""Batch layer entrypoint: recompute the windows that got records too late for the speed layer.

    spark-submit spark_jobs/batch_recompute.py [--config kdq.toml] --start 2023-11-14T22:00:00Z --end 2023-11-14T23:00:00Z

One run covers one interval of *ingest* time (Airflow's data interval; by
default the last full UTC hour): it finds the windows of archive rows ingested
in the interval that the stream did not count, recomputes their absolute
counts from every archived row of those windows, MERGEs the differences into
window_counts (updated_by = 'batch'), records each in the corrections table
and pushes the corrected windows to the metrics topic and InfluxDB.
Re-running an interval is a no-op for Delta (see kdq.spark.batch_layer) and
re-sends the same absolute values. Prints a JSON summary on stdout.

main(argv) → args → frozen config → session → run(spark, config, args).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import uuid
from collections.abc import Sequence

from kdq.config import Config
from kdq.intervals import iso, resolve_interval
from kdq.jobs import interval_parser, parse_interval_args, run_main

log = logging.getLogger("kdq.batch")


class StreamBehind(RuntimeError):
    """The interval cannot be recomputed yet: a micro-batch ingested before its end has not committed."""



def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = interval_parser("batch_recompute", __doc__.splitlines()[0])
    parser.add_argument("--run-id", help="recorded with every correction (Airflow passes its run id)")
    parser.add_argument("--reason", default="late_data", help="why, recorded with every correction")
    parser.add_argument("--skip-push", action="store_true", help="correct Delta only; no metrics topic, no InfluxDB")
    parser.add_argument(
        "--allow-stream-behind", action="store_true",
        help="recompute even when the speed layer has not committed every micro-batch ingested before --end",
    )
    return parse_interval_args(parser, argv)


def run(spark, config: Config, args: argparse.Namespace) -> dict:
    """Recompute one interval in an existing session; returns (and prints) the JSON summary.

    ``summary["ok"]`` is false when InfluxDB rejected the push (recorded in
    the push state for the catch-up); Delta and the metrics topic are done.
    """
    from pyspark.sql import functions as F

    from kdq.spark import batch_layer as bl
    from kdq.spark.retention import read_retired
    from kdq.spark.tables import ensure_tables, table_path
    from kdq.spark.writers import now_ms
    from kdq.stream_state import InfluxPushState
    from kdq.tables import RAW_ARCHIVE

    started = time.monotonic()
    started_ms = now_ms()
    interval = resolve_interval(getattr(args, "start", None), getattr(args, "end", None))
    run_id = getattr(args, "run_id", None) or f"manual-{uuid.uuid4().hex[:12]}"
    ensure_tables(spark, config)
    archive_path = table_path(config, RAW_ARCHIVE)
    archive = spark.read.format("delta").load(archive_path)

    caught_up = bl.stream_caught_up(spark, config, interval[1])
    if caught_up is False:
        # Rows of a micro-batch that started before the interval's end but has not committed (a slow
        # batch, or one that crashed and will be replayed with its original ingest time) become
        # visible only when it commits: recomputing now would miss them for good. Fail instead, so
        # Airflow retries the task (with backoff) once the stream has moved on.
        if not getattr(args, "allow_stream_behind", False):
            raise StreamBehind(
                f"the speed layer has not committed every micro-batch ingested before {iso(interval[1])}: "
                "recomputing now could miss their late rows; retry later (Airflow does), or pass "
                "--allow-stream-behind to recompute what is archived now"
            )
        log.warning("recomputing %s although the speed layer is behind (--allow-stream-behind)", iso(interval[1]))
    late = bl.late_windows(archive, *interval)
    late_scan = bl.scan_stats(spark, late)
    windows = [(r["topic"], int(r["ms"])) for r in late.select("topic", F.unix_millis("window_start").alias("ms")).collect()]
    summary: dict = {
        "run_id": run_id,
        "interval_start": iso(interval[0]),
        "interval_end": iso(interval[1]),
        "stream_caught_up": caught_up,
        "late_windows": len(windows),
        "archive_total": bl.table_totals(spark, archive_path),
        "scanned_late_rows": late_scan,
        "scanned_recompute": {"files": 0, "bytes": 0},
        "corrections": 0,
        "reason_corrections": 0,
        "ok": True,
    }
    changed: list[dict] = []
    if windows:
        windows_df = spark.createDataFrame(windows, "topic STRING, ms BIGINT").select(
            "topic", F.timestamp_millis("ms").alias("window_start")
        )
        summary["scanned_recompute"] = bl.scan_stats(spark, bl.archive_rows_of(archive, windows_df))
        new_counts = bl.recompute_counts(archive, windows_df, config.stream.window_seconds, read_retired(spark, config))
        changed = bl.apply_corrections(spark, config, new_counts, run_id, interval, getattr(args, "reason", None) or "late_data")
        summary["reason_corrections"] = bl.correct_interval_reasons(spark, config, archive, interval)
    summary["corrections"] = len(changed)
    summary["changes"] = [
        {"topic": r["topic"], "window_start_ms": r["window_start_ms"], "status": r["status"], "old": r["old_count"], "new": r["new_count"]}
        for r in changed[:100]
    ]
    log.info(
        "late rows scan: %(files)d files, %(bytes)d bytes (table: %(total)s)",
        {**late_scan, "total": summary["archive_total"]},
    )
    if not getattr(args, "skip_push", False):
        # Every window this interval ever corrected, not only this run's: a run
        # whose push failed after its Delta commits is fixed by running it again.
        pushed = bl.push_corrections(spark, config, bl.interval_corrections(spark, config, interval))
        summary["push"] = pushed
        if not pushed["influx_ok"]:
            InfluxPushState(config).record_failure(started_ms, pushed.get("influx_error", "batch push failed"))
            summary["ok"] = False
    # Streaming summaries: same interval, same app id and protocol, their own tables.
    summary["summaries"] = bl.recompute_summaries(
        spark, config, interval, run_id, getattr(args, "reason", None) or "late_data", push=not getattr(args, "skip_push", False)
    )
    if not summary["summaries"]["ok"]:
        error = summary["summaries"].get("push", {}).get("influx_error", "summary push failed")
        InfluxPushState(config).record_failure(started_ms, error)
        summary["ok"] = False
    summary["seconds"] = round(time.monotonic() - started, 2)
    print(json.dumps(summary, default=str), flush=True)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(argv, parse_args, run, app_name="kdq-batch-recompute")


if __name__ == "__main__":
    sys.exit(main())
