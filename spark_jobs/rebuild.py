"""Rebuild entrypoint: re-classify archived records of a window range with the current rules.

    spark-submit spark_jobs/rebuild.py [--config kdq.toml] --from 2023-11-14T00:00:00Z --to 2023-11-15T00:00:00Z \
        [--topics orders,payments] [--run-id ID] [--skip-push] [--keep-archive]

Reads the raw archive rows whose window starts in [from, to) (only those
``event_hour`` partitions), re-classifies them from their raw key/value with
the rules currently in ``paths.rules_dir``, recomputes the absolute counts of
every window they were or now are in, MERGEs the differences into
window_counts (corrections reason ``rule_change`` when the stored rules
version differs, else ``rebuild``), updates the archive rows' classification
(unless ``--keep-archive``) and pushes corrected windows to the metrics topic
and InfluxDB. Running it again changes nothing. Prints its report
(kdq.job_reports.RebuildReport) as one JSON line on stdout; exit 1 when
InfluxDB rejected the push (Delta and the metrics topic are done;
spark_jobs/influx_catch_up.py repairs it). See kdq.spark.rebuild.

main(argv) → args → frozen config → session → kdq.spark.rebuild.rebuild → report.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Sequence

from kdq.config import Config
from kdq.job_reports import RebuildReport
from kdq.jobs import run_main, time_arg, topics_arg


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rebuild", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="kdq config file (default: $KDQ_CONFIG or kdq.toml)")
    parser.add_argument("--from", dest="from_ms", type=time_arg, required=True, help="first window start (event time), inclusive")
    parser.add_argument("--to", dest="to_ms", type=time_arg, required=True, help="window start bound, exclusive")
    parser.add_argument("--topics", type=topics_arg, default=None, help="comma-separated topics (default: all)")
    parser.add_argument("--run-id", help="recorded with every correction (Airflow passes its run id)")
    parser.add_argument("--skip-push", action="store_true", help="correct Delta only; no metrics topic, no InfluxDB")
    parser.add_argument("--keep-archive", action="store_true", help="do not update the archive rows' classification")
    args = parser.parse_args(argv)
    if args.from_ms >= args.to_ms:
        parser.error(f"--from ({args.from_ms}) must be before --to ({args.to_ms})")
    return args


def run(spark, config: Config, args: argparse.Namespace) -> RebuildReport:
    """Rebuild one range in an existing session; returns its report."""
    from kdq.registry_versions import current_rules
    from kdq.spark.rebuild import rebuild

    return rebuild(
        spark,
        config,
        current_rules(config),  # the registry's subject versions in registry-backed rules' versions
        int(args.from_ms),
        int(args.to_ms),
        topics=getattr(args, "topics", None) or None,
        run_id=getattr(args, "run_id", None) or f"rebuild-{uuid.uuid4().hex[:12]}",
        push=not getattr(args, "skip_push", False),
        update_archive_rows=not getattr(args, "keep_archive", False),
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(argv, parse_args, run, app_name="kdq-rebuild")


if __name__ == "__main__":
    sys.exit(main())
