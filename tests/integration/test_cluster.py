"""The cluster shape of the local stack: three KRaft brokers (RF 3, min.insync.replicas 2) and a
Spark standalone master with two workers, started by ``LocalStack(cluster=True)`` (what `kdq up --cluster`
runs) in a folder of its own. The speed layer is submitted to the standalone master with spark-submit
(--py-files, --jars) exactly as `kdq stream` does; every output is compared with ground truth computed here.

The seed example with the hourly recompute and a rebuild submitted to the master, a broker killed mid-stream,
a worker killed mid-batch of a 100,000-record run. Slow (about 13 min on the quiet 2-core machine, 20-30 min
when other jobs load it; results in docs/cluster.md): marked ``cluster``; `make test-cluster` runs it,
`-m "not cluster"` leaves it out.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

from kdq.config import Config
from kdq.spark.writers import now_ms
from kdq.stack.manager import LocalStack
from tests.conftest import make_config
from tests.integration.helpers import (
    W0,
    archived_offsets,
    expected_counts,
    expected_reasons,
    influx_points,
    isolated_config,
    latest_metrics,
    produce,
    reason_counts,
    wait_for,
    window_counts,
    write_config_file,
)

# Each test submits several applications to a 1-core-per-worker cluster: past the suite-wide 900 s
# timeout when the machine is busy (seen: the seed test at 15 min on a loaded 2-core machine).
pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.timeout(2400)]


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


def submit_job(config: Config, job: str, job_args: list[str], timeout: float = 420, **kwargs) -> dict:
    """A spark_jobs/ job submitted to the master in the foreground (what `kdq job`, `kdq recompute` and the
    Airflow DAGs' spark-submit run), with a deadline; returns its report (the last JSON line of stdout)."""
    from kdq.spark.stream_process import child_env
    from kdq.spark.submit import submit_command

    command = submit_command(config, job, job_args, **kwargs)
    assert command[command.index("--master") + 1].startswith("spark://")
    assert "--py-files" in command and "--jars" in command
    result = subprocess.run(
        command, env={**os.environ, **child_env(config)}, cwd=config.base_dir,
        capture_output=True, text=True, timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    reports = [line for line in result.stdout.splitlines() if line.startswith("{")]
    return json.loads(reports[-1]) if reports else {}


def submit_available_now(config: Config, timeout: float = 420) -> None:
    """`kdq stream --available-now` in the foreground (spark-submit to the master)."""
    submit_job(config, "stream_counts", ["--available-now"], timeout, app_name="kdq-speed-layer")


def completed_apps(stack: LocalStack) -> list[dict]:
    return stack.spark.status().get("completedapps", [])


def topic_settings(stack: LocalStack, topic: str) -> tuple[int, str]:
    """(replication factor of partition 0, min.insync.replicas) of ``topic``."""
    admin = AdminClient({"bootstrap.servers": stack.kafka.bootstrap})
    # A new topic's partitions reach every broker's metadata a moment after its creation.
    meta = wait_for(lambda: admin.list_topics(topic, timeout=10).topics[topic].partitions, 30, f"{topic}'s metadata")
    replicas = len(meta[0].replicas)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)

    def configs():
        try:
            return admin.describe_configs([resource])[resource].result(timeout=10)
        except KafkaException as exc:  # asked a broker that has not seen the new topic yet (seen once)
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
            return None

    configs = wait_for(configs, 30, f"{topic}'s configs")
    return replicas, configs["min.insync.replicas"].value


def test_seed_example_then_recompute_and_rebuild_on_the_cluster(spark, cluster_stack: LocalStack, tmp_path: Path) -> None:
    """PRODUCT.md's example with the stream on the master; then the hourly recompute and a rule-change
    rebuild, each submitted to the master (the jobs the Airflow DAGs run), over the same data."""
    stack = cluster_stack
    prefix = f"cx{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-orders"
    stack.kafka.create_topic(topic, partitions=3)
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()  # no rule yet: valid = UTF-8 JSON; the rebuild below adds one
    config = cluster_config(
        stack, tmp_path, prefix, kafka={"topic_include": ".*", "topic_exclude": rf"_.*|kdq\..*|(?!{prefix}).*"},
        paths={"rules_dir": str(rules_dir)},
    )
    assert topic_settings(stack, topic) == (3, "2")
    assert topic_settings(stack, stack.config.kafka.metrics_topic) == (3, "2")

    # Two kinds of valid record: the rule added before the rebuild makes {"id": 2} invalid.
    good, two = json.dumps({"id": 1}).encode(), json.dumps({"id": 2}).encode()
    sent: list[tuple[int, bytes | None, int]] = []

    def send(records: list[tuple[int, bytes, int]]) -> None:
        produce(config.kafka_bootstrap(), topic, records)
        sent.extend(records)

    send(
        [(0, good, W0 + 10), (0, good, W0 + 20), (0, good, W0 + 30), (0, b"{oops", W0 + 40)]
        + [(2, two, W0 + 500), (2, two, W0 + 900)]
        + [(1, b"not json", W0 + 1500)],
    )
    submit_available_now(config)

    # It ran on the cluster: a finished application of the master, with executors on the workers.
    apps = [a for a in completed_apps(stack) if a.get("name") == "kdq-speed-layer"]
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
    send([(1, good, W0 + 700)])
    submit_available_now(config)
    assert window_counts(spark, config, topic)[(topic, W0, "valid")] == 6
    assert latest_metrics(config)[(topic, W0, "valid")] == 6
    assert influx_points(config, topic)[W0] == (6, 1)

    # Event time a minute on (its own run: the watermark moves between micro-batches), then a record for
    # w0: beyond the lateness, archived but not counted.
    send([(0, good, W0 + 60_000)])
    submit_available_now(config)
    ingest_from = now_ms()
    send([(2, two, W0 + 800)])
    submit_available_now(config)
    ingest_to = now_ms() + 1
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

    # The hourly recompute of the late record's ingest interval, submitted to the master (the hourly DAG's
    # job; with its push, as `kdq recompute` runs it): w0 valid 6 → 7 everywhere, one correction.
    finished = len(completed_apps(stack))
    report = submit_job(config, "batch_recompute", [f"--start={ingest_from}", f"--end={ingest_to}", "--run-id=cluster-1"])
    assert len(completed_apps(stack)) == finished + 1, "the recompute ran as an application of the master"
    assert report["ok"] and report["stream_caught_up"] is True, report
    assert (report["late_windows"], report["corrections"]) == (1, 1), report
    truth = {
        (topic, W0, "valid"): 7,
        (topic, W0, "invalid"): 1,
        (topic, w1, "invalid"): 1,
        (topic, W0 + 60_000, "valid"): 1,
    }
    assert window_counts(spark, config, topic) == truth
    assert latest_metrics(config) == truth
    assert influx_points(config, topic) == {W0: (7, 1), w1: (0, 1), W0 + 60_000: (1, 0)}
    assert corrections(spark, config, topic) == {(W0, "valid", 6, 7, "late_data", "cluster-1")}

    # A rule change and its rebuild, submitted to the master (the rebuild DAG's job): {"id": 2} is now
    # invalid; every output moves to the truth computed here from what was sent.
    (rules_dir / f"{topic}.schema.json").write_text(json.dumps(ID_AT_MOST_1))
    report = submit_job(config, "rebuild", [f"--from={W0}", f"--to={W0 + 120_000}", f"--topics={topic}", "--run-id=cluster-rb"])
    assert len(completed_apps(stack)) == finished + 2, "the rebuild ran as an application of the master"
    assert report["ok"] and report["archive_rows"] == 10 and report["corrections"] == 2, report
    truth = expected_counts(topic, [(ts, value == good) for _, value, ts in sent])
    assert truth == {
        (topic, W0, "valid"): 4,
        (topic, W0, "invalid"): 4,
        (topic, w1, "invalid"): 1,
        (topic, W0 + 60_000, "valid"): 1,
    }
    assert window_counts(spark, config, topic) == truth
    assert latest_metrics(config) == truth
    assert influx_points(config, topic) == {W0: (4, 4), w1: (0, 1), W0 + 60_000: (1, 0)}
    assert corrections(spark, config, topic) == {
        (W0, "valid", 6, 7, "late_data", "cluster-1"),
        (W0, "valid", 7, 4, "rule_change", "cluster-rb"),
        (W0, "invalid", 1, 4, "rule_change", "cluster-rb"),
    }
    maximum = "schema:/properties/id/maximum"
    invalid = [(ts, maximum if value == two else "not_json") for _, value, ts in sent if value != good]
    assert expected_reasons(invalid) == {(W0 - 20_000, "not_json"): 2, (W0 - 20_000, maximum): 3}
    # The rebuild counted the stream's reasons not appended yet as present; the stream appends them within a
    # minute (kdq.spark.reasons_flush).
    wait_for(lambda: reason_counts(spark, config, topic) == expected_reasons(invalid), 150,
             "invalid_reasons holds the rebuilt reasons and the stream's")


ID_AT_MOST_1 = {"type": "object", "properties": {"id": {"type": "integer", "maximum": 1}}}


def corrections(spark, config: Config, topic: str) -> set[tuple]:
    """(window, status, old, new, reason, run id) of every corrections row of ``topic``."""
    from pyspark.sql import functions as F

    rows = (
        spark.read.format("delta").load(str(config.tables_dir / "corrections")).where(F.col("topic") == topic)
        .select(F.unix_millis("window_start").alias("w"), "status", "old_count", "new_count", "reason", "run_id")
        .collect()
    )
    return {(r["w"], r["status"], r["old_count"], r["new_count"], r["reason"], r["run_id"]) for r in rows}


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(pid)], timeout=30)


def test_broker_killed_mid_stream_loses_and_doubles_nothing(spark, cluster_stack: LocalStack, tmp_path: Path) -> None:
    from kdq.spark.stream_process import start_stream, stop_stream, stream_process

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


# A second (or later) attempt of a task or of a stage, as an executor logs it: "Running task 1.1 in stage 12.0".
RETRY = re.compile(r"Running task \d+\.(?:[1-9]\d*) in stage \d+\.\d+|Running task \d+\.\d+ in stage \d+\.(?:[1-9]\d*)")


def _tasks_in_flight(stderr: Path) -> int:
    """Tasks an executor started and has not finished, from its log (the executor logs at INFO)."""
    text = stderr.read_text(errors="replace") if stderr.exists() else ""
    return text.count("Running task ") - text.count("Finished task ") - text.count("Exception in task ")


def test_worker_killed_mid_batch_of_a_100k_run_loses_and_doubles_nothing(
    spark, cluster_stack: LocalStack, tmp_path: Path
) -> None:
    """100,000 records through the stream on the master; one worker SIGKILLed while its executor runs a task
    of a micro-batch. Spark's answer, asserted here: the worker's executor exits with it (it watches its
    worker), the master marks the worker DEAD, the driver reports the executor lost and runs the lost tasks
    again on the executor left; the application and the stream go on. The worker is then restarted as an
    operator would, and the master gives the application a new executor on it. Every output exact."""
    from kdq.spark.stream_process import start_stream, stop_stream, stream_process

    stack = cluster_stack
    prefix = f"cw{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-events"
    stack.kafka.create_topic(topic, partitions=3)
    config = cluster_config(
        stack, tmp_path, prefix,
        kafka={"max_offsets_per_trigger": 10_000},
        stream={"allowed_lateness_seconds": 3600, "trigger_interval_seconds": 0.5},
    )
    total = 100_000
    good, bad = json.dumps({"id": 1}).encode(), b"{bad"
    truth = [(W0 + i * 10, i % 7 != 0) for i in range(total)]
    started = time.monotonic()
    records = [(i % 3, good if ok else bad, ts) for i, (ts, ok) in enumerate(truth)]
    for chunk in range(0, total, 25_000):  # within the producer's queue (100,000 messages)
        produce(config.kafka_bootstrap(), topic, records[chunk:chunk + 25_000])
    print(f"\n{total} records produced in {time.monotonic() - started:.1f} s")
    expected = expected_counts(topic, truth)

    started = time.monotonic()
    start_stream(config)
    try:
        wait_for(lambda: window_counts(spark, config, topic), 300, "the stream's first micro-batch", interval=2)
        first = time.monotonic() - started
        app = wait_for(
            lambda: next((a for a in stack.spark.status().get("activeapps", []) if a.get("name") == "kdq-speed-layer"), None),
            60, "the stream's application on the master",
        )
        victim = stack.spark.workers[0]
        # The executor of this application on that worker; its log says when one of its tasks runs.
        stderr = wait_for(lambda: next(iter((stack.spark.home / victim.name / app["id"]).glob("*/stderr")), None),
                          60, f"an executor of {app['id']} on {victim.name}")
        worker = victim.process()
        executors = worker.children(recursive=True)
        assert executors, f"{victim.name} runs no executor"
        counted = sum(window_counts(spark, config, topic).values())
        # Mid-batch: the kill follows the sight of a running task at once.
        wait_for(lambda: _tasks_in_flight(stderr) > 0, 240, "a task running on the worker's executor", interval=0.05)
        os.kill(worker.pid, signal.SIGKILL)
        in_flight = _tasks_in_flight(stderr)
        killed_at = time.monotonic()
        psutil.wait_procs([worker], timeout=30)
        print(f"{victim.name} (pid {worker.pid}) SIGKILLed {killed_at - started:.0f} s after the start "
              f"(first batch after {first:.0f} s), {in_flight} task(s) running on its executor, "
              f"{counted} of {total} records counted")

        # The executor watches its worker: it exits when the worker's connection drops.
        gone, alive = psutil.wait_procs(executors, timeout=60)
        assert not alive, f"executors outlived their worker: {alive}"
        wait_for(lambda: stack.spark.alive_workers() == 1, 60, "the master marking the worker dead")
        dead = [w for w in stack.spark.status()["workers"] if w.get("state") == "DEAD"]
        assert dead, stack.spark.status()["workers"]
        log = stream_process(config).log_file
        wait_for(lambda: re.search(r"Lost (an )?executor", log.read_text(errors="replace")), 60,
                 "the driver reporting the lost executor")
        assert stream_process(config).running(), stream_process(config).log_tail(60)
        # The application goes on with the executor left.
        assert any(a["id"] == app["id"] for a in stack.spark.status().get("activeapps", [])), stack.spark.status()
        wait_for(lambda: sum(window_counts(spark, config, topic).values()) > counted, 240,
                 "progress on the remaining executor", interval=3)

        # An operator restarts the worker: it registers again and the master gives the application a new
        # executor on it (the application wants every core of the cluster).
        restarted = time.monotonic()
        stack.spark.start()
        wait_for(lambda: stack.spark.alive_workers() == 2, 60, "the restarted worker registered")
        new_executor = wait_for(
            lambda: [p for p in (stack.spark.home / victim.name / app["id"]).glob("*/stderr") if p != stderr],
            120, "a new executor of the application on the restarted worker",
        )
        print(f"{victim.name} restarted, healthy and running a new executor ({new_executor[0].parent.name}) "
              f"{time.monotonic() - restarted:.1f} s later")

        wait_for(lambda: window_counts(spark, config, topic) == expected, 900, "every record counted once", interval=5)
        done = time.monotonic() - started
        assert stream_process(config).running(), "the stream must survive the worker's death"
        # The driver dropped the dead executor (ERROR "Lost executor"; a finished-task update the dying executor
        # may still send is ignored: "Ignoring update ... its executor has been marked as failed") and ran the
        # lost work again on the other executors: a second attempt of a task ("task 1.1") or of a stage
        # ("stage 12.1"). The driver logs at WARN, and an ExecutorLostFailure that is not the task's fault is
        # only an INFO line there, so the retry is read from the other executors' logs (INFO).
        text = log.read_text(errors="replace")
        others = [p for p in stack.spark.home.glob(f"spark-worker-*/{app['id']}/*/stderr") if p != stderr]
        retries = [m.group(0) for p in others for m in RETRY.finditer(p.read_text(errors="replace"))]
        ignored = [line for line in text.splitlines() if "Ignoring update" in line]
        print(f"{total} records counted {done:.0f} s after the stream's start; driver log: "
              f"{len(re.findall(r'Lost (?:an )?executor', text))} 'Lost executor', {len(ignored)} late status "
              f"update(s) of the dead executor ignored; retried on other executors: {len(retries)} attempt(s), "
              f"e.g. {retries[:3]}")
        assert retries, "no task or stage attempt ran again after the executor was lost"
    finally:
        stop_stream(config, timeout=120)

    assert window_counts(spark, config, topic) == expected
    assert latest_metrics(config, timeout=60) == expected
    windows = Counter()
    for (_, w, status), n in expected.items():
        windows[(w, status)] += n
    assert influx_points(config, topic) == {
        w: (windows[(w, "valid")], windows[(w, "invalid")]) for w in {w for (w, _) in windows}
    }
    offsets = archived_offsets(spark, config, topic)
    assert sum(offsets.values()) == total and set(offsets.values()) == {1}
