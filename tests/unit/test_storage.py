"""Where tables and checkpoints live (kdq.storage): locations as strings, local or a URI, never via pathlib
for a URI; the checkpoint readers on either; bad settings refused at start. No Spark, no JVM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kdq import batch_failures, storage
from kdq.checkpoint_offsets import batch_offset_ranges, passed_offsets, speed_layer_checkpoint
from kdq.config import ConfigError
from kdq.spark.session import spark_conf, storage_jars
from kdq.spark.tables import table_path
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
    assert batch_failures.checkpoint_of(config) == "s3a://bucket/kdq/checkpoints/speed_layer"
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
        assert batch_failures.pending_batch("s3a://b/cp") is None  # a supervisor without Spark: unknown
        assert batch_failures.offset_ranges("s3a://b/cp", 1) == []
        storage.use_remote_files(remote)
        for checkpoint in (str(local), "s3a://b/cp"):
            assert batch_failures.pending_batch(checkpoint) == 1
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
