"""Ordered pushes with the real InfluxDB 1.x and Kafka (a late push must not overwrite newer values).

A batch push (the hourly ``push_corrections``, a rebuild's push, the catch-up) must never put an older
absolute count over a newer one: InfluxDB keeps the last write of a point, so a push whose read is older
than what a point already holds must leave that point alone. Every count point carries the
``window_counts`` version it was read at (``kdq_version``), every metrics message the same as its
``kdq-version`` header.
"""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, TopicPartition

from kdq.influx import InfluxSink, Point
from kdq.spark.outputs import influx_catch_up, push_corrections
from kdq.spark.tables import ensure_tables, table_path
from kdq.stream.state import InfluxPushState
from kdq.tables import WINDOW_COUNTS
from tests.integration.helpers import influx_points, influx_rows, isolated_config
from tests.unit.test_batch_layer import _insert_counts

W0 = 1_700_000_000_000
W1 = W0 + 1000


def _table_version(spark, config) -> int:
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(spark, table_path(config, WINDOW_COUNTS)).history(1).first()["version"])


def _influx_versions(config, measurement: str) -> dict[int, int | None]:
    return {t: v for t, v in influx_rows(config, measurement, "kdq_version")}


def _metrics_headers(config) -> list[tuple[dict, bytes, list]]:
    import json

    consumer = Consumer({"bootstrap.servers": config.kafka_bootstrap(), "group.id": f"t-{uuid.uuid4().hex}"})
    topic = config.kafka.metrics_topic
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        partitions = [TopicPartition(topic, p, 0) for p in meta.partitions]
        ends = {p.partition: consumer.get_watermark_offsets(p, timeout=10)[1] for p in partitions}
        consumer.assign(partitions)
        seen: list[tuple[dict, bytes, list]] = []
        position = {p: 0 for p in ends}
        for _ in range(120):
            if all(position[p] >= ends[p] for p in ends):
                break
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            position[msg.partition()] = msg.offset() + 1
            seen.append((json.loads(msg.key()), msg.value(), msg.headers() or []))
        return seen
    finally:
        consumer.close()


def test_a_batch_push_never_replaces_a_newer_influx_point(spark, local_stack, tmp_path) -> None:
    topic = f"po-{uuid.uuid4().hex[:8]}"
    config = isolated_config(local_stack, tmp_path, "po-")
    ensure_tables(spark, config)
    _insert_counts(spark, config, [(topic, W0, "valid", 3), (topic, W1, "valid", 5), (topic, W1, "invalid", 1)])
    version = _table_version(spark, config)
    # W0: a writer already pushed a newer value (read at a later version of window_counts than this push
    # will read); W1: an older one.
    InfluxSink(config).write(
        [
            Point(topic, W0, {"valid": 7, "invalid": 0, "kdq_version": version + 100}),
            Point(topic, W1, {"valid": 4, "invalid": 1, "kdq_version": version - 1}),
        ]
    )

    pushed = push_corrections(spark, config, [(topic, W0, "valid"), (topic, W1, "valid"), (topic, W1, "invalid")])

    assert influx_points(config, topic) == {W0: (7, 0), W1: (5, 1)}  # the newer W0 stays, W1 is brought up to date
    assert _influx_versions(config, topic) == {W0: version + 100, W1: version}
    assert pushed.influx_ok and pushed.influx_points == 1 and pushed.influx_skipped == 1
    # the metrics messages carry the version they were read at
    messages = [(k["window"], k["status"], int(v), dict(h)) for k, v, h in _metrics_headers(config) if k["topic"] == topic]
    assert sorted(messages) == [
        (W0, "valid", 3, {"kdq-version": str(version).encode()}),
        (W1, "invalid", 1, {"kdq-version": str(version).encode()}),
        (W1, "valid", 5, {"kdq-version": str(version).encode()}),
    ]


def test_the_catch_up_never_replaces_a_newer_influx_point(spark, local_stack, tmp_path) -> None:
    topic = f"pc-{uuid.uuid4().hex[:8]}"
    config = isolated_config(local_stack, tmp_path, "pc-")
    ensure_tables(spark, config)
    InfluxPushState(config).record_failure(W0 - 60_000, "InfluxDB was down", now_ms=W0)
    _insert_counts(spark, config, [(topic, W0, "valid", 3), (topic, W1, "valid", 5)])
    version = _table_version(spark, config)
    InfluxSink(config).write([Point(topic, W0, {"valid": 9, "invalid": 0, "kdq_version": version + 1})])

    report = influx_catch_up(spark, config, since_ms=0)

    assert influx_points(config, topic) == {W0: (9, 0), W1: (5, 0)}
    assert _influx_versions(config, topic) == {W0: version + 1, W1: version}
    assert report.points == 1 and report.cleared
    assert InfluxPushState(config).read()["pending_since_ms"] is None
