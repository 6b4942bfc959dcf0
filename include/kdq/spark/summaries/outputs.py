"""What the metrics topic and InfluxDB receive for summary states (their statistics, absolute): the push of
corrected groups (the batch layer's, returning a :class:`SummariesPush`, beside the counts'
:class:`kdq.spark.outputs.CountsPush`), and the InfluxDB re-push of every summary row updated since a time
(the InfluxDB catch-up's summary part)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from kdq.config import Config
from kdq.spark.summaries.store import read_states
from kdq.spark.summaries.transforms import KEY, state_entry
from kdq.spark.tables import table_path
from kdq.summaries import SummaryState, metric_key, metric_value, statistics, summary_point
from kdq.tables import SUMMARIES

log = logging.getLogger("kdq.summaries")


@dataclass(frozen=True)
class SummariesPush:
    """What one push of corrected summary groups sent: ``summary_messages`` metrics-topic messages (one per
    group, InfluxDB gets a point each); ``influx_ok`` False and ``influx_error`` when InfluxDB refused the
    write. :meth:`to_dict` is the ``summaries_push`` object of the job reports (``push`` inside the
    recompute report's ``summaries`` part, :mod:`kdq.job_reports`): ``influx_error`` is there only when
    InfluxDB refused."""

    summary_messages: int = 0
    influx_ok: bool = True
    influx_error: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SummariesPush:
        """From a report's ``summaries_push`` object."""
        return cls(
            summary_messages=data.get("summary_messages", 0),
            influx_ok=data.get("influx_ok", True),
            influx_error=data.get("influx_error"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The report's ``summaries_push`` object."""
        out: dict[str, Any] = {"summary_messages": self.summary_messages, "influx_ok": self.influx_ok}
        if self.influx_error is not None:
            out["influx_error"] = self.influx_error
        return out


def outputs_of(config: Config, rows: Iterable[Mapping]) -> tuple[list[tuple[str, str]], list]:
    """Rows with KEY, groups and state → (metrics-topic messages, InfluxDB points) of their statistics."""
    messages, points = [], []
    for r in rows:
        s = config.summary(r["summary"])
        stats = statistics(r["state"], s.percentiles)
        w = int(r["window_start_ms"])
        messages.append((metric_key(s, r["topic"], w, r["groups"]), metric_value(stats)))
        points.append(summary_point(s, r["topic"], w, r["groups"], stats))
    return messages, points


def publish(config: Config, rows: Sequence[Mapping], producer: Any = None) -> tuple[int, Exception | None]:
    """Send rows' statistics to the metrics topic (raises on failure) and InfluxDB (failure returned)."""
    from kdq.influx import InfluxSink
    from kdq.metrics_topic import produce_messages

    messages, points = outputs_of(config, rows)
    if not messages:
        return 0, None
    produce_messages(config, messages, producer=producer)
    if not config.influxdb.enabled:
        return len(messages), None
    try:
        InfluxSink(config).write(points)
    except Exception as exc:  # InfluxWriteError, or a config error naming the missing URL
        return len(messages), exc
    return len(messages), None


def push_summary_corrections(
    spark: SparkSession, config: Config, keys: Iterable[tuple], producer: Any = None
) -> SummariesPush:
    """Current statistics of corrected groups (KEY tuples) to the metrics topic and InfluxDB (a deleted group
    as empty). A metrics-topic failure raises; an InfluxDB failure is returned (``influx_ok`` False)."""
    keys = sorted(set(keys))
    if not keys:
        return SummariesPush()
    from kdq.metrics_topic import ensure_metrics_topic

    current = read_states(spark, config, {k[:3] for k in keys})
    rows = [
        current.get(k) or {**dict(zip(KEY, k, strict=True)), "groups": json.loads(k[3]), "state": SummaryState()}
        for k in keys
    ]
    ensure_metrics_topic(config)
    sent, error = publish(config, rows, producer=producer)
    if error is not None:
        log.error("InfluxDB push of %d corrected summary groups failed: %s", len(rows), error)
        return SummariesPush(summary_messages=sent, influx_ok=False, influx_error=str(error)[:500])
    return SummariesPush(summary_messages=sent)


def push_updated_to_influx(spark: SparkSession, config: Config, since_ms: int, chunk: int = 5000) -> int:
    """Re-push every summary row updated at or after ``since_ms`` to InfluxDB; returns the points written."""
    from kdq.influx import InfluxSink

    if not config.summaries:
        return 0
    names = [s.name for s in config.summaries]
    rows = (
        spark.read.format("delta")
        .load(table_path(config, SUMMARIES))
        .where((F.col("updated_at") >= F.timestamp_millis(F.lit(int(since_ms)))) & F.col("summary").isin(names))
        .select("summary", "topic", F.unix_millis("window_start").alias("window_start_ms"), "group_key", "groups",
                "count", "sum", "sum_sq", "min", "max", "hist", "rejected")
    )
    sink = InfluxSink(config)
    written, batch = 0, []
    for row in rows.toLocalIterator():
        r = row.asDict()
        batch.append(state_entry(r))
        if len(batch) >= chunk:
            written += sink.write(outputs_of(config, batch)[1])
            batch = []
    if batch:
        written += sink.write(outputs_of(config, batch)[1])
    return written
