"""Producing the demo's records to Kafka: its topics, the registry's schemas, the producer loop and its
statistics."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdq.config import Config, ConfigError, check_kafka_reachable
from kdq.traffic.generator import DemoRecord, RateLimiter, TrafficGenerator, TrafficSpec
from kdq.traffic.kinds import KINDS, RegistryKind

log = logging.getLogger("kdq.demo")


@dataclass
class DemoStats:
    started_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    produced: Counter = field(default_factory=Counter)  # (topic, valid|invalid, timing)
    delivered: int = 0
    failed: int = 0
    last_error: str | None = None

    def add(self, record: DemoRecord) -> None:
        self.produced[(record.topic, "valid" if record.valid else "invalid", record.timing)] += 1

    def summary(self) -> dict:
        by_topic: dict[str, Counter] = {}
        for (topic, status, timing), n in self.produced.items():
            counter = by_topic.setdefault(topic, Counter())
            counter[status] += n
            counter[timing] += n
        return {
            "started_ms": self.started_ms,
            "updated_ms": int(time.time() * 1000),
            "produced": sum(self.produced.values()),
            "delivered": self.delivered,
            "failed": self.failed,
            "last_error": self.last_error,
            "topics": {topic: dict(counter) for topic, counter in sorted(by_topic.items())},
        }


def ensure_topics(config: Config, spec: TrafficSpec, timeout: float = 30.0) -> dict[str, int]:
    """Create missing topics with ``spec.partitions``; returns each topic's partition count."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(config.kafka_client_conf())
    existing = admin.list_topics(timeout=timeout).topics
    wanted = [topic for topic, _ in spec.topics if topic not in existing]
    if wanted:
        # The brokers' default replication factor (and min.insync.replicas): 1 on the single local broker, 3 (and 2)
        # on the cluster shape and in the compose deployment. An explicit 1 there would leave the topic below its
        # brokers' min.insync.replicas 2, and every acks=all write would be refused.
        futures = admin.create_topics(
            [NewTopic(t, spec.partitions, replication_factor=-1) for t in wanted], operation_timeout=timeout
        )
        for future in futures.values():
            try:
                future.result(timeout=timeout)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
    # A topic just created may be missing from the next metadata answer (the broker serving it learns of the topic
    # a moment later): asked again until every topic is there with its partitions, within ``timeout``.
    deadline = time.monotonic() + timeout
    while True:
        metadata = admin.list_topics(timeout=timeout).topics
        missing = [t for t, _ in spec.topics if t not in metadata or not metadata[t].partitions]
        if not missing:
            return {topic: min(spec.partitions, len(metadata[topic].partitions)) for topic, _ in spec.topics}
        if time.monotonic() >= deadline:
            raise KafkaException(f"topics {', '.join(missing)} are not in the brokers' metadata {timeout:.0f} s after "
                                 "their creation")
        time.sleep(0.2)


def register_schemas(config: Config, spec: TrafficSpec, attempts: int = 5) -> dict[str, int]:
    """Registers the schema of each :class:`RegistryKind` topic under ``<topic>-value`` (the same schema again:
    the same id) and returns topic -> id; retried with backoff, then a ConfigError naming the registry."""
    wanted = [(topic, KINDS[kind]) for topic, kind in spec.topics if isinstance(KINDS[kind], RegistryKind)]
    if not wanted:
        return {}
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client_conf = config.registry_client_conf()  # a ConfigError when no registry is configured or running
    for attempt in range(attempts):
        try:
            client = SchemaRegistryClient(client_conf)
            return {
                topic: client.register_schema(f"{topic}-value", Schema(kind.schema_text, kind.schema_type))
                for topic, kind in wanted
            }
        except Exception as exc:  # the registry's client raises its own errors and httpx's
            if attempt == attempts - 1:
                raise ConfigError(
                    f"the Schema Registry at {client_conf['url']} did not register the demo's schemas: {exc}"
                ) from None
            log.warning("demo: registering the schemas failed (%s); again in %d s", exc, 2**attempt)
            time.sleep(2**attempt)
    raise AssertionError("unreachable")


def run_demo(
    config: Config,
    spec: TrafficSpec,
    stop: threading.Event | None = None,
    stats_file: Path | None = None,
    report_every: float = 10.0,
) -> dict:
    """Produce until ``spec.count`` records, ``spec.duration_seconds`` or ``stop``; returns the summary."""
    from confluent_kafka import Producer

    stop = stop or threading.Event()
    check_kafka_reachable(config)  # a clear error for an unreachable broker or refused credentials, not a timeout
    partitions = ensure_topics(config, spec)
    generator = TrafficGenerator(spec, partitions, register_schemas(config, spec))
    stats = DemoStats()
    producer = Producer(
        {**config.kafka_client_conf(), "linger.ms": 20, "enable.idempotence": True, "client.id": "kdq-demo"}
    )

    def delivered(err: Any, _msg: Any) -> None:
        if err is None:
            stats.delivered += 1
        else:
            stats.failed += 1
            stats.last_error = str(err)

    def report() -> None:
        summary = stats.summary()
        if stats_file is not None:
            stats_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = stats_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(summary, indent=2))
            tmp.replace(stats_file)
        log.info("demo: produced %(produced)d, delivered %(delivered)d, failed %(failed)d", summary)

    limiter = RateLimiter(spec.rate)
    deadline = None if spec.duration_seconds is None else time.monotonic() + spec.duration_seconds
    next_report = time.monotonic() + report_every
    total = 0
    try:
        while not stop.is_set():
            if spec.count is not None and total >= spec.count:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            due = limiter.due()
            if spec.count is not None:
                due = min(due, spec.count - total)
            now_ms = int(time.time() * 1000)
            for _ in range(due):
                record = generator.record(now_ms)
                while True:
                    try:
                        producer.produce(
                            record.topic, value=record.value, key=record.key, partition=record.partition,
                            timestamp=record.timestamp_ms, on_delivery=delivered,
                        )
                        break
                    except BufferError:  # local queue full: let the broker catch up
                        producer.poll(0.1)
                stats.add(record)
                total += 1
            producer.poll(0)
            if time.monotonic() >= next_report:
                report()
                next_report = time.monotonic() + report_every
            stop.wait(min(limiter.wait_seconds(), 0.2) if due == 0 else 0)
    finally:
        left = producer.flush(30)
        if left:
            stats.failed += left
            stats.last_error = f"{left} records not delivered at exit"
        report()
    return stats.summary()
