"""Spark reads the real broker through the Kafka connector and upserts into Delta with an idempotent MERGE."""

from __future__ import annotations

from confluent_kafka import Producer
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from kdq.stack.manager import LocalStack


def test_kafka_batch_read_merge_twice_is_idempotent(spark, local_stack: LocalStack, topic_name, tmp_path) -> None:
    local_stack.kafka.create_topic(topic_name, partitions=3)
    producer = Producer({"bootstrap.servers": local_stack.kafka.bootstrap})
    for i in range(12):
        producer.produce(topic_name, key=f"k{i % 4}", value=str(i), partition=i % 3, timestamp=1_700_000_000_000 + i)
    assert producer.flush(30) == 0

    records = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", local_stack.kafka.bootstrap)
        .option("subscribe", topic_name)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    # Latest value per key, as an upsert source.
    per_key = (
        records.select(F.col("key").cast("string").alias("k"), "partition", "offset", F.col("value").cast("string").alias("v"))
        .groupBy("k")
        .agg(F.count("*").alias("n"), F.max(F.col("v").cast("int")).alias("max_v"))
    )
    assert per_key.count() == 4

    table = f"kdq.it_upsert_{topic_name.replace('-', '_')}"
    spark.sql(f"CREATE TABLE {table} (k STRING, n BIGINT, max_v INT) USING delta LOCATION '{tmp_path / 'upsert'}'")
    per_key.createOrReplaceTempView("per_key_source")
    merge = f"""
        MERGE INTO {table} t USING per_key_source s ON t.k = s.k
        WHEN MATCHED AND (t.n <> s.n OR t.max_v <> s.max_v) THEN UPDATE SET n = s.n, max_v = s.max_v
        WHEN NOT MATCHED THEN INSERT *
    """
    spark.sql(merge)
    first = spark.table(table)
    expected = spark.createDataFrame(
        [("k0", 3, 8), ("k1", 3, 9), ("k2", 3, 10), ("k3", 3, 11)], "k STRING, n BIGINT, max_v INT"
    )
    assertDataFrameEqual(first, expected)
    version_after_first = spark.sql(f"DESCRIBE HISTORY {table}").agg(F.max("version")).first()[0]

    spark.sql(merge)
    assertDataFrameEqual(spark.sql(f"SELECT * FROM {table}"), expected)
    # The second MERGE matched nothing to change: the table's content is identical.
    changed = spark.sql(f"DESCRIBE HISTORY {table}").where(F.col("version") > version_after_first)
    metrics = [row["operationMetrics"] for row in changed.collect()]
    assert all(int(m.get("numTargetRowsUpdated", "0")) == 0 and int(m.get("numTargetRowsInserted", "0")) == 0 for m in metrics)
