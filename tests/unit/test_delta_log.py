"""kdq.delta_log's pure parts: which storage delta-rs reads here, and the s3a settings it reads it with."""

from __future__ import annotations

from pathlib import Path

from kdq import delta_log
from kdq.tables import RAW_ARCHIVE, SUMMARIES, WINDOW_COUNTS
from tests.conftest import make_config

S3A = {"storage_uri": "s3a://bucket/kdq", "dynamodb_table": "log", "dynamodb_region": "eu-west-1"}


def test_local_tables_are_read_by_path_with_no_options(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    assert delta_log.readable(config) and delta_log.storage_options(config) == {}
    assert delta_log.log_uri(config, WINDOW_COUNTS) == str(tmp_path / "delta" / "window_counts")


def test_s3a_settings_become_delta_rs_options(tmp_path: Path) -> None:
    config = make_config(tmp_path, paths=S3A, spark={"conf": {
        "spark.hadoop.fs.s3a.endpoint": "127.0.0.1:9000", "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1", "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.access.key": "AK", "spark.hadoop.fs.s3a.secret.key": "SK",
        "spark.databricks.delta.optimize.minFileSize": "1048576",
    }})
    assert delta_log.readable(config)
    assert delta_log.log_uri(config, RAW_ARCHIVE) == "s3://bucket/kdq/delta/raw_archive"
    assert delta_log.storage_options(config) == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true", "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK",
    }
    assert delta_log.min_file_size(config) == 1048576


def test_aws_itself_needs_no_endpoint_and_takes_keys_from_the_environment(tmp_path: Path) -> None:
    config = make_config(tmp_path, paths=S3A)
    # Nothing in [spark.conf]: delta-rs reads the AWS environment itself, as Hadoop's default chain does.
    assert delta_log.storage_options(config) == {"AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true"}
    assert delta_log.min_file_size(config) == delta_log.DEFAULT_MIN_FILE_SIZE


def test_other_storage_is_left_to_spark(tmp_path: Path) -> None:
    config = make_config(tmp_path, paths={"storage_uri": "hdfs://namenode/kdq"})
    assert not delta_log.readable(config)


def test_the_window_tables_are_keyed_by_hour_and_the_archive_by_its_column() -> None:
    assert delta_log.partition_key_column(WINDOW_COUNTS) == delta_log.partition_key_column(SUMMARIES) == "window_hour"
    assert delta_log.partition_key_column(RAW_ARCHIVE) == "event_hour"


def test_a_table_delta_rs_cannot_read_is_left_to_spark_and_a_missing_one_to_the_job(tmp_path: Path) -> None:
    """A reader feature delta-rs does not know (one a newer Delta enabled) is LogUnreadable, which the maintenance
    answers by reading the log with Spark; a table with no log is TableMissing (the job creates it)."""
    import json

    import pytest

    config = make_config(tmp_path)
    with pytest.raises(delta_log.TableMissing, match="window_counts"):
        delta_log.table_state(config, WINDOW_COUNTS)
    folder = tmp_path / "delta" / "window_counts" / "_delta_log"
    folder.mkdir(parents=True)
    schema = json.dumps({"type": "struct", "fields": [{"name": "topic", "type": "string", "nullable": True, "metadata": {}}]})
    actions = [
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["kdqFutureFeature"],
                      "writerFeatures": ["kdqFutureFeature"]}},
        {"metaData": {"id": "00000000-0000-0000-0000-000000000001", "format": {"provider": "parquet", "options": {}},
                      "schemaString": schema, "partitionColumns": [], "configuration": {}, "createdTime": 1}},
    ]
    (folder / f"{0:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    with pytest.raises(delta_log.LogUnreadable, match="window_counts"):
        delta_log.table_state(config, WINDOW_COUNTS)
