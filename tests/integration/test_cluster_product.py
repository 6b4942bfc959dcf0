"""The whole product on the cluster shape: `kdq run --cluster --detach` in a data folder of its own,
then what a user of it relies on, each checked against the real components:

* the stream is an application of the standalone master (``activeapps``), started by the supervisor DAG
  (its task's XCom, the supervisor's state), capped at one core like the SQL endpoint's application, so the
  batch jobs get the rest of the workers' cores;
* records produced to a new topic reach ``window_counts`` exactly (the Delta table, read by a Spark session
  of the test's own);
* a run of the hourly recompute DAG, executed by Airflow's scheduler, submits its Spark jobs to the master
  through ``spark_default`` (the master lists them as completed applications) and corrects a record that came
  too late for the stream;
* the SQL endpoint, an application of the master, answers on ``window_counts`` over Spark Connect and
  through `kdq sql`;
* `kdq down` stops everything: no process of the data folder is left, no port open.

Slow (10-20 min on this 2-core machine): marked ``cluster``, run by `make test-cluster`; results in
docs/cluster.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import pytest

from kdq.config import Config
from kdq.procs import port_open
from kdq.stack.airflow import AirflowApi, floor_hour
from kdq.stack.manager import LocalStack
from kdq.stack.spark_cluster import PRODUCT_WORKER_CORES
from tests.conftest import PROJECT_ROOT, make_config
from tests.integration.helpers import W0, expected_counts, influx_points, produce, wait_for, window_counts

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

HOURLY = "kdq_hourly_recompute"
SUPERVISOR = "kdq_stream_supervisor"
STREAM_APP, ENDPOINT_APP = "kdq-speed-layer", "kdq-sql-endpoint"
GOOD, BAD = json.dumps({"id": 1}).encode(), b"{oops"
# Low demo traffic with 5 % late records (70 s to 11 min late): the hourly run's interval has demo records
# the recompute corrects (some for windows before the interval), and demo records that arrive after the
# interval for windows in it, which its reconcile must leave to the next run (`--after-recompute`).
DEMO_ARGS = "--rate 5 --late 0.05 --seed 16"

CONNECT_QUERY = """
import json, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
print(json.dumps([list(r) for r in spark.sql(sys.argv[2]).collect()]))
spark.stop()
"""


@dataclass
class Product:
    config: Config  # the same file and data folder as every process of the product
    env: dict[str, str]  # the environment `kdq` runs with
    stack: LocalStack  # the recorded shape, with the ports `kdq run` chose
    late: dict | None = None  # the records of the window-counts test, for the recompute test
    truth: dict | None = None  # window_counts after the recompute, for the SQL endpoint test

    def kdq(self, *args: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "kdq.cli", *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=PROJECT_ROOT,
            timeout=timeout,
        )

    def master(self) -> dict:
        return self.stack.spark.status()

    def apps(self, which: str = "activeapps") -> dict[str, list[dict]]:
        """The master's applications by name ("kdq-batch-recompute": the job's session names it, spark-submit
        with "kdq-batch_recompute" before)."""
        apps: dict[str, list[dict]] = {}
        for app in self.master().get(which, []):
            apps.setdefault(app["name"].replace("_", "-"), []).append(app)
        return apps

    def api(self) -> AirflowApi:
        return self.stack.airflow.api()


def _environment(data_dir: Path) -> dict[str, str]:
    """This environment without kdq's or Airflow's settings, plus the data folder: the project's kdq.toml
    (found in the working directory) with everything under ``data_dir``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KDQ_", "AIRFLOW", "PYSPARK", "SPARK_"))}
    return {
        **env,
        "PATH": f"{PROJECT_ROOT / '.venv' / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
        "KDQ_PATHS__DATA_DIR": str(data_dir),
        "KDQ_PATHS__JARS_DIR": str(PROJECT_ROOT / ".cache" / "jars"),
    }


def processes_of(data_dir: Path) -> list[psutil.Process]:
    """Every live process started for ``data_dir``: its path in the command line or working directory, or the
    data folder in its environment (every process `kdq run` starts inherits KDQ_PATHS__DATA_DIR, executors
    through their worker). Never this test's own process."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if (
                any(str(data_dir) in part for part in proc.cmdline())
                or str(data_dir) in proc.cwd()
                or proc.environ().get("KDQ_PATHS__DATA_DIR") == str(data_dir)
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module")
def product(tmp_path_factory: pytest.TempPathFactory):
    data_dir = tmp_path_factory.mktemp("cluster-product")
    env = _environment(data_dir)
    config = make_config(data_dir)

    def kdq(*args: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "kdq.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=PROJECT_ROOT,
            timeout=timeout,
        )

    try:
        started = time.monotonic()
        done = kdq("run", "--cluster", "--detach", f"--demo-args={DEMO_ARGS}", timeout=1500)
        print(
            f"\n`kdq run --cluster --detach` exited {done.returncode} after {time.monotonic() - started:.0f} s:\n"
            + done.stdout[-4000:]
            + done.stderr[-3000:]
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        stack = LocalStack(config)
        assert stack.cluster and stack.spark is not None
        # stack.config: the addresses `kdq run` recorded (config was loaded before them).
        yield Product(stack.config, env, stack)
    finally:
        # `kdq down` is the last test; this is the safety net when a test before it failed.
        kdq("down", timeout=600)
        leftovers = processes_of(data_dir)
        for proc in leftovers:
            proc.kill()
        psutil.wait_procs(leftovers, timeout=30)


def _xcom(api: AirflowApi, dag_id: str, run_id: str, task_id: str):
    response = api.request(
        "GET",
        f"dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value",
        params={"deserialize": True},
    )
    if response.status_code == 404:
        return None
    response.raise_for_status()
    value = response.json()["value"]
    return json.loads(value) if isinstance(value, str) and value.startswith(("{", "[", '"')) else value


@pytest.mark.timeout(2400)  # with the fixture's `kdq run --cluster --detach` (up to 25 min)
def test_the_stream_runs_on_the_master_started_by_the_supervisor(product: Product) -> None:
    from kdq.spark.stream_process import stream_process

    statuses = {s.name: s for s in product.stack.status()}
    assert all(s.healthy for s in statuses.values()), [s.line() for s in statuses.values()]
    assert {"kafka-1", "kafka-2", "kafka-3", "spark-master", "airflow", "sql", "demo"} <= set(statuses), statuses
    workers = [w for w in product.master()["workers"] if w["state"] == "ALIVE"]
    assert [w["cores"] for w in workers] == [PRODUCT_WORKER_CORES] * 2, workers

    # The supervisor DAG's first run (at once: unpaused, no catch-up) submits the stream to the master.
    started = time.monotonic()

    def both_running() -> dict | None:
        apps = product.apps()
        wanted = [app for name in (STREAM_APP, ENDPOINT_APP) for app in apps.get(name, [])]
        return apps if {STREAM_APP, ENDPOINT_APP} <= set(apps) and all(a["cores"] >= 1 for a in wanted) else None

    apps = wait_for(
        both_running, 600, "the stream and the SQL endpoint as applications of the master with executors", interval=3
    )
    print(f"stream and SQL endpoint running on the master {time.monotonic() - started:.0f} s after `kdq run` returned")
    # One application each, each capped at one core (spark.cores.max): the batch jobs get the rest.
    assert [a["cores"] for a in apps[STREAM_APP]] == [1] and [a["cores"] for a in apps[ENDPOINT_APP]] == [1], apps
    held = sum(a["cores"] for name in (STREAM_APP, ENDPOINT_APP) for a in apps[name])
    assert sum(w["cores"] for w in workers) - held == 2, (workers, apps)

    stream = wait_for(lambda: stream_process(product.config).process(), 60, "the stream's process")
    command = stream.cmdline()
    assert command[command.index("--master") + 1] == product.stack.spark.url
    assert "spark.cores.max=1" in command and any(part.endswith("stream_counts.py") for part in command)
    # Started by the supervisor's task: its XCom says so, and its state file holds the stream's pid.
    api = product.api()

    def started_by_supervisor() -> list:
        runs = api.get(f"dags/{SUPERVISOR}/dagRuns", limit=20)["dag_runs"]
        return [
            r
            for r in runs
            if r["state"] == "success"
            and _xcom(api, SUPERVISOR, r["dag_run_id"], "ensure_stream_running") == "restarted"
        ]

    assert wait_for(started_by_supervisor, 300, "a supervisor run that started the stream", interval=5)
    state = json.loads((product.config.data_dir / "stream" / "supervisor_state.json").read_text())
    assert state["pid"] == stream.pid, (state, stream.pid)


@pytest.mark.timeout(900)
def test_records_reach_window_counts_exactly(spark, product: Product) -> None:
    """PRODUCT.md's example to a topic created now (the stream picks it up without a restart), over three
    brokers at RF 3; then a record for w0 beyond the allowed lateness (60 s): archived, not counted."""
    from pyspark.sql import functions as F

    config = product.config
    topic = f"cp-orders-{uuid.uuid4().hex[:6]}"
    product.stack.kafka.create_topic(topic, partitions=3)
    sent: list[tuple[int, bool]] = []

    def send(records: list[tuple[int, bytes, int]]) -> None:
        produce(config.kafka_bootstrap(), topic, records)
        sent.extend((ts, value == GOOD) for _, value, ts in records)

    send(
        [
            (0, GOOD, W0 + 10),
            (0, GOOD, W0 + 20),
            (0, GOOD, W0 + 30),
            (0, BAD, W0 + 40),
            (2, GOOD, W0 + 500),
            (2, GOOD, W0 + 900),
            (1, BAD, W0 + 1500),
        ]
    )
    truth = expected_counts(topic, sent)
    assert truth == {(topic, W0, "valid"): 5, (topic, W0, "invalid"): 1, (topic, W0 + 1000, "invalid"): 1}
    wait_for(lambda: window_counts(spark, config, topic) == truth, 420, "the example counted exactly", interval=3)

    # Event time two minutes on (its own micro-batch: the watermark moves between batches), then w0 again.
    send([(1, GOOD, W0 + 120_000)])
    on_time = expected_counts(topic, sent)
    wait_for(lambda: window_counts(spark, config, topic) == on_time, 300, "the record two minutes on", interval=3)
    send([(2, GOOD, W0 + 800)])
    archive = config.tables_dir / "raw_archive"
    late = wait_for(
        lambda: (
            spark.read.format("delta")
            .load(str(archive))
            .where((F.col("topic") == topic) & ~F.col("counted"))
            .select(F.unix_millis("ingest_time").alias("ms"))
            .collect()
        ),
        300,
        "the late record archived, not counted",
        interval=3,
    )
    assert len(late) == 1 and window_counts(spark, config, topic) == on_time
    product.late = {"topic": topic, "sent": sent, "ingest": datetime.fromtimestamp(late[0]["ms"] / 1000, UTC)}


@pytest.mark.timeout(2100)
def test_hourly_recompute_runs_on_the_master_through_spark_default(spark, product: Product) -> None:
    """A run of the hourly DAG, triggered through the REST API and executed by the scheduler (LocalExecutor),
    over an interval that holds the late record's ingest time: its recompute, push and reconcile are
    applications of the master (spark_default), and w0 valid goes 5 -> 6 in Delta and InfluxDB."""
    from pyspark.sql import functions as F

    late = getattr(product, "late", None)
    assert late, "needs test_records_reach_window_counts_exactly"
    config, topic = product.config, late["topic"]
    # The interval ends just after the late record's ingest, in the past by more than the demo's out-of-order
    # reach (48 s), so no record for its windows is still on its way when the reconcile task compares them.
    end = late["ingest"].replace(microsecond=0) + timedelta(seconds=1)
    start = floor_hour(late["ingest"])
    time.sleep(max(0.0, (end + timedelta(seconds=60) - datetime.now(UTC)).total_seconds()))
    finished = {name: len(apps) for name, apps in product.apps("completedapps").items()}
    api = product.api()
    run_id = f"cluster_product__{uuid.uuid4().hex[:8]}"
    response = api.request(
        "POST",
        f"dags/{HOURLY}/dagRuns",
        json={
            "dag_run_id": run_id,
            "logical_date": late["ingest"].isoformat(),  # unique per DAG: not a scheduled run's hour
            "data_interval_start": start.isoformat(),
            "data_interval_end": end.isoformat(),
        },
    )
    assert response.ok, response.text
    started = time.monotonic()

    def done() -> dict | None:
        run = api.get(f"dags/{HOURLY}/dagRuns/{run_id}")
        if run["state"] == "failed":
            tis = api.get(f"dags/{HOURLY}/dagRuns/{run_id}/taskInstances")["task_instances"]
            raise AssertionError(f"{run_id} failed: {[(t['task_id'], t['state']) for t in tis]}")
        return run if run["state"] == "success" else None

    wait_for(done, 1800, f"{HOURLY} run {run_id}", interval=5)
    print(f"{HOURLY} run {run_id} over [{start}, {end}) succeeded in {time.monotonic() - started:.0f} s")
    tis = {t["task_id"]: t["state"] for t in api.get(f"dags/{HOURLY}/dagRuns/{run_id}/taskInstances")["task_instances"]}
    assert tis == dict.fromkeys(("recompute", "push_corrections", "influx_catch_up", "reconcile"), "success"), tis

    # spark-submit went to the master: each Spark task is a completed application there.
    completed = {name: len(apps) for name, apps in product.apps("completedapps").items()}
    for name in ("kdq-batch-recompute", "kdq-push-corrections", "kdq-reconcile"):
        assert completed.get(name, 0) > finished.get(name, 0), (name, completed)
    report = _xcom(api, HOURLY, run_id, "recompute")
    assert report["ok"] and report["stream_caught_up"] is True and report["late_windows"] >= 1, report
    checked = _xcom(api, HOURLY, run_id, "reconcile")
    assert checked["ok"] is True and checked["after_recompute"] is True, checked
    print(f"reconcile: {checked['pending_rows']} pending rows left to the next run, "
          f"{checked['late_windows_checked']} windows of late rows outside the interval checked")

    truth = expected_counts(topic, late["sent"])
    assert (
        window_counts(spark, config, topic)
        == truth
        == {
            (topic, W0, "valid"): 6,
            (topic, W0, "invalid"): 1,
            (topic, W0 + 1000, "invalid"): 1,
            (topic, W0 + 120_000, "valid"): 1,
        }
    )
    rows = (
        spark.read.format("delta")
        .load(str(config.tables_dir / "corrections"))
        .where(F.col("topic") == topic)
        .select(F.unix_millis("window_start").alias("w"), "status", "old_count", "new_count", "reason")
        .collect()
    )
    assert [tuple(r) for r in rows] == [(W0, "valid", 5, 6, "late_data")]
    assert influx_points(config, topic)[W0] == (6, 1)
    product.truth = truth


@pytest.mark.timeout(600)
def test_the_sql_endpoint_answers_on_the_cluster(spark, product: Product) -> None:
    """Over Spark Connect and through `kdq sql`: the counts the Delta table holds after the hourly recompute (w0
    valid 6); without that test's truth this one fails rather than compare the table with itself."""
    assert product.late, "needs test_records_reach_window_counts_exactly"
    topic = product.late["topic"]
    assert product.truth, "needs test_hourly_recompute_runs_on_the_master_through_spark_default (the truth after it)"
    truth = window_counts(spark, product.config, topic)
    assert truth == product.truth and truth[(topic, W0, "invalid")] == 1, truth
    endpoint = product.stack.sql_endpoint
    assert endpoint.healthy() and ENDPOINT_APP in product.apps()
    query = (
        f"SELECT topic, unix_millis(window_start), status, count FROM {product.config.spark.database}"
        f".window_counts WHERE topic = '{topic}'"
    )
    done = subprocess.run(
        [sys.executable, "-c", CONNECT_QUERY, endpoint.connect_url, query],
        capture_output=True,
        text=True,
        env=product.env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert {(t, w, s): c for t, w, s, c in json.loads(done.stdout.strip().splitlines()[-1])} == truth

    # `kdq sql` finds the endpoint through the stack state.
    summed = product.kdq(
        "sql",
        f"SELECT status, sum(count) AS n FROM kdq.window_counts WHERE topic = '{topic}' "
        "GROUP BY status ORDER BY status",
        timeout=300,
    )
    assert summed.returncode == 0, summed.stderr[-3000:]
    assert f"through the SQL endpoint {endpoint.connect_url}" in summed.stderr
    rows = [line.strip("| ").split("|") for line in summed.stdout.splitlines() if line.startswith("|")][1:]
    sums = {status: sum(n for (_, _, s), n in truth.items() if s == status) for status in ("invalid", "valid")}
    assert {s.strip(): int(n) for s, n in rows} == sums, summed.stdout


@pytest.mark.timeout(600)
def test_kdq_down_stops_everything(product: Product) -> None:
    stack = product.stack
    ports = [
        *(n.port for n in stack.kafka.nodes),
        stack.spark.master_port,
        stack.spark.master_ui_port,
        stack.airflow.port,
        stack.sql_endpoint.connect_port,
        stack.sql_endpoint.thrift_port,
        stack.influx.port,
    ]
    started = time.monotonic()
    down = product.kdq("down", timeout=600)
    print(f"`kdq down` in {time.monotonic() - started:.0f} s: {down.stdout.strip()}")
    assert down.returncode == 0, down.stderr
    stopped = set(down.stdout.split(":", 1)[1].replace(",", " ").split())
    assert {"demo", "airflow", "stream", "sql-endpoint", "influxdb", "spark-cluster", "kafka"} <= stopped, down.stdout
    wait_for(lambda: not processes_of(product.config.data_dir), 60, "no process of the data folder left")
    assert not [p for p in ports if port_open(p)], "ports still open after kdq down"
