"""Archive from Kafka fills a deliberately missing range without duplicates, on the real broker, Spark and Delta."""

from __future__ import annotations

import argparse
import json
from collections import Counter

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql import functions as F
from spark_jobs import archive_from_kafka, batch_recompute

from kdq.rules import load_rules
from kdq.spark.speed_layer import SpeedLayer
from kdq.spark.writers import now_ms
from tests.integration.helpers import W0, archived_offsets, expected_counts, isolated_config, produce, window_counts
from tests.integration.test_speed_layer_example import run_available_now


def _args(topics: list[str], starting: str = "earliest") -> argparse.Namespace:
    return argparse.Namespace(
        topics=topics, pattern=None, starting_offsets=starting, start_time=None,
        ending_offsets="latest", end_time=None, run_id=None,
    )


def test_archive_from_kafka_fills_a_gap_exactly_once(spark, local_stack, tmp_path) -> None:
    prefix = f"ak{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-orders"
    config = isolated_config(local_stack, tmp_path, prefix)
    local_stack.kafka.create_topic(topic, partitions=2)
    # 10 records per partition, every third one invalid, over a few 1-second windows.
    sent = [(p, i % 3 != 0, W0 + i * 300 + p) for p in (0, 1) for i in range(10)]
    produce(config.kafka_bootstrap(), topic, [(p, b'{"a":1}' if ok else b"{oops", ts) for p, ok, ts in sent])
    run_available_now(SpeedLayer(spark, config, load_rules(config.rules_dir)))
    every = Counter((p, o) for p in (0, 1) for o in range(10))
    assert archived_offsets(spark, config, topic) == every
    truth = expected_counts(topic, [(ts, ok) for _, ok, ts in sent])
    assert window_counts(spark, config, topic) == truth

    # A gap: partition 0's offsets 3..6 disappear from the archive.
    archive_path = config.tables_dir / "raw_archive"
    spark.sql(f"DELETE FROM delta.`{archive_path}` WHERE topic = '{topic}' AND partition = 0 AND offset BETWEEN 3 AND 6")
    assert archived_offsets(spark, config, topic) == every - Counter((0, o) for o in range(3, 7))

    ingest_from = now_ms()
    report = archive_from_kafka.run(spark, config, _args([topic]))
    ingest_to = now_ms() + 1
    assert report["ok"] and report["missing_in_kafka"] == []
    assert (report["rows_read"], report["rows_loaded"], report["rows_skipped_already_archived"]) == (20, 4, 16)
    assert archived_offsets(spark, config, topic) == every, "every (topic, partition, offset) exactly once"
    archive = spark.read.format("delta").load(str(archive_path)).where(F.col("topic") == topic)
    loaded = archive.where(F.col("source") == "archive_from_kafka").collect()
    assert sorted((r["partition"], r["offset"], r["counted"]) for r in loaded) == [(0, o, False) for o in range(3, 7)]
    # Reloaded records are classified like the stream did (the ground truth: every third one invalid).
    assert all(r["valid"] == (r["offset"] % 3 != 0) for r in loaded)

    # Running it again loads nothing.
    again = archive_from_kafka.run(spark, config, _args([topic]))
    assert (again["rows_loaded"], again["rows_skipped_already_archived"]) == (0, 20)
    assert archived_offsets(spark, config, topic) == every

    # The hourly recompute counts the loaded windows (source <> 'stream'): equal to the truth, no correction.
    summary = batch_recompute.run(
        spark, config, argparse.Namespace(start=ingest_from, end=ingest_to, run_id="ak", reason="late_data", skip_push=True)
    )
    assert summary["late_windows"] > 0 and summary["corrections"] == 0, summary
    assert window_counts(spark, config, topic) == truth

    # What Kafka no longer has is reported: delete partition 1 below offset 2, ask for it from offset 0.
    admin = AdminClient({"bootstrap.servers": config.kafka_bootstrap()})
    for future in admin.delete_records([TopicPartition(topic, 1, 2)]).values():
        future.result(timeout=30)
    gone = archive_from_kafka.run(spark, config, _args([topic], starting=json.dumps({topic: {"0": 0, "1": 0}})))
    assert not gone["ok"]
    assert gone["missing_in_kafka"] == [{"topic": topic, "partition": 1, "from_offset": 0, "to_offset": 2}]
    assert gone["rows_loaded"] == 0 and gone["rows_read"] == 18
    assert archived_offsets(spark, config, topic) == every
