"""The expectations' evaluation run on Spark: read counts and incidents, decide (kdq.expectation_run),
write the changed rows, deliver the notifications (kdq.notify).

Reads: ``window_counts`` at one Delta version (its version is the run's ``as_of``: the newest counts win, and a
re-run on the same version derives the same rows), the ``invalid_reasons`` increments, the stream's last
progress, the stored ``kdq.incidents`` rows. Writes, in this order:

1. the notifications into the outbox ``kdq.incident_notifications``, inserted once per id;
2. the changed incident rows into ``kdq.incidents``, a MERGE on ``incident_key`` that updates a row only with a
   higher ``version`` (a stale run that lost a race writes nothing over a newer row).

Outbox first: a run that dies between the two leaves the incidents as they were, so the next run derives the
same changes, the same notification ids, and the insert-once skips them; the other order would lose the
notifications of a change already stored (the next run would find nothing changed).

One run at a time: the scheduled run, a manual ``kdq`` run or a second scheduler may start together. Two runs
that read the same stored incidents could derive different next versions of one incident from different counts
(one of them then notifies a change that is never stored), and two deliveries could both send what neither has
recorded yet. So a run holds the evaluation lease (:class:`kdq.driver_lease.DriverLease` in
``<checkpoints>/expectations``: write-then-list, renewed, fenced) from its first read to its last write, and a
second run waits for it (``lease_wait_seconds``), then judges with the first one's incidents: it changes and
sends nothing the first did.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kdq.config import Config
from kdq.driver_lease import DriverLease, LeaseHeld, describe
from kdq.expectation_run import (
    DEFAULT_HORIZON_MINUTES,
    RunResult,
    minutes_since_recompute,
    notification_row,
    run_evaluation,
    run_window,
    stream_figures,
)
from kdq.expectations import MINUTE_MS
from kdq.incidents import Incident, incident_from_row, incident_row
from kdq.job_reports import ExpectationsReport
from kdq.rules import load_rules
from kdq.spark.reasons_flush import reasons_lag_seconds
from kdq.spark.tables import table_path
from kdq.spark.writers import delta_snapshot, insert_absent, retry_on_conflict
from kdq.step_clock import StepClock
from kdq.stream.failures import read_failure, running_batch
from kdq.stream.state import stream_status
from kdq.tables import INCIDENT_NOTIFICATIONS, INCIDENTS, INVALID_REASONS, RAW_ARCHIVE, WINDOW_COUNTS
from kdq.windows import range_hours
from kdq.writers_journal import read_entries

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

SAMPLE_VALUES = 3  # invalid records kept with an incident (its `sample` column)
_TIMESTAMP_COLUMNS = tuple(name for name, sql_type in INCIDENTS.columns if sql_type == "TIMESTAMP")


# --- readers: DataFrame in, plain rows out (no side effects) -----------------------------------------------


def minute_counts(window_counts: DataFrame, from_ms: int) -> list[dict[str, Any]]:
    """Per (topic, epoch minute): valid and invalid records and the newest counted window's start (ms)."""
    from pyspark.sql import functions as F

    start = F.unix_millis("window_start")
    rows = (
        window_counts.where(start >= F.lit(int(from_ms)))
        .groupBy("topic", F.floor(start / MINUTE_MS).cast("long").alias("minute"))
        .agg(
            F.sum(F.when(F.col("status") == "valid", F.col("count")).otherwise(0)).alias("valid"),
            F.sum(F.when(F.col("status") == "invalid", F.col("count")).otherwise(0)).alias("invalid"),
            F.max(start).alias("max_window_ms"),
        )
        .collect()
    )
    return [r.asDict() for r in rows]


def minute_reasons(invalid_reasons: DataFrame, from_ms: int) -> list[dict[str, Any]]:
    """Per (topic, epoch minute, reason): invalid records. The increments' windows are
    ``stream.reasons_window_seconds`` long (a minute by default): a longer one counts in its first minute."""
    from pyspark.sql import functions as F

    start = F.unix_millis("window_start")
    rows = (
        invalid_reasons.where(start >= F.lit(int(from_ms)))
        .groupBy("topic", F.floor(start / MINUTE_MS).cast("long").alias("minute"), "reason")
        .agg(F.sum("count").alias("count"))
        .where(F.col("count") != 0)
        .collect()
    )
    return [r.asDict() for r in rows]


def invalid_sample(archive: DataFrame, incident: Incident, limit: int = SAMPLE_VALUES) -> str | None:
    """The first ``limit`` invalid records (by partition, offset) behind an incident of a check on invalid records,
    as JSON ``[{partition, offset, reason, value}]`` (value: its first 200 characters); None for other checks or
    when the archive has none. Reads only the archive's ``event_hour`` partitions of the incident's windows."""
    from pyspark.sql import functions as F

    name = incident.expectation
    if name not in ("invalid_ratio", "anomaly:invalid_ratio") and not name.startswith(("reason_count:", "reason_share:")):
        return None
    start, end = incident.window_start_ms, incident.window_end_ms
    rows = archive.where(F.col("event_hour").isin(range_hours(start, end))).where(
        (F.col("topic") == incident.topic) & ~F.col("valid")
        & F.unix_millis("window_start").between(start, end - 1)
    )
    if name.startswith(("reason_count:", "reason_share:")):
        reason = name.split(":", 1)[1]
        rows = rows.where((F.col("reason") == reason) | F.col("reason").startswith(reason + "/"))
    picked = (
        rows.orderBy("partition", "offset")
        .select("partition", "offset", "reason", F.substring(F.col("value").cast("string"), 1, 200).alias("value"))
        .limit(limit)
        .collect()
    )
    return json.dumps([r.asDict() for r in picked]) if picked else None


def stored_incidents(incidents: DataFrame) -> list[Incident]:
    """Every stored incident. Timestamps are read as epoch millis: a collected TIMESTAMP is a naive datetime in
    the Python process's zone, not UTC."""
    from pyspark.sql import functions as F

    columns = [F.unix_millis(c).alias(c) if c in _TIMESTAMP_COLUMNS else F.col(c) for c in INCIDENTS.column_names]
    out = []
    for row in incidents.select(*columns).collect():
        values = row.asDict()
        for c in _TIMESTAMP_COLUMNS:
            if values[c] is not None:
                values[c] = datetime.fromtimestamp(values[c] / 1000, tz=UTC)
        out.append(incident_from_row(values))
    return out


# --- writers: one side effect each ------------------------------------------------------------------------


def insert_notifications(spark: SparkSession, config: Config, rows: Sequence[dict[str, Any]]) -> None:
    """Insert outbox rows whose ``notification_id`` is not there yet (a re-run inserts nothing)."""
    insert_absent(spark, config, INCIDENT_NOTIFICATIONS,
                  [tuple(r[c] for c in INCIDENT_NOTIFICATIONS.column_names) for r in rows], ["notification_id"])


def merge_incidents(spark: SparkSession, config: Config, rows: Sequence[dict[str, Any]]) -> None:
    """Upsert incident rows on ``incident_key``; a stored row is replaced only by a higher ``version``."""
    updates = {c: f"s.`{c}`" for c in INCIDENTS.column_names if c != "sample"}
    updates["sample"] = "coalesce(s.sample, t.sample)"
    if not rows:
        return
    from delta.tables import DeltaTable

    source = spark.createDataFrame([tuple(r[c] for c in INCIDENTS.column_names) for r in rows],
                                   INCIDENTS.ddl_columns)
    target = DeltaTable.forPath(spark, table_path(config, INCIDENTS))
    retry_on_conflict(
        lambda: target.alias("t").merge(source.alias("s"), "t.incident_key = s.incident_key")
        # The sample is taken when the incident opens; later versions keep it.
        .whenMatchedUpdate(condition="s.version > t.version", set=updates)
        .whenNotMatchedInsertAll().execute(),
        "incidents",
    )


# --- the run ------------------------------------------------------------------------------------------------

FAULT_ENV = "KDQ_FAULT_EXPECTATIONS"  # the kill tests' switch: "after_outbox" ends the process there (exit 137)


def _fault(point: str) -> None:
    if os.environ.get(FAULT_ENV) == point:
        log.error("%s=%s: the process is killed here", FAULT_ENV, point)
        os._exit(137)


def monitored_topics(config: Config, seen: Sequence[str]) -> list[str]:
    """The topics the unruled-topic check judges: those with counts (``seen``) and every topic of the cluster the
    stream reads (its include/exclude settings, kdq.spark.backfill.list_topics), so a topic created a moment ago
    and matched by no rule is told before its first record is counted. A broker that does not answer leaves
    the topics with counts (logged): the other checks never wait for it."""
    from kdq.spark.backfill import list_topics

    try:
        listed = list_topics(config)
    except Exception as exc:  # KafkaException, a timeout: judge what the counts show
        log.warning("listing the cluster's topics failed (%s): the unruled-topic check sees the counted ones", exc)
        listed = []
    return sorted({*seen, *listed})


def evaluation_inputs(spark: SparkSession, config: Config, now_ms: int) -> tuple:
    """What an evaluation's outcome depends on, taken without a Spark job (Delta log versions, the stream's state
    files): the minute (silence, the stream's checks and the horizon move with the clock), the versions of
    ``window_counts``, ``invalid_reasons`` (when a check reads it) and ``kdq.incidents``, the stream's last progress, its failing
    micro-batch and its batch in flight. Equal inputs give the same evaluation, so a repeating run skips it
    (a blocked batch is then judged at the next minute). Taken before the evaluation it gates: anything that
    changes while it runs changes the next inputs."""
    progress = stream_status(config)["progress"] or {}
    failure = read_failure(config) or {}
    running = running_batch(config, now_ms=now_ms) or {}
    tables = (WINDOW_COUNTS, INVALID_REASONS, INCIDENTS)
    if not load_rules(config.rules_dir).expectations.reads_reasons():
        tables = (WINDOW_COUNTS, INCIDENTS)
    return (
        now_ms // MINUTE_MS,
        *(int(delta_snapshot(spark, table_path(config, table)).version()) for table in tables),
        progress.get("timestamp"),
        failure.get("attempts"),
        running.get("batch_id"),
    )


class IncidentsCache:
    """The stored incidents of one ``kdq.incidents`` version, kept between the evaluations of one run: a
    repeating run writes them seldom and reads them every time (a Spark job each, about a second on a busy
    2-core machine). Read again whenever the table's version moved, whoever wrote it."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.rows: list[Incident] = []

    def read(self, spark: SparkSession, config: Config) -> list[Incident]:
        path = table_path(config, INCIDENTS)
        version = int(delta_snapshot(spark, path).version())
        if version != self.version:
            self.rows = stored_incidents(spark.read.format("delta").option("versionAsOf", version).load(path))
            self.version = version
        return list(self.rows)


def evaluate_run(spark: SparkSession, config: Config, now_ms: int,
                 horizon_minutes: int = DEFAULT_HORIZON_MINUTES,
                 still_held: Callable[[], None] = lambda: None,
                 step_seconds: dict[str, float] | None = None,
                 incidents: IncidentsCache | None = None) -> RunResult:
    """Read, evaluate, write; the run's result (changed rows and notifications). No delivery here.
    ``still_held`` raises when the run lost its lease: called before each write. ``step_seconds`` gets each
    step's wall seconds (read, judge, sample, write): what an evaluation's time goes to, in its report.
    ``incidents``: a repeating run's cache of the stored incidents (read under the lease, like every input)."""
    steps = StepClock(step_seconds)
    rules = load_rules(config.rules_dir)
    expectations = rules.expectations
    counts_path = table_path(config, WINDOW_COUNTS)
    counts_version = int(delta_snapshot(spark, counts_path).version())
    stored = (incidents or IncidentsCache()).read(spark, config)
    window = run_window(expectations, stored, now_ms, horizon_minutes)
    from_ms = window.read_from_minute * MINUTE_MS
    window_counts = spark.read.format("delta").option("versionAsOf", counts_version).load(counts_path)
    counts = minute_counts(window_counts, from_ms)
    reasons = (minute_reasons(spark.read.format("delta").load(table_path(config, INVALID_REASONS)), from_ms)
               if expectations.reads_reasons() else [])  # a Spark job no check would use
    topics_seen = sorted({str(r["topic"]) for r in counts})
    if expectations.unruled_topic or any(e.unruled_topic for e in expectations.entries):
        topics_seen = monitored_topics(config, topics_seen)
    steps.lap("read")
    result = run_evaluation(
        expectations, stored, window, None, now_ms=now_ms, as_of=counts_version,
        allowed_lateness_seconds=config.stream.allowed_lateness_seconds,
        stream=stream_figures(stream_status(config)["progress"], read_failure(config),
                              running_batch(config, now_ms=now_ms), now_ms=now_ms,
                              recompute_minutes=minutes_since_recompute(read_entries(config), now_ms)),
        has_rule={t: rules.rule_for(t) is not None for t in topics_seen},
        counts=counts, reasons=reasons, reasons_lag_seconds=reasons_lag_seconds(config.stream),
    )
    steps.lap("judge")
    opened = {n.incident.key for n in result.notifications if n.event == "open"}
    archive = spark.read.format("delta").load(table_path(config, RAW_ARCHIVE))
    samples = {i.key: invalid_sample(archive, i) for i in result.changed if i.key in opened}
    steps.lap("sample")
    still_held()
    insert_notifications(spark, config, [notification_row(n, now_ms, samples.get(n.incident.key))
                                         for n in result.notifications])
    _fault("after_outbox")
    still_held()
    merge_incidents(spark, config, [incident_row(i, samples.get(i.key)) for i in result.changed])
    steps.lap("write")
    log.info("expectations: minutes %d..%d at window_counts v%d: %d verdicts, %d violated, %d rows changed, "
             "%d notifications (%s)", window.first_minute, window.last_minute, counts_version, result.verdicts,
             result.violated, len(result.changed), len(result.notifications), steps)
    return result


LEASE_SECONDS = 60.0  # a run that dies holds the evaluation for at most this long (on this host: not at all)
LEASE_WAIT_SECONDS = 300.0  # how long a run waits for another one before it fails (a failed Airflow task)


def evaluation_lease(config: Config, lease_seconds: float = LEASE_SECONDS) -> DriverLease:
    """The lease one evaluation run holds at a time (module doc), beside the stream's checkpoints."""
    from kdq import storage

    location = storage.checkpoint_location(config, "expectations")
    return DriverLease(storage.files_for(location), location, lease_seconds=lease_seconds)


@contextmanager
def holding_the_evaluation(config: Config, wait_seconds: float = LEASE_WAIT_SECONDS,
                           poll_seconds: float = 1.0) -> Iterator[Callable[[], None]]:
    """Hold the evaluation lease, waiting up to ``wait_seconds`` for a run that holds it; yields a check that
    raises once the lease was lost (this run was paused past its lease and another one may run: it must stop
    writing). :class:`LeaseHeld` when the other run still holds it after the wait."""
    lease = evaluation_lease(config)
    deadline = time.monotonic() + wait_seconds
    waited = False
    while True:
        try:
            lease.acquire()
            break
        except LeaseHeld as held:
            if time.monotonic() >= deadline:
                raise LeaseHeld(f"another expectations run still holds the evaluation after {wait_seconds:.0f} s: "
                                f"{describe(held.owner, int(time.time() * 1000))}", held.owner) from None
            if not waited:
                log.info("another expectations run holds the evaluation (%s): waiting for it",
                         describe(held.owner, int(time.time() * 1000)))
                waited = True
            time.sleep(poll_seconds * random.uniform(0.5, 1.5))  # two waiters let go at once must not keep colliding
    lost = threading.Event()
    lease.keep_renewed(lambda reason: lost.set())

    def still_held() -> None:
        if lost.is_set():
            raise RuntimeError(f"FENCED: this expectations run lost the evaluation lease ({lease.lost}); it stops "
                               "before its next write (the next run derives the same changes)")

    try:
        yield still_held
    finally:
        lease.release()


def evaluate_expectations(spark: SparkSession, config: Config, now_ms: int,
                          horizon_minutes: int = DEFAULT_HORIZON_MINUTES, deliver: bool = False,
                          lease_wait_seconds: float = LEASE_WAIT_SECONDS,
                          incidents: IncidentsCache | None = None) -> ExpectationsReport:
    """The job, holding the evaluation lease: evaluate and write, then (``deliver``) send what is pending; a
    failing channel is reported, never a failed run (the evaluation is committed, the next run delivers again)."""
    with holding_the_evaluation(config, lease_wait_seconds) as still_held:
        return _evaluate_and_deliver(spark, config, now_ms, horizon_minutes, deliver, still_held, incidents)


def _evaluate_and_deliver(spark: SparkSession, config: Config, now_ms: int, horizon_minutes: int, deliver: bool,
                          still_held: Callable[[], None], incidents: IncidentsCache | None) -> ExpectationsReport:
    step_seconds: dict[str, float] = {}
    result = evaluate_run(spark, config, now_ms, horizon_minutes, still_held, step_seconds, incidents)
    report = ExpectationsReport(
        step_seconds=step_seconds,
        now_ms=now_ms,
        first_minute=datetime.fromtimestamp(result.window.first_minute * 60, tz=UTC).isoformat(),
        last_minute=datetime.fromtimestamp(result.window.last_minute * 60, tz=UTC).isoformat(),
        counts_version=result.counts_version,
        verdicts=result.verdicts,
        violated=result.violated,
        incidents_changed=len(result.changed),
        open_incidents=result.open_incidents,
        notifications_total=len(result.notifications),
        notifications=[{"id": n.id, "event": n.event, "topic": n.incident.topic,
                        "expectation": n.incident.expectation, "status": n.incident.status,
                        "worst_value": n.incident.worst_value} for n in result.notifications[:100]],
    )
    if deliver:
        from kdq.spark.notify import deliver_pending

        still_held()
        started = time.monotonic()
        try:
            report.delivery = deliver_pending(spark, config, now_ms)
        except Exception as exc:  # e.g. a malformed channel setting: the evaluation is committed, the next run retries
            log.exception("notifications not delivered")
            report.delivery = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        step_seconds["deliver"] = round(time.monotonic() - started, 3)
    return report
