"""The notifier's Delta side: which outbox rows each channel still owes, and recording deliveries.

The outbox is ``kdq.incident_notifications`` (one row per notification id, written by the evaluation run);
``kdq.incident_deliveries`` holds one row per (notification id, channel) delivered. What is due for a channel is
the outbox minus its deliveries, so a retry, a re-run or a replay of the evaluation never sends twice.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kdq.config import Config
from kdq.notify import CHANNELS_ENV, Channel, channels_from_json, deliver
from kdq.spark.tables import table_path
from kdq.spark.writers import insert_absent
from kdq.tables import INCIDENT_DELIVERIES, INCIDENT_NOTIFICATIONS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# A channel added later does not receive the whole history: only notifications this recent are due.
DEFAULT_DUE_WITHIN_HOURS = 24


def due_notifications(outbox: DataFrame, deliveries: DataFrame, since_ms: int) -> tuple[list[dict], set[tuple[str, str]]]:
    """The outbox rows created since ``since_ms`` (oldest first, then by incident and version) and the
    (notification_id, channel) pairs already delivered among them."""
    from pyspark.sql import functions as F

    recent = outbox.where(F.unix_millis("created_at") >= F.lit(int(since_ms)))
    rows = [r.asDict() for r in recent.orderBy("created_at", "incident_key", "version", "notification_id").collect()]
    sent = {
        (r["notification_id"], r["channel"])
        for r in deliveries.join(recent.select("notification_id"), "notification_id", "left_semi")
        .select("notification_id", "channel").collect()
    }
    return rows, sent


def record_deliveries(spark: SparkSession, config: Config, delivered: Sequence[tuple[str, str, int]], now_ms: int) -> None:
    """Insert (notification_id, channel) rows not there yet."""
    at = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
    insert_absent(spark, config, INCIDENT_DELIVERIES,
                  [(nid, channel, at, attempts) for nid, channel, attempts in delivered], ["notification_id", "channel"])


def deliver_pending(
    spark: SparkSession, config: Config, now_ms: int, channels: Sequence[Channel] | None = None,
    due_within_hours: float = DEFAULT_DUE_WITHIN_HOURS, **deliver_options: Any,
) -> dict[str, Any]:
    """Send what each channel still owes (channels: ``$KDQ_NOTIFY_CHANNELS`` unless given) and record it.
    Deliveries are recorded even when a later send raised something unexpected."""
    channels = channels_from_json(os.environ.get(CHANNELS_ENV)) if channels is None else list(channels)
    if not channels:
        return {"channels": [], "sent": {}, "failed": {}, "deferred": {}, "skipped_already_sent": 0, "errors": []}
    rows, sent = due_notifications(
        spark.read.format("delta").load(table_path(config, INCIDENT_NOTIFICATIONS)),
        spark.read.format("delta").load(table_path(config, INCIDENT_DELIVERIES)),
        now_ms - int(due_within_hours * 3_600_000),
    )
    names = {c.name for c in channels}
    result = deliver(rows, channels, sent, **deliver_options)
    record_deliveries(spark, config, result.delivered, now_ms)
    return {"channels": sorted(names), **result.summary(sum(1 for _, c in sent if c in names))}
