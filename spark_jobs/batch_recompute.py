"""Batch layer entrypoint: recompute the windows that got records too late for the speed layer.

    spark-submit spark_jobs/batch_recompute.py [--config kdq.toml] --start 2023-11-14T22:00:00Z --end 2023-11-14T23:00:00Z

One run covers one interval of *ingest* time (Airflow's data interval; by
default the last full UTC hour): it finds the windows of archive rows ingested
in the interval that the stream did not count, recomputes their absolute
counts from every archived row of those windows, MERGEs the differences into
window_counts (updated_by = 'batch'), records each in the corrections table
and pushes the corrected windows to the metrics topic and InfluxDB.
Re-running an interval is a no-op for Delta (see kdq.spark.batch_layer) and
re-sends the same absolute values. Prints its report (kdq.job_reports.RecomputeReport) as one JSON
line on stdout; exit 1 when InfluxDB refused the push (recorded for the catch-up).

main(argv) → args → frozen config → session → kdq.spark.recompute.recompute_interval → report.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Sequence

from kdq.config import Config
from kdq.intervals import resolve_interval
from kdq.job_reports import RecomputeReport
from kdq.jobs import interval_parser, parse_interval_args, run_main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = interval_parser("batch_recompute", __doc__.splitlines()[0])
    parser.add_argument("--run-id", help="recorded with every correction (Airflow passes its run id)")
    parser.add_argument("--reason", default="late_data", help="why, recorded with every correction")
    parser.add_argument("--skip-push", action="store_true", help="correct Delta only; no metrics topic, no InfluxDB")
    parser.add_argument(
        "--compact-closed-hours", action="store_true",
        help="then compact today's closed hours of raw_archive, window_counts and summaries (the hourly DAG's run)",
    )
    parser.add_argument(
        "--allow-stream-behind", action="store_true",
        help="recompute even when the speed layer has not committed every micro-batch ingested before --end",
    )
    return parse_interval_args(parser, argv)


def run(spark, config: Config, args: argparse.Namespace) -> RecomputeReport:
    """Recompute one interval in an existing session; returns its report (``ok`` false: InfluxDB refused the
    push, recorded for the catch-up; Delta and the metrics topic are done)."""
    from kdq.spark.recompute import recompute_interval

    return recompute_interval(
        spark,
        config,
        resolve_interval(getattr(args, "start", None), getattr(args, "end", None)),
        run_id=getattr(args, "run_id", None) or f"manual-{uuid.uuid4().hex[:12]}",
        reason=getattr(args, "reason", None) or "late_data",
        push=not getattr(args, "skip_push", False),
        allow_stream_behind=getattr(args, "allow_stream_behind", False),
        compact=getattr(args, "compact_closed_hours", False),
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(argv, parse_args, run, app_name="kdq-batch-recompute")


if __name__ == "__main__":
    sys.exit(main())
