"""The speed layer: Kafka → classify → (archive, window counts, reasons, metrics topic, InfluxDB).

Design (why no Spark stateful aggregation): each micro-batch is aggregated on
its own and its per-window *increments* are MERGEd into Delta under Delta's
idempotent-write guard (txnAppId = this checkpoint's app id, txnVersion =
batch id). Memory therefore does not grow with topics × windows × lateness
(there is no state store), and lateness is judged per topic against the
maximum event time each topic has shown, recorded in the micro-batch ledger, instead
of Spark's single global watermark, so one producer with a clock in the future
cannot make every other topic's records late.

Exactly once, step by step, for micro-batch N (Spark replays N after a crash
until its commit is in the checkpoint):

1. one pass over the batch's records: classify, append to the raw archive
   under the guard (app id, N) as write options, and count, the counts being an
   observed metric of that write (``DataFrame.observe`` of
   :func:`kdq.spark.transforms.batch_counts_metric`): each 1 KB value is read,
   judged and written once, never cached. A replay whose archive append landed
   reads its counts back from the archived rows instead (their verdicts, their
   ingest time), so it counts exactly what was archived; samples of invalid
   messages are a view over the archive (``invalid_samples``);
2. ledger row N (ingest time, per-topic watermarks before and after, the
   rules' hash) is written if missing, before any other output: the next
   batch judges lateness from it, and a replay of an entry written by an
   earlier version (before its archive append) classifies with the rules of its
   first attempt (the classifier document is kept in the checkpoint by hash);
3. this thread MERGEs the window-count increments (and the summaries),
   guarded by the session-wide (app id, N); the batch's invalid-reason
   increments are in its ledger entry, and once a minute (and at a graceful
   stop) the entries not yet in ``invalid_reasons`` are appended there in one
   commit guarded by (app id, N), on a writer thread beside the MERGE
   (:mod:`kdq.spark.reasons_flush`);
4. absolute counts of the changed windows are read back from the files the
   MERGE's own commit added (both statuses of each window are in the MERGE;
   a scan of the table when that commit is not found) and sent
   to the metrics topic and InfluxDB: absolute values, so re-sending after a
   replay is harmless (at-least-once delivery of idempotent values); they carry
   the ``window_counts`` version they were read at and are written holding the
   push lock, re-read when a batch push sent a newer version meanwhile
   (:mod:`kdq.push_order`), so they never replace a newer value;
5. the batch returns (and Spark commits it) only after every append finished.

Between micro-batches, while the stream waits for its next trigger, :mod:`kdq.spark.stream_upkeep` prepares the
guarded tables' snapshots, checkpoints them and compacts the open hour of the window tables: work Delta would
otherwise do inside a batch's commits (none of it changes data, so none of it needs the guard).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from kdq import storage
from kdq.config import Config
from kdq.metrics_topic import ensure_metrics_topic, metrics_producer, produce_counts
from kdq.push_order import push_lock, versioned_count_points
from kdq.rules import RuleSet
from kdq.spark import transforms
from kdq.spark.classifier import ClassifierDocument
from kdq.spark.faults import FaultInjector
from kdq.spark.kafka_fallback import fallback_batch, is_record_conversion_error
from kdq.spark.ledger import SUMMARY_INCREMENTS_KEY, MicroBatchLedger, RulesDocuments
from kdq.spark.outputs import push_batch_influx
from kdq.spark.push_reads import counts_version, read_merge_output, read_range_at
from kdq.spark.reasons_flush import REASONS_KEY, ReasonsFlush
from kdq.spark.session import small_query_session
from kdq.spark.stream_upkeep import MAINTENANCE_IDLE_MS, StreamUpkeep
from kdq.spark.tables import ensure_tables, table_path
from kdq.spark.writers import (
    append_archive,
    append_reason_increments,
    merge_window_increments,
    now_ms,
    txn_version,
)
from kdq.step_clock import StepClock
from kdq.stream import failures as batch_failures
from kdq.stream.checkpoint_offsets import speed_layer_checkpoint
from kdq.stream.micro_batch import MicroBatchReport, idle_ms_before_next_trigger, increments_of, merge_maxima
from kdq.stream.state import InfluxPushState
from kdq.tables import RAW_ARCHIVE, SUMMARIES, WINDOW_COUNTS
from kdq.windows import subscribe_pattern

log = logging.getLogger("kdq.stream")


def checkpoint_dir(config: Config) -> str:
    return speed_layer_checkpoint(config)


def app_id_for(checkpoint: storage.Location) -> str:
    """The idempotent-write app id, stored inside the checkpoint (local or remote: :mod:`kdq.storage`).

    Tied to the checkpoint on purpose: a new checkpoint restarts batch ids at
    0, and with the old app id Delta would silently skip those batches as
    already written. A new checkpoint gets a new app id.
    """
    files = storage.files_for(checkpoint)
    files.mkdirs(checkpoint)
    path = storage.join(checkpoint, "kdq_app_id")
    if not files.exists(path):
        files.create_if_absent(path, f"kdq-stream-{uuid.uuid4()}".encode())  # two starters agree on one id
    return files.read_bytes(path).decode().strip()


class SpeedLayer:
    """One streaming query; ``process_batch`` is its foreachBatch writer (one writer thread per session)."""

    def __init__(
        self,
        spark: SparkSession,
        config: Config,
        rules: RuleSet,
        faults: FaultInjector | None = None,
        checkpoint: storage.Location | None = None,
    ) -> None:
        self.spark = spark
        # The per-batch MERGE, read-back and reason append run over a few hundred rows: interpreted
        # (benchmarks/PERF_NOTES.md, "the per-batch queries interpreted").
        self.small = small_query_session(spark)
        # Its MERGEs never compact in their own commit: the upkeep does, between micro-batches (kdq.spark.stream_upkeep).
        self.small.conf.set("spark.databricks.delta.autoCompact.enabled", "false")
        # The summaries' reads and MERGE, on their own thread beside the window counts' MERGE: a session of their
        # own, since the MERGE's txnAppId/txnVersion guard is session-wide (one writer thread per session).
        self.small_summaries = small_query_session(spark) if config.summaries else self.small
        self.small_summaries.conf.set("spark.databricks.delta.autoCompact.enabled", "false")
        self._summaries_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kdq-summaries")
        self.config = config
        self.rules = rules
        self.faults = faults or FaultInjector()
        self.checkpoint = checkpoint or checkpoint_dir(config)
        self.app_id = app_id_for(self.checkpoint)
        self.ledger = MicroBatchLedger(spark, str(self.checkpoint))
        self._archive_path = table_path(config, RAW_ARCHIVE)
        # The rules as the JVM compiles them; a ledger entry names the hash of the document its batch used.
        self.rules_document = ClassifierDocument.of(rules, config.stream)
        self.rules_documents = RulesDocuments(spark, str(self.checkpoint))
        self.reasons = ReasonsFlush(self.small, config, self.app_id, self.ledger)
        self._newest_entry = -1  # the newest batch whose ledger entry this process wrote or read
        self.push_state = InfluxPushState(config)
        self.reports: dict[int, MicroBatchReport] = {}
        self.on_report: Callable[[MicroBatchReport], None] | None = None
        self._producer = None
        self._writers = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kdq-append")
        # The snapshots, checkpoints and compactions of the stream's tables, between micro-batches.
        window_paths = [table_path(config, WINDOW_COUNTS)] + ([table_path(config, SUMMARIES)] if config.summaries else [])
        self.upkeep = StreamUpkeep(self.small, spark, self.app_id, [self._archive_path, *window_paths], window_paths)
        self._upkeep_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kdq-upkeep")
        self._upkeep_running: Future | None = None
        # The processing-time trigger's interval (0: batches back to back), set by start(): the upkeep runs when a
        # batch leaves idle time before the next trigger.
        self._trigger_ms = int(config.stream.trigger_interval_seconds * 1000)
        self._quarantine_decisions: MicroBatchLedger | None = None
        self._quarantined: list[dict] = []  # the current batch's applied quarantine entries
        self._archived = False  # the current batch's archive append landed in an earlier attempt

    # -- the source ------------------------------------------------------------
    def source(self) -> DataFrame:
        kafka = self.config.kafka
        pattern = subscribe_pattern(kafka.topic_include, kafka.topic_exclude, (kafka.metrics_topic,))
        reader = (
            self.spark.readStream.format("kafka")
            .options(**self.config.spark_kafka_options())
            .option("subscribePattern", pattern)
            .option("startingOffsets", kafka.starting_offsets)
            .option("maxOffsetsPerTrigger", kafka.max_offsets_per_trigger)
            .option("failOnDataLoss", str(kafka.fail_on_data_loss).lower())
            # New topics matching the pattern are found when the consumer
            # refreshes metadata; the client default (5 min) is too slow.
            .option("kafka.metadata.max.age.ms", "5000")
        )
        return reader.load()

    def start(self, trigger_seconds: float | None = None, available_now: bool = False) -> StreamingQuery:
        ensure_metrics_topic(self.config)
        self._warm_producer()
        ensure_tables(self.spark, self.config)
        self.reasons.flushed()  # the ledger's trim floor, before a batch may trim it
        seconds = self.config.stream.trigger_interval_seconds if trigger_seconds is None else trigger_seconds
        writer = (
            self.source()
            .writeStream.queryName("kdq_speed_layer")
            .option("checkpointLocation", str(self.checkpoint))
            .foreachBatch(self.process_batch)
        )
        writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=f"{seconds} seconds")
        self._trigger_ms = 0 if available_now else int(seconds * 1000)
        return writer.start()

    def _warm_producer(self) -> None:
        """The metrics producer, created before the first micro-batch with the metrics topic's metadata fetched: its
        connection, producer id and partition leaders are then not paid inside the first batch (up to ~1 s of a
        catch-up's first push in `make bench`). A broker that does not answer yet is not an error here: the first
        push waits for it, as before."""
        if self._producer is None:
            self._producer = metrics_producer(self.config)
        try:
            self._producer.list_topics(self.config.kafka.metrics_topic, timeout=10)
        except Exception as exc:  # KafkaException: retried by the first push
            log.warning("metrics topic %s: no metadata yet (%s); the first push will wait for it",
                        self.config.kafka.metrics_topic, exc)

    # -- one micro-batch -----------------------------------------------------------
    def process_batch(self, batch: DataFrame, batch_id: int) -> None:
        started_ms = now_ms()
        steps = StepClock(millis=True)  # whole milliseconds per step: the report's durations_ms
        batch = self._before_batch(batch, batch_id)  # progress for the supervisor, quarantine, test faults
        # "before": the batch's bookkeeping ahead of its work; mostly the archive's Delta snapshot update (the txn
        # check), which the archive append would otherwise pay (benchmarks/PERF_NOTES.md, "the small batch's latency").
        steps.lap("before")
        timings: dict[str, int] = steps.durations
        lap = steps.lap

        stream = self.config.stream
        current = self.ledger.read(batch_id)
        replayed = current is not None
        if replayed:
            ingest_ms = int(current["ingest_time_ms"])
            before = dict(current["max_event_ms_before"])
        else:
            previous = self.ledger.latest_before(batch_id)
            ingest_ms = now_ms()
            before = dict(previous["max_event_ms_after"]) if previous else {}
        rules = self._rules_for(batch_id, current)
        archived = self._archived
        if archived:  # the counts are read back from the rows an earlier attempt archived
            aggregates, archived_ingest_ms = self._archived_aggregates(batch_id)
            replayed = True
            ingest_ms = archived_ingest_ms if archived_ingest_ms is not None else ingest_ms
        classified = transforms.mark_late(transforms.classify(batch, rules, stream, ingest_ms), before, stream)
        summary_states: list[dict] | None = None  # observed in the archive pass; else computed from `classified`
        lap("plan")
        report: MicroBatchReport | None = None
        writes: list[Future] = []
        summaries_step: Future | None = None  # the summaries' step beside the counts' MERGE (_start_summaries)
        try:
            if not archived:
                aggregates, summary_states, classified = self._archive_and_count(
                    classified, rules, ingest_ms, before, batch_id)
                self.faults.maybe_crash("after_archive", batch_id, sum(int(r["count"]) for r in aggregates))
            increments_in = increments_of(aggregates, stream.reasons_window_seconds)
            report = MicroBatchReport(
                batch_id=batch_id,
                input_rows=increments_in.input_rows,
                input_rows_by_topic=increments_in.input_rows_by_topic,
                invalid_rows=increments_in.invalid_rows,
                invalid_rows_by_topic=increments_in.invalid_rows_by_topic,
                late_rows=increments_in.late_rows,
                max_event_ms=increments_in.max_event_ms,
                replayed=replayed,
                oldest_kafka_ms=increments_in.oldest_kafka_ms,
                newest_kafka_ms=increments_in.newest_kafka_ms,
            )
            lap("classify_archive")
            if current is None:
                self.rules_documents.put(self.rules_document.sha256, self.rules_document.text)  # before the entry naming it
                self.ledger.write(
                    {
                        "batch_id": batch_id,
                        "rules_sha256": self.rules_document.sha256,
                        "ingest_time_ms": ingest_ms,
                        "max_event_ms_before": before,
                        "max_event_ms_after": merge_maxima(before, increments_in.max_event_ms),
                        "input_rows": report.input_rows,
                        "input_rows_by_topic": report.input_rows_by_topic,
                        "late_rows": report.late_rows,
                        "invalid_rows": report.invalid_rows,
                        REASONS_KEY: increments_in.reason_increments,
                        # Known here when the archive's pass observed the states (else a cut waits for the MERGE).
                        **({} if summary_states is None else
                           {SUMMARY_INCREMENTS_KEY: sum(1 for r in summary_states if not r["late"])}),
                    }
                )
            self._newest_entry = max(self._newest_entry, batch_id)
            self.faults.maybe_crash("after_ledger", batch_id, report.input_rows)
            if report.input_rows == 0:
                return

            # The reasons' flush carries its own (app id, batch) guard as write options, so it runs beside the
            # MERGEs on a writer thread; the MERGEs use the session-wide guard and therefore stay on this thread,
            # one after the other. Each write is idempotent on its own, so any subset of them may have landed when
            # the process dies: the replay completes the rest.
            if current is not None and REASONS_KEY not in current:
                # An entry of a kdq version that appended each batch's reasons itself: so does its replay.
                writes = [self._submit(timings, "reasons", append_reason_increments, self.small,
                                       increments_in.reason_increments, self.config, self.app_id, batch_id)]
            elif self.reasons.due():
                writes = [self._submit(timings, "reasons", self.reasons.flush, batch_id)]
            increments = increments_in.window_increments
            with self.upkeep.merging():  # after a compaction of the upkeep that still runs
                if self.config.summaries:
                    summaries_step = self._start_summaries(
                        classified, before, batch_id, ingest_ms, report, replayed, summary_states)
                merge_window_increments(self.small, increments, self.config, self.app_id, batch_id)
                report.visible_ms = now_ms()
                lap("merge_counts")
                if summaries_step is not None:
                    timings.update(summaries_step.result())
                    summaries_step = None
                    lap("summaries_wait")
            self.upkeep.merged(int(r["window_start_ms"]) for r in increments)
            self.faults.maybe_crash("after_merge", batch_id, report.input_rows)

            keys = sorted({(r["topic"], int(r["window_start_ms"])) for r in increments})
            # The absolute counts and the version they hold (the order of what is pushed, kdq.push_order): from the
            # files the MERGE just wrote, or, for a replay whose MERGE had landed before, by a scan.
            written = read_merge_output(self.small, self.config, self.app_id, batch_id, keys)
            if written is not None:
                version, absolute = written
            else:
                version = counts_version(self.small, self.config)
                absolute = read_range_at(self.small, self.config, keys, version)
            report.changed_windows = len(keys)
            lap("read_back")
            if self._producer is None:
                self._producer = metrics_producer(self.config)
            with push_lock(self.config) as clock:
                if clock.batch_version > version:
                    # A batch push sent a newer version of the table since the read-back: read again, so
                    # this push (the last one) never puts older values over it.
                    version = counts_version(self.small, self.config)
                    absolute = read_range_at(self.small, self.config, keys, version)
                by_key = {(r["topic"], r["window_start_ms"]): r for r in absolute}
                metric_rows = [
                    {**r, "count": by_key[(r["topic"], int(r["window_start_ms"]))][r["status"]]} for r in increments
                ]
                produce_counts(self.config, metric_rows, producer=self._producer, version=version)
                lap("metrics_topic")
                self.faults.maybe_crash("after_metrics", batch_id, report.input_rows)

                report.influx_ok = push_batch_influx(
                    self.config, versioned_count_points(absolute, version), report.batch_id,
                    report.input_rows_by_topic, report.late_rows, ingest_ms, self.push_state.record_failure,
                )
            lap("influxdb")
            for write in writes:
                write.result()
            writes = []
            lap("wait_appends")
            self.faults.maybe_crash("before_commit", batch_id, report.input_rows)
            self._upkeep(idle_ms_before_next_trigger(started_ms, now_ms(), self._trigger_ms))
        finally:
            # Never return (commit the batch) while an append or the summaries' MERGE still runs.
            for write in [*writes, *([summaries_step] if summaries_step is not None else [])]:
                try:
                    write.result()
                except Exception:  # the batch fails anyway; the first error is already propagating
                    log.exception("append of batch %d failed", batch_id)
            if report is not None:
                report.durations_ms = timings
                self.reports[batch_id] = report
                # Keep the last few reports only: the listener consumes them.
                for old in [b for b in self.reports if b < batch_id - 20]:
                    del self.reports[old]
                if self.on_report is not None:
                    self.on_report(report)

    def _archive_and_count(
        self, classified: DataFrame, rules: RuleSet | ClassifierDocument, ingest_ms: int, before: dict[str, int],
        batch_id: int,
    ) -> tuple[list[dict], list[dict] | None, DataFrame]:
        """Append the batch's classified records to the raw archive and return its aggregate rows
        (:func:`kdq.spark.transforms.batch_aggregates`) and, with summaries configured, its summary states
        (:func:`kdq.spark.summaries.summary_states`' rows), both computed in the same pass as observed metrics of
        the write: each 1 KB value is read from Kafka, classified and written once, never cached
        (benchmarks/PERF_NOTES.md, "one pass per micro-batch", "the summaries in the archive's pass").

        The observation is merged once per result task (as an action's accumulators are), and the write is
        one result stage: no exchange between the observed rows and the files. Also returns the classified frame
        (the fallback batch's when Spark's Kafka source could not convert a record)."""
        def once(frame: DataFrame) -> tuple[list[dict], list[dict] | None]:
            observation = Observation(f"kdq_batch_{batch_id}_{uuid.uuid4().hex[:8]}")
            metrics = [transforms.batch_counts_metric(frame).alias("counts")]
            if self.config.summaries:
                from kdq.spark.summaries import with_summary_states_metric

                frame, states = with_summary_states_metric(frame, self.config.summaries, before, self.rules)
                metrics.append(states.alias("summaries"))
            observed = frame.observe(observation, *metrics)
            append_archive(observed, self.config, self.app_id, batch_id, batch_id, "stream")
            values = observation.get
            states = None
            if self.config.summaries:
                from kdq.spark.summaries import summary_states_rows

                states = summary_states_rows(values["summaries"])
            return transforms.batch_counts_rows(values["counts"]), states

        try:
            return *once(classified), classified
        except Exception as exc:
            # One record Spark's Kafka source cannot convert would fail this batch on every replay: read the
            # same offsets without it (kafka_fallback). Nothing was committed: the write failed.
            if not is_record_conversion_error(exc):
                raise
            batch = self._prepare(fallback_batch(self.spark, self.config, self.checkpoint, batch_id))
            classified = transforms.mark_late(transforms.classify(batch, rules, self.config.stream, ingest_ms), before, self.config.stream)
            return *once(classified), classified

    def _archived_aggregates(self, batch_id: int) -> tuple[list[dict], int | None]:
        """The aggregate rows of batch ``batch_id`` from its archived records (an earlier attempt's append
        landed) and their ingest time: this checkpoint's batch, told apart from another checkpoint's batch of
        the same id by its Kafka offset ranges (Spark's offset log)."""
        archive = self.spark.read.format("delta").load(self._archive_path)
        rows = archive.where((F.col("batch_id") == batch_id) & (F.col("source") == "stream"))
        ranges = batch_failures.offset_ranges(self.checkpoint, batch_id)
        if ranges:
            scope = F.lit(False)
            for r in ranges:
                scope = scope | (
                    (F.col("topic") == r["topic"]) & (F.col("partition") == int(r["partition"]))
                    & F.col("offset").between(int(r["from"]), int(r["to"]))
                )
            rows = rows.where(scope)
        rows = rows.cache()
        try:
            aggregates = [r.asDict() for r in transforms.batch_aggregates(rows).collect()]
            ingest = rows.agg(F.max(F.unix_millis("ingest_time")).alias("ms")).first()["ms"]
        finally:
            rows.unpersist()
        log.warning(
            "batch %d: its records were archived by an earlier attempt (%d rows); its counts are read back from them",
            batch_id, sum(int(r["count"]) for r in aggregates),
        )
        return aggregates, (int(ingest) if ingest is not None else None)

    def _rules_for(self, batch_id: int, entry: dict | None) -> RuleSet | ClassifierDocument:
        """The rules batch ``batch_id`` is classified with: the current ones, except for a replay whose ledger entry
        names other rules (the rules changed between its first attempt, whose outputs may have landed, and this
        restart): the document stored under that hash. An entry from before the hash was recorded: the current."""
        recorded = entry.get("rules_sha256") if entry else None
        if recorded is None or recorded == self.rules_document.sha256:
            return self.rules
        text = self.rules_documents.get(recorded)
        if text is None:
            log.error(
                "batch %d was first classified with rules %s, whose document is missing from the checkpoint "
                "(kdq_rules/): replaying it with the current rules %s; its counts may disagree with its archived rows",
                batch_id, recorded[:16], self.rules_document.sha256[:16],
            )
            return self.rules
        log.warning(
            "batch %d is replayed with the rules it was first classified with (%s, kept in the checkpoint), not the "
            "current rules (%s): its outputs may have landed before the restart; the following batches use the current rules",
            batch_id, recorded[:16], self.rules_document.sha256[:16],
        )
        return ClassifierDocument(text)

    # -- batch progress, quarantined offsets, test faults (kept out of process_batch's steps) --------
    def _before_batch(self, batch: DataFrame, batch_id: int) -> DataFrame:
        """First thing of every micro-batch: record its start (the supervisor's hung-batch check), decide
        which quarantined ranges apply, and mark their records so classify skips the classifier for them."""
        batch_failures.batch_started(self.config, batch_id)
        self.faults.maybe_hang(batch_id)
        # Archived by an earlier attempt (the archive append is a batch's first output): then its archived rows
        # are its verdicts, whatever this attempt's clock, rules or quarantine list would say.
        self._archived = txn_version(self.spark, self._archive_path, self.app_id) >= batch_id
        self._quarantined = self._decide_quarantine(batch_id)
        return self._prepare(batch)

    def _prepare(self, batch: DataFrame) -> DataFrame:
        """The batch's records with the quarantine mark (when a range applies), in at most
        ``stream.batch_tasks`` tasks, and the test faults."""
        if self._quarantined:
            hit = F.lit(False)
            for e in self._quarantined:
                hit = hit | (
                    (F.col("topic") == e["topic"]) & (F.col("partition") == int(e["partition"]))
                    & F.col("offset").between(int(e["from_offset"]), int(e["to_offset"]))
                )
            batch = batch.withColumn(transforms.QUARANTINED_COLUMN, hit)
        # Coalesce, never shuffle: a task reads several Kafka partitions one after the other. One task per core
        # by default: each task pays code generation, serialization and its own archive file (docs/performance.md).
        batch = batch.coalesce(self.config.stream.batch_tasks or self.spark.sparkContext.defaultParallelism)
        return self.faults.poison(batch)

    def _decide_quarantine(self, batch_id: int) -> list[dict]:
        """The quarantine entries batch ``batch_id`` applies, identical for every replay that may matter.

        The archive append is a batch's first output, and its ledger entry follows it. So while batch N has
        neither, nothing of it landed and the decision is taken afresh from the operator's list (a range added
        after a failed attempt applies to the next one); the decision is recorded in the checkpoint
        (``kdq_quarantine/N``, same atomic Hadoop-FS files as the ledger) before the archive append. Once
        either exists, a replay uses the recorded decision (none if none was recorded), whatever the list
        says now. Without a quarantine list this costs one stat per batch (plus one on a replay).
        """
        replay = self.ledger.read(batch_id) is not None or self._archived
        if not replay and not batch_failures.quarantine_in_use(self.config):
            return []
        if self._quarantine_decisions is None:
            self._quarantine_decisions = MicroBatchLedger(self.spark, str(self.checkpoint), directory="kdq_quarantine")
        decisions = self._quarantine_decisions
        if replay:
            recorded = decisions.read(batch_id)
            return list(recorded["entries"]) if recorded else []
        entries = batch_failures.read_quarantine(self.config)
        ranges = batch_failures.offset_ranges(self.checkpoint, batch_id)
        applied = batch_failures.overlapping(entries, ranges) if ranges else entries
        previous = decisions.read(batch_id)
        if previous is not None and previous["entries"] != applied:
            # Safe to replace non-atomically: without a ledger entry, a missing decision is taken afresh.
            decisions.delete(batch_id)
            previous = None
        if applied and previous is None:
            decisions.write({"batch_id": batch_id, "entries": applied})
        if applied:
            log.warning(
                "batch %d: %d quarantined offset range(s) apply: %s; their records are counted invalid (%s)",
                batch_id, len(applied),
                ", ".join(f"{e['topic']}/{e['partition']}@{e['from_offset']}..{e['to_offset']}" for e in applied),
                transforms.QUARANTINED,
            )
        return applied

    def _start_summaries(
        self, classified: DataFrame, before: dict, batch_id: int, ingest_ms: int, report: MicroBatchReport,
        replayed: bool, states: list[dict] | None,
    ) -> Future:
        """The batch's summaries (read, MERGE, late windows, outputs: :func:`kdq.spark.summaries.stream_summaries`) on
        their own thread and session, beside the window counts' MERGE: both are mostly the driver planning Delta's
        small jobs, so on two cores the second no longer waits for the first (benchmarks/PERF_NOTES.md,
        "twenty-second pass"). Their session has its own txnAppId/txnVersion guard; Delta keeps one version per app
        id and table, so the two MERGEs' guards are independent. The future's value: the step durations (ms)."""
        from kdq.spark.summaries import stream_summaries

        if self._producer is None:
            self._producer = metrics_producer(self.config)
        producer = self._producer

        def run() -> dict[str, int]:
            self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", "summaries")
            clock = StepClock(millis=True)
            stream_summaries(
                self.small_summaries, self.config, classified, before, self.app_id, batch_id, ingest_ms,
                report.input_rows_by_topic, producer, self.push_state.record_failure, replayed, clock.lap,
                rules=self.rules, states=states,
            )
            return clock.durations

        return self._summaries_thread.submit(run)

    def _submit(self, timings: dict[str, int], name: str, action: Callable[..., None], *args) -> Future:
        def timed() -> None:
            started = time.monotonic()
            # Its own fair-scheduler pool, so the small jobs of the MERGEs on the
            # main thread get cores between this append's tasks instead of queueing
            # behind all of them (FIFO within a pool; pools share fairly).
            self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", name)
            try:
                action(*args)
            finally:
                timings[name] = int((time.monotonic() - started) * 1000)

        return self._writers.submit(timed)

    def _upkeep(self, idle_ms: int) -> None:
        """The tables' upkeep after this batch's commits (kdq.spark.stream_upkeep), on a thread of its own: the
        snapshots always, a compaction or a checkpoint when the stream waits ``idle_ms`` >= MAINTENANCE_IDLE_MS for
        its next trigger. A stream with no such pause (catching up) compacts the hours that can wait no longer
        here, on the batch's thread.

        The snapshots: a guarded write (Delta's txnAppId/txnVersion) looks up the app's version in the table's
        snapshot, and Delta 4.4 computes that from the table's whole state, a Spark job over the log after every
        commit (its checksum's copy of the txn versions is not read). The next batch would pay it on its critical
        path (~0.9 s a batch on two cores, benchmarks/PERF_NOTES.md, "seventeenth pass"); computed here, the next
        batch finds it ready (a lazy value: a batch that starts while it runs waits for it instead of computing it
        twice). Even with batches back to back this pays: beside the next batch's classification it costs that
        batch less than its MERGE would pay for it ("eighteenth pass")."""
        if idle_ms < MAINTENANCE_IDLE_MS:
            self.upkeep.in_batch()
        if self._upkeep_running is not None and not self._upkeep_running.done():
            return
        self._upkeep_running = self._upkeep_thread.submit(self.upkeep.between_batches, idle_ms)

    def flush_reasons(self, only_if_due: bool = False) -> None:
        """Append the reasons the batches so far keep only in their ledger entries: at a stop, and from the
        stream's loop while no batch runs (``only_if_due``: once a minute), so the last reasons before a quiet
        spell do not wait for the next record."""
        if self._newest_entry >= 0 and not (only_if_due and not self.reasons.due()):
            self.reasons.flush(self._newest_entry)

    def close(self, flush_reasons: bool = True) -> None:
        """After the query stopped: append the reasons still only in the ledger (not by a driver fenced out of the
        checkpoint: its owner does), then flush and drop the metrics producer (its client threads would otherwise
        outlive the query)."""
        self._writers.shutdown(wait=True)
        self._summaries_thread.shutdown(wait=True)
        self._upkeep_thread.shutdown(wait=True)
        if flush_reasons:
            try:
                self.flush_reasons()
            except Exception:  # they stay in the ledger: the next start's first flush appends them
                log.exception("the reasons of micro-batches up to %d were not appended at the stop", self._newest_entry)
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None
