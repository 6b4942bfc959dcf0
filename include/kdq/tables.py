"""Names, schemas and layout of every Delta table kdq writes.

Pure data (no Spark import) so the CLI, the DAGs and the tests share one
definition. The Spark side (:mod:`kdq.spark.tables`) creates and registers
them from these specs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TableSpec:
    name: str
    columns: tuple[tuple[str, str], ...]
    partitioned_by: tuple[str, ...] = ()
    properties: tuple[tuple[str, str], ...] = ()
    comment: str = ""

    @property
    def ddl_columns(self) -> str:
        return ", ".join(f"`{name}` {sql_type}" for name, sql_type in self.columns)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)


# Tables written once per micro-batch accumulate small files. They are
# compacted by the maintenance job (closed partitions only), not by Delta's
# auto compaction, which would run inside the stream's batches and race its MERGEs.

# delta.checkpointInterval of the tables the stream commits to every micro-batch (the archive, window_counts,
# summaries). Delta writes a checkpoint inside every interval-th commit; the stream writes them between its
# micro-batches instead, every kdq.spark.stream_upkeep.CHECKPOINT_EVERY commits, so the property only serves the
# writers that run without a stream (a rebuild, a backfill).
STREAM_CHECKPOINT_INTERVAL = 100

RAW_ARCHIVE = TableSpec(
    name="raw_archive",
    columns=(
        ("topic", "STRING"),
        ("partition", "INT"),
        ("offset", "BIGINT"),
        ("kafka_timestamp", "TIMESTAMP"),
        ("event_time", "TIMESTAMP"),
        ("window_start", "TIMESTAMP"),
        ("key", "BINARY"),
        ("value", "BINARY"),
        ("ingest_time", "TIMESTAMP"),
        ("valid", "BOOLEAN"),
        ("reason", "STRING"),
        ("counted", "BOOLEAN"),
        ("rules_version", "STRING"),
        ("batch_id", "BIGINT"),
        ("source", "STRING"),
        ("event_hour", "STRING"),
    ),
    # Partitioned by the hour of the window the record counts in: recomputing
    # a window reads one partition; finding an interval's late rows relies on
    # per-file min/max statistics of ingest_time (files are written per batch,
    # so their ingest_time ranges are narrow and skipping is effective).
    partitioned_by=("event_hour",),
    properties=(("delta.checkpointInterval", str(STREAM_CHECKPOINT_INTERVAL)),),
    comment="Every consumed Kafka record exactly once (topic, partition, offset).",
)

# The tables the stream MERGEs into every micro-batch (window_counts, summaries), partitioned by the UTC date and
# hour of window_start. Deletion vectors make a MERGE mark the rows it changes in the files that hold them and
# write only the batch's rows, instead of rewriting every touched file: with one file per partition, each
# micro-batch rewrote the whole day's counts so far, a cost that grew all day (benchmarks/PERF_NOTES.md, ninth
# pass). New files then cover the batch's few seconds of windows, so data skipping on window_start keeps a
# MERGE's reads to the last minute's files; the hour lets the batch layer compact closed hours during the day
# (kdq.spark.maintenance.compact_closed_hours) without touching the files the stream reads.
# Between those compactions the open hour gets one small file per micro-batch, and every reader of the day (SQL,
# the page, the expectations run, the summaries' MERGE over its 30-minute lateness) opened them all: Delta's auto
# compaction (a post-commit hook of the writer's own commit) folds an hour's small files into one whenever it holds
# AUTO_COMPACT_MIN_FILES of them. It touches only the partitions the commit wrote, a failure of it is logged and
# never fails the write, and a conflict with another writer of that hour leaves the files for the next commit.
# The stream's own writes turn it off and compact the same way between micro-batches (kdq.spark.stream_upkeep).
WINDOW_PARTITIONS = ("window_date", "window_hour")
WINDOW_TABLE_PROPERTIES = (
    ("delta.enableDeletionVectors", "true"),
    ("delta.autoOptimize.autoCompact", "true"),
    ("delta.checkpointInterval", str(STREAM_CHECKPOINT_INTERVAL)),
)
AUTO_COMPACT_MIN_FILES = 10  # spark.databricks.delta.autoCompact.minNumFiles (Delta's default: 50)

# Table property of window_counts: the stream.window_seconds its windows were counted with (kdq.spark.tables).
WINDOW_SECONDS_PROPERTY = "kdq.window_seconds"

WINDOW_COUNTS = TableSpec(
    name="window_counts",
    columns=(
        ("topic", "STRING"),
        ("window_start", "TIMESTAMP"),
        ("window_end", "TIMESTAMP"),
        ("status", "STRING"),
        ("count", "BIGINT"),
        ("updated_at", "TIMESTAMP"),
        ("updated_by", "STRING"),
        ("rules_version", "STRING"),
        ("window_date", "DATE"),
        ("window_hour", "INT"),
    ),
    partitioned_by=WINDOW_PARTITIONS,
    properties=WINDOW_TABLE_PROPERTIES,
    comment="Absolute valid/invalid counts per (topic, window_start, status).",
)

INVALID_REASONS = TableSpec(
    name="invalid_reasons",
    columns=(
        ("topic", "STRING"),
        ("window_start", "TIMESTAMP"),
        ("reason", "STRING"),
        ("count", "BIGINT"),
        ("batch_id", "BIGINT"),
        ("updated_at", "TIMESTAMP"),
    ),
    # Appended increments (one row per batch, topic, coarse window and reason),
    # summed by the invalid_reason_counts view: an append costs a fraction of a
    # MERGE, and this table is a diagnostic breakdown, not the counted truth.
    comment="Invalid-message increments per (topic, coarse window, reason); query the invalid_reason_counts view.",
)

RETIRED_COUNTS = TableSpec(
    name="retired_counts",
    columns=(
        ("topic", "STRING"),
        ("window_start", "TIMESTAMP"),
        ("status", "STRING"),
        ("count", "BIGINT"),
        ("rules_version", "STRING"),
        ("event_hour", "STRING"),
        # The retirement covered this hour's archive rows ingested before this instant (and at or after
        # the hour's previous retirement): kdq.spark.retention.
        ("retired_before", "TIMESTAMP"),
        ("retired_at", "TIMESTAMP"),
    ),
    # Archive retention deletes raw rows; the counts they made stay here, so a window that gets a
    # late record after its hour was deleted is recomputed as retired + archived, never as a partial count.
    comment="Valid/invalid counts of archive rows deleted by retention, per (topic, window, status) and retirement.",
)

# Views registered in every session next to the tables; {db}, {coarse_ms} (stream.reasons_window_seconds
# in millis) and {per_window} (stream.quarantine_per_window) are filled in from the typed config.
VIEWS: tuple[tuple[str, str], ...] = (
    (
        "invalid_reason_counts",
        "SELECT topic, window_start, reason, SUM(count) AS count, MAX(updated_at) AS updated_at "
        "FROM {db}.invalid_reasons GROUP BY topic, window_start, reason",
    ),
    # Examples of invalid messages: the first (partition, offset) ones per topic, reasons window and reason,
    # read from the raw archive (which holds every record once) instead of a copy written per micro-batch.
    # event_hour is in the sample's partitioning (a reasons window never spans two hours), so a filter on
    # topic or event_hour prunes the archive's partitions before the ranking.
    (
        "invalid_samples",
        "SELECT topic, partition, offset, window_start, reason, value_preview, value_bytes, ingest_time, batch_id, "
        "event_hour FROM (SELECT topic, partition, offset, "
        "timestamp_millis(div(unix_millis(window_start), {coarse_ms}) * {coarse_ms}) AS window_start, reason, "
        "substring(CAST(value AS STRING), 1, 512) AS value_preview, CAST(length(value) AS BIGINT) AS value_bytes, "
        "ingest_time, batch_id, event_hour, row_number() OVER (PARTITION BY topic, event_hour, "
        "div(unix_millis(window_start), {coarse_ms}), reason ORDER BY partition, offset) AS sample_rank "
        "FROM {db}.raw_archive WHERE NOT valid) WHERE sample_rank <= {per_window}",
    ),
)

CORRECTIONS = TableSpec(
    name="corrections",
    columns=(
        ("topic", "STRING"),
        ("window_start", "TIMESTAMP"),
        ("status", "STRING"),
        ("old_count", "BIGINT"),
        ("new_count", "BIGINT"),
        ("interval_start", "TIMESTAMP"),
        ("interval_end", "TIMESTAMP"),
        ("run_id", "STRING"),
        ("reason", "STRING"),
        ("corrected_at", "TIMESTAMP"),
    ),
    comment="Every change the batch layer made to window_counts.",
)

# Streaming summaries (kdq.summaries, kdq.spark.summaries).

SUMMARIES = TableSpec(
    name="summaries",
    columns=(
        ("summary", "STRING"),
        ("topic", "STRING"),
        ("window_start", "TIMESTAMP"),
        ("window_end", "TIMESTAMP"),
        # Canonical JSON of the group values in the configured order: the MERGE key
        # (a map cannot be compared or grouped on); `groups` is the same for SQL users.
        ("group_key", "STRING"),
        ("groups", "MAP<STRING, STRING>"),
        # The mergeable state ...
        ("count", "BIGINT"),
        ("sum", "DOUBLE"),
        ("sum_sq", "DOUBLE"),
        ("min", "DOUBLE"),
        ("max", "DOUBLE"),
        ("hist", "MAP<DOUBLE, BIGINT>"),
        ("rejected", "MAP<STRING, BIGINT>"),
        # ... and what is derived from it, recomputed by every write (kdq.spark.summaries.derived_sql).
        ("mean", "DOUBLE"),
        ("stddev", "DOUBLE"),
        ("percentiles", "MAP<STRING, DOUBLE>"),
        ("precision", "STRING"),
        ("updated_at", "TIMESTAMP"),
        ("updated_by", "STRING"),
        ("window_date", "DATE"),
        ("window_hour", "INT"),
    ),
    partitioned_by=WINDOW_PARTITIONS,
    properties=WINDOW_TABLE_PROPERTIES,
    comment="Per (summary, topic, window, group): count, sum, sum of squares, min, max, bucket histogram; statistics.",
)

SUMMARY_LATE_WINDOWS = TableSpec(
    name="summary_late_windows",
    columns=(
        ("summary", "STRING"),
        ("topic", "STRING"),
        ("window_start", "TIMESTAMP"),
        ("rows", "BIGINT"),
        ("ingest_time", "TIMESTAMP"),
        ("batch_id", "BIGINT"),
    ),
    # The archive's `counted` flag is about the count windows; a summary has its own window
    # size and lateness, so the stream records here which summary windows it left to the
    # batch layer (appended once per micro-batch, only when there are any).
    comment="Summary windows that received records too late for the speed layer (for the hourly batch layer).",
)

SUMMARY_CORRECTIONS = TableSpec(
    name="summary_corrections",
    columns=(
        ("summary", "STRING"),
        ("topic", "STRING"),
        ("window_start", "TIMESTAMP"),
        ("group_key", "STRING"),
        ("old_count", "BIGINT"),
        ("new_count", "BIGINT"),
        ("old_stats", "STRING"),
        ("new_stats", "STRING"),
        ("interval_start", "TIMESTAMP"),
        ("interval_end", "TIMESTAMP"),
        ("run_id", "STRING"),
        ("reason", "STRING"),
        ("corrected_at", "TIMESTAMP"),
    ),
    comment="Every change the batch layer made to summaries (statistics before and after as JSON).",
)

# Expectations and incidents (kdq.expectations, kdq.incidents), written by spark_jobs/evaluate_expectations.py:
# one row per incident, MERGEd on incident_key guarded by version (kdq.spark.expectations).
INCIDENTS = TableSpec(
    name="incidents",
    columns=(
        ("incident_key", "STRING"),  # topic|expectation|first window as first seen (kdq.incidents.incident_key)
        ("topic", "STRING"),  # "(stream)" for the stream's latency and lag
        ("expectation", "STRING"),  # invalid_ratio, silence, reason_count:<reason>, anomaly:spike, ...
        ("status", "STRING"),  # open | resolved | retracted
        ("window_start", "TIMESTAMP"),  # the windows whose counts are behind it (sliding periods included)
        ("window_end", "TIMESTAMP"),
        ("first_window", "TIMESTAMP"),  # first and last violated minute
        ("last_window", "TIMESTAMP"),
        ("worst_value", "DOUBLE"),
        ("threshold", "DOUBLE"),
        ("level", "INT"),  # worsen_at levels passed
        ("final", "BOOLEAN"),  # every violated minute is past its allowed lateness
        ("resolved_window", "TIMESTAMP"),  # the minute whose clear verdict resolved it
        ("opened_at", "TIMESTAMP"),  # first seen (evaluation time)
        ("last_seen_at", "TIMESTAMP"),
        ("updated_at", "TIMESTAMP"),
        ("version", "BIGINT"),  # counts its changes; the notifier's idempotency key with incident_key
        ("sample", "STRING"),  # a sample of invalid values where it applies (from invalid_samples)
    ),
    comment="One row per incident of an expectation (kdq.incidents), updated in place, versioned.",
)

INCIDENT_NOTIFICATIONS = TableSpec(
    name="incident_notifications",
    columns=(
        ("notification_id", "STRING"),  # <incident_key>#v<version>:<event> (kdq.incidents.Notification.id)
        ("incident_key", "STRING"),
        ("version", "BIGINT"),
        ("event", "STRING"),  # open | worsen | resolve | amend | retract
        ("topic", "STRING"),
        ("expectation", "STRING"),
        ("payload", "STRING"),  # the incident row as of this change, JSON (what every channel sends)
        ("created_at", "TIMESTAMP"),
    ),
    # The outbox: inserted once per id (a re-run derives the same ids), before the incident rows that caused
    # them, so a crash between the two re-derives and re-inserts nothing new.
    comment="Notifications of incident changes, one row per notification id (the notifier's outbox).",
)

INCIDENT_DELIVERIES = TableSpec(
    name="incident_deliveries",
    columns=(
        ("notification_id", "STRING"),
        ("channel", "STRING"),  # the channel's name (kdq.notify)
        ("sent_at", "TIMESTAMP"),
        ("attempts", "INT"),  # tries of the run that delivered it
    ),
    comment="Which notification each channel has delivered (one row per id and channel): sent once.",
)

INCIDENT_TABLES: tuple[TableSpec, ...] = (INCIDENTS, INCIDENT_NOTIFICATIONS, INCIDENT_DELIVERIES)

SUMMARY_TABLES: tuple[TableSpec, ...] = (SUMMARIES, SUMMARY_LATE_WINDOWS, SUMMARY_CORRECTIONS)

ALL_TABLES: tuple[TableSpec, ...] = (
    RAW_ARCHIVE,
    WINDOW_COUNTS,
    INVALID_REASONS,
    CORRECTIONS,
    RETIRED_COUNTS,
    *SUMMARY_TABLES,
    *INCIDENT_TABLES,
)
