"""Expectations entrypoint (issue 27): judge the counts, update ``kdq.incidents``, notify the channels.

    spark-submit spark_jobs/evaluate_expectations.py [--config kdq.toml] [--now 2026-11-27T09:00:00Z] \
        [--horizon-minutes 180] [--deliver]

Evaluates the expectations of ``config/rules/topics.toml`` ([expectations]) on the per-minute counts of
``window_counts`` (at one Delta version) and ``invalid_reasons`` and on the stream's last progress, for every
minute of the horizon (moved back to the first minute of any incident still open), and MERGEs the incidents
that changed into ``kdq.incidents`` (guarded by their version) after inserting their notifications into the
outbox ``kdq.incident_notifications``: a re-run on the same counts changes and notifies nothing. With
``--deliver`` it then sends what each channel of ``$KDQ_NOTIFY_CHANNELS`` still owes (kdq.notify); a failing
channel is reported, never a failed run. How: :mod:`kdq.spark.expectations`, :mod:`kdq.expectation_run`.

Prints its report (kdq.job_reports.ExpectationsReport) with the notifications it produced.

main(argv) → args → frozen config → session → kdq.spark.expectations.evaluate_expectations → report.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from kdq.config import Config
from kdq.expectation_run import DEFAULT_HORIZON_MINUTES
from kdq.job_reports import ExpectationsReport
from kdq.jobs import run_main, time_arg


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="evaluate_expectations", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="kdq config file (default: $KDQ_CONFIG or kdq.toml)")
    parser.add_argument("--now", dest="now_ms", type=time_arg,
                        help="the evaluation's time (default: now); a test or a replay pins it")
    parser.add_argument("--horizon-minutes", type=int, default=DEFAULT_HORIZON_MINUTES,
                        help="how many minutes back every run re-evaluates (late records, batch-layer corrections)")
    parser.add_argument("--deliver", action="store_true", help="then send the pending notifications")
    args = parser.parse_args(argv)
    if args.horizon_minutes < 1:
        parser.error("--horizon-minutes must be at least 1")
    return args


def run(spark, config: Config, args: argparse.Namespace) -> ExpectationsReport:
    from kdq.spark.expectations import evaluate_expectations

    now_ms = getattr(args, "now_ms", None) or int(time.time() * 1000)
    return evaluate_expectations(spark, config, now_ms, getattr(args, "horizon_minutes", DEFAULT_HORIZON_MINUTES),
                                 deliver=getattr(args, "deliver", False))


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(argv, parse_args, run, app_name="kdq-evaluate-expectations")


if __name__ == "__main__":
    sys.exit(main())
