"""The cluster shape of the local stack (issue 16): three KRaft brokers (RF 3, min.insync.replicas 2) and a
Spark standalone master with two workers, started by ``LocalStack(cluster=True)`` (what `kdq up --cluster`
runs) in a folder of its own. The speed layer is submitted to the standalone master with spark-submit
(--py-files, --jars) exactly as `kdq stream` does; every output is compared with ground truth computed here.

Slow (about 11 minutes on 2 cores): marked ``cluster``; `make test-cluster` runs it, `-m "not cluster"`
leaves it out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from kdq.config import Config
from kdq.stack.manager import LocalStack
from tests.conftest import make_config
from tests.integration.helpers import (
    W0,
    archived_offsets,
    expected_counts,
    influx_points,
    isolated_config,
    latest_metrics,
    produce,
    wait_for,
    window_counts,
    write_config_file,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.fixture(scope="module")
def cluster_stack(tmp_path_factory: pytest.TempPathFactory):
    config = make_config(tmp_path_factory.mktemp("cluster-stack"))
    stack = LocalStack(config, cluster=True)
    try:
        started = time.monotonic()
        statuses = stack.up()
        print(f"\ncluster stack up in {time.monotonic() - started:.1f} s")
        assert all(s.healthy for s in statuses), [s.line() for s in statuses]
        yield stack
    finally:
        stack.down()
    leftovers = [p.name for p in [*(n.process for n in stack.kafka.nodes), *stack.spark.processes()] if p.running()]
    assert not leftovers, f"still running after down: {leftovers}"


def cluster_config(stack: LocalStack, data_dir: Path, prefix: str, **sections: dict) -> Config:
    """An isolated config whose jobs go to the standalone master, written to a file for spark-submit."""
    spark = {"master": stack.spark.url, "shuffle_partitions": 2, **sections.pop("spark", {})}
    config = isolated_config(stack, data_dir, prefix, spark=spark, **sections)
    return write_config_file(config, data_dir / "kdq.toml")


def submit_available_now(config: Config, timeout: float = 420) -> None:
    """`kdq stream --available-now` in the foreground (spark-submit to the master), with a deadline."""
    from kdq.spark.submit import submit_command
    from kdq.stream_process import child_env

    command = submit_command(config, "stream_counts", ["--available-now"], app_name="kdq-speed-layer")
    assert command[command.index("--master") + 1].startswith("spark://")
    assert "--py-files" in command and "--jars" in command
    result = subprocess.run(
        command, env={**os.environ, **child_env(config)}, cwd=config.base_dir,
        capture_output=True, text=True, timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]


def topic_settings(stack: LocalStack, topic: str) -> tuple[int, str]:
    """(replication factor of partition 0, min.insync.replicas) of ``topic``."""
    admin = AdminClient({"bootstrap.servers": stack.kafka.bootstrap})
    # A new topic's partitions reach every broker's metadata a moment after its creation.
    meta = wait_for(lambda: admin.list_topics(topic, timeout=10).topics[topic].partitions, 30, f"{topic}'s metadata")
    replicas = len(meta[0].replicas)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    return replicas, configs["min.insync.replicas"].value


def test_seed_example_on_the_cluster(spark, cluster_stack: LocalStack, tmp_path: Path) -> None:
    stack = cluster_stack
    prefix = f"cx{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-orders"
    stack.kafka.create_topic(topic, partitions=3)
    config = cluster_config(
        stack, tmp_path, prefix, kafka={"topic_include": ".*", "topic_exclude": rf"_.*|kdq\..*|(?!{prefix}).*"}
    )
    assert topic_settings(stack, topic) == (3, "2")
    assert topic_settings(stack, stack.config.kafka.metrics_topic) == (3, "2")

    good = json.dumps({"id": 1}).encode()
    produce(
        config.kafka_bootstrap(),
        topic,
        [(0, good, W0 + 10), (0, good, W0 + 20), (0, good, W0 + 30), (0, b"{oops", W0 + 40)]
        + [(2, good, W0 + 500), (2, good, W0 + 900)]
        + [(1, b"not json", W0 + 1500)],
    )
    submit_available_now(config)

    # It ran on the cluster: a finished application of the master, with executors on the workers.
    apps = [a for a in stack.spark.status().get("completedapps", []) if a.get("name") == "kdq-speed-layer"]
    assert apps and apps[-1]["cores"] >= 1, stack.spark.status()
    executors = [p for w in stack.spark.workers for p in (Path(w.pid_file).parent / w.name).glob("app-*/*/stderr")]
    assert executors, "no executor ran on a worker"
    # The internal topics at RF 3 (the stream's metrics producer and the test's consumer groups use them).
    assert topic_settings(stack, config.kafka.metrics_topic) == (3, "2")

    w1 = W0 + 1000
    assert window_counts(spark, config, topic) == {
        (topic, W0, "valid"): 5,
        (topic, W0, "invalid"): 1,
        (topic, w1, "invalid"): 1,
    }
    metrics = latest_metrics(config)
    assert metrics == {(topic, W0, "valid"): 5, (topic, W0, "invalid"): 1, (topic, w1, "invalid"): 1}
    assert influx_points(config, topic) == {W0: (5, 1), w1: (0, 1)}

    # One more valid record for w0, within the allowed lateness (10 s): everything moves to 6.
    produce(config.kafka_bootstrap(), topic, [(1, good, W0 + 700)])
    submit_available_now(config)
    assert window_counts(spark, config, topic)[(topic, W0, "valid")] == 6
    assert latest_metrics(config)[(topic, W0, "valid")] == 6
    assert influx_points(config, topic)[W0] == (6, 1)

    # Event time a minute on (its own run: the watermark moves between micro-batches), then a record for
    # w0: beyond the lateness, archived but not counted.
    produce(config.kafka_bootstrap(), topic, [(0, good, W0 + 60_000)])
    submit_available_now(config)
    produce(config.kafka_bootstrap(), topic, [(2, good, W0 + 800)])
    submit_available_now(config)
    counts = window_counts(spark, config, topic)
    assert counts == {
        (topic, W0, "valid"): 6,
        (topic, W0, "invalid"): 1,
        (topic, w1, "invalid"): 1,
        (topic, W0 + 60_000, "valid"): 1,
    }
    assert influx_points(config, topic) == {W0: (6, 1), w1: (0, 1), W0 + 60_000: (1, 0)}
    offsets = archived_offsets(spark, config, topic)
    assert sum(offsets.values()) == 10 and set(offsets.values()) == {1}


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(pid)], timeout=30)


def test_broker_killed_mid_stream_loses_and_doubles_nothing(spark, cluster_stack: LocalStack, tmp_path: Path) -> None:
    from kdq.stream_process import start_stream, stop_stream, stream_process

    stack = cluster_stack
    prefix = f"ck{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-events"
    stack.kafka.create_topic(topic, partitions=3)
    config = cluster_config(
        stack, tmp_path, prefix,
        kafka={"max_offsets_per_trigger": 600},
        stream={"allowed_lateness_seconds": 3600, "trigger_interval_seconds": 0.5},
    )
    good, bad = json.dumps({"id": 1}).encode(), b"{bad"
    waves = 3
    per_wave = 3000
    truth: list[tuple[int, bool]] = []

    def wave(n: int) -> None:
        records = []
        for i in range(n * per_wave, (n + 1) * per_wave):
            ts, valid = W0 + i * 10, i % 7 != 0
            truth.append((ts, valid))
            records.append((i % 3, good if valid else bad, ts))
        produce(config.kafka_bootstrap(), topic, records)

    wave(0)
    start_stream(config)
    try:
        # Mid-stream: the first micro-batches are in Delta, most of the topic is not.
        wait_for(lambda: window_counts(spark, config, topic), 300, "the stream's first micro-batch")
        admin = AdminClient({"bootstrap.servers": stack.kafka.bootstrap})
        leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
        node = next(n for n in stack.kafka.nodes if n.node_id == leader)
        _kill(node.process.process().pid)
        assert not node.process.running()
        wave(1)  # acks=all with 2 of 3 replicas in sync: accepted while the broker is down
        time.sleep(10)
        assert stream_process(config).running(), stream_process(config).log_tail(60)
        started = time.monotonic()
        stack.kafka.start()
        print(f"\nbroker {leader} killed and restarted (back in {time.monotonic() - started:.1f} s)")
        wave(2)

        expected = expected_counts(topic, truth)
        wait_for(lambda: window_counts(spark, config, topic) == expected, 420, "every record counted once")
        assert stream_process(config).running(), "the stream must survive the broker's death"
    finally:
        stop_stream(config, timeout=120)

    assert window_counts(spark, config, topic) == expected
    assert latest_metrics(config) == expected
    windows = Counter()
    for (_, w, status), n in expected.items():
        windows[(w, status)] += n
    assert influx_points(config, topic) == {
        w: (windows[(w, "valid")], windows[(w, "invalid")]) for w in {w for (w, _) in windows}
    }
    offsets = archived_offsets(spark, config, topic)
    assert sum(offsets.values()) == waves * per_wave and set(offsets.values()) == {1}
