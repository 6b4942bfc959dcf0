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

With ``--every N --for-seconds T`` it looks again every N seconds for T seconds in the same session (the
DAG's task does: one Spark start-up an hour, not per evaluation, so an incident opens within seconds of the
counts that cause it, not within the next run's start-up); each evaluation holds the evaluation lease on its
own, so a manual run can slip in between. A look whose inputs did not change since the last evaluation (Delta
versions of the counts, reasons and incidents, the stream's progress and state, the minute) skips it, and an
evaluation is followed by a rest at least as long as itself: on a 2-core machine shared with the stream the
evaluator must not take a core of its own. Between looks it reads the end of the stream's progress log every
two seconds (a file, no Spark job): a micro-batch whose own counts put a topic with no open invalid_ratio
incident over that check's threshold is evaluated for at once, rest or not, so a burst of invalid records
opens its incident seconds after the stream counts it.

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
                        help="with --every: look again for this long after the first evaluation")
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


REST_FACTOR = 1.0  # a repeating run rests this many times as long as its last evaluation took
# Between its regular looks a repeating run reads the stream's newest progress records this often: a micro-batch
# whose own counts put a topic over its invalid_ratio threshold is evaluated at once (rest or not).
HINT_SECONDS = 2.0
PROGRESS_TAIL_BYTES = 64 * 1024  # the progress log's end: the micro-batches since the last evaluation


def wall_clock_ms() -> int:
    """The wall clock the evaluations are made at (one place, so a test can hold it still)."""
    return int(time.time() * 1000)


def run(spark, config: Config, args: argparse.Namespace) -> ExpectationsReport:
    from kdq.spark.expectations import IncidentsCache, evaluate_expectations, evaluation_inputs

    horizon = getattr(args, "horizon_minutes", DEFAULT_HORIZON_MINUTES)
    deliver = getattr(args, "deliver", False)
    every, for_seconds = getattr(args, "every_seconds", 0.0), getattr(args, "for_seconds", 0.0)
    if not every:
        now_ms = getattr(args, "now_ms", None) or wall_clock_ms()
        return evaluate_expectations(spark, config, now_ms, horizon, deliver=deliver)
    # Repeating: the machine is shared with the stream, so an evaluation runs only when what it reads changed
    # (or deliveries are still owed), and rests at least as long as the last one took (at most half the wall
    # clock, however slow the machine). One exception keeps incidents quick: a micro-batch whose own counts
    # breach an invalid_ratio check of a topic with no open incident is evaluated for at once.
    reports: list[ExpectationsReport] = []
    incidents = IncidentsCache()
    last_inputs, skipped, at_once = None, 0, 0
    seen_batch = None  # the newest micro-batch an evaluation began after (the first covers every earlier one)
    started = not_before = next_look = time.monotonic()
    while True:
        tick = time.monotonic()
        now_ms = wall_clock_ms()
        urgent, newest = _breaching(config, seen_batch, incidents)
        urgent = urgent and bool(reports)
        if urgent or (tick >= next_look and tick >= not_before):
            next_look = tick + every
            inputs = evaluation_inputs(spark, config, now_ms)
            if urgent or inputs != last_inputs or not reports or owes_deliveries(reports[-1]):
                seen_batch = newest
                reports.append(evaluate_expectations(spark, config, now_ms, horizon, deliver=deliver,
                                                     incidents=incidents))
                at_once += bool(urgent)
                last_inputs = inputs
                not_before = time.monotonic() + REST_FACTOR * (time.monotonic() - tick)
                if len(reports) == 1:
                    started = time.monotonic()  # --for-seconds counts from the first evaluation's end (its cold start)
            else:
                skipped += 1
        if time.monotonic() + min(every, HINT_SECONDS) - started > for_seconds or not reports[-1].ok:
            report = ExpectationsReport.combined(reports)
            report.skipped_unchanged = skipped
            report.evaluated_at_once = at_once
            return report
        time.sleep(max(0.0, min(HINT_SECONDS, max(next_look, not_before) - time.monotonic())))


def _breaching(config: Config, after_batch_id: int | None, incidents) -> tuple[bool, int | None]:
    """(whether a micro-batch after ``after_batch_id`` breaches an invalid_ratio check of a topic with no open
    incident, the newest batch id seen): files only, no Spark job."""
    from kdq.expectation_run import batches_breaching
    from kdq.quality_health import read_progress_log
    from kdq.rules import load_rules

    progress = read_progress_log(config, max_bytes=PROGRESS_TAIL_BYTES)
    ids = [r["batch_id"] for r in progress if isinstance(r.get("batch_id"), int)]
    newest = max([*ids, *([after_batch_id] if after_batch_id is not None else [])], default=None)
    if newest == after_batch_id:
        return False, newest
    expectations = load_rules(config.rules_dir).expectations
    return bool(batches_breaching(expectations, progress, after_batch_id, incidents.rows)), newest


def owes_deliveries(report: ExpectationsReport) -> bool:
    """The evaluation left notifications a channel failed or deferred: the next tick delivers again."""
    delivery = report.delivery or {}
    return "error" in delivery or any(sum(dict(delivery.get(key) or {}).values()) for key in ("failed", "deferred"))


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(argv, parse_args, run, app_name="kdq-evaluate-expectations")


if __name__ == "__main__":
    sys.exit(main())
