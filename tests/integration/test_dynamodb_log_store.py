"""kdq's DynamoDB log store (jvm/hadoop-aws/kdq-dynamodb, io.kdq.storage.DynamoDBLogStore): its JUnit tests, and its
recovery of a writer that died between its claim of version N and its completion, under Spark and Delta on moto.

`make setup-s3` runs them whenever it builds the module (``mvn package``, only when the module's sources changed);
this test runs them on every `make test-cluster` (which depends on setup-s3, so Maven's cache holds the AWS SDK and
Hadoop artifacts they need). They cover, on the local file system with DynamoDB in memory: a failure of the copy or
the completion after a successful claim is not thrown (the commit is decided; the next reader or writer completes
it, as Delta's S3DynamoDBLogStore does), a writer that dies between its claim and its completion (a later reader or
writer completes N.json from its temporary file; no commit lost, no version written twice), a failed claim thrown,
a claim whose response was lost kept, and the recovery's retries. The second test leaves a real Delta commit of a
table on s3a:// (moto's S3 and DynamoDB) in the state such a writer leaves (its temporary file, an incomplete item, no
N.json), then a new Spark application appends to the table and reads it back: N is completed from the temporary
file, the append lands at N+1, every row is there once. Marked ``cluster``: the module builds only under setup-s3.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT, make_config
from tests.integration import test_cluster_s3
from tests.integration.helpers import write_config_file
from tests.integration.test_cluster_s3 import BUCKET, DDB_TABLE, dynamodb_client, s3a_conf

pytestmark = pytest.mark.cluster

MODULE = PROJECT_ROOT / "jvm" / "hadoop-aws" / "kdq-dynamodb"
s3_endpoint = test_cluster_s3.s3_endpoint  # moto's server (S3 + DynamoDB, bucket and log store table made)
JOB_TIMEOUT = 900

APPEND_AND_READ = """
import json, sys
from pyspark.sql import SparkSession
from kdq.config import load_config
from kdq.spark.session import spark_conf
from kdq.spark.storage import prepare

config = load_config(sys.argv[1], env={})
table, first, last = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
builder = SparkSession.builder.master(config.spark.master)
for key, value in spark_conf(config, "kdq-log-store-recovery").items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
prepare(spark, config)
for seq in range(first, last):
    spark.createDataFrame([(seq, n) for n in range(2)], "seq INT, n INT").coalesce(1).write.format("delta") \
        .mode("append").option("userMetadata", f"c{seq}").save(table)
rows = sorted(tuple(r) for r in spark.read.format("delta").load(table).collect())
history = sorted((r.version, r.userMetadata) for r in spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect())
print("KDQ_OUT " + json.dumps({"rows": rows, "history": history}), flush=True)
spark.stop()
"""


@pytest.mark.timeout(600)
def test_the_log_store_junit_tests_pass() -> None:
    mvn = shutil.which("mvn")
    assert mvn, "Maven is required (make setup-s3 installs it)"
    reports = MODULE / "target" / "surefire-reports"
    shutil.rmtree(reports, ignore_errors=True)
    done = subprocess.run([mvn, "-q", "-B", "-f", str(MODULE / "pom.xml"), "test"],
                          capture_output=True, text=True, timeout=540, cwd=PROJECT_ROOT)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    suites = [ET.parse(path).getroot() for path in sorted(reports.glob("TEST-*.xml"))]
    counts = {key: sum(int(s.get(key, "0")) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
    names = {case.get("name") for s in suites for case in s.iter("testcase")}
    assert counts["tests"] >= 9 and counts["failures"] == counts["errors"] == counts["skipped"] == 0, counts
    assert {"aCopyThatFailsAfterTheClaimIsNotThrownAndTheNextReaderCompletesTheCommit",
            "aWriterThatDiedAfterItsClaimIsCompletedByAReader",
            "aWriterThatDiedAfterItsClaimIsCompletedByTheNextWriterAndItsVersionIsNotWrittenTwice"} <= names, names


def _run(script: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=JOB_TIMEOUT,
                          cwd=PROJECT_ROOT, env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "TZ": "UTC",
                                                 "PYTHONPATH": f"{PROJECT_ROOT / 'include'}:{PROJECT_ROOT}"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("KDQ_OUT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(lines[-1].removeprefix("KDQ_OUT "))


@pytest.mark.timeout(1800)
def test_a_writer_that_died_after_claiming_a_version_is_completed_by_the_next_application(s3_endpoint, tmp_path) -> None:
    prefix = f"rec{tmp_path.name[-6:].replace('_', '')}"
    sections = {
        "paths": {"storage_uri": f"s3a://{BUCKET}/{prefix}", "dynamodb_table": DDB_TABLE, "dynamodb_endpoint": s3_endpoint},
        "spark": {"master": "local[1]", "shuffle_partitions": "1",
                  "conf": {k: v for k, v in s3a_conf(s3_endpoint).items() if k.startswith("spark.hadoop.")}},
    }
    config = write_config_file(make_config(tmp_path / "data", **sections), tmp_path / "kdq.toml")
    table = f"s3a://{BUCKET}/{prefix}/delta/recovery"
    log_key = f"{prefix}/delta/recovery/_delta_log/"
    script = tmp_path / "append_and_read.py"
    script.write_text(APPEND_AND_READ)
    # Versions 0, 1, 2: three appends through the log store.
    first = _run(script, config.source, table, "0", "3")
    assert [v for v, _ in first["history"]] == [0, 1, 2]
    # Version 2 as a writer leaves it that died after its claim: its actions only in the temporary file, its item
    # incomplete, no 00000000000000000002.json.
    s3 = test_cluster_s3._client(s3_endpoint)
    ddb = dynamodb_client(s3_endpoint)
    name = f"{2:020d}.json"
    item = ddb.get_item(TableName=DDB_TABLE, Key={"tablePath": {"S": table}, "fileName": {"S": name}},
                        ConsistentRead=True)["Item"]
    temp = item["tempPath"]["S"]
    assert temp.startswith(f".tmp/{name}.") and item["complete"]["S"] == "true"
    actions = s3.get_object(Bucket=BUCKET, Key=log_key + temp)["Body"].read()
    assert actions == s3.get_object(Bucket=BUCKET, Key=log_key + name)["Body"].read()
    s3.delete_object(Bucket=BUCKET, Key=log_key + name)
    ddb.put_item(TableName=DDB_TABLE, Item={"tablePath": {"S": table}, "fileName": {"S": name},
                                           "tempPath": {"S": temp}, "complete": {"S": "false"}})
    # A new application appends twice and reads the table back: version 2 is completed from the temporary file (its
    # rows are there), its appends land at 3 and 4, no version is written twice.
    second = _run(script, config.source, table, "3", "5")
    assert second["history"] == [[0, "c0"], [1, "c1"], [2, "c2"], [3, "c3"], [4, "c4"]]
    assert second["rows"] == sorted([seq, n] for seq in range(5) for n in range(2))
    assert s3.get_object(Bucket=BUCKET, Key=log_key + name)["Body"].read() == actions
    items = {i["fileName"]["S"]: i for i in ddb.query(
        TableName=DDB_TABLE, KeyConditionExpression="tablePath = :t",
        ExpressionAttributeValues={":t": {"S": table}}, ConsistentRead=True)["Items"]}
    assert sorted(items) == [f"{v:020d}.json" for v in range(5)]
    assert all(i["complete"]["S"] == "true" and "expireTime" in i for i in items.values()), items
