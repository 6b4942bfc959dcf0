"""Concurrent writers on S3: Spark drivers in separate processes committing to the same Delta tables on
s3a:// at the same time lose nothing, because Delta's DynamoDB log store (``paths.dynamodb_table``;
io.delta.storage.S3DynamoDBLogStore) lets exactly one of them write each version of a table's log.

Delta's default log store for s3a:// (S3SingleDriverLogStore) guards a commit with a lock inside one JVM only: S3
has no put-if-absent, so two drivers that both write version N of a table each see their write succeed, and the
later one silently replaces the earlier commit (its rows are gone from the table). kdq's stream, hourly recompute,
rebuild and maintenance are such separate drivers.

moto's server (from test_cluster_s3: S3 and DynamoDB on one loopback port, the bucket and the log store's table
made by its fixture) stands in for AWS. The first test runs two Spark applications (processes of their own,
``local[1]`` each) appending to one table at the same moment, many times; the second runs kdq's own jobs at the same
time, the stream (``kdq stream --available-now``) and a rebuild (``kdq job rebuild``), against the same s3a://
tables, and checks their outputs exactly. Marked ``cluster`` (slow; `make test-cluster`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kdq.config import Config
from tests.conftest import PROJECT_ROOT, make_config
from tests.integration import test_cluster_s3
from tests.integration.helpers import W0, expected_counts, isolated_config, produce, write_config_file
from tests.integration.test_cluster_s3 import BUCKET, DDB_TABLE, dynamodb_client, read_back, s3a_conf

pytestmark = pytest.mark.cluster

s3_endpoint = test_cluster_s3.s3_endpoint  # moto's server for this module too (S3 + DynamoDB, bucket and table made)
_client = test_cluster_s3._client

JOB_TIMEOUT = 900
WRITERS, COMMITS, ROWS = 2, 15, 3

WRITER = """
import json, pathlib, sys, time
from pyspark.sql import SparkSession
from kdq.config import load_config
from kdq.spark.session import spark_conf
from kdq.spark.storage import prepare

config = load_config(sys.argv[1], env={})
table, writer, commits, rows, folder = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), pathlib.Path(sys.argv[6])
builder = SparkSession.builder.master(config.spark.master)
for key, value in spark_conf(config, f"kdq-concurrent-writer-{writer}").items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
prepare(spark, config)  # the storage root, and Delta's DynamoDB log store reaching its table
if writer == 0:
    spark.sql(f"CREATE TABLE delta.`{table}` (writer INT, seq INT, n INT) USING delta")
(folder / f"ready-{writer}").write_text("")
deadline = time.monotonic() + 600
while not (folder / "go").exists():
    assert time.monotonic() < deadline, "no go"
    time.sleep(0.05)
started = time.monotonic()
for seq in range(commits):
    (spark.createDataFrame([(writer, seq, n) for n in range(rows)], "writer INT, seq INT, n INT")
     .coalesce(1).write.format("delta").mode("append").option("userMetadata", f"w{writer}-{seq}").save(table))
print("KDQ_WRITER " + json.dumps({"writer": writer, "seconds": round(time.monotonic() - started, 1)}), flush=True)
spark.stop()
"""

HISTORY = """
import json, sys
from pyspark.sql import SparkSession
from kdq.config import load_config
from kdq.spark.session import spark_conf

config = load_config(sys.argv[1], env={})
table = sys.argv[2]
builder = SparkSession.builder.master(config.spark.master)
for key, value in spark_conf(config, "kdq-concurrent-readback").items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
rows = [tuple(r) for r in spark.read.format("delta").load(table).select("writer", "seq", "n").collect()]
history = [r.asDict() for r in spark.sql(f"DESCRIBE HISTORY delta.`{table}`")
           .selectExpr("version", "operation", "userMetadata", "readVersion").collect()]
print("KDQ_HISTORY " + json.dumps({"rows": rows, "history": history}), flush=True)
spark.stop()
"""


def _env() -> dict[str, str]:
    return {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "TZ": "UTC",
            "PYTHONPATH": f"{PROJECT_ROOT / 'include'}:{PROJECT_ROOT}"}


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _output(done: subprocess.CompletedProcess, marker: str) -> dict:
    lines = [line for line in done.stdout.splitlines() if line.startswith(f"{marker} ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(lines[-1].removeprefix(f"{marker} "))


def _log_store_entries(endpoint: str, table: str) -> dict[str, dict]:
    """The DynamoDB items of Delta's log store for ``table``: its commit files by name."""
    client = dynamodb_client(endpoint)
    items: list[dict] = []
    for page in client.get_paginator("scan").paginate(TableName=DDB_TABLE):
        items.extend(page["Items"])
    return {i["fileName"]["S"]: i for i in items if i["tablePath"]["S"].rstrip("/") == table.rstrip("/")}


def _commit_files(endpoint: str, prefix: str) -> list[str]:
    keys = [o["Key"] for page in _client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
            for o in page.get("Contents", [])]
    return sorted(k.rsplit("/", 1)[-1] for k in keys if k.endswith(".json") and "/.tmp/" not in k)


def _coordinated_config(tmp_path: Path, prefix: str, endpoint: str, **spark: str) -> dict:
    """The paths of a config whose commits are coordinated by kdq's own settings (paths.dynamodb_*), not [spark.conf]:
    the S3A keys of s3a_conf only."""
    return {
        "paths": {"storage_uri": f"s3a://{BUCKET}/{prefix}", "dynamodb_table": DDB_TABLE, "dynamodb_endpoint": endpoint},
        "spark": {**spark, "conf": {k: v for k, v in s3a_conf(endpoint).items() if k.startswith("spark.hadoop.")}},
    }


@pytest.mark.timeout(1800)
def test_two_spark_applications_appending_to_one_s3a_table_at_once_lose_no_commit(s3_endpoint, tmp_path) -> None:
    prefix = f"cw{tmp_path.name[-6:].replace('_', '')}"
    sections = _coordinated_config(tmp_path, prefix, s3_endpoint, master="local[1]", shuffle_partitions="1")
    config = write_config_file(make_config(tmp_path / "data", **sections), tmp_path / "kdq.toml")
    assert config.paths.dynamodb_table == DDB_TABLE
    table = f"s3a://{BUCKET}/{prefix}/delta/concurrent_appends"
    writer = _script(tmp_path, "writer.py", WRITER)
    started = time.monotonic()
    processes = [
        subprocess.Popen(
            [sys.executable, str(writer), config.source, table, str(w), str(COMMITS), str(ROWS), str(tmp_path)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=PROJECT_ROOT, env=_env(),
        )
        for w in range(WRITERS)
    ]
    try:
        deadline = time.monotonic() + JOB_TIMEOUT
        while not all((tmp_path / f"ready-{w}").exists() for w in range(WRITERS)):
            failed = [p for p in processes if p.poll() not in (None, 0)]
            assert not failed, failed[0].communicate()[1][-6000:]
            assert time.monotonic() < deadline, "the writers did not get ready"
            time.sleep(0.2)
        print(f"\nwriters ready in {time.monotonic() - started:.0f} s: go", flush=True)
        (tmp_path / "go").write_text("")
        outputs = [p.communicate(timeout=max(1.0, deadline - time.monotonic())) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    results = [_output(subprocess.CompletedProcess([], p.returncode, out, err), "KDQ_WRITER")
               for p, (out, err) in zip(processes, outputs, strict=True)]
    print("writers:", results, flush=True)

    done = subprocess.run([sys.executable, str(_script(tmp_path, "history.py", HISTORY)), config.source, table],
                          capture_output=True, text=True, timeout=JOB_TIMEOUT, cwd=PROJECT_ROOT, env=_env())
    data = _output(done, "KDQ_HISTORY")
    # Every row of every commit of both writers, once.
    expected = sorted((w, seq, n) for w in range(WRITERS) for seq in range(COMMITS) for n in range(ROWS))
    assert sorted(map(tuple, data["rows"])) == expected
    # One version per commit, without gaps: the creation, then the WRITERS * COMMITS appends, each recorded.
    history = sorted(data["history"], key=lambda h: h["version"])
    last = WRITERS * COMMITS
    assert [h["version"] for h in history] == list(range(last + 1))
    appends = [h for h in history if h["operation"] == "WRITE"]
    assert sorted(h["userMetadata"] for h in appends) == sorted(f"w{w}-{s}" for w in range(WRITERS) for s in range(COMMITS))
    # The two writers' commits interleave (they ran at the same time), and some were retried at a later version
    # after the other writer had taken theirs (read version not the one before: a collision the log store decided).
    order = [h["userMetadata"][:2] for h in appends]
    switches = sum(1 for a, b in zip(order, order[1:], strict=False) if a != b)
    rebased = [h["version"] for h in appends if h["readVersion"] is not None and h["readVersion"] < h["version"] - 1]
    print(f"commit order {''.join(o[1] for o in order)}: {switches} switches; rebased commits {rebased}", flush=True)
    assert switches >= 2, order
    # Every commit file is in the bucket, and the log store's DynamoDB table holds an entry for each, complete.
    names = [f"{v:020d}.json" for v in range(last + 1)]
    assert _commit_files(s3_endpoint, f"{prefix}/delta/concurrent_appends/_delta_log/") == names
    entries = _log_store_entries(s3_endpoint, table)
    assert sorted(entries) == names, sorted(entries)
    assert all(e["complete"]["S"] == "true" for e in entries.values())
    print(f"concurrent appends: {last} commits by {WRITERS} writers in {time.monotonic() - started:.0f} s", flush=True)


ID1, ID2, BAD = json.dumps({"id": 1}).encode(), json.dumps({"id": 2}).encode(), b"{oops"
HOUR = 3_600_000


def _start_kdq(config: Config, *args: str) -> subprocess.Popen:
    """One kdq command in a process of its own (spark-submit), started, not awaited."""
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "kdq"), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=PROJECT_ROOT,
        env={"KDQ_CONFIG": config.source, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "TZ": "UTC"},
    )


def _finish(process: subprocess.Popen, what: str, started: float) -> float:
    try:
        out, err = process.communicate(timeout=JOB_TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert process.returncode == 0, f"{what} failed:\n{out[-3000:]}\n{err[-6000:]}"
    print(f"{what}: done {time.monotonic() - started:.0f} s after the start", flush=True)
    return time.monotonic()


def _commits(endpoint: str, prefix: str, table: str) -> dict[int, list[dict]]:
    """The actions of every commit of a table's Delta log, read from the bucket, by version."""
    client = _client(endpoint)
    log = f"{prefix}/delta/{table}/_delta_log/"
    commits = {}
    for name in _commit_files(endpoint, log):
        body = client.get_object(Bucket=BUCKET, Key=log + name)["Body"].read().decode()
        commits[int(name.split(".")[0])] = [json.loads(line) for line in body.splitlines() if line.strip()]
    return commits


@pytest.mark.timeout(2400)
def test_the_stream_and_a_rebuild_at_once_on_the_same_s3a_tables_keep_every_commit(
    local_stack, s3_endpoint, tmp_path
) -> None:
    """kdq's own jobs, two drivers at the same time: the stream counts new records of one topic while a rebuild
    re-judges another topic's hour after a rule change; both commit to window_counts (and the stream to the archive,
    the rebuild to corrections). Every output exact, every commit in the log, once, without a gap."""
    prefix = f"cj{tmp_path.name[-6:].replace('_', '')}"
    streamed, rebuilt = f"{prefix}-orders", f"{prefix}-payments"
    for topic in (streamed, rebuilt):
        local_stack.kafka.create_topic(topic, partitions=2)
    rules = tmp_path / "rules"
    shutil.copytree(PROJECT_ROOT / "config" / "rules", rules)
    sections = _coordinated_config(tmp_path, prefix, s3_endpoint)
    config = write_config_file(
        isolated_config(local_stack, tmp_path / "data", prefix, paths={**sections["paths"], "rules_dir": str(rules)},
                        spark=sections["spark"]),
        tmp_path / "kdq.toml",
    )
    assert config.paths.dynamodb_table == DDB_TABLE and config.paths.dynamodb_endpoint == s3_endpoint

    # The rebuilt topic's hour is in the archive first (PRODUCT.md's example and a record a minute later).
    old = [(0, ID2, W0 + 10), (0, ID2, W0 + 20), (0, ID1, W0 + 30), (0, BAD, W0 + 40), (1, ID2, W0 + 500),
           (1, ID1, W0 + 900), (1, BAD, W0 + 1500), (0, ID2, W0 + 60_005)]
    produce(config.kafka_bootstrap(), rebuilt, old)
    started = time.monotonic()
    _finish(_start_kdq(config, "stream", "--available-now"), "first stream", started)
    first = set(_commits(s3_endpoint, prefix, "window_counts"))

    # A rule change for the rebuilt topic (ids below 2 become invalid), and new records for the streamed one.
    (rules / f"{rebuilt}.schema.json").write_text(json.dumps(
        {"type": "object", "properties": {"id": {"type": "integer", "minimum": 2}}, "required": ["id"]}
    ))
    new = [(p, value, W0 + 2 * HOUR + 100 * i) for i, (p, value) in enumerate(
        [(0, ID1), (1, ID2), (0, BAD), (1, ID1), (0, ID2), (1, ID2), (0, ID1), (1, BAD)])]
    produce(config.kafka_bootstrap(), streamed, new)

    # At once: the stream (the new records) and the rebuild of the other topic's hour.
    started = time.monotonic()
    stream = _start_kdq(config, "stream", "--available-now")
    rebuild = _start_kdq(config, "job", "rebuild", f"--from={W0}", f"--to={W0 + HOUR}", f"--topics={rebuilt}",
                         "--run-id=cj-rebuild")
    _finish(stream, "stream", started)
    _finish(rebuild, "rebuild", started)

    streamed_data, rebuilt_data = read_back(config, streamed, tmp_path), read_back(config, rebuilt, tmp_path)
    counts = lambda rows, topic: {(topic, r["w"], r["status"]): r["count"] for r in rows if r["count"]}  # noqa: E731
    assert counts(streamed_data["counts"], streamed) == expected_counts(streamed, [(ts, v != BAD) for _, v, ts in new])
    assert counts(rebuilt_data["counts"], rebuilt) == expected_counts(rebuilt, [(ts, v == ID2) for _, v, ts in old])
    assert sorted((a["partition"], a["offset"]) for a in streamed_data["archive"]) == sorted(
        (p, o) for p in (0, 1) for o in range(sum(1 for q, _, _ in new if q == p)))
    # The rebuild's corrections, once each: window W0 loses the two id-1 records to invalid.
    assert sorted((c["w"], c["status"], c["old_count"], c["new_count"]) for c in rebuilt_data["corrections"]) == [
        (W0, "invalid", 1, 3), (W0, "valid", 5, 3)]
    assert streamed_data["corrections"] == []

    # window_counts' log: versions 0..M without a gap, each in the log store's DynamoDB table, and both jobs'
    # commits after the first stream's (their transactions' app ids), interleaved in time.
    commits = _commits(s3_endpoint, prefix, "window_counts")
    assert sorted(commits) == list(range(len(commits)))
    entries = _log_store_entries(s3_endpoint, f"s3a://{BUCKET}/{prefix}/delta/window_counts")
    assert sorted(entries) == [f"{v:020d}.json" for v in sorted(commits)]
    stream_app = _client(s3_endpoint).get_object(
        Bucket=BUCKET, Key=f"{prefix}/checkpoints/speed_layer/kdq_app_id")["Body"].read().decode().strip()
    apps = {v: {a["txn"]["appId"] for a in actions if "txn" in a} for v, actions in commits.items() if v not in first}
    times = {v: next(a["commitInfo"]["timestamp"] for a in actions if "commitInfo" in a)
             for v, actions in commits.items() if v not in first}
    print("window_counts commits during the concurrent run:",
          {v: (sorted(apps[v]), times[v]) for v in sorted(apps)}, flush=True)
    by_stream = [times[v] for v in apps if stream_app in apps[v]]
    by_rebuild = [times[v] for v in apps if stream_app not in apps[v]]
    assert by_stream and by_rebuild, apps


@pytest.mark.parametrize("case", ["uncoordinated", "unreachable-dynamodb"])
def test_s3a_tables_without_a_usable_log_store_stop_the_job_at_start_by_name(s3_endpoint, tmp_path, case) -> None:
    """No coordination of the commits: refused before a JVM starts. A DynamoDB endpoint that does not answer:
    refused when the session is built, naming the setting, not at the first commit."""
    sections = _coordinated_config(tmp_path, f"bad{case[:4]}", s3_endpoint)
    if case == "uncoordinated":
        sections["paths"] = {"storage_uri": sections["paths"]["storage_uri"]}
        reason = "paths.s3_single_writer = true"
    else:
        sections["paths"]["dynamodb_endpoint"] = f"http://127.0.0.1:{test_cluster_s3._free_port()}"
        reason = f"the DynamoDB log store (paths.dynamodb_table = '{DDB_TABLE}'): cannot reach DynamoDB"
    config = write_config_file(make_config(tmp_path / "data", **sections), tmp_path / "kdq.toml")
    started = time.monotonic()
    process = _start_kdq(config, "job", "maintenance")
    out, err = process.communicate(timeout=JOB_TIMEOUT)
    print(f"{case}: exit {process.returncode} in {time.monotonic() - started:.0f} s", flush=True)
    assert process.returncode != 0 and reason in out + err, (out + err)[-4000:]
