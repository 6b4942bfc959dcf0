"""The metrics topic: one message per changed window, key naming the window, value its absolute count.

Key   ``{"topic":"tx","window":1501273548000,"status":"valid"}`` (window start, epoch millis)
Value ``6`` (the new absolute count)
Header ``kdq-version`` ``42`` (the ``window_counts`` version the count was read at; :mod:`kdq.push_order`)

The topic is compacted: consumers converge to the latest absolute value per
window, so re-sending a value after a crash (at-least-once) is harmless. Writers run concurrently (the
stream, the hourly push, a rebuild): a consumer keeps, per key, the value with the highest ``kdq-version``
header (none: older than any), and the writers' push lock makes the last message per key the newest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from kdq.config import Config


def metric_key(topic: str, window_ms: int, status: str) -> str:
    # Fixed key order and no spaces: the key is what compaction deduplicates on.
    return json.dumps({"topic": topic, "window": int(window_ms), "status": status}, separators=(",", ":"))


def ensure_metrics_topic(config: Config, partitions: int = 3) -> None:
    """Create the compacted metrics topic if it does not exist (replication from the cluster default)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(config.kafka_client_conf())
    name = config.kafka.metrics_topic
    if name in admin.list_topics(timeout=30).topics:
        return
    futures = admin.create_topics(
        [NewTopic(name, partitions, replication_factor=-1, config={"cleanup.policy": "compact"})], operation_timeout=30
    )
    try:
        futures[name].result(timeout=60)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise


def metrics_producer(config: Config):
    """An idempotent producer for the metrics topic; create once per process and reuse."""
    from confluent_kafka import Producer

    return Producer(
        {
            **config.kafka_client_conf(),
            # Idempotent: broker-side dedup of retries, and per-partition order,
            # so a later count for a window never lands before an earlier one.
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "lz4",
        }
    )


def produce_counts(
    config: Config, rows: Iterable[Mapping], timeout: float = 60.0, producer=None, version: int | None = None
) -> int:
    """Send (topic, window_start_ms, status, count) rows; raises if any is not acknowledged in time.
    ``version``: the ``window_counts`` version the counts were read at, sent as the ``kdq-version`` header."""
    messages = (
        (metric_key(row["topic"], row["window_start_ms"], row["status"]), str(int(row["count"]))) for row in rows
    )
    headers = [("kdq-version", str(int(version)).encode())] if version is not None else None
    return produce_messages(config, messages, timeout, producer, headers=headers)


def produce_messages(
    config: Config,
    messages: Iterable[tuple[str, str]],
    timeout: float = 60.0,
    producer=None,
    headers: list[tuple[str, bytes]] | None = None,
) -> int:
    """Send (key, value) text pairs (e.g. summary statistics), each with ``headers``; raises if any is not
    acknowledged in time."""
    from confluent_kafka import KafkaException

    producer = producer or metrics_producer(config)
    errors: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            errors.append(f"{msg.key()!r}: {err}")

    sent = 0
    for key, value in messages:
        if headers:
            producer.produce(config.kafka.metrics_topic, key=key, value=value, headers=headers, on_delivery=on_delivery)
        else:
            producer.produce(config.kafka.metrics_topic, key=key, value=value, on_delivery=on_delivery)
        sent += 1
        producer.poll(0)
    remaining = producer.flush(timeout)
    if remaining or errors:
        raise KafkaException(f"metrics topic {config.kafka.metrics_topic}: {remaining} unsent, errors: {errors[:5]}")
    return sent
