"""Maintenance entrypoint: compaction of closed partitions, raw-archive retention, VACUUM (daily).

    spark-submit spark_jobs/maintenance.py [--config kdq.toml] [--archive-retention-days 30] \
        [--vacuum-retain-hours 168] [--today 2026-11-24]

The steps, why they are safe next to the running stream, and how each is limited to what changed since the
last run: :mod:`kdq.spark.maintenance`. Submitted with one core and under ``nice`` (kdq.spark.submit.BACKGROUND_JOBS).
Prints its report (kdq.job_reports.MaintenanceReport: what each step did, or why it was skipped). ``--today`` (UTC date; default: now) sets which partitions are closed and
the retention's bounds.

main(argv) → args → frozen config → session → kdq.spark.maintenance.run_maintenance → report.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Sequence

from kdq.config import Config
from kdq.job_reports import MaintenanceReport
from kdq.jobs import run_main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="maintenance", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="kdq config file (default: $KDQ_CONFIG or kdq.toml)")
    parser.add_argument("--archive-retention-days", type=int, default=30, help="raw rows older than this are retired, then deleted")
    parser.add_argument("--vacuum-retain-hours", type=int, default=168, help="VACUUM retention (at least 168)")
    parser.add_argument("--today", type=dt.date.fromisoformat, help="UTC date of the run (default: today)")
    return parser.parse_args(argv)


def run(spark, config: Config, args: argparse.Namespace) -> MaintenanceReport:
    """Run the maintenance in an existing session; returns its report."""
    from kdq.spark.maintenance import run_maintenance

    today = getattr(args, "today", None) or dt.datetime.now(dt.UTC).date()
    return run_maintenance(spark, config, args.archive_retention_days, args.vacuum_retain_hours, today)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(argv, parse_args, run, app_name="kdq-maintenance")


if __name__ == "__main__":
    sys.exit(main())
