"""The speed layer's part of the streaming summaries: one call per micro-batch, after the window-count MERGE.

The batch's states are increments. Like the counts, they are MERGEd into the
``summaries`` table under Delta's idempotent-write guard (txnAppId = the
stream's app id, txnVersion = the batch id: Delta keeps one version per app
id *per table*, so the guard is independent of the other tables'), adding
counts, sums and histograms (``map_zip_with``) and taking least/greatest for
min/max. Before writing, the current rows of the touched windows are read:
the merged state is checked against the size limits (a violation stops the
batch, naming the summary, window, group and setting, before anything is
written) and is what the metrics topic and InfluxDB receive. When Delta's log
shows the batch already applied (a replay after a crash) the MERGE is skipped
and the rows read *are* the absolute state, so the outputs are re-sent
unchanged.

Records too late for their (summary, topic, window) are left out and their
windows recorded in ``summary_late_windows`` for the batch layer
(:mod:`kdq.spark.summaries.batch`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq.config import Config
from kdq.rules import RuleSet
from kdq.spark.summaries.outputs import publish
from kdq.spark.summaries.store import check_limits, merge_increments, read_states
from kdq.spark.summaries.transforms import active_summaries, key_of, state_entry, summary_states, summary_values
from kdq.spark.tables import table_path
from kdq.spark.writers import append_once, txn_version
from kdq.summaries import SummaryState, merge
from kdq.tables import SUMMARIES, SUMMARY_LATE_WINDOWS

log = logging.getLogger("kdq.summaries")


def append_late_windows(
    spark: SparkSession, config: Config, rows: Sequence[Mapping], app_id: str, batch_id: int, ingest_ms: int
) -> None:
    """Record the (summary, topic, window)s this batch left to the batch layer, once per (app id, batch)."""
    if not rows:
        return
    df = spark.createDataFrame(
        [(r["summary"], r["topic"], int(r["window_start_ms"]), int(r["rows"])) for r in rows],
        "summary STRING, topic STRING, window_start_ms BIGINT, rows BIGINT",
    )
    late_windows = (
        df.groupBy("summary", "topic", "window_start_ms")
        .agg(F.sum("rows").alias("rows"))
        .select(
            "summary",
            "topic",
            F.timestamp_millis("window_start_ms").alias("window_start"),
            "rows",
            F.timestamp_millis(F.lit(int(ingest_ms))).alias("ingest_time"),
            F.lit(int(batch_id)).cast("bigint").alias("batch_id"),
        )
    )
    append_once(late_windows, table_path(config, SUMMARY_LATE_WINDOWS), app_id, batch_id)


def stream_summaries(
    spark: SparkSession,
    config: Config,
    classified: DataFrame,
    watermarks: Mapping[str, int],
    app_id: str,
    batch_id: int,
    ingest_ms: int,
    topics: Iterable[str],
    producer: Any = None,
    on_influx_failure: Callable[[int, str], None] | None = None,
    replayed: bool = True,
    lap: Callable[[str], None] = lambda step: None,
    rules: RuleSet | None = None,
    states: list[dict] | None = None,
) -> dict[str, int]:
    """One micro-batch of every summary on the batch's topics (see the module doc); returns counts for the report.
    ``spark``: the session of the summaries table's reads and writes (the speed layer passes its small-query
    session; ``classified`` keeps its own).
    ``rules``: the stream's rules (registry-backed topics' values are read from their decoded records).
    ``states``: the batch's :func:`summary_states` rows when they were computed already (the speed layer observes
    them in its archive pass: :func:`~kdq.spark.summaries.transforms.summary_states_metric`); else they are
    computed here from ``classified``.

    ``watermarks`` are the per-topic maximum event times *before* the batch
    (the ledger's ``max_event_ms_before``), ``topics`` the batch's topics:
    a batch without a summary topic costs nothing. ``replayed`` False (the
    batch's ledger entry was written by this attempt) skips the look into
    Delta's log: a first attempt cannot have been applied. ``lap(step)`` is called after each
    step (``summary_states``, ``summary_read``, ``summary_merge``, ``summary_late``, ``summary_outputs``): the
    micro-batch report's breakdown.
    """
    summaries = active_summaries(config, topics)
    report = {"summary_groups": 0, "summary_late_rows": 0}
    if not summaries:
        return report
    if states is None:
        values = summary_values(classified.select("topic", "window_start", "valid", "value"), summaries, watermarks, rules)
        states = [r.asDict() for r in summary_states(values).collect()]
    rows = states
    late = [r for r in rows if r["late"]]
    increments = [state_entry(r) for r in rows if not r["late"]]
    lap("summary_states")
    report["summary_late_rows"] = sum(int(r["rows"]) for r in late)
    absolute: dict[tuple, dict] = {}
    if increments:
        existing = read_states(spark, config, {(r["summary"], r["topic"], r["window_start_ms"]) for r in increments})
        lap("summary_read")
        applied = replayed and txn_version(spark, table_path(config, SUMMARIES), app_id) >= batch_id
        if applied:
            # Delta already holds this batch: what was read is the absolute state.
            absolute = dict(existing)
        else:
            absolute = dict(existing)
            for r in increments:
                key = key_of(r)
                before = existing.get(key, {}).get("state", SummaryState())
                absolute[key] = {**r, "state": merge(before, r["state"])}
            check_limits(config, absolute)
            merge_increments(spark, config, increments, app_id, batch_id)
    lap("summary_merge")
    append_late_windows(spark, config, late, app_id, batch_id, ingest_ms)
    lap("summary_late")
    changed = [absolute[key_of(r)] for r in increments if key_of(r) in absolute]
    report["summary_groups"] = len(changed)
    _, influx_error = publish(config, changed, producer=producer)
    if influx_error is not None:
        log.error("InfluxDB push of %d summary groups failed for batch %d: %s", len(changed), batch_id, influx_error)
        if on_influx_failure is not None:
            on_influx_failure(ingest_ms, str(influx_error)[:500])
    lap("summary_outputs")
    return report
