"""Archive-from-Kafka entrypoint: load raw records of an offset or time range into the raw archive.

    spark-submit spark_jobs/archive_from_kafka.py [--config kdq.toml] [--topics a,b | --pattern 'orders-.*'] \
        [--starting-offsets earliest|'{"orders":{"0":42}}' | --start-time 2023-11-14T22:00:00Z] \
        [--ending-offsets latest|'{"orders":{"0":99}}' | --end-time 2023-11-14T23:00:00Z] [--run-id ID]

For a new deployment or a gap in the archive: reads the range with Spark's
batch Kafka source, classifies the records with the current rules, and inserts
the ones whose (topic, partition, offset) is not archived yet (counted =
false, source = 'archive_from_kafka'). Re-running inserts nothing. The report
(JSON on stdout) gives rows loaded, rows skipped as already archived, and per
partition what Kafka no longer had (requested start below its earliest
offset): kdq.job_reports.ArchiveReport. Exit 0; 1 when part of the requested range is gone from Kafka.
Then run batch_recompute for the interval containing this run's ingest time
to count the loaded windows. See kdq.spark.backfill.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Sequence

from kdq.config import Config, check_kafka_reachable
from kdq.job_reports import ArchiveReport
from kdq.jobs import run_main, time_arg, topics_arg


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="archive_from_kafka", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="kdq config file (default: $KDQ_CONFIG or kdq.toml)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--topics", type=topics_arg, help="comma-separated topics")
    which.add_argument("--pattern", help="regex (full match) over topic names; default: kafka.topic_include/exclude")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--starting-offsets", default="earliest", help="earliest or a JSON offsets object")
    start.add_argument("--start-time", type=time_arg, help="record time (epoch millis or ISO-8601), inclusive")
    end = parser.add_mutually_exclusive_group()
    end.add_argument("--ending-offsets", default="latest", help="latest or a JSON offsets object (exclusive)")
    end.add_argument("--end-time", type=time_arg, help="record time, exclusive")
    parser.add_argument("--run-id", help="recorded in the Delta commit (Airflow passes its run id)")
    return parser.parse_args(argv)


def run(spark, config: Config, args: argparse.Namespace) -> ArchiveReport:
    """Load one range in an existing session; returns its report (``ok``: nothing missing)."""
    from kdq.registry_versions import current_rules
    from kdq.spark.backfill import archive_from_kafka

    start_time = getattr(args, "start_time", None)
    end_time = getattr(args, "end_time", None)
    return archive_from_kafka(
        spark,
        config,
        current_rules(config),  # the registry's subject versions in registry-backed rules' versions
        topics=getattr(args, "topics", None),
        pattern=getattr(args, "pattern", None),
        start=start_time if start_time is not None else getattr(args, "starting_offsets", "earliest"),
        end=end_time if end_time is not None else getattr(args, "ending_offsets", "latest"),
        run_id=getattr(args, "run_id", None) or f"archive-{uuid.uuid4().hex[:12]}",
    )


def main(argv: Sequence[str] | None = None) -> int:
    # Kafka first: an unreachable broker or refused credentials fail the job with a clear error, not a timeout.
    return run_main(argv, parse_args, run, app_name="kdq-archive-from-kafka", before_session=check_kafka_reachable)


if __name__ == "__main__":
    sys.exit(main())
