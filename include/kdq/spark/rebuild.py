"""Rebuild: re-classify archived records with the *current* rules and correct their windows.

After a rule change (or a bug fix in the classifier) the stored counts were
computed with another rules version. A rebuild covers a window range
``[from, to)`` of event time and a set of topics (default: every topic):

1. :func:`rebuild_selection` — every archive row whose ``window_start`` is in
   the range, read from the range's ``event_hour`` partitions only.
2. :func:`reclassify` — the same :func:`kdq.spark.transforms.classify` the
   stream uses, on the archived raw key/value, with the archived
   ``ingest_time`` as ingest time (so ``future_timestamp`` is judged exactly as
   when the record arrived).
3. :func:`rebuild_counts` — absolute counts of the union of the old windows,
   the new windows (a changed event-time field can move a record to another
   window, possibly outside the range: such a window is recounted from its own
   archived rows plus the records that moved into it) and the windows
   ``window_counts`` holds in the range (a count the archive no longer
   supports goes to 0).
4. :func:`apply_rebuild` — MERGEs the differences into ``window_counts``
   (``updated_by = 'batch'``), one ``corrections`` row per changed (topic,
   window, status) with reason ``rule_change`` when the window's stored
   ``rules_version`` differs from the new one, else ``rebuild``. Windows whose
   counts are unchanged but whose ``rules_version`` is stale get the new
   version (no correction row: no number changed). Guarded by Delta's
   idempotent writes under app id ``kdq-rebuild-<from>-<to>``, the same
   protocol as :func:`kdq.spark.batch_layer.apply_corrections`.
5. :func:`correct_reasons` — ``invalid_reasons`` of the range's coarse
   windows set to the reasons of the re-judged records (adjustment rows).
6. :func:`update_archive` — the archive rows whose classification changed
   get the new ``event_time``, ``window_start``, ``event_hour``, ``valid``,
   ``reason`` and ``rules_version`` (a Delta MERGE on (topic, partition,
   offset) restricted to the range's ``event_hour`` partitions). This keeps
   the hourly recompute (which counts the archived ``valid`` flag) and the
   reconciliation check consistent with the rebuilt counts. The raw key,
   value, offsets, ``ingest_time``, ``counted`` and ``source`` never change.
   It runs *after* the counts: if the job dies in between, running it again
   re-selects the same records, finds the counts already equal, and finishes
   the archive update.

**Beside the running stream.** A rebuild sets absolute counts while the
stream may still add increments to the same windows. It reads through a
consistent cut (:mod:`kdq.spark.stream_cut`): the stored counts at one
``window_counts`` version, the archive and ``invalid_reasons`` without the
rows of the stream's micro-batches that version does not hold yet (their
MERGEs add them on top), and it writes with a compare-and-set (a stored count
changed since the cut makes the write fail and the rebuild start over from a
new cut, up to ``MAX_ATTEMPTS`` times). Windows the stream still counts get
the new rules for the records already counted; the stream's own later
batches count with the rules it runs with. The archive update rewrites only
the cut's rows. Both Delta MERGEs retry on a conflicting concurrent commit. The summaries of the range
(:func:`kdq.spark.summaries.rebuild_summaries`) go through the same cut: the stored states at the cut's
``summaries`` version, the stream's later rows left out, a compare-and-set at the write.

**Cost.** The range's archive partitions are read (twice: counts, then the
archive update); the touched windows' keys and counts are collected on the
driver (two rows per window at most), so very long ranges of 1-second windows
are best split (e.g. one day per run).

The corrections of a rebuild are recorded with ``interval_start = from`` and
``interval_end = to``; corrected windows are pushed to the metrics topic and
InfluxDB with :func:`kdq.spark.outputs.push_corrections`.

Finding stale windows after a rule change (``<current>`` is the topic's
version, :meth:`kdq.rules.RuleSet.version_for` of the loaded rules)::

    SELECT topic, MIN(window_start) AS first_stale, MAX(window_start) AS last_stale, COUNT(*) AS rows
    FROM kdq.window_counts
    WHERE topic = 'orders' AND rules_version <> '<current>'
    GROUP BY topic;

then rebuild that range::

    spark-submit spark_jobs/rebuild.py --from <first_stale> --to <last_stale + window> --topics orders
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq.config import Config
from kdq.intervals import iso
from kdq.job_reports import RebuildReport
from kdq.rules import RuleSet
from kdq.spark import batch_layer as bl
from kdq.spark import transforms
from kdq.spark.corrections import record_then_apply
from kdq.spark.outputs import push_corrections
from kdq.spark.recount import archive_rows_of
from kdq.spark.retention import read_retired, retired_hours
from kdq.spark.stream_cut import StreamCut, archive_at, counts_at, reasons_at, stream_cut
from kdq.spark.tables import table_path
from kdq.spark.writers import adjust_invalid_reasons, is_stale_read, retry_on_conflict
from kdq.sql_literals import date_literal, timestamp_literal
from kdq.tables import CORRECTIONS, RAW_ARCHIVE, WINDOW_COUNTS
from kdq.windows import range_dates, range_hours
from kdq.writers_journal import WAITS

log = logging.getLogger("kdq.rebuild")

REBUILD = "rebuild"
RULE_CHANGE = "rule_change"
MAX_ATTEMPTS = 10  # cuts a rebuild takes before giving up on a stream that keeps changing its windows
_RECLASSIFIED = ("event_time", "window_start", "valid", "reason", "rules_version", "event_hour")


def rebuild_app_id(from_ms: int, to_ms: int) -> str:
    return f"kdq-rebuild-{int(from_ms)}-{int(to_ms)}"


def _ts(ms: int):
    return F.timestamp_millis(F.lit(int(ms)))


def _topic_filter(topics: Sequence[str] | None):
    return F.lit(True) if not topics else F.col("topic").isin(list(topics))


def rebuild_selection(archive_df: DataFrame, from_ms: int, to_ms: int, topics: Sequence[str] | None) -> DataFrame:
    """Archived records (each once) of the windows in [from, to) of the given topics; only the range's
    partitions are read."""
    return transforms.one_row_per_record(
        archive_df.where(F.col("event_hour").isin(range_hours(from_ms, to_ms)))
        .where((F.col("window_start") >= _ts(from_ms)) & (F.col("window_start") < _ts(to_ms)))
        .where(_topic_filter(topics))
    )


def reclassify(selected: DataFrame, rules: RuleSet, config: Config) -> DataFrame:
    """Archive rows → classified rows with the current rules (classify's columns plus counted, source)."""
    records = selected.select(
        "topic", "partition", "offset", F.col("kafka_timestamp").alias("timestamp"), "key", "value", "ingest_time"
    )
    return transforms.classify(records, rules, config.stream, F.col("ingest_time"))


def rebuild_counts(
    spark: SparkSession,
    config: Config,
    archive_df: DataFrame,
    selected: DataFrame,
    reclassified: DataFrame,
    from_ms: int,
    to_ms: int,
    topics: Sequence[str] | None,
    cut: StreamCut,
) -> tuple[list[dict], list[tuple[str, int]]]:
    """Absolute counts of every window the rebuild touches (see module doc), collected:
    (rows of topic, w (window start millis), status, count, rules_version; the (topic, w) windows)."""
    in_range = (F.col("window_start") >= _ts(from_ms)) & (F.col("window_start") < _ts(to_ms))
    stored = (
        counts_at(spark, config, cut)
        .where(f"window_date IN ({', '.join(range_dates(from_ms, to_ms))})")
        .where(in_range & _topic_filter(topics))
        .select("topic", "window_start")
    )
    windows = (
        selected.select("topic", "window_start")
        .union(reclassified.select("topic", "window_start"))
        .union(stored)
        .distinct()
        .persist()
    )
    try:
        outside = windows.where(~in_range)
        rows = reclassified.select("topic", "window_start", "valid", "rules_version")
        if outside.limit(1).count():
            # Windows outside the range that records moved into: their own archived rows count as archived.
            others = archive_rows_of(archive_df, outside).where(~in_range)
            rows = rows.unionByName(others.select("topic", "window_start", "valid", "rules_version"))
        counts = transforms.count_windows(rows, config.stream)
        new = [
            r.asDict()
            for r in counts.select("topic", F.unix_millis("window_start").alias("w"), "status", "count", "rules_version").collect()
        ]
        keys = [(r["topic"], int(r["w"])) for r in windows.select("topic", F.unix_millis("window_start").alias("w")).collect()]
        return new, keys
    finally:
        windows.unpersist()


def _diff(
    spark: SparkSession,
    config: Config,
    counts: list[dict],
    windows: list[tuple[str, int]],
    rules: RuleSet,
    from_ms: int,
    to_ms: int,
    cut: StreamCut,
) -> tuple[list[dict], list[dict]]:
    """(count changes, version-only changes) for every (window, status) of ``windows``, against the counts
    the cut read (the compare-and-set of the write checks they are still stored)."""
    if not windows:
        return [], []
    size_ms = config.stream.window_seconds * 1000
    keys = sorted(set(windows))
    new = {(r["topic"], int(r["w"]), r["status"]): (int(r["count"]), r["rules_version"]) for r in counts}
    wanted = spark.createDataFrame(keys, "topic STRING, w BIGINT").select("topic", F.timestamp_millis("w").alias("window_start"))
    dates = sorted({date_literal(w) for _, w in keys})
    lo, hi = min(w for _, w in keys), max(w for _, w in keys)
    old_rows = (
        counts_at(spark, config, cut)
        .where(f"window_date IN ({', '.join(dates)})")
        .where(f"window_start BETWEEN {timestamp_literal(lo)} AND {timestamp_literal(hi)}")
        .join(F.broadcast(wanted), ["topic", "window_start"], "left_semi")
        .select("topic", F.unix_millis("window_start").alias("w"), "status", "count", "rules_version")
        .collect()
    )
    old = {(r["topic"], r["w"], r["status"]): (int(r["count"]), r["rules_version"]) for r in old_rows}
    changed: list[dict] = []
    version_only: list[dict] = []

    def versions(topic: str, w: int) -> tuple[set, str]:
        stored = {old[(topic, w, s)][1] for s in bl.STATUSES if (topic, w, s) in old}
        if stored and not from_ms <= w < to_ms:
            # Outside the range, a window that records moved into keeps rows classified with the
            # stored rules: it keeps the stored version, so it still shows as stale until rebuilt.
            return stored, max(stored)
        return stored, rules.version_for(topic)

    # A window with no stored row, or outside the range (records moved into it), changed because
    # of the rules when its topic's windows in range did.
    stale_topics = {t for t, w in keys if from_ms <= w < to_ms and (v := versions(t, w))[0] and v[0] != {v[1]}}
    for topic, w in keys:
        stored_versions, new_version = versions(topic, w)
        if stored_versions and from_ms <= w < to_ms:
            stale = stored_versions != {new_version}
        else:
            stale = topic in stale_topics
        for status in bl.STATUSES:
            old_count, old_version = old.get((topic, w, status), (0, None))
            new_count = new.get((topic, w, status), (0, new_version))[0]
            row = {
                "topic": topic,
                "window_start_ms": w,
                "window_end_ms": w + size_ms,
                "status": status,
                "old_count": old_count,
                "new_count": new_count,
                "rules_version": new_version,
                "reason": RULE_CHANGE if stale else REBUILD,
            }
            if old_count != new_count:
                changed.append(row)
            elif old_count > 0 and old_version != new_version:
                version_only.append(row)
    return changed, version_only


def apply_rebuild(
    spark: SparkSession,
    config: Config,
    changed: list[dict],
    version_only: list[dict],
    run_id: str,
    interval: tuple[int, int],
) -> None:
    """Record ``changed`` in corrections, then MERGE changed and version-only rows, once per version."""
    if not changed and not version_only:
        return
    app_id = rebuild_app_id(*interval)

    rows = [dict(r, new_count=r["new_count"]) for r in changed + version_only]
    retry_on_conflict(
        lambda: record_then_apply(
            spark,
            table_path(config, CORRECTIONS),
            table_path(config, WINDOW_COUNTS),
            app_id,
            (bl._correction_key(r) for r in changed),
            lambda: bl.recorded_attempt(spark, config, interval, reasons=(REBUILD, RULE_CHANGE)),
            lambda v: bl.append_corrections(spark, config, changed, run_id, interval, app_id, v) if changed else None,
            lambda v: bl._merge_absolute(spark, config, rows, app_id, v),
            "rebuild",
        ),
        "rebuild",
        stale_reads=False,  # the changes were computed from a cut: rebuild() starts over from a new one
    )


def correct_reasons(
    spark: SparkSession,
    config: Config,
    archive_df: DataFrame,
    reclassified: DataFrame,
    from_ms: int,
    to_ms: int,
    topics: Sequence[str] | None,
    cut: StreamCut,
) -> int:
    """Set ``invalid_reasons`` of the rebuilt range to the reasons of the re-judged records; returns
    the rows appended. Compared with the reasons the cut holds (the stream's later batches append theirs).

    Per (topic, coarse reasons window overlapping [from, to), reason): the re-judged records of the
    range plus the archived ones of the coarse windows' parts outside it, minus what the table sums
    to, appended as adjustments (``batch_id`` NULL; a negative count takes back an old reason). A
    re-run finds nothing to adjust; Delta's idempotent write (app id ``<rebuild app id>-reasons``)
    makes two concurrent runs adjust once.
    """
    size = config.stream.reasons_window_seconds * 1000
    lo, hi = from_ms // size * size, -(-to_ms // size) * size
    coarse = (F.col("window_start") >= _ts(lo)) & (F.col("window_start") < _ts(hi)) & _topic_filter(topics)
    in_range = (F.col("window_start") >= _ts(from_ms)) & (F.col("window_start") < _ts(to_ms))
    edges = sorted(set(range_hours(lo, from_ms) if lo < from_ms else []) | set(range_hours(to_ms, hi) if to_ms < hi else []))
    outside = transforms.one_row_per_record(
        archive_df.where(F.col("event_hour").isin(edges)).where(coarse & ~in_range)
    ).select("topic", "window_start", "valid", "reason")
    records = reclassified.select("topic", "window_start", "valid", "reason").where(coarse).unionByName(outside)
    target = transforms.reason_counts(records, config.stream.reasons_window_seconds)
    return adjust_invalid_reasons(
        spark, config, target, coarse, None, f"{rebuild_app_id(from_ms, to_ms)}-reasons",
        table=lambda: reasons_at(spark, config, cut),
    )


def update_archive(
    spark: SparkSession,
    config: Config,
    rules: RuleSet,
    from_ms: int,
    to_ms: int,
    topics: Sequence[str] | None,
    cut: StreamCut,
) -> int:
    """Write the new classification of changed rows into the archive; returns how many rows changed.

    Only the cut's rows: a micro-batch the cut left out adds its own increments, computed with the
    verdicts it archived. The MERGE source is built from a fresh, uncached read (Delta refuses a
    source whose plan's caching changes while the MERGE runs).
    """
    from delta.tables import DeltaTable

    keys = ["topic", "partition", "offset"]
    selected = rebuild_selection(archive_at(spark, config, cut), from_ms, to_ms, topics)
    old = selected.select(*keys, *[F.col(c).alias(f"old_{c}") for c in _RECLASSIFIED])
    differs = " OR ".join(f"NOT (old_{c} <=> {c})" for c in _RECLASSIFIED)
    source = reclassify(selected, rules, config).select(*keys, *_RECLASSIFIED).join(old, keys).where(differs)
    source = source.select(*keys, *_RECLASSIFIED)
    n = source.count()
    if not n:
        return 0
    hours = ", ".join(f"'{h}'" for h in range_hours(from_ms, to_ms))
    condition = (
        f"t.event_hour IN ({hours}) AND t.window_start >= {timestamp_literal(from_ms)} AND t.window_start < {timestamp_literal(to_ms)} "
        "AND t.topic = s.topic AND t.partition = s.partition AND t.offset = s.offset"
    )
    retry_on_conflict(
        lambda: DeltaTable.forPath(spark, table_path(config, RAW_ARCHIVE))
        .alias("t")
        .merge(source.alias("s"), condition)
        .whenMatchedUpdate(set={c: f"s.{c}" for c in _RECLASSIFIED})
        .execute(),
        "archive update",
    )
    return n


def rebuild(
    spark: SparkSession,
    config: Config,
    rules: RuleSet,
    from_ms: int,
    to_ms: int,
    topics: Sequence[str] | None = None,
    run_id: str = "rebuild",
    push: bool = True,
    update_archive_rows: bool = True,
) -> RebuildReport:
    """Rebuild windows [from, to) of ``topics`` (None: all) with ``rules``; returns its report."""
    if from_ms >= to_ms:
        raise ValueError(f"rebuild range start ({from_ms}) must be before its end ({to_ms})")
    from kdq.spark.tables import ensure_tables

    ensure_tables(spark, config)
    interval = (int(from_ms), int(to_ms))
    gone = retired_hours(read_retired(spark, config), range_hours(from_ms, to_ms))
    if gone:
        # Rebuilding re-judges raw values; retention deleted these hours' values (their counts live on
        # in retired_counts), so a rebuild would replace full counts with the judgement of what is left.
        raise ValueError(
            f"rebuild {iso(from_ms)}..{iso(to_ms)}: archive retention deleted raw records of {len(gone)} hour(s) "
            f"in the range ({gone[0]} .. {gone[-1]}); rebuild a range after {gone[-1]} (UTC hour) instead"
        )
    for attempt in range(1, MAX_ATTEMPTS + 1):
        cut = stream_cut(spark, config)
        try:
            report, changed = _rebuild_at(spark, config, rules, interval, topics, run_id, cut)
            break
        except Exception as exc:
            if attempt == MAX_ATTEMPTS or not is_stale_read(exc):
                raise
            log.warning("rebuild %s..%s: a window changed since its cut (attempt %d); reading again",
                        iso(from_ms), iso(to_ms), attempt)
            WAITS.retried(stale_read=True)  # starts over from a new cut (the writers journal)
    # After the counts (see the module doc), and with nothing of this rebuild cached any more.
    report.archive_rows_updated = (
        update_archive(spark, config, rules, from_ms, to_ms, topics, cut) if update_archive_rows else None
    )
    if push:
        keys = [(r["topic"], r["window_start_ms"], r["status"]) for r in changed]
        # Every window a rebuild of this range ever corrected: a run whose push failed is fixed by re-running.
        keys += bl.interval_corrections(spark, config, interval)
        pushed = push_corrections(spark, config, keys)
        report.push = pushed.to_dict()
        report.ok = bool(pushed.influx_ok)
        if config.summaries:
            from kdq.spark.summaries import interval_summary_corrections, push_summary_corrections

            summaries_pushed = push_summary_corrections(spark, config, interval_summary_corrections(spark, config, interval))
            report.summaries_push = summaries_pushed.to_dict()
            report.ok = report.ok and summaries_pushed.influx_ok
    return report


def _rebuild_at(
    spark: SparkSession,
    config: Config,
    rules: RuleSet,
    interval: tuple[int, int],
    topics: Sequence[str] | None,
    run_id: str,
    cut: StreamCut,
) -> tuple[RebuildReport, list[dict]]:
    """Counts, corrections and reasons of one rebuild through one cut; (its report, the changed rows)."""
    from_ms, to_ms = interval
    archive = archive_at(spark, config, cut)
    selected = rebuild_selection(archive, from_ms, to_ms, topics).persist()
    try:
        reclassified = reclassify(selected, rules, config).persist()
        try:
            counts, windows = rebuild_counts(spark, config, archive, selected, reclassified, from_ms, to_ms, topics, cut)
            changed, version_only = _diff(spark, config, counts, windows, rules, from_ms, to_ms, cut)
            apply_rebuild(spark, config, changed, version_only, run_id, interval)
            reason_rows = correct_reasons(spark, config, archive, reclassified, from_ms, to_ms, topics, cut)
            report = RebuildReport(
                run_id=run_id,
                from_=iso(from_ms),
                to=iso(to_ms),
                topics=list(topics) if topics else "all",
                archive_rows=selected.count(),
                windows=len(windows),
                corrections=len(changed),
                rule_change=sum(1 for r in changed if r["reason"] == RULE_CHANGE),
                version_only=len(version_only),
                reason_corrections=reason_rows,
                changes=[
                    {k: r[k] for k in ("topic", "window_start_ms", "status", "old_count", "new_count", "reason")}
                    for r in changed[:100]
                ],
                rules_version=rules.version,
            )
            if config.summaries:  # the streaming summaries of the same records (kdq.spark.summaries)
                from kdq.spark.summaries import rebuild_summaries

                report.summaries_corrections = len(
                    rebuild_summaries(
                        spark, config, archive, selected, reclassified, from_ms, to_ms, topics, run_id,
                        rebuild_app_id(from_ms, to_ms), cut,
                    )
                )
        finally:
            reclassified.unpersist()
    finally:
        selected.unpersist()
    return report, changed
