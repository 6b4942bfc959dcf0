"""The hourly batch-layer run of one ingest-time interval, end to end: what ``spark_jobs/batch_recompute.py``
and ``spark_jobs/push_corrections.py`` call.

:func:`recompute_interval` chains the steps of :mod:`kdq.spark.batch_layer` (late windows → absolute
counts → corrections → reasons → push; :mod:`kdq.spark.recount` and :mod:`kdq.spark.outputs` hold the
transforms and the push) and the streaming summaries' part
(:func:`kdq.spark.summaries.recompute_summaries`: same interval, same app id and protocol, their own
tables); :func:`push_interval` is the push alone, for the DAG that recomputes with ``skip_push`` and
pushes in a task of its own. Both return their typed report (:mod:`kdq.job_reports`).

An InfluxDB push that fails does not fail the run: Delta and the metrics topic are done, the failure is
recorded in the stream's push state (:class:`kdq.stream.state.InfluxPushState`) for the InfluxDB
catch-up, and the report says ``ok = false``.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq.config import Config
from kdq.intervals import iso
from kdq.job_reports import PushReport, RecomputeReport
from kdq.spark import batch_layer as bl
from kdq.spark.maintenance import compact_closed_hours
from kdq.spark.outputs import push_corrections
from kdq.spark.recount import archive_rows_of, awaiting_recompute, late_windows, recompute_counts
from kdq.spark.retention import read_retired
from kdq.spark.summaries import interval_summary_corrections, push_summary_corrections, recompute_summaries
from kdq.spark.tables import ensure_tables, table_path
from kdq.spark.writers import now_ms
from kdq.stream.state import InfluxPushState
from kdq.tables import RAW_ARCHIVE
from kdq.writers_journal import WAITS

log = logging.getLogger("kdq.batch")


# -- what a read costs ---------------------------------------------------------------------------


def scan_stats(spark: SparkSession, df: DataFrame) -> dict[str, int]:
    """Files and bytes a DataFrame will read, after partition pruning and Delta data skipping.

    ``inputFiles()`` reflects Delta's file skipping (the optimizer prepares
    the Delta scan with the query's filters); sizes come from one listing per
    folder rather than one request per file, which matters on object stores.
    """
    files = df.inputFiles()
    by_dir: dict[str, set[str]] = defaultdict(set)
    for uri in files:
        folder, _, name = uri.rpartition("/")
        by_dir[folder].add(name)
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    size = 0
    for folder, names in by_dir.items():
        path = jvm.org.apache.hadoop.fs.Path(folder)
        for status in path.getFileSystem(conf).listStatus(path):
            if status.getPath().getName() in names:
                size += status.getLen()
    return {"files": len(files), "bytes": size}


def table_totals(spark: SparkSession, path: str) -> dict[str, int]:
    """Files and bytes of a Delta table's current snapshot (from its log), to set a scan's cost against."""
    from delta.tables import DeltaTable

    row = DeltaTable.forPath(spark, path).detail().select("numFiles", "sizeInBytes").first()
    return {"files": int(row["numFiles"] or 0), "bytes": int(row["sizeInBytes"] or 0)}


# -- the run ---------------------------------------------------------------------------------------------


class StreamBehind(RuntimeError):
    """The interval cannot be recomputed yet: a micro-batch ingested before its end has not committed."""


def recompute_interval(
    spark: SparkSession,
    config: Config,
    interval: tuple[int, int],
    run_id: str,
    reason: str = "late_data",
    push: bool = True,
    allow_stream_behind: bool = False,
    compact: bool = False,
) -> RecomputeReport:
    """Recompute the late windows of ``interval`` (ingest time), record and apply the corrections, push them;
    ``compact``: then compact the closed hours of the archive and the window tables (the hourly DAG's run).

    Raises :class:`StreamBehind` while the speed layer has not committed every micro-batch ingested before
    the interval's end (unless ``allow_stream_behind``). Re-running an interval is a no-op for Delta and
    re-sends the same absolute values.
    """
    started_ms = now_ms()
    ensure_tables(spark, config)
    archive_path = table_path(config, RAW_ARCHIVE)
    archive = spark.read.format("delta").load(archive_path)

    caught_up = bl.stream_caught_up(spark, config, interval[1])
    if caught_up is False:
        WAITS.stream_behind()  # the writers journal: this run waited on (or went past) the stream
        # Rows of a micro-batch that started before the interval's end but has not committed (a slow
        # batch, or one that crashed and will be replayed with its original ingest time) become
        # visible only when it commits: recomputing now would miss them for good. Fail instead, so
        # Airflow retries the task (with backoff) once the stream has moved on.
        if not allow_stream_behind:
            raise StreamBehind(
                f"the speed layer has not committed every micro-batch ingested before {iso(interval[1])}: "
                "recomputing now could miss their late rows; retry later (Airflow does), or pass "
                "--allow-stream-behind to recompute what is archived now"
            )
        log.warning("recomputing %s although the speed layer is behind (--allow-stream-behind)", iso(interval[1]))
    late = late_windows(archive, *interval)
    late_scan = scan_stats(spark, late)
    windows = [(r["topic"], int(r["ms"])) for r in late.select("topic", F.unix_millis("window_start").alias("ms")).collect()]
    report = RecomputeReport(
        run_id=run_id,
        interval_start=iso(interval[0]),
        interval_end=iso(interval[1]),
        stream_caught_up=caught_up,
        late_windows=len(windows),
        archive_total=table_totals(spark, archive_path),
        scanned_late_rows=late_scan,
    )
    changed: list[dict] = []
    if windows:
        windows_df = spark.createDataFrame(windows, "topic STRING, ms BIGINT").select(
            "topic", F.timestamp_millis("ms").alias("window_start")
        )
        report.scanned_recompute = scan_stats(spark, archive_rows_of(archive, windows_df))
        # Rows the stream left to the batch layer that arrived after the interval's end are the next run's
        # to count (its late_windows selects them); counting them here too would make this run's result
        # depend on when it read, and its reconcile (which leaves them out the same way) fail on correct data.
        settled = archive.where(~awaiting_recompute(interval[1]))
        new_counts = recompute_counts(settled, windows_df, config.stream.window_seconds, read_retired(spark, config))
        changed = bl.apply_corrections(spark, config, new_counts, run_id, interval, reason)
        report.reason_corrections = bl.correct_interval_reasons(spark, config, archive, interval)
    report.corrections = len(changed)
    report.changes = [
        {"topic": r["topic"], "window_start_ms": r["window_start_ms"], "status": r["status"], "old": r["old_count"], "new": r["new_count"]}
        for r in changed[:100]
    ]
    log.info(
        "late rows scan: %(files)d files, %(bytes)d bytes (table: %(total)s)",
        {**late_scan, "total": report.archive_total},
    )
    if push:
        # Every window this interval ever corrected, not only this run's: a run whose push failed after
        # its Delta commits is fixed by running it again.
        pushed = push_corrections(spark, config, bl.interval_corrections(spark, config, interval))
        report.push = pushed.to_dict()
        if not pushed.influx_ok:
            error = pushed.influx_error if pushed.influx_error is not None else "batch push failed"
            InfluxPushState(config).record_failure(started_ms, error)
            report.ok = False
    report.summaries = recompute_summaries(spark, config, interval, run_id, reason, push=push)
    if not report.summaries.ok:
        error = (report.summaries.push or {}).get("influx_error", "summary push failed")
        InfluxPushState(config).record_failure(started_ms, error)
        report.ok = False
    if compact:
        # The stream leaves a file per micro-batch in each hour it counts; compacting the closed ones every hour
        # keeps the tables' snapshots and the readers of the day small (the nightly maintenance does closed days).
        report.compacted = compact_closed_hours(spark, config)
    return report


def push_interval(spark: SparkSession, config: Config, interval: tuple[int, int]) -> PushReport:
    """Push every (topic, window, status) and summary group the interval's corrections ever touched, with
    its current absolute value (read back from the tables), to the metrics topic and InfluxDB."""
    started_ms = now_ms()
    ensure_tables(spark, config)
    keys = bl.interval_corrections(spark, config, interval)
    report = PushReport(interval_start=iso(interval[0]), interval_end=iso(interval[1]), corrected_keys=len(keys))
    pushed = push_corrections(spark, config, keys)
    report.push = pushed.to_dict()
    summary_keys = interval_summary_corrections(spark, config, interval)
    report.corrected_summary_groups = len(summary_keys)
    summaries_pushed = push_summary_corrections(spark, config, summary_keys) if summary_keys else None
    report.summaries_push = summaries_pushed.to_dict() if summaries_pushed is not None else None
    errors = [
        p.influx_error if p.influx_error is not None else "batch push failed"
        for p in (pushed, summaries_pushed) if p is not None and not p.influx_ok
    ]
    if errors:
        InfluxPushState(config).record_failure(started_ms, "; ".join(errors))
        report.ok = False
    return report
