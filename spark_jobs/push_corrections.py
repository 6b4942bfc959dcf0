"""Batch layer entrypoint: push the corrections of one interval to the metrics topic and InfluxDB.

    spark-submit spark_jobs/push_corrections.py [--config kdq.toml] --start 2023-11-14T22:00:00Z --end 2023-11-14T23:00:00Z

The second step of the hourly DAG, after ``batch_recompute.py --skip-push``
has MERGEd the interval's corrections into window_counts. Every (topic,
window, status) the corrections table holds for the interval (this run's and
any earlier attempt's) gets its current absolute count, read back from
window_counts: one metrics-topic message per key, one InfluxDB point per
window with both fields; likewise every streaming-summary group the interval
corrected (summary_corrections → summaries). Absolute values make a re-run harmless, so a failed
push is fixed by running the task again. When InfluxDB refuses the points the
failure is recorded in the stream's push state (for the InfluxDB catch-up)
and the job exits 1; a metrics-topic failure raises. Prints its report (kdq.job_reports.PushReport).

main(argv) → args → frozen config → session → kdq.spark.recompute.push_interval → report.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kdq.config import Config
from kdq.intervals import resolve_interval
from kdq.job_reports import PushReport
from kdq.jobs import interval_parser, parse_interval_args, run_main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = interval_parser("push_corrections", __doc__.splitlines()[0])
    return parse_interval_args(parser, argv)


def run(spark, config: Config, args: argparse.Namespace) -> PushReport:
    """Push one interval's corrected windows in an existing session; returns its report."""
    from kdq.spark.recompute import push_interval

    return push_interval(spark, config, resolve_interval(getattr(args, "start", None), getattr(args, "end", None)))


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(argv, parse_args, run, app_name="kdq-push-corrections")


if __name__ == "__main__":
    sys.exit(main())
