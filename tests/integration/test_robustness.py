"""No record can stop the counts or skew them: poison records in a running stream, aborted transactions.

Each test names its scenario and runs against the real broker, Spark and Delta.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections import Counter

from confluent_kafka import Producer
from pyspark.sql import functions as F
from spark_jobs import archive_from_kafka, reconcile

from kdq.rules import load_rules
from kdq.spark.speed_layer import SpeedLayer
from tests.integration.helpers import W0, archived_offsets, isolated_config, produce, wait_for, window_counts
from tests.integration.test_speed_layer_example import run_available_now

# Values that once failed whole micro-batches, or could: each must become one invalid count.
POISON_VALUES: list[tuple[bytes, str]] = [
    (b'{"id":"p1","ts":1700000000000000000}', "bad_timestamp"),  # epoch nanoseconds: was a long overflow
    (b'{"id":"p2","ts":1700000000000000}', "bad_timestamp"),  # epoch microseconds
    (b'{"id":"p3","ts":-5}', "bad_timestamp"),
    (b'{"id":"p4","ts":"NaN"}', "bad_timestamp"),
    (b'{"id":"p5","ts":123456789012345678901234567890}', "bad_timestamp"),
    (b'{"id":"p6","ts":"' + b"7" * 50_000 + b'"}', "bad_timestamp"),
    (b'{"id":"p7","ts":"10000-01-01T00:00:00Z"}', "bad_timestamp"),
    (b'{"id":"p8","id":"p8","ts":1700000000100}', "not_json"),  # duplicate keys
    (b"[" * 50_000 + b"]" * 50_000, "too_complex"),  # nesting deeper than the parser's limit
    (b'{"id":"\xed\xa0\x80","ts":1700000000100}', "not_utf8"),  # an encoded surrogate
]


def _event_time_rules(folder, topic: str) -> None:
    folder.mkdir(parents=True)
    (folder / "topics.toml").write_text(f'[[topic]]\nmatch = "{topic}"\nevent_time_field = "ts"\n')


def test_poison_records_between_valid_ones_in_a_running_stream(spark, local_stack, tmp_path) -> None:
    prefix = f"poison{uuid.uuid4().hex[:6]}"
    topic, other = f"{prefix}-events", f"{prefix}-other"
    _event_time_rules(tmp_path / "rules", topic)
    config = isolated_config(local_stack, tmp_path / "data", prefix, paths={"rules_dir": str(tmp_path / "rules")})
    local_stack.kafka.create_topic(topic, partitions=2)
    local_stack.kafka.create_topic(other, partitions=1)

    def valid(i: int) -> bytes:
        return json.dumps({"id": f"v{i}", "ts": W0 + 100 + i}).encode()

    layer = SpeedLayer(spark, config, load_rules(config.rules_dir))
    query = layer.start(trigger_seconds=1)
    try:
        # Every poison record sits between two valid ones, on both partitions; another topic flows beside it.
        records = []
        for i, (value, _) in enumerate(POISON_VALUES):
            records += [(i % 2, valid(2 * i), W0 + 500), (i % 2, value, W0 + 500), (i % 2, valid(2 * i + 1), W0 + 500)]
        produce(config.kafka_bootstrap(), topic, records)
        produce(config.kafka_bootstrap(), other, [(0, b'{"ok":1}', W0 + 200 + i) for i in range(7)])
        expected = {(topic, W0, "valid"): 2 * len(POISON_VALUES), (topic, W0, "invalid"): len(POISON_VALUES)}
        wait_for(lambda: window_counts(spark, config, topic) == expected, 180, "counts of the poisoned topic")
        wait_for(lambda: window_counts(spark, config, other) == {(other, W0, "valid"): 7}, 60, "the other topic")

        # The stream is still running and keeps counting after the poison.
        late_valid = json.dumps({"id": "v-last", "ts": W0 + 150}).encode()
        produce(config.kafka_bootstrap(), topic, [(0, late_valid, W0 + 600), (1, POISON_VALUES[0][0], W0 + 600)])
        expected = {(topic, W0, "valid"): 2 * len(POISON_VALUES) + 1, (topic, W0, "invalid"): len(POISON_VALUES) + 1}
        wait_for(lambda: window_counts(spark, config, topic) == expected, 120, "counts after a second poison record")
        assert query.isActive and query.exception() is None
    finally:
        query.stop()

    archive = spark.read.format("delta").load(str(config.tables_dir / "raw_archive")).where(F.col("topic") == topic)
    reasons = sorted(r["reason"] for r in archive.where(~F.col("valid")).collect())
    assert reasons == sorted([reason for _, reason in POISON_VALUES] + ["bad_timestamp"])
    # A bad event time counts in the window of the Kafka timestamp it came with.
    bad = archive.where(F.col("reason") == "bad_timestamp").select(F.unix_millis("event_time").alias("t")).collect()
    assert {r["t"] for r in bad} == {W0 + 500, W0 + 600}


def test_record_whose_kafka_timestamp_spark_cannot_convert(spark, local_stack, tmp_path) -> None:
    """A producer that stamps records with epoch nanoseconds: the broker accepts it, Spark's Kafka source
    overflows converting it, and without the fallback every batch (all topics) would fail forever."""
    prefix = f"kts{uuid.uuid4().hex[:6]}"
    topic, other = f"{prefix}-events", f"{prefix}-other"
    config = isolated_config(local_stack, tmp_path, prefix)
    local_stack.kafka.create_topic(topic, partitions=2)
    local_stack.kafka.create_topic(other, partitions=1)
    ok = b'{"ok":1}'
    produce(
        config.kafka_bootstrap(),
        topic,
        [(0, ok, W0 + 1), (0, ok, 1_700_000_000_000_000_000), (0, ok, W0 + 2), (1, ok, W0 + 3), (1, b"x", W0 + 4)],
    )
    produce(config.kafka_bootstrap(), other, [(0, ok, W0 + 5)])
    layer = SpeedLayer(spark, config, load_rules(config.rules_dir))
    run_available_now(layer)
    # The record with the absurd timestamp counts once, invalid, in the window of its ingest time.
    counts = window_counts(spark, config, topic)
    assert counts.pop((topic, W0, "valid")) == 3 and counts.pop((topic, W0, "invalid")) == 1
    assert list(counts.values()) == [1] and next(iter(counts))[2] == "invalid" and next(iter(counts))[1] > W0
    assert window_counts(spark, config, other) == {(other, W0, "valid"): 1}
    archive = spark.read.format("delta").load(str(config.tables_dir / "raw_archive")).where(F.col("topic") == topic)
    poisoned = archive.where(F.col("reason") == "bad_timestamp").collect()
    assert [(r["partition"], r["offset"], r["kafka_timestamp"]) for r in poisoned] == [(0, 1, None)]
    assert archive.count() == 5

    # Later batches read through Spark's source again.
    produce(config.kafka_bootstrap(), topic, [(1, ok, W0 + 6)])
    run_available_now(layer)
    assert window_counts(spark, config, topic)[(topic, W0, "valid")] == 4

    # Archive-from-Kafka over the same range meets the same record and reads around Spark's source too.
    archive_path = str(config.tables_dir / "raw_archive")
    spark.sql(f"DELETE FROM delta.`{archive_path}` WHERE topic = '{topic}' AND partition = 0")
    report = archive_from_kafka.run(
        spark, config,
        argparse.Namespace(topics=[topic], pattern=None, starting_offsets="earliest", start_time=None,
                           ending_offsets="latest", end_time=None, run_id=None),
    )
    assert (report["rows_read"], report["rows_loaded"]) == (6, 3), report
    assert archived_offsets(spark, config, topic) == Counter([(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)])


def test_transactional_producer_that_aborts_is_counted_for_its_commits_only(spark, local_stack, tmp_path) -> None:
    prefix = f"txn{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}-payments"
    config = isolated_config(local_stack, tmp_path, prefix)
    local_stack.kafka.create_topic(topic, partitions=2)
    producer = Producer(
        {"bootstrap.servers": config.kafka_bootstrap(), "transactional.id": f"{prefix}-producer", "enable.idempotence": True}
    )
    producer.init_transactions(30)

    def transaction(n: int, commit: bool, offset: int) -> None:
        producer.begin_transaction()
        for i in range(n):
            producer.produce(topic, value=json.dumps({"n": offset + i}).encode(), partition=i % 2, timestamp=W0 + 100)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)

    transaction(50, commit=True, offset=0)
    transaction(30, commit=False, offset=50)
    # Plain records after the aborted transaction, and a last committed one: the reader must pass the
    # abort markers and the aborted batch, and still see everything committed after them.
    produce(config.kafka_bootstrap(), topic, [(0, b'{"plain":1}', W0 + 200), (1, b"not json", W0 + 200)])
    transaction(4, commit=True, offset=80)

    layer = SpeedLayer(spark, config, load_rules(config.rules_dir))
    run_available_now(layer)
    assert window_counts(spark, config, topic) == {(topic, W0, "valid"): 55, (topic, W0, "invalid"): 1}
    archive = spark.read.format("delta").load(str(config.tables_dir / "raw_archive")).where(F.col("topic") == topic)
    archived = sorted(json.loads(r["value"])["n"] for r in archive.where(F.col("valid")).collect() if b"plain" not in r["value"])
    assert archived == list(range(50)) + [80, 81, 82, 83], "aborted records (50..79) must never be archived or counted"

    # Reconciliation: the aborted records and the transaction markers occupy offsets no reader sees; they
    # are holes, not gaps.
    report = reconcile.run(spark, config, argparse.Namespace(topics=[topic], pattern=None, from_ms=None, to_ms=None))
    assert report["ok"] and report["missing_offsets"] == 0, report["problems"]
    assert sum(p.get("holes_without_records", 0) for p in report["partitions"]) >= 30 + 3
