"""The stream's process marker (how `running()`, the supervisor and `kdq down` recognise the detached stream)
comes from the same settings as its spark-submit command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdq.spark.stream_process import stream_process
from kdq.spark.submit import submit_command
from tests.conftest import make_config

STORAGE = {
    "local": {},
    "hdfs": {"paths": {"storage_uri": "hdfs://namenode:8020/kdq"}},
    "abfss": {"paths": {"storage_uri": "abfss://data@account.dfs.core.windows.net/kdq/"}},
}


@pytest.mark.parametrize("where", sorted(STORAGE))
def test_the_marker_is_in_the_streams_command_line(tmp_path: Path, where: str) -> None:
    config = make_config(tmp_path / "data", spark={"master": "local[2]"}, **STORAGE[where])
    command = submit_command(config, "stream_counts", [], app_name="kdq-speed-layer")
    marker = stream_process(config).marker
    assert any(marker in part for part in command), (marker, command)


def test_the_marker_is_unique_per_data_folder(tmp_path: Path) -> None:
    one = make_config(tmp_path / "one", spark={"master": "local[2]"})
    two = make_config(tmp_path / "two", spark={"master": "local[2]"})
    assert stream_process(one).marker != stream_process(two).marker


def test_the_marker_without_a_submittable_config_is_the_same(tmp_path: Path) -> None:
    """`kdq status` answers even when no job could be submitted now (here: no jars): the same marker."""
    config = make_config(tmp_path / "data", spark={"master": "local[2]"}, **STORAGE["hdfs"])
    broken = config.model_copy(update={"paths": config.paths.model_copy(update={"jars_dir": tmp_path / "none"})})
    assert stream_process(broken).marker == stream_process(config).marker == (
        "spark.sql.warehouse.dir=hdfs://namenode:8020/kdq/warehouse"
    )


def test_status_shows_the_last_batchs_end_to_end_latency(tmp_path: Path) -> None:
    import time

    from kdq.spark.stream_process import describe_stream
    from kdq.stream import state as stream_state

    config = make_config(tmp_path)
    folder = stream_state.state_dir(config)
    folder.mkdir(parents=True, exist_ok=True)
    stream_state.atomic_write_json(folder / stream_state.HEARTBEAT, {"state": "running", "time_ms": int(time.time() * 1000)})
    progress = {"batch_id": 7, "input_rows": 5000, "duration_ms": {"triggerExecution": 800},
                "end_to_end_latency_ms": {"oldest": 2450, "newest": 610}}
    stream_state.atomic_write_json(folder / stream_state.PROGRESS, progress)
    lines = describe_stream(config)
    assert any("end-to-end latency" in line and "at batch 7: oldest record 2.5s, newest 0.6s" in line
               for line in lines), lines
    del progress["end_to_end_latency_ms"]  # a progress record of an older stream: no latency line
    stream_state.atomic_write_json(folder / stream_state.PROGRESS, progress)
    assert not any("end-to-end latency" in line for line in describe_stream(config))


def test_a_process_between_two_execs_is_still_the_managed_one() -> None:
    """spark-submit execs spark-class, which execs java: for a moment /proc/<pid>/cmdline reads empty (39 of
    79,700 samples of `spark-submit --version` here). The pid file named the process, so it is still ours; taken
    for gone, a benchmark reported a starting stream as exited and a supervisor could start a second driver."""
    from kdq.procs import is_marked

    assert is_marked([], "--conf=spark.sql.warehouse.dir=/x")
    assert is_marked(["java", "--conf", "spark.sql.warehouse.dir=/x"], "spark.sql.warehouse.dir=/x")
    assert not is_marked(["python", "other.py"], "spark.sql.warehouse.dir=/x")
