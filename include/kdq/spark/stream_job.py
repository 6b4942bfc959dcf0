"""The speed layer's run loop: what ``spark_jobs/stream_counts.py`` calls once its session is up.

Rules first (every rule compiled in the JVM, so a broken one stops the job naming its file), then
the starting offsets (a new checkpoint over tables that already hold counts must not count everything
again: :mod:`kdq.spark.lost_checkpoint`), then :class:`kdq.spark.speed_layer.SpeedLayer` until a stop.
SIGTERM (and Ctrl-C) stop it gracefully: the current micro-batch is allowed to finish (up to
``stop_timeout`` seconds), then the query stops; every write is idempotent per batch, so even an
abandoned batch is replayed exactly once on restart from the checkpoint.

One driver per checkpoint: before anything else the driver takes the checkpoint's lease
(:mod:`kdq.driver_lease`); while another driver holds it, it refuses to start (the report's error names
that driver; ``driver_refused.json`` tells the supervisor it is no crash), and a renewal that finds it
was taken over stops the query at once (fenced). A graceful stop releases the lease.

From its first line until the query runs the driver beats ``starting`` (``kdq.stream.state.StartingBeat``,
with the start-up phase), so a long start-up is not mistaken for a hang. A heartbeat is written every 5 s
between batches too, so a supervisor can tell "idle" from "hung".
When the query dies, the batch it was running (planned in the offset log, not committed) is recorded
with the error and its offset ranges in ``<data_dir>/stream/batch_failure.json``
(:mod:`kdq.stream.failures`): the supervisor counts consecutive failures of that batch.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping

from pyspark.sql import SparkSession

from kdq.config import Config
from kdq.driver_lease import DriverLease
from kdq.job_reports import StreamReport
from kdq.stream import state as stream_state
from kdq.stream.state import StartingBeat

log = logging.getLogger("kdq.stream")


def run_speed_layer(
    spark: SparkSession,
    config: Config,
    trigger_seconds: float | None = None,
    available_now: bool = False,
    stop_timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    starting: StartingBeat | None = None,
) -> StreamReport:
    """Run the speed layer in ``spark`` until it stops (SIGTERM/SIGINT, the end of an available-now run, or
    the query dying); ``ok`` is false when it died, when another driver holds the checkpoint (refused), or
    when another driver took it over (fenced). ``starting``: the start-up heartbeat the entrypoint began
    (one is started here otherwise); it stops once the query runs."""
    from kdq import driver_lease, storage
    from kdq.spark.speed_layer import checkpoint_dir

    starting = starting or StartingBeat(config).start()
    checkpoint = checkpoint_dir(config)
    lease = driver_lease.DriverLease(
        storage.files_for(checkpoint), checkpoint, lease_seconds=config.stream.driver_lease_seconds
    )
    try:
        starting.phase("lease")
        lease.acquire()
    except driver_lease.LeaseHeld as held:
        starting.stop()
        log.error("REFUSED to start: %s", held)
        stream_state.record_refusal(config, str(held), held.owner)
        return StreamReport(ok=False, checkpoint=str(checkpoint), error=f"refused: {held}")
    except BaseException:
        starting.stop()
        raise
    try:
        starting.own()
        return _run_owned(spark, config, lease, starting, trigger_seconds, available_now, stop_timeout, env)
    finally:
        starting.stop()
        lease.release()


def _run_owned(
    spark: SparkSession,
    config: Config,
    lease: DriverLease,
    starting: StartingBeat,
    trigger_seconds: float | None,
    available_now: bool,
    stop_timeout: float,
    env: Mapping[str, str] | None,
) -> StreamReport:
    """:func:`run_speed_layer` once this driver holds the checkpoint's lease."""
    from pyspark.errors import StreamingQueryException

    from kdq.registry_versions import current_rules
    from kdq.spark.classifier import check_rules
    from kdq.spark.faults import FaultInjector
    from kdq.spark.lost_checkpoint import starting_offsets
    from kdq.spark.speed_layer import SpeedLayer, checkpoint_dir
    from kdq.spark.stream_progress import ProgressRecorder
    from kdq.windows import topic_selected

    fenced = threading.Event()
    lease.keep_renewed(lambda reason: fenced.set())
    starting.phase("rules")
    rules = current_rules(config)  # with the registry's subject versions in registry-backed rules' versions
    for line in rules.describe():
        log.info("rule %s", line)
    # Every rule compiled in the JVM now: a broken one stops the job here, naming its file. The Schema Registry is
    # asked too when a registry-backed rule may meet a topic this stream reads: not configured, not answering or
    # refusing kdq's login stops the job here, naming the rule (the supervisor retries it with backoff).
    kafka = config.kafka
    in_use = rules.registry_rules_in_use(
        lambda topic: topic_selected(topic, kafka.topic_include, kafka.topic_exclude, (kafka.metrics_topic,))
    )
    log.info("rules: %s", check_rules(spark, rules, config.stream, ask_registry=bool(in_use)))
    # A new checkpoint over tables that hold counts must not count everything again.
    starting.phase("lost_checkpoint")
    resume_at = starting_offsets(spark, config, checkpoint_dir(config))
    if resume_at is not None:
        config = config.model_copy(update={"kafka": config.kafka.model_copy(update={"starting_offsets": resume_at})})
    layer = SpeedLayer(spark, config, rules, faults=FaultInjector.from_env(dict(env or os.environ)))
    recorder = ProgressRecorder(layer)
    spark.streams.addListener(recorder)
    starting.phase("query_start")
    query = layer.start(trigger_seconds=trigger_seconds, available_now=available_now)
    starting.stop()  # the query's own "running" beats take over (the loop below, the listener)
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
    while query.isActive and not stop.is_set() and not fenced.is_set():
        # A heartbeat between batches too, so a supervisor can tell "idle" from "hung".
        active = bool(query.status["isTriggerActive"])
        progress = query.lastProgress
        done = progress["batchId"] if progress else None
        if not active:
            active_since = None
            try:
                layer.flush_reasons(only_if_due=True)
            except Exception:  # kept in the ledger: the next flush (a minute on, or the next batch's) retries
                log.exception("appending the stream's pending invalid reasons failed")
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
    if fenced.is_set():
        # Another driver owns the checkpoint now: stop at once, mid-batch (every write is idempotent per batch;
        # the owner replays whatever this one leaves).
        log.error("FENCED: stopping the query now: %s", lease.lost)
        query.stop()
    elif stop.is_set() and query.isActive:
        deadline = time.monotonic() + stop_timeout
        while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.2)
        query.stop()
    recorder.heartbeat("stopped")
    layer.close(flush_reasons=not fenced.is_set())
    report = StreamReport(app_id=layer.app_id, checkpoint=str(layer.checkpoint))
    if fenced.is_set():
        stream_state.record_refusal(config, f"fenced: {lease.lost}", None, kind="fenced")
        report.ok, report.error = False, f"fenced: {lease.lost}"
        return report
    error = query.exception()
    if error is not None:
        message = str(error)
        if "data loss" in message.lower() or "failOnDataLoss" in message:
            log.error("DATA LOSS: Kafka no longer has records the stream had not read yet: %s", message[:2000])
        else:
            log.error("speed layer failed: %s", message[:2000])
        record_batch_failure(config, layer.checkpoint, message)
        report.ok, report.error = False, message[:2000]
    return report


def record_batch_failure(config: Config, checkpoint, message: str) -> None:
    """The batch the query died in (planned, not committed), recorded for the supervisor (never raises)."""
    from kdq.stream import failures

    try:
        batch_id = failures.pending_batch(checkpoint)
        if batch_id is None:
            log.error("no micro-batch was in flight: nothing recorded in batch_failure.json")
            return
        failure = failures.record_failure(config, batch_id, message, checkpoint=checkpoint)
        log.error(
            "micro-batch %d failed (attempt %d in a row); offset ranges:\n%s",
            batch_id, failure["attempts"], "\n".join(failures.format_ranges(failure["ranges"])),
        )
    except Exception:  # the job exits non-zero anyway
        log.exception("could not record the failed micro-batch")
