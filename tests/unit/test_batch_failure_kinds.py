"""Transient vs deterministic failures of a micro-batch: a transient one (the disk, the
network, an S3 or DynamoDB outage) is recorded but never blocks the stream; a deterministic one (the same
batch fails the same way on every attempt) counts toward stream.max_batch_failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdq.stream import failures
from kdq.stream.failures import classify_failure
from tests.conftest import make_config

TRANSIENT = [
    "java.io.IOException: No space left on device",
    "OSError: [Errno 28] No space left on device: '/data/stream/progress.json'",
    "py4j.protocol.Py4JJavaError: ... Caused by: java.net.ConnectException: Connection refused",
    "java.net.SocketTimeoutException: Read timed out",
    "java.net.SocketTimeoutException: connect timed out",
    "java.net.UnknownHostException: minio: Name or service not known",
    "java.net.SocketException: Connection reset",
    "org.apache.hadoop.fs.s3a.AWSServiceThrottledException: put on s3a://b/kdq: SlowDown",
    "org.apache.hadoop.fs.s3a.AWSStatus500Exception: getFileStatus on s3a://b/kdq/delta: InternalError",
    "org.apache.hadoop.fs.s3a.AWSClientIOException: listObjects on s3a://b/kdq: Unable to execute HTTP request",
    "software.amazon.awssdk.core.exception.SdkClientException: Unable to execute HTTP request: Connect timed out",
    "com.amazonaws.services.s3.model.AmazonS3Exception: Service Unavailable (Status Code: 503)",
    "software.amazon.awssdk.services.dynamodb.model.ProvisionedThroughputExceededException: The level of "
    "configured provisioned throughput for the table was exceeded",
    "software.amazon.awssdk.services.dynamodb.model.DynamoDbException: Throughput exceeds the current capacity "
    "(Service: DynamoDb, Status Code: 400, ThrottlingException)",
    "software.amazon.awssdk.services.dynamodb.model.InternalServerErrorException: Internal server error",
    "org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms expired before the position for "
    "partition t-0 could be determined",
    "io.delta.exceptions.ConcurrentAppendException: Files were added to the root of the table by a concurrent "
    "update",
]
DETERMINISTIC = [
    "KDQ_FAULT_FAIL_VALUE: cannot process record t partition 1 offset 7",
    "org.apache.spark.sql.AnalysisException: [UNRESOLVED_COLUMN] A column with name `x` cannot be resolved",
    "java.lang.OutOfMemoryError: Java heap space",
    "java.lang.StackOverflowError",
    "Partition t-0's offset was changed from 100 to 3, some data may have been missed. Some data may have been "
    "lost because they are not available in Kafka any more (failOnDataLoss)",
    "ValueError: invalid literal for int() with base 10: 'x'",
    "java.lang.IllegalStateException: timed out waiting for nothing (an assertion of kdq's own code)",
    "",
]


@pytest.mark.parametrize("error", TRANSIENT)
def test_transient(error: str) -> None:
    assert classify_failure(error) == "transient", error


@pytest.mark.parametrize("error", DETERMINISTIC)
def test_deterministic(error: str) -> None:
    assert classify_failure(error) == "deterministic", error


def test_a_transient_cause_under_a_wrapper_is_transient() -> None:
    error = (
        "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 12.0 failed 1 times\n"
        "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2898)\n"
        "Caused by: java.io.IOException: No space left on device\n"
    )
    assert classify_failure(error) == "transient"


def test_recorded_kinds_and_what_counts(tmp_path: Path) -> None:
    config = make_config(tmp_path / "data")
    first = failures.record_failure(config, 5, "java.net.ConnectException: Connection refused")
    assert (first["kind"], first["attempts"], first["transient_attempts"]) == ("transient", 0, 1)
    second = failures.record_failure(config, 5, "ValueError: bad")
    assert (second["kind"], second["attempts"], second["transient_attempts"]) == ("error", 1, 1)
    third = failures.record_failure(config, 5, "HUNG: ...", kind="hung")
    assert (third["kind"], third["attempts"], third["hung_attempts"]) == ("hung", 2, 1)
    assert failures.blocked(config, 2) is not None
    other = failures.record_failure(config, 6, "java.io.IOException: No space left on device")
    assert (other["attempts"], other["transient_attempts"], other["hung_attempts"]) == (0, 1, 0)


def test_hung_limit_grows_per_hung_attempt(tmp_path: Path) -> None:
    config = make_config(tmp_path / "data")
    assert failures.hung_limit(config, 9, 900) == 900
    failures.record_failure(config, 9, "HUNG", kind="hung")
    assert failures.hung_limit(config, 9, 900) == 1800
    failures.record_failure(config, 9, "HUNG", kind="hung")
    assert failures.hung_limit(config, 9, 900) == 3600
    failures.record_failure(config, 9, "java.net.ConnectException: Connection refused")
    assert failures.hung_limit(config, 9, 900) == 3600, "only hangs make the limit grow"
    assert failures.hung_limit(config, None, 900) == 900
