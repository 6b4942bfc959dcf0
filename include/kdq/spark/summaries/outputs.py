"""What the metrics topic and InfluxDB receive for summary states (their statistics, absolute), and the
InfluxDB re-push of every summary row updated since a time (the InfluxDB catch-up's summary part)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from kdq.config import Config
from kdq.spark.summaries.transforms import state_entry
from kdq.spark.tables import table_path
from kdq.summaries import metric_key, metric_value, statistics, summary_point
from kdq.tables import SUMMARIES


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
