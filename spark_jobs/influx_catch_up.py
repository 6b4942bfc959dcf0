"""InfluxDB catch-up: push every window updated since the stream last failed to reach InfluxDB.

    spark-submit spark_jobs/influx_catch_up.py [--config kdq.toml] [--since 2023-11-14T22:00:00Z] [--force]

The speed layer keeps going when InfluxDB is down and records, in
``<data_dir>/stream/influx_push_state.json``, when its first unpushed batch
started. This job pushes (absolute values, both fields) every window with a
window_counts row updated at or after that time, or ``--since``, then clears
the pending state. With nothing pending it does nothing unless ``--force``
(push every window). Re-pushing is harmless: a point is keyed by topic and
window start. Prints its report (kdq.job_reports.CatchUpReport) as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kdq.config import Config
from kdq.job_reports import CatchUpReport
from kdq.jobs import run_main, time_arg


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="influx_catch_up", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="kdq config file (default: $KDQ_CONFIG or kdq.toml)")
    parser.add_argument("--since", type=time_arg, help="push rows updated at or after this time (default: pending state)")
    parser.add_argument("--force", action="store_true", help="with nothing pending and no --since, push every window")
    return parser.parse_args(argv)


def run(spark, config: Config, args: argparse.Namespace) -> CatchUpReport:
    """Catch up in an existing session; returns its report (a refused InfluxDB write raises)."""
    from kdq.spark.outputs import influx_catch_up

    return influx_catch_up(spark, config, since_ms=getattr(args, "since", None), force=getattr(args, "force", False))


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(argv, parse_args, run, app_name="kdq-influx-catch-up")


if __name__ == "__main__":
    sys.exit(main())
