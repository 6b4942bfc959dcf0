"""The reconciliation check finds a missing archive range, on the real broker, Spark and Delta."""

from __future__ import annotations

import argparse

from spark_jobs import reconcile

from kdq.rules import load_rules
from kdq.spark.speed_layer import SpeedLayer
from tests.integration.helpers import W0, isolated_config, produce
from tests.integration.test_speed_layer_example import run_available_now


def test_reconcile_clean_then_detects_a_deleted_range(spark, local_stack, tmp_path) -> None:
    prefix = f"rc{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-orders"
    config = isolated_config(local_stack, tmp_path, prefix)
    local_stack.kafka.create_topic(topic, partitions=2)
    # 8 records per partition, increasing timestamps, over W0 .. W0 + 4 s.
    sent = [(p, W0 + i * 500 + p) for p in (0, 1) for i in range(8)]
    produce(config.kafka_bootstrap(), topic, [(p, b'{"a":1}' if i % 2 else b"{x", ts) for i, (p, ts) in enumerate(sent)])
    run_available_now(SpeedLayer(spark, config, load_rules(config.rules_dir)))
    args = argparse.Namespace(topics=[topic], pattern=None, from_ms=W0, to_ms=W0 + 10_000)

    clean = reconcile.run(spark, config, args)
    assert clean.ok, clean
    assert [(p["partition"], p["expected"], p["archived"], p["gaps"]) for p in clean["partitions"]] == [(0, 8, 8, []), (1, 8, 8, [])]
    assert clean["count_mismatches"] == 0

    # Partition 1 loses offsets 2..4 from the archive (e.g. a deleted file).
    path = config.tables_dir / "raw_archive"
    spark.sql(f"DELETE FROM delta.`{path}` WHERE topic = '{topic}' AND partition = 1 AND offset BETWEEN 2 AND 4")
    broken = reconcile.run(spark, config, args)
    assert not broken.ok
    assert [(p["topic"], p["partition"], p["gaps"], p["missing"]) for p in broken["problems"]] == [(topic, 1, [[2, 4]], 3)]
    assert broken["missing_offsets"] == 3 and broken["partitions_with_gaps"] == 1
    # The window counts (the stream counted them) no longer match the archive for the windows those records were in.
    lost = {W0 + i * 500 + 1 for i in (2, 3, 4)}
    expected_windows = {ts // 1000 * 1000 for ts in lost}
    assert broken["count_mismatches"] > 0
    assert {m["window_start_ms"] for m in broken["mismatches"]} == expected_windows
    assert sum(m["window_counts"] - m["archive"] for m in broken["mismatches"]) == 3

    # A gap at the edge of the range (the last offsets) is found too.
    spark.sql(f"DELETE FROM delta.`{path}` WHERE topic = '{topic}' AND partition = 0 AND offset >= 6")
    edge = reconcile.run(spark, config, args)
    assert {(p["partition"], tuple(map(tuple, p["gaps"]))) for p in edge["problems"]} == {(0, ((6, 7),)), (1, ((2, 4),))}
