"""A micro-batch's records read without Spark's Kafka source, for the batches that source cannot convert.

Spark's Kafka source turns every record's timestamp into microseconds with an
overflow check, so a single record whose *Kafka* timestamp is absurd (a
producer that sets epoch nanoseconds, 1.7e18, as the record timestamp; the
broker accepts any value) fails the whole micro-batch before kdq sees a row,
and the replay fails the same way, forever, for every topic. The source takes
no interceptor or deserializer that could repair the record first.

So when a batch fails inside that conversion, the speed layer reads the same
offset ranges itself (from the checkpoint's offset log, which Spark writes
before the batch runs) with a read_committed consumer, replaces timestamps
outside 1970..9999 with null, and classifies those rows exactly as it would
have classified Spark's: such records become ``bad_timestamp``, counted in
the window of their ingest time. Rare by nature, so it favours simplicity
over speed: the batch's records pass through the driver (at most
``kafka.max_offsets_per_trigger`` of them).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterable

from pyspark.sql import DataFrame, SparkSession

from kdq.config import Config
from kdq.storage import Location
from kdq.stream.checkpoint_offsets import EARLIEST, OffsetRange, batch_offset_ranges

log = logging.getLogger("kdq.stream")

MAX_KAFKA_TIMESTAMP_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
KAFKA_SOURCE_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"
)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def is_record_conversion_error(exc: BaseException) -> bool:
    """Whether a failed Spark action failed while Spark's Kafka source converted a record to a row."""
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    seen = 0
    while java is not None and seen < 20:
        if any("KafkaRecordToRowConverter" in str(frame.getClassName()) for frame in java.getStackTrace()):
            return True
        java, seen = java.getCause(), seen + 1
    return "KafkaRecordToRowConverter" in str(exc)


def read_ranges(config: Config, ranges: Iterable[OffsetRange], timeout: float = 120.0) -> list[tuple]:
    """Every committed record of the ranges as a row of Spark's Kafka source schema.

    read_committed, like the Spark source: aborted records are skipped, and the
    consumer's position moves past transaction markers, so a range is done when
    the position reaches its end, not when a record with offset end-1 arrives.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    ranges = list(ranges)
    if not ranges:
        return []
    consumer = Consumer(
        {
            **config.kafka_client_conf(),
            "group.id": "kdq-fallback-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.message.max.bytes": config.kafka.max_message_bytes,
        }
    )
    rows: list[tuple] = []
    try:
        ends = {(r.topic, r.partition): r.end for r in ranges}
        consumer.assign(
            [TopicPartition(r.topic, r.partition, OFFSET_BEGINNING if r.start == EARLIEST else r.start) for r in ranges]
        )
        pending = set(ends)
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading the batch's records from Kafka: {sorted(pending)} not done in {timeout:.0f}s")
            for message in consumer.consume(1000, 0.5):
                if message.error():
                    raise RuntimeError(f"reading the batch's records from Kafka: {message.error()}")
                tp = (message.topic(), message.partition())
                if tp in pending and message.offset() < ends[tp]:
                    rows.append(_row(message))
            for tp in list(pending):
                position = consumer.position([TopicPartition(tp[0], tp[1])])[0].offset
                if position >= ends[tp]:
                    pending.discard(tp)
                    consumer.pause([TopicPartition(tp[0], tp[1])])
    finally:
        consumer.close()
    return rows


def _row(message) -> tuple:
    kind, millis = message.timestamp()
    # Out of 1970..9999 (or absent): null, which classify turns into bad_timestamp.
    stamp = _EPOCH + dt.timedelta(milliseconds=millis) if 0 <= millis <= MAX_KAFKA_TIMESTAMP_MS else None
    return (message.key(), message.value(), message.topic(), message.partition(), message.offset(), stamp, kind)


def fallback_batch(spark: SparkSession, config: Config, checkpoint: Location, batch_id: int) -> DataFrame:
    """Micro-batch ``batch_id``'s records as a DataFrame shaped like the Spark Kafka source's."""
    ranges = batch_offset_ranges(checkpoint, batch_id)
    rows = read_ranges(config, ranges)
    log.warning(
        "batch %d: Spark's Kafka source could not convert a record (an out-of-range Kafka timestamp); "
        "read its %d records over %d partition ranges directly from Kafka instead",
        batch_id, len(rows), len(ranges),
    )
    return spark.createDataFrame(rows, KAFKA_SOURCE_SCHEMA)
