"""PRODUCT.md's example end to end on the real broker, Spark, Delta and InfluxDB."""

from __future__ import annotations

import json

from pyspark.sql import functions as F

from kdq.rules import load_rules
from kdq.spark.speed_layer import SpeedLayer
from tests.integration.helpers import W0, influx_points, isolated_config, latest_metrics, produce, window_counts


def run_available_now(layer: SpeedLayer, timeout: float = 180) -> None:
    query = layer.start(available_now=True)
    try:
        assert query.awaitTermination(timeout), "stream did not finish within the deadline"
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
        layer.flush_reasons()  # as a graceful stop does: the reasons the batches kept in their ledger entries


def test_orders_example_with_late_data(spark, local_stack, tmp_path) -> None:
    prefix = f"ex{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-orders"
    local_stack.kafka.create_topic(topic, partitions=3)
    # Include everything and exclude other tests' topics, so the default exclusion of
    # our own output topics (the metrics topic receives messages during this test) is exercised.
    config = isolated_config(
        local_stack, tmp_path, prefix, kafka={"topic_include": ".*", "topic_exclude": rf"_.*|kdq\..*|(?!{prefix}).*"}
    )
    good = json.dumps({"id": 1}).encode()
    produce(
        config.kafka_bootstrap(),
        topic,
        [(0, good, W0 + 10), (0, good, W0 + 20), (0, good, W0 + 30), (0, b"{oops", W0 + 40)]
        + [(2, good, W0 + 500), (2, good, W0 + 900)]
        + [(1, b"not json", W0 + 1500)],
    )
    layer = SpeedLayer(spark, config, load_rules(config.rules_dir))
    run_available_now(layer)

    w1 = W0 + 1000
    assert window_counts(spark, config, topic) == {
        (topic, W0, "valid"): 5,
        (topic, W0, "invalid"): 1,
        (topic, w1, "invalid"): 1,
    }
    metrics = latest_metrics(config)
    assert metrics[(topic, W0, "valid")] == 5 and metrics[(topic, W0, "invalid")] == 1
    assert metrics[(topic, w1, "invalid")] == 1 and (topic, w1, "valid") not in metrics
    assert influx_points(config, topic) == {W0: (5, 1), w1: (0, 1)}

    # One more valid record for w0, within the allowed lateness (10 s): everything moves to 6.
    produce(config.kafka_bootstrap(), topic, [(1, good, W0 + 700)])
    run_available_now(layer)
    assert window_counts(spark, config, topic)[(topic, W0, "valid")] == 6
    assert latest_metrics(config)[(topic, W0, "valid")] == 6
    assert influx_points(config, topic)[W0] == (6, 1)

    # Advance the topic's event time by a minute, then send a record for w0: beyond the lateness.
    produce(config.kafka_bootstrap(), topic, [(0, good, W0 + 60_000)])
    run_available_now(layer)
    produce(config.kafka_bootstrap(), topic, [(2, good, W0 + 800)])
    run_available_now(layer)
    counts = window_counts(spark, config, topic)
    assert counts[(topic, W0, "valid")] == 6, "the speed layer must leave a closed window alone"
    assert influx_points(config, topic)[W0] == (6, 1)
    archive = spark.read.format("delta").load(str(config.tables_dir / "raw_archive"))
    late = archive.where((F.col("topic") == topic) & ~F.col("counted")).collect()
    assert [(r["partition"], r["valid"]) for r in late] == [(2, True)]
    assert archive.where(F.col("topic") == topic).count() == 10
    assert {r["topic"] for r in archive.select("topic").distinct().collect()} == {topic}, "output topics must be excluded"
    # The late-rows metric, durably in the micro-batch ledger (and per batch in the progress records).
    assert sum(entry["late_rows"].get(topic, 0) for entry in layer.ledger.entries()) == 1
    assert sum(report.late_rows.get(topic, 0) for report in layer.reports.values()) == 1


def test_batch_tasks_coalesce_the_kafka_partitions(spark, local_stack, tmp_path) -> None:
    """stream.batch_tasks = 1: the four Kafka partitions' records are read by one task per micro-batch (the
    archive append writes one file for its one event hour, not one per partition); every count still exact."""
    from delta.tables import DeltaTable

    from tests.integration.helpers import expected_counts

    prefix = f"bt{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-orders"
    local_stack.kafka.create_topic(topic, partitions=4)
    config = isolated_config(local_stack, tmp_path, prefix, stream={"batch_tasks": 1})
    sent = [(p, i % 4 != 0, W0 + i * 90 + p) for p in range(4) for i in range(10)]  # one event hour
    produce(config.kafka_bootstrap(), topic, [(p, b'{"a":1}' if ok else b"{oops", ts) for p, ok, ts in sent])
    run_available_now(SpeedLayer(spark, config, load_rules(config.rules_dir)))

    assert window_counts(spark, config, topic) == expected_counts(topic, [(ts, ok) for _, ok, ts in sent])
    archive = str(config.tables_dir / "raw_archive")
    assert spark.read.format("delta").load(archive).count() == 40
    appends = [h for h in DeltaTable.forPath(spark, archive).history().collect() if h["operation"] == "WRITE"]
    assert appends and all(int(h["operationMetrics"]["numFiles"]) == 1 for h in appends), [
        dict(h["operationMetrics"]) for h in appends
    ]
