"""Where tables and checkpoints live (kdq.storage): locations as strings, local or a URI, never via pathlib
for a URI; the checkpoint readers on either; bad settings refused at start. No Spark, no JVM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kdq import storage
from kdq.config import ConfigError
from kdq.spark.session import spark_conf, storage_jars
from kdq.spark.tables import table_path
from kdq.stream import failures
from kdq.stream.checkpoint_offsets import batch_offset_ranges, passed_offsets, speed_layer_checkpoint
from kdq.tables import RAW_ARCHIVE, WINDOW_COUNTS
from tests.conftest import make_config

OFFSETS_HEADER = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n'


def test_local_by_default_in_the_data_folder(tmp_path) -> None:
    config = make_config(tmp_path / "data")
    assert storage.tables_location(config) == str(tmp_path / "data" / "delta")
    assert table_path(config, WINDOW_COUNTS) == str(tmp_path / "data" / "delta" / "window_counts")
    assert speed_layer_checkpoint(config) == str(tmp_path / "data" / "checkpoints" / "speed_layer")
    assert config.tables_dir == tmp_path / "data" / "delta"  # unchanged for local storage
    assert spark_conf(config, "x")["spark.sql.warehouse.dir"] == str(tmp_path / "data" / "warehouse")
    assert storage_jars(config) == []


def test_a_storage_uri_keeps_tables_checkpoints_and_warehouse_there_and_local_state_local(tmp_path) -> None:
    (tmp_path / "jars" / "hadoop-aws").mkdir(parents=True)
    (tmp_path / "jars" / "hadoop-aws" / "hadoop-aws-3.5.0.jar").write_bytes(b"")
    config = make_config(tmp_path / "data", paths={"storage_uri": "s3a://bucket/kdq/", "jars_dir": str(tmp_path / "jars")})
    assert config.paths.storage_uri == "s3a://bucket/kdq"  # the trailing / dropped
    assert table_path(config, RAW_ARCHIVE) == "s3a://bucket/kdq/delta/raw_archive"
    assert speed_layer_checkpoint(config) == "s3a://bucket/kdq/checkpoints/speed_layer"
    assert failures.checkpoint_of(config) == "s3a://bucket/kdq/checkpoints/speed_layer"
    assert storage.warehouse_location(config) == "s3a://bucket/kdq/warehouse"
    assert config.state_file == tmp_path / "data" / "stack" / "state.json"
    with pytest.raises(ConfigError, match="paths.storage_uri"):
        config.tables_dir  # noqa: B018  (no local folder to hand out: pathlib would make s3a:/bucket a folder)
    assert [p.name for p in storage_jars(config)] == ["hadoop-aws-3.5.0.jar"]


def test_join_and_names_keep_a_uri_a_uri() -> None:
    assert storage.join("s3a://b/p/", "offsets", 7) == "s3a://b/p/offsets/7"
    assert storage.join("hdfs://nn:8020/kdq", "delta") == "hdfs://nn:8020/kdq/delta"
    assert storage.join("/tmp/x", "a", "b") == "/tmp/x/a/b"
    assert storage.name_of("s3a://b/kdq/checkpoints/speed_layer/") == "speed_layer"
    assert storage.scheme("abfss://c@a.dfs.core.windows.net/p") == "abfss"
    assert storage.scheme("/local/path") is None and storage.scheme("C:/x") is None
    assert storage.is_remote("gs://b/p") and not storage.is_remote("file:///tmp/x") and not storage.is_remote("rel/p")
    assert storage.local_path("file:///tmp/x") == Path("/tmp/x")


@pytest.mark.parametrize(
    ("paths", "expected"),
    [
        ({"data_dir": "s3a://bucket/kdq"}, "data_dir is a local folder.*paths.storage_uri = 's3a://bucket/kdq'"),
        ({"storage_uri": "bucket/kdq"}, "expected a Hadoop FileSystem URI"),
        ({"storage_uri": "s3://bucket/kdq"}, "use s3a://"),
        ({"storage_uri": "s3a:///kdq"}, "names no bucket"),
        ({"storage_uri": "s3a://bucket/k`dq"}, "backtick"),
    ],
)
def test_bad_storage_settings_are_refused_at_start(tmp_path, paths, expected) -> None:
    with pytest.raises(ConfigError, match=expected):
        make_config(tmp_path / "data", paths=paths)


def test_s3a_without_the_connector_jars_fails_at_start_with_the_way_out(tmp_path) -> None:
    config = make_config(tmp_path / "data", paths={"storage_uri": "s3a://bucket/kdq", "jars_dir": str(tmp_path / "none")})
    with pytest.raises(ConfigError, match=r"make setup-s3"):
        storage_jars(config)
    # Another scheme brings its own connector (the cluster's); kdq adds nothing.
    assert storage_jars(make_config(tmp_path / "data", paths={"storage_uri": "hdfs://nn/kdq"})) == []


def _write_log(checkpoint: Path, batch_id: int, offsets: dict, committed: bool) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(batch_id)).write_text(OFFSETS_HEADER + json.dumps(offsets) + "\n")
    if committed:
        (checkpoint / "commits" / str(batch_id)).write_text("v1\n{}\n")


class FakeRemote:
    """Files of a remote store, kept in a dict (what HadoopFiles does through the JVM)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def exists(self, location) -> bool:
        return str(location) in self.files or any(k.startswith(f"{location}/") for k in self.files)

    def names(self, location) -> list[str]:
        prefix = f"{location}/"
        return sorted({k[len(prefix):].split("/")[0] for k in self.files if k.startswith(prefix)})

    def read_bytes(self, location) -> bytes:
        if str(location) not in self.files:
            raise FileNotFoundError(location)
        return self.files[str(location)]

    def mkdirs(self, location) -> None:
        pass

    def create_if_absent(self, location, data: bytes) -> bool:
        if str(location) in self.files:
            return False
        self.files[str(location)] = data
        return True


def test_checkpoint_readers_work_on_a_remote_checkpoint_through_the_registered_files(tmp_path) -> None:
    local = tmp_path / "cp"
    _write_log(local, 0, {"a": {"0": 4}}, committed=True)
    _write_log(local, 1, {"a": {"0": 9}}, committed=False)
    remote = FakeRemote()
    for path in local.rglob("*"):
        if path.is_file():
            remote.files[f"s3a://b/cp/{path.relative_to(local).as_posix()}"] = path.read_bytes()
    try:
        with pytest.raises(storage.RemoteStorageUnavailable, match="no Spark session"):
            batch_offset_ranges("s3a://b/cp", 1)
        assert failures.pending_batch("s3a://b/cp") is None  # a supervisor without Spark: unknown
        assert failures.offset_ranges("s3a://b/cp", 1) == []
        storage.use_remote_files(remote)
        for checkpoint in (str(local), "s3a://b/cp"):
            assert failures.pending_batch(checkpoint) == 1
            assert passed_offsets(checkpoint) == {("a", 0): 4}
            assert [(r.topic, r.partition, r.start, r.end) for r in batch_offset_ranges(checkpoint, 1)] == [("a", 0, 4, 9)]
    finally:
        storage.use_remote_files(None)


def test_create_if_absent_keeps_the_first_content(tmp_path) -> None:
    files = storage.files_for(tmp_path)
    assert files.create_if_absent(tmp_path / "id", b"first")
    assert not files.create_if_absent(tmp_path / "id", b"second")
    assert files.read_bytes(tmp_path / "id") == b"first"
    assert sorted(files.names(tmp_path)) == ["id"] and files.names(tmp_path / "missing") == []


# -- concurrent writers on s3a:// (Delta's DynamoDB log store) ---------------------------------------------------------

REMOTE = {"master": "spark://spark-master.example:7077"}  # no local jars needed to build the settings
LOG_STORE = "spark.delta.logStore.s3a.impl"


def test_s3a_tables_without_coordinated_commits_stop_every_job_at_start(tmp_path) -> None:
    """Delta's default log store for s3a:// is safe for one writing driver; kdq's jobs are several drivers."""
    config = make_config(tmp_path / "data", paths={"storage_uri": "s3a://bucket/kdq"}, spark=REMOTE)
    with pytest.raises(ConfigError) as refused:
        spark_conf(config, "kdq-speed-layer")
    message = str(refused.value)
    assert "paths.storage_uri = 's3a://bucket/kdq'" in message and "one writing Spark driver only" in message
    for way_out in ("paths.dynamodb_table", "spark.delta.logStore.s3a.impl", "paths.s3_single_writer = true"):
        assert way_out in message
    # Delta's single-driver store named explicitly is no coordination either.
    single = {"spark.delta.logStore.s3a.impl": "io.delta.storage.S3SingleDriverLogStore"}
    with pytest.raises(ConfigError, match="paths.dynamodb_table"):
        spark_conf(make_config(tmp_path / "data", paths={"storage_uri": "s3a://bucket/kdq"},
                               spark={**REMOTE, "conf": single}), "x")
    # Other stores give Delta an atomic rename, and local tables need nothing.
    for uri in ("hdfs://nn/kdq", "abfss://c@a.dfs.core.windows.net/kdq", ""):
        assert "spark.delta.logStore.s3a.impl" not in spark_conf(
            make_config(tmp_path / "data", paths={"storage_uri": uri}, spark=REMOTE), "x")


def test_single_writer_acknowledged_or_a_log_store_of_ones_own_runs_as_configured(tmp_path) -> None:
    single = make_config(
        tmp_path / "data", paths={"storage_uri": "s3a://bucket/kdq", "s3_single_writer": True}, spark=REMOTE
    )
    assert not [k for k in spark_conf(single, "x") if "logStore" in k or "dynamodb" in k]
    own = {LOG_STORE: "io.delta.storage.S3DynamoDBLogStore", "spark.io.delta.storage.S3DynamoDBLogStore.ddb.tableName": "t"}
    conf = spark_conf(
        make_config(tmp_path / "data", paths={"storage_uri": "s3a://bucket/kdq"}, spark={**REMOTE, "conf": own}), "x"
    )
    assert {k: conf[k] for k in own} == own
    # The acknowledgement as an environment variable, as a deployment would pass it.
    from kdq.config import load_config
    from tests.conftest import PROJECT_ROOT

    env = {
        "KDQ_PATHS__STORAGE_URI": "s3a://b/k",
        "KDQ_PATHS__S3_SINGLE_WRITER": "true",
        "KDQ_PATHS__DATA_DIR": str(tmp_path / "data"),
        "KDQ_SPARK__MASTER": REMOTE["master"],
    }
    assert load_config(path=PROJECT_ROOT / "kdq.toml", env=env).paths.s3_single_writer is True


def test_dynamodb_table_turns_on_kdqs_dynamodb_log_store(tmp_path) -> None:
    paths = {"storage_uri": "s3a://bucket/kdq", "dynamodb_table": "kdq_delta_log", "dynamodb_region": "eu-west-3"}
    conf = spark_conf(make_config(tmp_path / "data", paths=paths, spark=REMOTE), "x")
    assert conf[LOG_STORE] == "io.kdq.storage.DynamoDBLogStore"
    assert conf["spark.kdq.dynamodb.table"] == "kdq_delta_log" and conf["spark.kdq.dynamodb.region"] == "eu-west-3"
    assert "spark.kdq.dynamodb.endpoint" not in conf  # the AWS SDK's: AWS's endpoint of the region
    # A local DynamoDB (moto, DynamoDB Local); an empty region is us-east-1.
    local = {**paths, "dynamodb_endpoint": "http://127.0.0.1:8000/", "dynamodb_region": ""}
    conf = spark_conf(make_config(tmp_path / "data", paths=local, spark=REMOTE), "x")
    assert conf["spark.kdq.dynamodb.endpoint"] == "http://127.0.0.1:8000" and conf["spark.kdq.dynamodb.region"] == "us-east-1"
    # [spark.conf] wins over the settings kdq derives.
    conf = spark_conf(make_config(tmp_path / "data", paths=paths, spark={**REMOTE, "conf": {"spark.kdq.dynamodb.region": "x-y-1"}}), "x")
    assert conf["spark.kdq.dynamodb.region"] == "x-y-1"
    # Tables not on s3a://: the setting has nothing to coordinate.
    hdfs = make_config(tmp_path / "data", paths={"storage_uri": "hdfs://nn/kdq", "dynamodb_table": "t_x"}, spark=REMOTE)
    assert LOG_STORE not in spark_conf(hdfs, "x")


@pytest.mark.parametrize(
    ("paths", "expected"),
    [
        ({"dynamodb_table": "no spaces"}, r"paths.dynamodb_table .*expected a DynamoDB table name"),
        ({"dynamodb_table": "ab"}, r"paths.dynamodb_table .*expected a DynamoDB table name"),
        ({"dynamodb_region": "Mars"}, r"paths.dynamodb_region .*expected an AWS region name"),
        ({"dynamodb_endpoint": "127.0.0.1:8000"}, r"paths.dynamodb_endpoint .*expected http://host:port"),
        ({"dynamodb_endpoint": "http://host:8000/path"}, r"paths.dynamodb_endpoint .*expected http://host:port"),
        ({"s3_single_writer": "perhaps"}, r"paths.s3_single_writer .*valid boolean"),
    ],
)
def test_bad_dynamodb_settings_are_refused_at_start(tmp_path, paths, expected) -> None:
    with pytest.raises(ConfigError, match=expected):
        make_config(tmp_path / "data", paths={"storage_uri": "s3a://bucket/kdq", **paths})


def test_the_dynamodb_log_store_needs_its_jars_from_make_setup_s3(tmp_path) -> None:
    folder = tmp_path / "jars" / "hadoop-aws"
    folder.mkdir(parents=True)
    (folder / "hadoop-aws-3.5.0.jar").write_bytes(b"")
    paths = {"storage_uri": "s3a://bucket/kdq", "jars_dir": str(tmp_path / "jars"), "dynamodb_table": "kdq_delta_log"}
    with pytest.raises(ConfigError, match=r"needs kdq-dynamodb\*.jar, dynamodb-2.\*.jar in .*make setup-s3"):
        storage_jars(make_config(tmp_path / "data", paths=paths))
    # Without the log store (single writer acknowledged) S3A alone is enough.
    assert storage_jars(make_config(tmp_path / "data", paths={**paths, "dynamodb_table": "", "s3_single_writer": True}))
    for name in ("kdq-dynamodb.jar", "dynamodb-2.35.4.jar"):
        (folder / name).write_bytes(b"")
    assert len(storage_jars(make_config(tmp_path / "data", paths=paths))) == 3
