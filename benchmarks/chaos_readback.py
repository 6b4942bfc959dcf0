"""Reading the chaos run's outputs back: the topics' ground truth (read_committed), the metrics topic, InfluxDB
and Delta (see :mod:`benchmarks.chaos`)."""

from __future__ import annotations

import uuid

from benchmarks import chaos_logic as cl
from benchmarks.chaos_setup import _now
from kdq.config import Config


def end_offsets(config: Config, topics: list[str]) -> dict[tuple[str, int], int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**config.kafka_client_conf(), "group.id": f"chaos-{uuid.uuid4().hex}"})
    try:
        meta = consumer.list_topics(timeout=30).topics
        return {
            (t, p): consumer.get_watermark_offsets(TopicPartition(t, p), timeout=30)[1]
            for t in topics for p in meta[t].partitions
        }
    finally:
        consumer.close()


def read_topics(config: Config, topics: list[str], isolation: str, on_message, timeout: float = 900.0) -> int:
    """Every record of ``topics`` from the beginning to the end, in offset order per partition."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({
        **config.kafka_client_conf(),
        "group.id": f"chaos-truth-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": isolation,
    })
    try:
        meta = consumer.list_topics(timeout=30).topics
        partitions = [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in meta[t].partitions]
        consumer.assign(partitions)
        pending = {(tp.topic, tp.partition) for tp in partitions}
        deadline = _now() + timeout
        n = 0
        while pending:
            if _now() > deadline:
                raise TimeoutError(f"reading {topics} back: partitions {sorted(pending)} not at their end after {timeout:.0f} s")
            for msg in consumer.consume(1000, 1.0):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        pending.discard((msg.topic(), msg.partition()))
                        continue
                    raise RuntimeError(f"reading {msg.topic()}: {msg.error()}")
                on_message(msg)
                n += 1
        return n
    finally:
        consumer.close()


def read_truth(config: Config, topics: list[str]) -> tuple[cl.Truth, int]:
    truth = cl.Truth()
    read_topics(config, topics, "read_committed",
                lambda m: truth.add(m.topic(), m.partition(), m.offset(), m.headers(), m.value()))
    uncommitted = cl.Truth()
    read_topics(config, topics, "read_uncommitted", lambda m: uncommitted.add(m.topic(), m.partition(), m.offset(), m.headers()))
    return truth, uncommitted.meant_to_abort


def read_metrics(config: Config) -> tuple[dict, int]:
    messages: list[tuple[bytes | None, bytes | None]] = []
    read_topics(config, [config.kafka.metrics_topic], "read_committed", lambda m: messages.append((m.key(), m.value())))
    return cl.last_values(messages)


def read_influx(config: Config, topics: list[str]) -> dict[str, dict[int, tuple]]:
    import requests

    out: dict[str, dict[int, tuple]] = {}
    for topic in topics:
        response = requests.get(
            f"{config.influx_url()}/query",
            params={"db": config.influxdb.database, "q": f'SELECT valid, invalid FROM "{topic}"', "epoch": "ms"},
            timeout=60,
        )
        response.raise_for_status()
        body = response.json()["results"][0]
        if "error" in body:
            raise RuntimeError(f"InfluxDB query of {topic}: {body['error']}")
        series = body.get("series", [])
        out[topic] = {int(t): (v, i) for t, v, i in series[0]["values"]} if series else {}
    return out


def read_delta(config: Config, topics: list[str]) -> tuple[list[tuple], dict, list[tuple]]:
    from pyspark.sql import functions as F

    from kdq.spark.session import build_session
    from kdq.storage import table_location

    spark = build_session(config, app_name="kdq-chaos-check")
    try:
        # kdq.storage's locations: a local folder, or s3a:// with paths.storage_uri (--storage s3a)
        counts = spark.read.format("delta").load(table_location(config, "window_counts")).where(F.col("topic").isin(topics))
        rows = [(r[0], int(r[1]), r[2], int(r[3])) for r in
                counts.select("topic", F.unix_millis("window_start"), "status", "count").collect()]
        archive = spark.read.format("delta").load(table_location(config, "raw_archive")).where(F.col("topic").isin(topics))
        archived = {(r[0], int(r[1]), int(r[2])): int(r[3]) for r in
                    archive.groupBy("topic", "partition", "offset").count().collect()}
        summaries = spark.read.format("delta").load(table_location(config, "summaries")).where(F.col("topic").isin(topics))
        summary_rows = [tuple(r) for r in summaries.select(
            "summary", "topic", F.unix_millis("window_start"), "groups", "count", "sum", "min", "max", "rejected").collect()]
        return rows, archived, summary_rows
    finally:
        spark.stop()
