"""Expectations entrypoint: judge the counts, update ``kdq.incidents``, notify the channels.

    spark-submit spark_jobs/evaluate_expectations.py [--config kdq.toml] [--now 2026-11-27T09:00:00Z] \
        [--horizon-minutes 180] [--deliver] [--every 15 --for-seconds 40]

Evaluates the expectations of ``config/rules/topics.toml`` ([expectations]) on the per-minute counts of
``window_counts`` (at one Delta version) and ``invalid_reasons`` and on the stream's last progress, for every
minute of the horizon (moved back to the first minute of any incident still open), and MERGEs the incidents
that changed into ``kdq.incidents`` (guarded by their version) after inserting their notifications into the
outbox ``kdq.incident_notifications``: a re-run on the same counts changes and notifies nothing. With
``--deliver`` it then sends what each channel of ``$KDQ_NOTIFY_CHANNELS`` still owes (kdq.notify); a failing
channel is reported, never a failed run. How: :mod:`kdq.spark.expectations`, :mod:`kdq.expectation_run`.

With ``--every N --for-seconds T`` it evaluates again every N seconds for T seconds in the same session (the
DAG's task does: one Spark start-up per minute, not per evaluation, so an incident opens within seconds of the
counts that cause it, not within the next run's start-up); each evaluation holds the evaluation lease on its
own, so a manual run can slip in between.

Prints its report (kdq.job_reports.ExpectationsReport: the evaluations' combined) with the notifications it
produced.

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
    parser.add_argument("--every", dest="every_seconds", type=float, default=0.0,
                        help="evaluate again every this many seconds (with --for-seconds; default: once)")
    parser.add_argument("--for-seconds", type=float, default=0.0,
                        help="with --every: start evaluations for this long after the first one")
    args = parser.parse_args(argv)
    if args.horizon_minutes < 1:
        parser.error("--horizon-minutes must be at least 1")
    if args.every_seconds < 0 or args.for_seconds < 0:
        parser.error("--every and --for-seconds must not be negative")
    if args.for_seconds and not args.every_seconds:
        parser.error("--for-seconds needs --every")
    if args.every_seconds and args.now_ms:
        parser.error("--every judges the clock's minutes as they pass: it takes no --now")
    return args


def run(spark, config: Config, args: argparse.Namespace) -> ExpectationsReport:
    from kdq.spark.expectations import evaluate_expectations

    horizon = getattr(args, "horizon_minutes", DEFAULT_HORIZON_MINUTES)
    deliver = getattr(args, "deliver", False)
    every, for_seconds = getattr(args, "every_seconds", 0.0), getattr(args, "for_seconds", 0.0)
    if not every:
        now_ms = getattr(args, "now_ms", None) or int(time.time() * 1000)
        return evaluate_expectations(spark, config, now_ms, horizon, deliver=deliver)
    reports = []
    started = time.monotonic()
    while True:
        reports.append(evaluate_expectations(spark, config, int(time.time() * 1000), horizon, deliver=deliver))
        next_at = started + len(reports) * every
        if next_at - started > for_seconds or not reports[-1].ok:
            return ExpectationsReport.combined(reports)
        time.sleep(max(0.0, next_at - time.monotonic()))


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(argv, parse_args, run, app_name="kdq-evaluate-expectations")


if __name__ == "__main__":
    sys.exit(main())
