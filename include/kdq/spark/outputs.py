"""What the metrics topic and InfluxDB receive for window counts outside the stream (absolute, ordered), and
the InfluxDB catch-up: the batch layer's pushes (its step 4, :mod:`kdq.spark.batch_layer`), beside
:mod:`kdq.spark.summaries.outputs` for the streaming summaries.

:func:`push_corrections` sends the current absolute counts of corrected keys (the hourly push, a rebuild's)
and returns a :class:`CountsPush`; :func:`influx_catch_up` re-pushes every window updated since the stream
last failed to reach InfluxDB (and the summaries' rows, through their outputs). :func:`push_batch_influx` is
the speed layer's InfluxDB write of a micro-batch, whose failure that catch-up repairs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from kdq.config import Config
from kdq.influx import InfluxSink, InfluxWriteError, Point
from kdq.intervals import iso
from kdq.job_reports import CatchUpReport
from kdq.metrics_topic import ensure_metrics_topic
from kdq.push_order import push_ordered
from kdq.spark.push_reads import latest_reader
from kdq.spark.tables import ensure_tables, table_path
from kdq.spark.writers import now_ms
from kdq.tables import WINDOW_COUNTS

log = logging.getLogger("kdq.batch")
stream_log = logging.getLogger("kdq.stream")


@dataclass(frozen=True)
class CountsPush:
    """What one push of window counts sent: ``metrics_sent`` messages, ``influx_points`` written,
    ``influx_skipped`` (InfluxDB already held a newer version, :mod:`kdq.push_order`); ``influx_ok`` False and
    ``influx_error`` when InfluxDB refused the write. :meth:`to_dict` is the ``push`` object of the job
    reports (:mod:`kdq.job_reports`): ``influx_error`` is there only when InfluxDB refused."""

    metrics_sent: int = 0
    influx_points: int = 0
    influx_skipped: int = 0
    influx_ok: bool = True
    influx_error: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CountsPush:
        """From :func:`kdq.push_order.push_ordered`'s result (or a report's ``push`` object)."""
        return cls(
            metrics_sent=data.get("metrics_sent", 0),
            influx_points=data.get("influx_points", 0),
            influx_skipped=data.get("influx_skipped", 0),
            influx_ok=data.get("influx_ok", True),
            influx_error=data.get("influx_error"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The report's ``push`` object: the keys :func:`kdq.push_order.push_ordered` returns."""
        out: dict[str, Any] = {
            "metrics_sent": self.metrics_sent,
            "influx_points": self.influx_points,
            "influx_skipped": self.influx_skipped,
            "influx_ok": self.influx_ok,
        }
        if self.influx_error is not None:
            out["influx_error"] = self.influx_error
        return out


def push_corrections(
    spark: SparkSession, config: Config, keys: Iterable[tuple[str, int, str]], producer: Any = None
) -> CountsPush:
    """Send the current absolute counts of corrected (topic, window, status) keys to both outputs.

    Metrics topic: one message per key, the count read back from Delta (0
    for a deleted row). InfluxDB: one point per window with both fields.
    Ordered (:func:`kdq.push_order.push_ordered`): read at the table's latest
    version while holding the push lock, sent with that version (the
    ``kdq-version`` header, the ``kdq_version`` field), and a point InfluxDB
    holds with a newer version is left alone, so an older value never
    replaces a newer one the stream pushed meanwhile.
    A metrics-topic failure raises; an InfluxDB failure is returned
    (``influx_ok`` False, ``influx_error``) so the caller can record it for the catch-up.
    """
    keys = sorted(set(keys))
    if not keys:
        return CountsPush()
    ensure_metrics_topic(config)  # compacted; a producer would otherwise auto-create it without compaction
    return CountsPush.from_dict(push_ordered(
        config, latest_reader(spark, config), [(t, ms) for t, ms, _ in keys], keys, producer=producer
    ))


def influx_catch_up(
    spark: SparkSession,
    config: Config,
    since_ms: int | None = None,
    force: bool = False,
    chunk: int = 5000,
) -> CatchUpReport:
    """Push every window with a window_counts row updated at or after ``since_ms`` to InfluxDB.

    ``since_ms`` defaults to the stream's pending push state (the start of the
    first batch whose push failed); with neither, nothing is done unless
    ``force`` (then every window is pushed). Points carry absolute values, so
    re-pushing is harmless, and each chunk is read at the latest version just
    before it is written, never replacing a newer point (:mod:`kdq.push_order`).
    Afterwards the pending state forgets the failures recorded before this run
    started that it covered (:meth:`kdq.stream.state.InfluxPushState.clear`):
    one recorded while it ran, or pending from before ``since_ms``, stays.
    """
    from kdq.stream.state import InfluxPushState

    ensure_tables(spark, config)
    state = InfluxPushState(config)
    before = state.read()
    pending = before.get("pending_since_ms")
    since = since_ms if since_ms is not None else pending
    report = CatchUpReport(since_ms=since, pending_since_ms=pending)
    if not config.influxdb.enabled:
        report.skipped = "influxdb.enabled is false"
        return report
    if since is None:
        if not force:
            report.skipped = "nothing pending"
            return report
        since = 0
        report.since_ms = 0
    started = now_ms()
    updated = (
        spark.read.format("delta").load(table_path(config, WINDOW_COUNTS))
        .where(F.col("updated_at") >= F.timestamp_millis(F.lit(int(since))))
        .select("topic", F.unix_millis("window_start").alias("ms"))
        .distinct()
    )
    # Each chunk is read again at the table's latest version while holding the push lock, right before it
    # is written, and InfluxDB points already holding a newer version are skipped
    # (:func:`kdq.push_order.push_ordered`): a window the stream updated after this listing keeps the
    # stream's newer value.
    read = latest_reader(spark, config)
    windows: list[tuple[str, int]] = []

    def push(chunk_windows: list[tuple[str, int]]) -> None:
        pushed = push_ordered(config, read, chunk_windows)
        if not pushed["influx_ok"]:
            raise InfluxWriteError(pushed.get("influx_error", "InfluxDB push failed"))
        report.points += pushed["influx_points"]
        report.skipped_newer += pushed["influx_skipped"]

    for row in updated.toLocalIterator():
        windows.append((row["topic"], int(row["ms"])))
        if len(windows) >= chunk:
            push(windows)
            windows = []
    if windows:
        push(windows)
    if config.summaries:  # streaming summaries updated since then, too (their stream push shares the pending state)
        from kdq.spark.summaries import push_updated_to_influx

        report.summary_points = push_updated_to_influx(spark, config, since, chunk)
    if pending is not None:
        # Under the state's lock: forgets the failures recorded before this run started whose rows it
        # covered; one recorded while it ran (or pending from before ``since``) stays for the next run.
        report.cleared = state.clear(started, covered_from_ms=since)
    log.info("InfluxDB catch-up since %s: %d points", iso(since), report.points)
    return report


def push_batch_influx(
    config: Config,
    points: Sequence[Point],
    batch_id: int,
    input_rows_by_topic: Mapping[str, int],
    late_rows: Mapping[str, int],
    batch_started_ms: int,
    on_failure: Callable[[int, str], None],
) -> bool:
    """A micro-batch's InfluxDB write: its windows' count ``points`` and its health per topic (measurement
    ``kdq.stream``: ``late_rows``, ``input_rows``, tag ``topic``). Whether it was written; a refused write
    does not stop the stream: it goes to ``on_failure`` (the push state :func:`influx_catch_up` reads)."""
    if not config.influxdb.enabled:
        return True
    progress = [
        Point(
            "kdq.stream",
            batch_started_ms,
            {"late_rows": int(late_rows.get(topic, 0)), "input_rows": int(rows)},
            {"topic": topic},
        )
        for topic, rows in input_rows_by_topic.items()
    ]
    try:
        InfluxSink(config).write(list(points) + progress)
        return True
    except (InfluxWriteError, Exception) as exc:
        # The stream keeps going: counts are safe in Delta, and the batch
        # layer's catch-up pushes every row updated since this moment.
        stream_log.error(
            "InfluxDB push failed for batch %d (%d points); recorded for catch-up: %s",
            batch_id,
            len(points),
            exc,
        )
        on_failure(batch_started_ms, str(exc)[:500])
        return False
