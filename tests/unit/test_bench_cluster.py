"""benchmarks.cluster (make bench-cluster): its arguments and its side-by-side report; no stack is started."""

from __future__ import annotations

import pytest
from benchmarks import cluster


def test_workload_options_go_to_make_bench_and_only_the_orders_speed_run() -> None:
    own, workload = cluster.parse_args(["--quick", "--shapes", "cluster", "--messages", "1000", "--no-save"])
    assert own.shapes == ["cluster"] and own.no_save
    assert workload.messages == 1000 and workload.quick
    assert workload.rule_variants == [] and workload.phases == {"throughput", "latency"}
    assert workload.schema == "on"
    with pytest.raises(SystemExit):
        cluster.parse_args(["--shapes", "yarn"])


def _run(shape: str, msgs: int, executors: float | None = None) -> dict:
    cpu = {"stream_cores": 1.0, "broker_cores": 0.1, "machine_cores": 1.9, "other_cores": 0.0}
    if executors is not None:
        cpu["executor_cores"] = executors
    return {
        "shape": shape,
        "stack": {"up_seconds": 10.0, "kafka_brokers": 3 if shape == "cluster" else 1,
                  "replication_factor": 3 if shape == "cluster" else 1, "min_insync_replicas": 2,
                  "spark": "local[2]" if shape == "local" else "spark://127.0.0.1:<port>, 2 workers x 1 core / 2 GB"},
        "stream_settings": {"master": "local[2]", "trigger_seconds": 5, "max_offsets_per_trigger": 200000,
                            "shuffle_partitions": 4},
        "catch_up": {"msgs_per_s": msgs, "steady_msgs_per_s": msgs + 100, "first_batch_seconds": 9.0,
                     "wall_seconds_incl_startup": 80.0, "cpu": cpu},
        "latency_phases": [{"target_msgs_per_s": 5000, "latency_s": {"p50": 8.0, "p99": 14.0}}],
        "catch_up_peak_rss": 2 * 2**30,
        "checks": {"exactly_once": True, "archive_matches_expected": True, "counted_matches": True},
    }


def test_the_table_puts_the_shapes_side_by_side() -> None:
    result = {"runs": [_run("local", 16000), _run("cluster", 12000, executors=1.5)]}
    lines = cluster.comparison(result)
    local, clustered = lines[2], lines[3]
    assert local.startswith("| local | 1 broker, RF 1 | local[2] | **16,000**") and local.endswith("| yes |")
    assert clustered.startswith("| cluster | 3 brokers, RF 3 |") and "**12,000**" in clustered
    assert "1.0 / 1.5 / 0.1 / 1.9" in clustered and "5,000/s: p50 8.0 s, p99 14.0 s" in clustered
    assert lines[-1] == "Cluster ÷ local[2] catch-up throughput: **0.75×**."


def test_a_cluster_only_run_is_shown_beside_the_last_make_bench() -> None:
    reference = {**_run("local", 15855), "started_at": "2026-11-23T22:37:25Z"}
    del reference["stack"]
    lines = cluster.comparison({"runs": [_run("cluster", 11000, executors=1.2)], "reference_local": reference})
    assert lines[3].startswith("| local (latest.json, 2026-11-23T22:37:25Z: another run) | 1 broker, RF 1 | local[2] |")
    failed = _run("cluster", 11000)
    failed["checks"]["exactly_once"] = False
    assert cluster.comparison({"runs": [failed]})[2].endswith("| NO |")
