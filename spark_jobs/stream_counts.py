"""Speed layer entrypoint: the long-running Structured Streaming job.

    spark-submit spark_jobs/stream_counts.py [--config kdq.toml] [--trigger-seconds 5] [--available-now]

(or `kdq stream` locally). main(argv) → args → frozen config → Kafka reachable →
session → kdq.spark.stream_job.run_speed_layer → report (kdq.job_reports.StreamReport,
printed when the stream stops). SIGTERM (and Ctrl-C) stop it gracefully: the
current micro-batch is allowed to finish (up to --stop-timeout seconds). When the
query dies, the batch it was in is recorded for the supervisor
(``<data_dir>/stream/batch_failure.json``) and the job exits 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kdq.config import Config, check_kafka_reachable
from kdq.job_reports import StreamReport
from kdq.jobs import run_main
from kdq.stream.state import StartingBeat


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="stream_counts", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="kdq config file (default: $KDQ_CONFIG or kdq.toml)")
    parser.add_argument("--trigger-seconds", type=float, help="override stream.trigger_interval_seconds")
    parser.add_argument("--available-now", action="store_true", help="process what is in Kafka now, then exit")
    parser.add_argument("--stop-timeout", type=float, default=120.0, help="seconds to let a batch finish on SIGTERM")
    return parser.parse_args(argv)


# The start-up heartbeat, begun before the session (the JVM's Spark context, the Kafka check) so the supervisor
# sees a beat as soon as this driver's Python runs; run_speed_layer stops it once the query runs.
_starting: StartingBeat | None = None


def before_session(config: Config) -> None:
    global _starting
    _starting = StartingBeat(config).start()
    _starting.phase("kafka_check")
    try:
        check_kafka_reachable(config)
    except BaseException:
        _starting.stop()
        raise
    _starting.phase("session")


def run(spark, config: Config, args: argparse.Namespace, env: dict[str, str] | None = None) -> StreamReport:
    """Run the speed layer in an existing session until it stops; returns its report."""
    from kdq.spark.session import exit_when_jvm_dies
    from kdq.spark.stream_job import run_speed_layer

    exit_when_jvm_dies(spark)  # a driver without its JVM must not linger (the supervisor restarts us)

    return run_speed_layer(
        spark,
        config,
        trigger_seconds=args.trigger_seconds,
        available_now=args.available_now,
        stop_timeout=args.stop_timeout,
        env=env,
        starting=_starting,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(argv, parse_args, run, app_name="kdq-speed-layer", before_session=before_session)


if __name__ == "__main__":
    sys.exit(main())
