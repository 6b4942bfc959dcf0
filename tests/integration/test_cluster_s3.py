"""Tables and checkpoints on object storage: ``paths.storage_uri = s3a://...`` end to end.

An S3-compatible server (moto's server mode, from PyPI) runs on a free loopback port for the module; kdq
reaches it through S3A (hadoop-aws and the AWS SDK modules fetched by `make setup-s3`), configured the
Spark way in ``[spark.conf]`` (``spark.hadoop.fs.s3a.endpoint``, path-style access, keys). Every job runs
as its own process through the ``kdq`` command (spark-submit), as a cluster runs them, and shares only
what is in the bucket: the stream (available-now, twice: on-time data, then data too late for it), the
hourly recompute, a rebuild after a rule change, and the daily maintenance (retention retires and deletes
the archive's rows). The Delta tables are read back from s3a:// by a process of their own and compared
with ground truth computed here; no table or checkpoint folder may appear on the local disk.

Marked ``cluster`` (slow: seven Spark applications): `make test-cluster` runs it, CI's ``-m "not
cluster"`` leaves it out. The Kafka broker and InfluxDB are the session's single-node stack (lighter than
the three-broker shape: what is under test here is the storage). The last test runs the same jobs, with the
same checks, on the cluster shape (`kdq up --cluster`: three brokers, a standalone master, two workers), each
job an application of the master whose executors write to the bucket.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kdq.config import Config
from kdq.spark.writers import now_ms
from tests.conftest import PROJECT_ROOT
from tests.integration.helpers import (
    W0,
    expected_counts,
    influx_points,
    isolated_config,
    produce,
    wait_for,
    write_config_file,
)

pytestmark = pytest.mark.cluster

BUCKET = "kdq-tables"
KEY, SECRET = "kdq-test-key", "kdq-test-secret"
# The DynamoDB table of kdq's DynamoDB log store (Delta commits of concurrent drivers coordinated; docs/cluster.md),
# on the same moto server: every test's jobs commit through it, as production on S3 does.
DDB_TABLE = "kdq_delta_log"
W1, W2, W60 = W0 + 1000, W0 + 2000, W0 + 60_000
ID1, ID2, BAD = json.dumps({"id": 1}).encode(), json.dumps({"id": 2}).encode(), b"{oops"
JOB_TIMEOUT = 600


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's server on a free loopback port (its own process; S3 and DynamoDB on the same port), with the test
    bucket and the DynamoDB table of the log store; stopped after."""

    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    server = PROJECT_ROOT / ".venv" / "bin" / "moto_server"
    command = [str(server) if server.exists() else shutil.which("moto_server") or "moto_server", "-H", "127.0.0.1", "-p", str(port)]
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "moto_server did not open its port: " + log.read_text()
                time.sleep(0.2)
        endpoint = f"http://127.0.0.1:{port}"
        _client(endpoint).create_bucket(Bucket=BUCKET)
        create_log_store_table(endpoint)
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _client(endpoint: str):
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name="us-east-1"
    )


def dynamodb_client(endpoint: str):
    import boto3

    return boto3.client(
        "dynamodb", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name="us-east-1"
    )


def create_log_store_table(endpoint: str, name: str = DDB_TABLE) -> None:
    """The DynamoDB table of the log store, made as docs/cluster.md makes it on AWS: on-demand capacity, the key
    (tablePath, fileName), TTL on expireTime."""
    client = dynamodb_client(endpoint)
    client.create_table(
        TableName=name,
        AttributeDefinitions=[{"AttributeName": "tablePath", "AttributeType": "S"},
                              {"AttributeName": "fileName", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "tablePath", "KeyType": "HASH"}, {"AttributeName": "fileName", "KeyType": "RANGE"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    client.update_time_to_live(TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expireTime"})


def s3a_conf(endpoint: str) -> dict[str, str]:
    """S3A settings for an S3-compatible server on loopback, and kdq's DynamoDB log store on the same server
    (docs/cluster.md), all in [spark.conf] (paths.dynamodb_table / _region / _endpoint make the last four keys)."""
    return {
        "spark.hadoop.fs.s3a.endpoint": endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.access.key": KEY,
        "spark.hadoop.fs.s3a.secret.key": SECRET,
        "spark.delta.logStore.s3a.impl": "io.kdq.storage.DynamoDBLogStore",
        "spark.kdq.dynamodb.table": DDB_TABLE,
        "spark.kdq.dynamodb.region": "us-east-1",
        "spark.kdq.dynamodb.endpoint": endpoint,
    }


def _kdq(config: Config, *args: str, timeout: float = JOB_TIMEOUT) -> subprocess.CompletedProcess:
    """One kdq command in a process of its own (its Spark jobs through spark-submit), with this config."""
    started = time.monotonic()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "kdq"), *args],
        capture_output=True, text=True, timeout=timeout, cwd=PROJECT_ROOT,
        env={"KDQ_CONFIG": config.source, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "TZ": "UTC"},
    )
    print(f"kdq {' '.join(args)}: exit {done.returncode} in {time.monotonic() - started:.0f} s", flush=True)
    assert done.returncode == 0, f"kdq {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done


READBACK = """
import json, sys
from pyspark.sql import functions as F
from kdq import storage
from kdq.config import load_config
from kdq.spark.session import build_session

config = load_config(sys.argv[1], env={})
topic = sys.argv[2]
spark = build_session(config, app_name="kdq-s3-readback")

def table(name):
    return spark.read.format("delta").load(storage.table_location(config, name)).where(F.col("topic") == topic)

w = F.unix_millis("window_start").alias("w")
out = {
    "counts": [r.asDict() for r in table("window_counts").select(w, "status", "count").collect()],
    "corrections": [r.asDict() for r in table("corrections").select(w, "status", "old_count", "new_count", "reason").collect()],
    "archive": [r.asDict() for r in table("raw_archive").select("partition", "offset", "valid", "counted").collect()],
    "retired": [r.asDict() for r in table("retired_counts").select(w, "status", "count").collect()],
    "locations": {name: storage.table_location(config, name) for name in ("window_counts", "raw_archive")},
}
print("KDQ_READBACK " + json.dumps(out))
spark.stop()
"""


def read_back(config: Config, topic: str, tmp_path: Path) -> dict:
    """The kdq tables' rows of ``topic``, read from s3a:// by a Spark application of its own."""
    script = tmp_path / "read_back.py"
    script.write_text(READBACK)
    done = subprocess.run(
        [sys.executable, str(script), config.source, topic], capture_output=True, text=True, timeout=JOB_TIMEOUT,
        cwd=PROJECT_ROOT, env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "TZ": "UTC",
                               "PYTHONPATH": f"{PROJECT_ROOT / 'include'}:{PROJECT_ROOT}"},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("KDQ_READBACK ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(lines[-1].removeprefix("KDQ_READBACK "))


def _counts(rows: list[dict], topic: str) -> dict[tuple[str, int, str], int]:
    return {(topic, r["w"], r["status"]): r["count"] for r in rows if r["count"]}


def _points(counts: dict[tuple[str, int, str], int]) -> dict[int, tuple[int, int]]:
    return {w: (counts.get((t, w, "valid"), 0), counts.get((t, w, "invalid"), 0)) for t, w, _ in counts}


def _json_valid(value: bytes) -> bool:
    return value != BAD  # no rule for the topic: valid JSON is valid


def _id_at_least_2(value: bytes) -> bool:
    return value == ID2  # the rule run_the_pipeline adds before the rebuild


@dataclass(frozen=True)
class Pipeline:
    """Ground truth of :func:`run_the_pipeline`, computed here from what it produced."""

    topic: str
    on_time: dict[tuple[str, int, str], int]  # the stream's counts: the records it saw in time
    recomputed: dict[tuple[str, int, str], int]  # after the hourly recompute: the late records too
    rebuilt: dict[tuple[str, int, str], int]  # after the rule change's rebuild


def s3_config(stack, tmp_path: Path, prefix: str, endpoint: str, **spark: str) -> Config:
    """An isolated config (file) with its tables and checkpoints under s3a://BUCKET/<prefix> and a rules folder
    of its own (a copy of config/rules: no rule for the test's topic yet)."""
    rules = tmp_path / "rules"
    shutil.copytree(PROJECT_ROOT / "config" / "rules", rules)
    root = f"s3a://{BUCKET}/{prefix}"
    config = write_config_file(
        isolated_config(stack, tmp_path / "data", prefix, paths={"storage_uri": root, "rules_dir": str(rules)},
                        spark={**spark, "conf": s3a_conf(endpoint)}),
        tmp_path / "kdq.toml",
    )
    assert config.paths.storage_uri == root
    return config


def run_the_pipeline(config: Config, topic: str, kdq: Callable[..., object]) -> Pipeline:
    """The stream twice (PRODUCT.md's example, then records too late for it), the hourly recompute of the late
    records' ingest interval, a rule change and its rebuild, and the daily maintenance two days on; each job a
    kdq command in a process of its own, run by ``kdq(*args)``, sharing only the bucket."""
    produced: list[tuple[int, bytes]] = []

    def send(records: list[tuple[int, bytes, int]]) -> None:
        produce(config.kafka_bootstrap(), topic, records)
        produced.extend((ts, value) for _, value, ts in records)

    def truth(valid: Callable[[bytes], bool]) -> dict[tuple[str, int, str], int]:
        return expected_counts(topic, [(ts, valid(value)) for ts, value in produced])

    # PRODUCT.md's example (w0: 5 valid + 1 invalid over partitions 0 and 2; w1: 1 invalid), and a record a
    # minute later that moves the topic's event time on.
    send([(0, ID2, W0 + 10), (0, ID2, W0 + 20), (0, ID1, W0 + 30), (0, BAD, W0 + 40), (2, ID2, W0 + 500),
          (2, ID1, W0 + 900), (1, BAD, W1 + 500), (0, ID2, W60 + 5)])
    kdq("stream", "--available-now")
    on_time = truth(_json_valid)

    # Too late for the stream (allowed lateness 10 s): archived, not counted; the recompute counts them.
    ingest_from = now_ms()
    send([(2, ID1, W0 + 800), (1, BAD, W1 + 200), (0, ID2, W2 + 500)])
    kdq("stream", "--available-now")
    ingest_to = now_ms() + 1
    kdq("recompute", f"--start={ingest_from}", f"--end={ingest_to}", "--run-id=s3-hourly")
    recomputed = truth(_json_valid)

    # A rule change: ids below 2 become invalid; the rebuild re-judges the hour from the archive.
    (config.rules_dir / f"{topic}.schema.json").write_text(json.dumps(
        {"type": "object", "properties": {"id": {"type": "integer", "minimum": 2}}, "required": ["id"]}
    ))
    kdq("job", "rebuild", f"--from={W0}", f"--to={W0 + 3_600_000}", f"--topics={topic}", "--run-id=s3-rebuild")
    rebuilt = truth(_id_at_least_2)

    # The daily maintenance, run as if two days later: the archive's rows (event time 2023) are retired
    # into retired_counts and deleted; OPTIMIZE runs on every table (no VACUUM: the tables are younger than its
    # 168 hours retention, tests/integration/test_maintenance.py runs one).
    today = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).date().isoformat()
    kdq("job", "maintenance", f"--today={today}")
    return Pipeline(topic, on_time, recomputed, rebuilt)


def assert_exact_on_s3a(config: Config, pipeline: Pipeline, endpoint: str, prefix: str, tmp_path: Path) -> None:
    """Every output of :func:`run_the_pipeline` equals its ground truth, read back from s3a:// by a Spark
    application of its own (and InfluxDB); tables and checkpoints are in the bucket, none on the local disk."""
    topic, on_time, recomputed, rebuilt = pipeline.topic, pipeline.on_time, pipeline.recomputed, pipeline.rebuilt
    data = read_back(config, topic, tmp_path)
    assert data["locations"]["window_counts"] == f"{config.paths.storage_uri}/delta/window_counts"
    assert _counts(data["counts"], topic) == rebuilt
    assert rebuilt == {(topic, W0, "valid"): 3, (topic, W0, "invalid"): 4, (topic, W1, "invalid"): 2,
                       (topic, W2, "valid"): 1, (topic, W60, "valid"): 1}
    # Every correction, once: the recompute's (on time → with the late records), then the rebuild's.
    late = sorted((w, s, on_time.get((topic, w, s), 0), n) for (_, w, s), n in recomputed.items()
                  if n != on_time.get((topic, w, s), 0))
    assert sorted((c["w"], c["status"], c["old_count"], c["new_count"]) for c in data["corrections"]
                  if c["reason"] == "late_data") == late
    assert late == [(W0, "valid", 5, 6), (W1, "invalid", 1, 2), (W2, "valid", 0, 1)]
    rebuild = sorted((c["w"], c["status"], c["old_count"], c["new_count"]) for c in data["corrections"]
                     if c["reason"] != "late_data")
    assert rebuild == [(W0, "invalid", 1, 4), (W0, "valid", 6, 3)], data["corrections"]
    assert {c["reason"] for c in data["corrections"]} <= {"late_data", "rule_change", "rebuild"}
    # Retention: every archived row retired (counted as the rebuild judged it: each record archived once),
    # then deleted.
    assert data["archive"] == []
    assert _counts(data["retired"], topic) == rebuilt
    assert influx_points(config, topic) == _points(rebuilt)

    # Tables and checkpoints are in the bucket, nowhere on the local disk.
    keys = {o["Key"] for page in _client(endpoint).get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Prefix=f"{prefix}/") for o in page.get("Contents", [])}
    for expected in ("delta/window_counts/_delta_log/00000000000000000000.json",
                     "delta/raw_archive/_delta_log/00000000000000000000.json",
                     "delta/corrections/_delta_log/00000000000000000000.json",
                     "delta/retired_counts/_delta_log/00000000000000000000.json",
                     "checkpoints/speed_layer/kdq_app_id", "checkpoints/speed_layer/metadata",
                     "checkpoints/speed_layer/offsets/0", "checkpoints/speed_layer/commits/1",
                     "checkpoints/speed_layer/kdq_ledger/1"):
        assert f"{prefix}/{expected}" in keys, sorted(keys)[:50]
    local = config.data_dir
    assert local.is_dir()  # the stream's local state: heartbeat, progress, logs
    assert not [p for p in tmp_path.rglob("_delta_log")], "a Delta table was written to the local disk"
    assert not [p for p in tmp_path.rglob("*") if p.name in ("offsets", "commits", "kdq_ledger", "kdq_app_id")]
    assert not (local / "delta").exists() and not (local / "checkpoints").exists()
    print("local data_dir holds:", sorted(p.name for p in local.iterdir()), flush=True)


@pytest.mark.timeout(3600)  # seven Spark applications: 15-30 min on the loaded 2-core machine
def test_stream_recompute_rebuild_and_maintenance_with_tables_and_checkpoints_on_s3a(
    local_stack, s3_endpoint, tmp_path
) -> None:
    prefix = f"s3{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-orders"
    local_stack.kafka.create_topic(topic, partitions=3)
    config = s3_config(local_stack, tmp_path, prefix, s3_endpoint)
    pipeline = run_the_pipeline(config, topic, lambda *args: _kdq(config, *args))
    assert_exact_on_s3a(config, pipeline, s3_endpoint, prefix, tmp_path)


@pytest.mark.parametrize(
    ("bucket", "drop", "reason"),
    [("no-such-bucket", (), "the bucket does not exist"),
     (BUCKET, ("spark.hadoop.fs.s3a.access.key", "spark.hadoop.fs.s3a.secret.key"), "no AWS credentials")],
    ids=["unknown-bucket", "no-credentials"],
)
def test_unusable_object_storage_stops_the_job_at_start_by_name(local_stack, s3_endpoint, tmp_path, bucket, drop, reason) -> None:
    conf = {k: v for k, v in s3a_conf(s3_endpoint).items() if k not in drop}
    conf.update({"spark.hadoop.fs.s3a.attempts.maximum": "1", "spark.hadoop.fs.s3a.retry.limit": "1",
                 # no instance-metadata credentials lookup: only the keys of the configuration and the environment
                 "spark.hadoop.fs.s3a.aws.credentials.provider":
                     "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider,"
                     "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"})
    config = write_config_file(
        isolated_config(local_stack, tmp_path / "data", "s3bad", paths={"storage_uri": f"s3a://{bucket}/kdq"},
                        spark={"conf": conf}),
        tmp_path / "kdq.toml",
    )
    started = time.monotonic()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "kdq"), "job", "maintenance"], capture_output=True, text=True,
        timeout=JOB_TIMEOUT, cwd=PROJECT_ROOT,
        env={"KDQ_CONFIG": config.source, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "TZ": "UTC"},
    )
    print(f"unusable storage ({reason}): exit {done.returncode} in {time.monotonic() - started:.0f} s", flush=True)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert f"paths.storage_uri = 's3a://{bucket}/kdq'" in output and reason in output, output[-4000:]
    assert not (config.data_dir / "delta").exists()


@pytest.fixture(scope="module")
def cluster_stack_s3(tmp_path_factory: pytest.TempPathFactory):
    """The cluster shape of the stack (`kdq up --cluster`: three brokers, a standalone master, two workers)."""
    from kdq.stack.manager import LocalStack
    from tests.conftest import make_config

    stack = LocalStack(make_config(tmp_path_factory.mktemp("cluster-stack-s3")), cluster=True)
    try:
        started = time.monotonic()
        statuses = stack.up()
        print(f"\ncluster stack up in {time.monotonic() - started:.1f} s", flush=True)
        assert all(s.healthy for s in statuses), [s.line() for s in statuses]
        yield stack
    finally:
        stack.down()


# The application each kdq command registers with the master (its SparkSession's name, kdq.jobs.run_main's
# app_name in spark_jobs/).
APPLICATIONS = {"stream": "kdq-speed-layer", "recompute": "kdq-batch-recompute", "rebuild": "kdq-rebuild",
                "maintenance": "kdq-maintenance"}


@pytest.mark.timeout(3600)  # six applications of 1-core executors: 15-30 min on the loaded 2-core machine
def test_stream_recompute_rebuild_and_maintenance_on_the_standalone_cluster_with_tables_on_s3a(
    cluster_stack_s3, s3_endpoint, tmp_path
) -> None:
    """The pipeline of the first test with every job submitted to the standalone master: executors in separate
    JVMs (two workers) write the Delta tables and the driver the checkpoint on s3a://; the S3A jars travel with
    --jars, the kdq package with --py-files, the fs.s3a settings with the application's configuration. Each job
    is checked to be a finished application of the master with an executor on a worker."""
    stack = cluster_stack_s3
    prefix = f"s3c{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-orders"
    stack.kafka.create_topic(topic, partitions=3)
    config = s3_config(stack, tmp_path, prefix, s3_endpoint, master=stack.spark.url)
    ran: list[str] = []

    def on_the_master(*args: str) -> None:
        before = {a["id"] for a in stack.spark.status().get("completedapps", [])}
        _kdq(config, *args)
        apps = wait_for(lambda: [a for a in stack.spark.status().get("completedapps", []) if a["id"] not in before],
                        60, f"kdq {' '.join(args)} among the master's completed applications")
        expected = APPLICATIONS[args[1] if args[0] == "job" else args[0]]
        assert [a["name"] for a in apps] == [expected], apps
        executors = sorted(stack.spark.home.glob(f"spark-worker-*/{apps[0]['id']}/*/stderr"))
        assert executors, f"{expected} ({apps[0]['id']}) ran no executor on a worker"
        ran.append(f"{expected} {apps[0]['id']} ({len(executors)} executors)")

    pipeline = run_the_pipeline(config, topic, on_the_master)
    print("applications of the master:", ran, flush=True)
    assert len(ran) == 5
    assert_exact_on_s3a(config, pipeline, s3_endpoint, prefix, tmp_path)
