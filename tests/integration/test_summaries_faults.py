"""Streaming summaries stay exact through crashes: the stream runs through spark-submit and the
fault-injection switch (KDQ_FAULT_POINT/BATCH/MARKER) kills it before and after the summary MERGE."""

from __future__ import annotations

import json
import random

import pytest

from kdq.spark.stream_process import stop_stream
from tests.integration.helpers import (
    crash_test_config,
    crash_then_restart,
    summary_rows,
    wait_for,
    write_config_file_with_summaries,
)
from tests.integration.test_summaries import W0, Truth, _assert_stats, assert_everywhere


def _delta_exact(spark, config, truth: Truth) -> bool:
    expected = truth.expected()
    rows = {k: r for k, r in summary_rows(spark, config, "lat").items() if k[1] == truth.topic}
    if set(rows) != set(expected):
        return False
    for key, want in expected.items():
        row = rows[key]
        try:
            _assert_stats(str(key), {**{k: row[k] for k in ("count", "sum", "min", "max", "mean", "stddev")},
                                     **row["percentiles"]}, want)
        except AssertionError:
            return False
    return True


@pytest.fixture
def stream_config(local_stack, tmp_path):
    prefix = f"sf{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-ops"
    local_stack.kafka.create_topic(topic, partitions=3)
    config = crash_test_config(local_stack, tmp_path / "data", prefix).with_summaries(
        [{"name": "lat", "topic": topic, "value": "value", "group_by": ["env", "metric"], "window_seconds": 600,
          "allowed_lateness_seconds": 3600, "significant_digits": 3, "percentiles": [50, 90, 99]}]
    )
    config = write_config_file_with_summaries(config, tmp_path / "kdq.toml")
    assert config.summaries and config.summaries[0].name == "lat"
    try:
        yield topic, config
    finally:
        stop_stream(config, timeout=30)


@pytest.mark.slow  # ~7 min on the 2-core machine: `make test-slow`, not CI (its time budget)
@pytest.mark.timeout(1800)  # four starts of spark-submit on a 2-core machine
def test_summaries_exact_through_crashes_before_and_after_their_merge(spark, stream_config, tmp_path) -> None:
    topic, config = stream_config
    truth = Truth(topic)
    rng = random.Random(5)
    # after_archive: the process dies as soon as its archive append is done, with the summary MERGE
    # (on the main thread, beside the append) not yet or partly run (the replay must apply it once);
    # after_merge: it dies after the MERGE and the outputs (the replay must skip the MERGE, resend the same).
    for n, point in enumerate(["after_archive", "after_merge"]):
        for _ in range(150):
            env, metric = rng.choice(["prod", "dev"]), rng.choice(["db_wait", "cpu"])
            truth.add(W0 + rng.randrange(0, 1_200_000), env, metric, round(rng.lognormvariate(2, 1), 3))
        truth.add(W0 + 1_000, "prod", "db_wait", "oops", reason="not_numeric")
        truth.flush(config)
        crash_then_restart(config, point, tmp_path / f"fault-{point}", "local[1]" if n % 2 == 0 else "local[2]", 300)
        wait_for(lambda: _delta_exact(spark, config, truth), 300, f"summaries exact after a crash at {point}", interval=4)
        assert stop_stream(config, timeout=120)
    assert_everywhere(spark, config, truth)
    assert sum(json.loads(k[3]) == {"env": "prod", "metric": "db_wait"} for k in truth.expected()) == 2
