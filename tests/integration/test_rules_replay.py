"""A replay after a rule change counts what the batch's first attempt archived.

The stream is killed right after the raw archive append of a batch (its archived rows judged by the old
rule, its window-count MERGE not done), the rule is changed, the stream restarts: the replayed batch's
MERGE must count what its archived rows say (the old rule), and the batches after it the new rule.
Before the ledger recorded the rules, the replay was re-classified with the new rule and window_counts
disagreed with the archive. Since the archive append became a batch's first write (the counts
are an observed metric of that write), the replay reads its counts back from the archived rows.
"""

from __future__ import annotations

import json

import psutil
import pytest
from pyspark.sql import functions as F

from kdq.spark.stream_process import start_stream, stop_stream, stream_process
from tests.integration.helpers import (
    W0,
    isolated_config,
    produce,
    wait_for,
    window_counts,
    write_config_file,
)

OLD_RULE = {"type": "object", "required": ["a"]}
NEW_RULE = {"type": "object", "required": ["b"]}


def _archive_counts(spark, config, topic: str) -> dict[tuple[str, int, str], int]:
    rows = (
        spark.read.format("delta").load(str(config.tables_dir / "raw_archive"))
        .where(F.col("topic") == topic)
        .groupBy((F.unix_millis("window_start")).alias("w"), "valid")
        .count()
        .collect()
    )
    return {(topic, r["w"], "valid" if r["valid"] else "invalid"): r["count"] for r in rows}


@pytest.mark.slow  # ~3 min on the 2-core machine: `make test-slow`, not CI (its time budget)
@pytest.mark.timeout(900)
def test_a_replay_after_a_rule_change_counts_what_its_archive_rows_say(spark, local_stack, tmp_path) -> None:
    prefix = f"rr{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-rules"
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    rule_file = rules_dir / f"{topic}.schema.json"
    rule_file.write_text(json.dumps(OLD_RULE))
    config = isolated_config(  # crash_test_config's small batches, with this test's rules folder
        local_stack, tmp_path / "data", prefix,
        kafka={"max_offsets_per_trigger": 50},
        stream={"allowed_lateness_seconds": 3600, "trigger_interval_seconds": 0.5},
        paths={"rules_dir": str(rules_dir)},
    )
    config = write_config_file(config, tmp_path / "kdq.toml")
    assert config.rules_dir == rules_dir
    local_stack.kafka.create_topic(topic, partitions=1)
    # 200 records, 50 per micro-batch: four in five have "a", the fifth "b" (valid under the old rule: 40 of a
    # batch, under the new one: 10; the rules disagree on every record).
    values = [json.dumps({"b" if i % 5 == 0 else "a": i}).encode() for i in range(200)]
    produce(config.kafka_bootstrap(), topic, [(0, v, W0 + i * 10) for i, v in enumerate(values)])
    marker = tmp_path / "fault-after-archive"
    try:
        env = {"KDQ_FAULT_POINT": "after_archive", "KDQ_FAULT_BATCH": "1", "KDQ_FAULT_MARKER": str(marker)}
        pid = start_stream(config, extra_env=env)
        code = psutil.Process(pid).wait(timeout=300)
        assert marker.exists() and code == 137, stream_process(config).log_tail(60)

        rule_file.write_text(json.dumps(NEW_RULE))  # the rule changes while the stream is down
        start_stream(config)
        # Records produced after the restart are judged by the new rule.
        later = [json.dumps({"b": i}).encode() for i in range(200, 230)]
        produce(config.kafka_bootstrap(), topic, [(0, v, W0 + 5000 + i) for i, v in enumerate(later)])

        def archived_all() -> bool:
            return sum(_archive_counts(spark, config, topic).values()) == 230

        wait_for(archived_all, 300, "every record archived", interval=3)
        archive = _archive_counts(spark, config, topic)
        wait_for(lambda: window_counts(spark, config, topic) == archive, 120, "window_counts equal the archive", interval=3)
        log = stream_process(config).log_tail(2000)
        assert "batch 1: its records were archived by an earlier attempt" in log, log[-3000:]
        # The 30 later records are valid under the new rule: the stream went on with it after the replay.
        later_valid = (
            spark.read.format("delta").load(str(config.tables_dir / "raw_archive"))
            .where((F.col("topic") == topic) & (F.col("window_start") >= F.timestamp_millis(F.lit(W0 + 5000))))
            .where("valid").count()
        )
        assert later_valid == 30
    finally:
        stop_stream(config, timeout=60)
