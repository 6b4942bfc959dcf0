"""The batch layer's part of the streaming summaries: the hourly recompute and the rebuild.

:func:`recompute_summaries` and :func:`rebuild_summaries` recompute the
absolute state of whole (summary, topic, window)s from every archived row of
the window, compare with the table (counts, extremes, histograms and
rejections exactly, sums up to rounding: the summation order differs), and
for each changed group append a ``summary_corrections`` row and MERGE the new
state (a group that no longer has records is deleted), with the
record-then-apply protocol of :mod:`kdq.spark.corrections` on the two summary
tables. Since a topic's watermark only moves forward, a window the stream
recorded in ``summary_late_windows`` is never touched by the stream again, so
the batch layer sets its absolute state without racing a micro-batch.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq.config import Config, SummaryConfig
from kdq.job_reports import SummariesRecomputeReport
from kdq.rules import RuleSet, load_rules
from kdq.spark.corrections import latest_attempt, record_then_apply
from kdq.spark.summaries.outputs import push_summary_corrections
from kdq.spark.summaries.store import check_limits, merge_absolute, read_states
from kdq.spark.summaries.transforms import KEY, active_summaries, key_of, state_entry, summary_states, summary_values
from kdq.spark.tables import table_path
from kdq.spark.writers import append_once, is_stale_read, retry_on_conflict
from kdq.summaries import SummaryState, same_state, statistics
from kdq.tables import SUMMARIES, SUMMARY_CORRECTIONS, SUMMARY_LATE_WINDOWS

if TYPE_CHECKING:
    from kdq.spark.stream_cut import StreamCut

STALE_READ_ATTEMPTS = 5  # reads of the stored states a recompute takes while other writers keep changing them

log = logging.getLogger("kdq.summaries")


def _window_hours(config: Config, windows: Iterable[tuple[str, str, int]]) -> list[str]:
    """``event_hour`` partitions of every count window inside the given summary windows."""
    from kdq.windows import HOUR_MS, event_hour

    hours = set()
    for summary, _, w in windows:
        size = config.summary(summary).window_seconds * 1000
        hours.update(event_hour(ms) for ms in range(w // HOUR_MS * HOUR_MS, w + size, HOUR_MS))
    return sorted(hours)


def _without_retired_hours(
    spark: SparkSession, config: Config, windows: Sequence[tuple[str, str, int]]
) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]:
    """(windows whose archive hours are all whole, windows with an hour archive retention retired)."""
    from kdq.spark.retention import read_retired, retired_hours

    if not windows:
        return list(windows), []
    retired = set(retired_hours(read_retired(spark, config), _window_hours(config, windows)))
    if not retired:
        return list(windows), []
    whole, kept = [], []
    for window in windows:
        (kept if retired.intersection(_window_hours(config, [window])) else whole).append(window)
    return whole, kept


def _wanted(spark: SparkSession, windows: Iterable[tuple[str, str, int]]) -> DataFrame:
    return spark.createDataFrame(sorted(set(windows)), "summary STRING, topic STRING, window_start_ms BIGINT")


def _collect_states(states: DataFrame) -> dict[tuple, dict]:
    out = {}
    for row in states.collect():
        r = row.asDict()
        out[key_of(r)] = state_entry(r)
    return out


def late_summary_windows(spark: SparkSession, config: Config, interval: tuple[int, int]) -> list[tuple[str, str, int]]:
    """(summary, topic, window_start_ms) the stream left to the batch layer, for records ingested in [start, end).

    The windows ``summary_late_windows`` recorded, plus the summary windows of
    archive rows another job loaded (``source <> 'stream'``): the stream never
    saw those. Summaries no longer configured are skipped.
    """
    from kdq.tables import RAW_ARCHIVE

    start_ms, end_ms = interval
    in_interval = (F.col("ingest_time") >= F.timestamp_millis(F.lit(start_ms))) & (
        F.col("ingest_time") < F.timestamp_millis(F.lit(end_ms))
    )
    names = {s.name for s in config.summaries}
    marked = (
        spark.read.format("delta")
        .load(table_path(config, SUMMARY_LATE_WINDOWS))
        .where(in_interval)
        .select("summary", "topic", F.unix_millis("window_start").alias("w"))
        .distinct()
        .collect()
    )
    windows = {(r["summary"], r["topic"], int(r["w"])) for r in marked if r["summary"] in names}
    loaded = (
        spark.read.format("delta")
        .load(table_path(config, RAW_ARCHIVE))
        .where(in_interval & (F.coalesce(F.col("source"), F.lit("")) != "stream"))
        .select("topic", F.unix_millis("window_start").alias("w"))
        .distinct()
        .collect()
    )
    for row in loaded:
        for s in config.summaries:
            if s.matches(row["topic"]):
                size = s.window_seconds * 1000
                windows.add((s.name, row["topic"], int(row["w"]) // size * size))
    return sorted(windows)


def recompute_states(spark: SparkSession, config: Config, archive: DataFrame, windows: Sequence[tuple[str, str, int]]) -> dict[tuple, dict]:
    """Absolute states of whole (summary, topic, window)s from every archived row of them.

    Reads only the ``event_hour`` partitions the windows span; uses the
    archived classification (``valid``) and the stream's own transforms.
    """
    if not windows:
        return {}
    summaries = [config.summary(name) for name in sorted({s for s, _, _ in windows})]
    topics = sorted({t for _, t, _ in windows})
    rows = archive.where(F.col("event_hour").isin(_window_hours(config, windows)) & F.col("topic").isin(topics))
    return _states_of(spark, rows.select("topic", "window_start", "valid", "value"), summaries, windows,
                      load_rules(config.rules_dir))


def _states_of(
    spark: SparkSession, rows: DataFrame, summaries: Sequence[SummaryConfig], windows, rules: RuleSet | None = None
) -> dict[tuple, dict]:
    """``rules``: the topics' rules (registry-backed topics' values are read from their decoded records)."""
    values = summary_values(rows, summaries, rules=rules).join(
        F.broadcast(_wanted(spark, windows)), ["summary", "topic", "window_start_ms"], "left_semi"
    )
    return _collect_states(summary_states(values))


def diff_states(
    windows: Iterable[tuple[str, str, int]], new: Mapping[tuple, dict], stored: Mapping[tuple, dict]
) -> list[dict]:
    """Groups of the given windows whose recomputed state differs from the stored one (see same_state).

    A stored group the recomputation no longer has changes to the empty state
    (its row is deleted). Each change carries the stored group it replaces (``old_state``, ``old_updated_us``;
    None: no row), which :func:`~kdq.spark.summaries.store.merge_absolute` checks is still stored.
    """
    wanted = set(windows)
    changes = []
    for key in sorted(set(new) | set(stored), key=lambda k: (k[0], k[1], k[2], k[3])):
        if key[:3] not in wanted:
            continue
        old = stored[key]["state"] if key in stored else SummaryState()
        entry = new.get(key) or {**stored[key], "state": SummaryState()}
        if not same_state(old, entry["state"]):
            changes.append({**entry, "old_state": old, "old_updated_us": stored[key]["updated_us"] if key in stored else None})
    return changes


_ORDER_SENSITIVE = ("sum", "mean", "stddev")  # float sums: their last digits depend on the summation order


def _stats_json(config: Config, summary: str, state: SummaryState) -> str:
    return json.dumps(statistics(state, config.summary(summary).percentiles), separators=(",", ":"))


def _attempt_key(r: Mapping) -> tuple:
    exact = {k: v for k, v in json.loads(r["new_stats"]).items() if k not in _ORDER_SENSITIVE}
    return (r["summary"], r["topic"], int(r["window_start_ms"]), r["group_key"], int(r["old_count"]), int(r["new_count"]), json.dumps(exact, sort_keys=True))


def _correction_rows(config: Config, changes: Sequence[dict]) -> list[dict]:
    return [
        {
            **{k: c[k] for k in KEY},
            "old_count": c["old_state"].count,
            "new_count": c["state"].count,
            "old_stats": _stats_json(config, c["summary"], c["old_state"]),
            "new_stats": _stats_json(config, c["summary"], c["state"]),
        }
        for c in changes
    ]


def _recorded_attempt(spark: SparkSession, config: Config, interval: tuple[int, int], reasons: Sequence[str] | None = None) -> set[tuple]:
    """The correction rows of the latest attempt for this interval (see kdq.spark.corrections)."""
    table = spark.read.format("delta").load(table_path(config, SUMMARY_CORRECTIONS)).where(
        (F.col("interval_start") == F.timestamp_millis(F.lit(interval[0])))
        & (F.col("interval_end") == F.timestamp_millis(F.lit(interval[1])))
    )
    if reasons:
        table = table.where(F.col("reason").isin(list(reasons)))
    rows = table.select(
        "summary", "topic", F.unix_millis("window_start").alias("window_start_ms"), "group_key", "old_count",
        "new_count", "new_stats", "corrected_at",
    )
    return latest_attempt(rows, _attempt_key)


def _append_corrections(
    spark: SparkSession, config: Config, rows: Sequence[dict], run_id: str, interval: tuple[int, int], reason: str,
    app_id: str, version: int,
) -> None:
    df = spark.createDataFrame(
        [(r["summary"], r["topic"], int(r["window_start_ms"]), r["group_key"], r["old_count"], r["new_count"],
          r["old_stats"], r["new_stats"]) for r in rows],
        "summary STRING, topic STRING, window_start_ms BIGINT, group_key STRING, old_count BIGINT, new_count BIGINT, "
        "old_stats STRING, new_stats STRING",
    )
    rows = df.select(
        "summary", "topic", F.timestamp_millis("window_start_ms").alias("window_start"), "group_key",
        "old_count", "new_count", "old_stats", "new_stats",
        F.timestamp_millis(F.lit(interval[0])).alias("interval_start"),
        F.timestamp_millis(F.lit(interval[1])).alias("interval_end"),
        F.lit(run_id).alias("run_id"), F.lit(reason).alias("reason"), F.current_timestamp().alias("corrected_at"),
    )
    append_once(rows, table_path(config, SUMMARY_CORRECTIONS), app_id, version)


def apply_summary_corrections(
    spark: SparkSession, config: Config, changes: Sequence[dict], run_id: str, interval: tuple[int, int], reason: str,
    app_id: str, stale_reads: bool = True,
) -> list[dict]:
    """Record ``changes`` in summary_corrections, then MERGE the new absolute states, once per version.

    The protocol of :func:`kdq.spark.batch_layer.apply_corrections` on the two
    summary tables (their own idempotent-write versions for ``app_id``): an
    attempt that recorded its corrections and died before the MERGE is
    completed with the same version when the recomputation still gives the
    same changes (compared without the float sums, whose last digits depend on
    the summation order), else recorded again under a new version.
    """
    if not changes:
        return []
    rows = _correction_rows(config, changes)

    retry_on_conflict(
        lambda: record_then_apply(
            spark,
            table_path(config, SUMMARY_CORRECTIONS),
            table_path(config, SUMMARIES),
            app_id,
            (_attempt_key(r) for r in rows),
            lambda: _recorded_attempt(spark, config, interval, [reason]),
            lambda v: _append_corrections(spark, config, rows, run_id, interval, reason, app_id, v),
            lambda v: merge_absolute(spark, config, changes, app_id, v),
            "summary correction",
        ),
        "summary corrections",
        stale_reads=stale_reads,
    )
    return rows


def interval_summary_corrections(spark: SparkSession, config: Config, interval: tuple[int, int]) -> list[tuple]:
    """KEY of every summary correction ever recorded for this interval."""
    rows = (
        spark.read.format("delta")
        .load(table_path(config, SUMMARY_CORRECTIONS))
        .where(
            (F.col("interval_start") == F.timestamp_millis(F.lit(interval[0])))
            & (F.col("interval_end") == F.timestamp_millis(F.lit(interval[1])))
        )
        .select("summary", "topic", F.unix_millis("window_start").alias("w"), "group_key")
        .distinct()
        .collect()
    )
    names = {s.name for s in config.summaries}
    return sorted((r["summary"], r["topic"], int(r["w"]), r["group_key"]) for r in rows if r["summary"] in names)


def recompute_summaries(
    spark: SparkSession,
    config: Config,
    interval: tuple[int, int],
    run_id: str,
    reason: str = "late_data",
    push: bool = True,
) -> SummariesRecomputeReport:
    """The summaries' part of the hourly recompute for one ingest-time interval: the ``summaries`` part of the
    recompute report (:class:`kdq.job_reports.SummariesRecomputeReport`).

    Same interval and app id (``kdq-batch-<interval start>``) as the counts' corrections, and the same
    record-then-apply protocol, on the summaries' own tables; :func:`kdq.spark.recompute.recompute_interval`
    runs it after the counts. Idempotent: re-running an interval finds the states equal and writes
    nothing; the push re-sends every group this interval ever corrected.
    """
    from kdq.intervals import batch_app_id
    from kdq.spark.tables import ensure_tables
    from kdq.tables import RAW_ARCHIVE

    result = SummariesRecomputeReport()
    if not config.summaries:
        return result
    ensure_tables(spark, config)
    windows = late_summary_windows(spark, config, interval)
    result.late_windows = len(windows)
    windows, kept = _without_retired_hours(spark, config, windows)
    if kept:
        # Summary states are not retired with the archive (kdq.spark.retention): recomputing these
        # from what is left would replace a full state with a partial one, so the stored one stays.
        log.warning(
            "%d summary window(s) got late records after archive retention deleted their hours; "
            "their stored states are kept (not recomputed): %s", len(kept), kept[:10],
        )
        result.retired_windows_kept = len(kept)
    if windows:
        archive = spark.read.format("delta").load(table_path(config, RAW_ARCHIVE))
        new = recompute_states(spark, config, archive, windows)
        check_limits(config, {c_key: c for c_key, c in new.items()})
        for attempt in range(1, STALE_READ_ATTEMPTS + 1):
            changes = diff_states(windows, new, read_states(spark, config, windows))
            try:
                rows = apply_summary_corrections(
                    spark, config, changes, run_id, interval, reason, batch_app_id(interval[0]), stale_reads=False)
                break
            except Exception as exc:
                # The stream never adds to a late window again (kdq.spark.batch_layer, "why the recompute cannot
                # race the stream"), but another absolute writer (a rebuild) may have set it since the read.
                if attempt == STALE_READ_ATTEMPTS or not is_stale_read(exc):
                    raise
                log.warning("summaries recompute: a stored state changed since it was read (attempt %d); reading again",
                            attempt)
        result.corrections = len(rows)
        result.changes = [{k: r[k] for k in (*KEY, "old_count", "new_count")} for r in rows[:100]]
    if push:
        pushed = push_summary_corrections(spark, config, interval_summary_corrections(spark, config, interval))
        result.push = pushed.to_dict()
        result.ok = pushed.influx_ok
    return result


def rebuild_summaries(
    spark: SparkSession,
    config: Config,
    archive: DataFrame,
    selected: DataFrame,
    reclassified: DataFrame,
    from_ms: int,
    to_ms: int,
    topics: Sequence[str] | None,
    run_id: str,
    app_id: str,
    cut: StreamCut,
) -> list[dict]:
    """Recompute every summary window with records in [from, to) after reclassification (see kdq.spark.rebuild).

    Records of the range count with their new classification (and possibly
    new window); records of the same summary windows outside the range with
    their archived one. Stored windows overlapping the range are recomputed
    too, so a state the archive no longer supports is corrected.
    Corrections have reason ``rebuild`` and interval (from, to).

    Beside the running stream it reads through the rebuild's ``cut`` (:mod:`kdq.spark.stream_cut`): the stored
    states at ``cut.summaries_version``, the rows ``cut.summary_rows()`` keeps (``archive``, ``selected`` and
    ``reclassified`` are the counts' rows of that cut: the stream's uncounted rows of later batches are dropped
    here). A state the stream changed since is caught by the write's compare-and-set: the
    :data:`~kdq.spark.writers.STALE_READ` error reaches the rebuild, which starts over from a new cut.
    """
    if not config.summaries or (topics and not active_summaries(config, topics)):
        return []  # no summary on the rebuilt topics: nothing to read
    if cut.excluded_from_ms is not None:
        held = cut.summary_rows()
        later = selected.where(~held).select("topic", "partition", "offset")
        archive, selected = archive.where(held), selected.where(held)
        reclassified = reclassified.join(later, ["topic", "partition", "offset"], "left_anti")
    found = set()
    moved = selected.select("topic", "window_start").union(reclassified.select("topic", "window_start")).distinct()
    for row in moved.select("topic", F.unix_millis("window_start").alias("w")).collect():
        for s in config.summaries:
            if s.matches(row["topic"]):
                size = s.window_seconds * 1000
                found.add((s.name, row["topic"], int(row["w"]) // size * size))
    names = {s.name for s in config.summaries}
    max_size = max(s.window_seconds for s in config.summaries) * 1000
    stored = (
        spark.read.format("delta")
        .option("versionAsOf", int(cut.summaries_version))
        .load(table_path(config, SUMMARIES))
        .where((F.col("window_start") < F.timestamp_millis(F.lit(to_ms))) & (F.col("window_end") > F.timestamp_millis(F.lit(from_ms))))
        .where(F.col("window_start") >= F.timestamp_millis(F.lit(from_ms - max_size)))
        .where(F.lit(True) if not topics else F.col("topic").isin(list(topics)))
        .select("summary", "topic", F.unix_millis("window_start").alias("w"))
        .distinct()
        .collect()
    )
    found.update((r["summary"], r["topic"], int(r["w"])) for r in stored if r["summary"] in names)
    windows = sorted(found)
    if not windows:
        return []
    in_range = (F.col("window_start") >= F.timestamp_millis(F.lit(from_ms))) & (F.col("window_start") < F.timestamp_millis(F.lit(to_ms)))
    topic_list = sorted({t for _, t, _ in windows})
    outside = archive.where(F.col("event_hour").isin(_window_hours(config, windows)) & F.col("topic").isin(topic_list) & ~in_range)
    columns = ("topic", "window_start", "valid", "value")
    rows = reclassified.select(*columns).unionByName(outside.select(*columns))
    summaries = [config.summary(name) for name in sorted({s for s, _, _ in windows})]
    new = _states_of(spark, rows, summaries, windows, load_rules(config.rules_dir))
    changes = diff_states(windows, new, read_states(spark, config, windows, cut.summaries_version))
    return apply_summary_corrections(
        spark, config, changes, run_id, (int(from_ms), int(to_ms)), "rebuild", app_id, stale_reads=False)
