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
and the job exits 1; a metrics-topic failure raises. Prints a JSON summary.

main(argv) → args → frozen config → session → run(spark, config, args).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence

from kdq.config import Config
from kdq.intervals import iso, resolve_interval
from kdq.jobs import interval_parser, parse_interval_args, run_main

log = logging.getLogger("kdq.batch")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = interval_parser("push_corrections", __doc__.splitlines()[0])
    return parse_interval_args(parser, argv)


def run(spark, config: Config, args: argparse.Namespace) -> dict:
    """Push one interval's corrected windows in an existing session; returns (and prints) the JSON summary."""
    from kdq.spark import batch_layer as bl
    from kdq.spark.summaries import interval_summary_corrections, push_summary_corrections
    from kdq.spark.tables import ensure_tables
    from kdq.spark.writers import now_ms
    from kdq.stream_state import InfluxPushState

    started = time.monotonic()
    started_ms = now_ms()
    interval = resolve_interval(getattr(args, "start", None), getattr(args, "end", None))
    ensure_tables(spark, config)
    keys = bl.interval_corrections(spark, config, interval)
    summary: dict = {
        "interval_start": iso(interval[0]),
        "interval_end": iso(interval[1]),
        "corrected_keys": len(keys),
        "ok": True,
    }
    pushed = bl.push_corrections(spark, config, keys)
    summary["push"] = pushed
    summary_keys = interval_summary_corrections(spark, config, interval)
    summary["corrected_summary_groups"] = len(summary_keys)
    summary["summaries_push"] = push_summary_corrections(spark, config, summary_keys) if summary_keys else None
    errors = [p.get("influx_error", "batch push failed") for p in (pushed, summary["summaries_push"]) if p and not p["influx_ok"]]
    if errors:
        InfluxPushState(config).record_failure(started_ms, "; ".join(errors))
        summary["ok"] = False
    summary["seconds"] = round(time.monotonic() - started, 2)
    print(json.dumps(summary, default=str), flush=True)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(argv, parse_args, run, app_name="kdq-push-corrections")


if __name__ == "__main__":
    sys.exit(main())
