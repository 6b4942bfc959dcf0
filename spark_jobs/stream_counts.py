"""Speed layer entrypoint: the long-running Structured Streaming job.

    spark-submit spark_jobs/stream_counts.py [--config kdq.toml] [--trigger-seconds 5] [--available-now]

(or `kdq stream` locally). main(argv) → args → frozen config → session →
rules → SpeedLayer.start(). SIGTERM (and Ctrl-C) stop it gracefully: the
current micro-batch is allowed to finish (up to --stop-timeout seconds), then
the query stops; every write is idempotent per batch, so even an abandoned
batch is replayed exactly once on restart from the checkpoint.

When the query dies, the batch it was running (planned in the offset log,
not committed) is recorded with the error and its offset ranges in
``<data_dir>/stream/batch_failure.json`` (kdq.batch_failures) before the job
exits non-zero: the supervisor counts consecutive failures of that batch.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

from kdq.config import Config, check_kafka_reachable, load_config

log = logging.getLogger("kdq.stream")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="stream_counts", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="kdq config file (default: $KDQ_CONFIG or kdq.toml)")
    parser.add_argument("--trigger-seconds", type=float, help="override stream.trigger_interval_seconds")
    parser.add_argument("--available-now", action="store_true", help="process what is in Kafka now, then exit")
    parser.add_argument("--stop-timeout", type=float, default=120.0, help="seconds to let a batch finish on SIGTERM")
    return parser.parse_args(argv)


def run(spark, config: Config, args: argparse.Namespace, env: dict[str, str] | None = None) -> int:
    """Run the speed layer in an existing session until it stops; returns the exit code."""
    from pyspark.errors import StreamingQueryException

    from kdq.rules import load_rules
    from kdq.spark.classifier import check_rules
    from kdq.spark.lost_checkpoint import starting_offsets
    from kdq.spark.speed_layer import FaultInjector, ProgressRecorder, SpeedLayer, checkpoint_dir

    rules = load_rules(config.rules_dir)
    for line in rules.describe():
        log.info("rule %s", line)
    # Every rule compiled in the JVM now: a broken one stops the job here, naming its file.
    log.info("rules: %s", check_rules(spark, rules, config.stream))
    # A new checkpoint over tables that hold counts must not count everything again.
    resume_at = starting_offsets(spark, config, checkpoint_dir(config))
    if resume_at is not None:
        config = config.model_copy(update={"kafka": config.kafka.model_copy(update={"starting_offsets": resume_at})})
    layer = SpeedLayer(spark, config, rules, faults=FaultInjector.from_env(dict(env or os.environ)))
    recorder = ProgressRecorder(layer)
    spark.streams.addListener(recorder)
    query = layer.start(trigger_seconds=args.trigger_seconds, available_now=args.available_now)
    log.info("speed layer started: app id %s, checkpoint %s", layer.app_id, layer.checkpoint)

    stop = threading.Event()

    def request_stop(signum, frame) -> None:  # noqa: ARG001
        log.info("signal %s: stopping after the current micro-batch", signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)

    active_since: int | None = None  # when the current trigger started, as far as 5-second polls see
    last_done: int | None = None
    while query.isActive and not stop.is_set():
        # A heartbeat between batches too, so a supervisor can tell "idle" from "hung".
        active = bool(query.status["isTriggerActive"])
        progress = query.lastProgress
        done = progress["batchId"] if progress else None
        if not active:
            active_since = None
        elif active_since is None or done != last_done:
            active_since = int(time.time() * 1000)
        last_done = done
        recorder.heartbeat(
            "running",
            {"query_id": str(query.id), "trigger_active": active, "trigger_active_since_ms": active_since},
        )
        try:
            query.awaitTermination(5)
        except StreamingQueryException:
            break  # the query died: reported (and its batch recorded) below, from query.exception()
    if stop.is_set() and query.isActive:
        deadline = time.monotonic() + args.stop_timeout
        while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.2)
        query.stop()
    recorder.heartbeat("stopped")
    layer.close()
    error = query.exception()
    if error is not None:
        message = str(error)
        if "data loss" in message.lower() or "failOnDataLoss" in message:
            log.error("DATA LOSS: Kafka no longer has records the stream had not read yet: %s", message[:2000])
        else:
            log.error("speed layer failed: %s", message[:2000])
        record_batch_failure(config, layer.checkpoint, message)
        return 1
    return 0


def record_batch_failure(config: Config, checkpoint, message: str) -> None:
    """The batch the query died in (planned, not committed), recorded for the supervisor (never raises)."""
    from kdq import batch_failures

    try:
        batch_id = batch_failures.pending_batch(checkpoint)
        if batch_id is None:
            log.error("no micro-batch was in flight: nothing recorded in batch_failure.json")
            return
        failure = batch_failures.record_failure(config, batch_id, message, checkpoint=checkpoint)
        log.error(
            "micro-batch %d failed (attempt %d in a row); offset ranges:\n%s",
            batch_id, failure["attempts"], "\n".join(batch_failures.format_ranges(failure["ranges"])),
        )
    except Exception:  # the job exits non-zero anyway
        log.exception("could not record the failed micro-batch")


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    config = load_config(args.config)
    check_kafka_reachable(config)
    from kdq.spark.session import build_session

    spark = build_session(config, app_name="kdq-speed-layer")
    try:
        return run(spark, config, args)
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
