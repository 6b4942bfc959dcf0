"""Reconciliation check: does the archive hold every Kafka offset, and do window_counts match the archive?

    spark-submit spark_jobs/reconcile.py [--config kdq.toml] [--topics a,b | --pattern 're'] \
        [--from 2023-11-14T22:00:00Z --to 2023-11-14T23:00:00Z [--after-recompute]]

Two checks: every Kafka offset of the range is in the archive (gaps read back
from Kafka with a read_committed consumer, so transaction markers and aborted
records are no gap), and window_counts equal the counts recomputed from the
archive. One JSON report on stdout (kdq.job_reports.ReconcileReport), exit 1
when either finds a problem (a failed Airflow task). How each check works and
what it reads: kdq.spark.reconcile.

main(argv) → args → frozen config → session → kdq.spark.reconcile.reconcile → report.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kdq.config import Config
from kdq.job_reports import ReconcileReport
from kdq.jobs import run_main, time_arg, topics_arg


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="reconcile", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="kdq config file (default: $KDQ_CONFIG or kdq.toml)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--topics", type=topics_arg, help="comma-separated topics")
    which.add_argument("--pattern", help="regex (full match) over topic names; default: kafka.topic_include/exclude")
    parser.add_argument("--from", dest="from_ms", type=time_arg, help="range start (inclusive); default: everything")
    parser.add_argument("--to", dest="to_ms", type=time_arg, help="range end (exclusive); default: everything")
    parser.add_argument(
        "--after-recompute",
        action="store_true",
        help="the range is also the ingest interval an hourly recompute has just finished (the hourly DAG's "
        "check): leave out rows a later interval's recompute counts, and also check the windows outside the "
        "range that the interval's late rows touched",
    )
    args = parser.parse_args(argv)
    if (args.from_ms is None) != (args.to_ms is None):
        parser.error("--from and --to go together")
    if args.from_ms is not None and args.from_ms >= args.to_ms:
        parser.error("--from must be before --to")
    if args.after_recompute and args.from_ms is None:
        parser.error("--after-recompute needs --from and --to (the interval)")
    return args


def run(spark, config: Config, args: argparse.Namespace) -> ReconcileReport:
    """Both checks in an existing session; returns the report (``ok`` false on any problem)."""
    from kdq.spark.reconcile import reconcile

    return reconcile(
        spark,
        config,
        topics=getattr(args, "topics", None),
        pattern=getattr(args, "pattern", None),
        from_ms=getattr(args, "from_ms", None),
        to_ms=getattr(args, "to_ms", None),
        after_recompute=getattr(args, "after_recompute", False),
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(argv, parse_args, run, app_name="kdq-reconcile")


if __name__ == "__main__":
    sys.exit(main())
