"""The maintenance plan's Delta log reader (kdq.delta_log, delta-rs) reads tables on s3a:// storage through a
real S3 server (moto's, on loopback), with the ``fs.s3a`` settings of ``[spark.conf]`` that Spark uses.

Tables written by Spark and Delta locally (two hours of MERGEs, some compacted by Delta's auto compaction) are
copied object by object into the bucket; read from there, each table's state is what it is read from the local
disk, and the plan made from S3 is the plan made from the local copy.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from kdq import delta_log
from kdq.procs import free_port
from kdq.spark.maintenance import plan_from_log
from kdq.spark.tables import ensure_tables
from kdq.spark.writers import merge_window_increments
from kdq.stack.moto import LocalS3
from kdq.tables import ALL_TABLES, WINDOW_COUNTS
from tests.conftest import make_config

pytestmark = pytest.mark.integration

DAY = dt.date(2026, 11, 24)
DAY_MS = int(dt.datetime.combine(DAY, dt.time(), tzinfo=dt.UTC).timestamp() * 1000)


@pytest.fixture
def local_s3(tmp_path: Path) -> Iterator[LocalS3]:
    server = LocalS3(free_port(), tmp_path / "moto.log", bucket="kdq-delta-log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_the_plan_reads_the_same_log_from_s3_as_from_the_local_disk(spark, tmp_path: Path, local_s3: LocalS3) -> None:
    local = make_config(tmp_path / "local", spark={"master": "local[2]", "shuffle_partitions": 2})
    ensure_tables(spark, local)
    for version in range(1, 5):
        rows = [{"topic": "orders", "window_start_ms": DAY_MS + hour * 3_600_000 + version * 1000, "status": "valid",
                 "count": 1, "rules_version": "r1"} for hour in (0, 1)]
        merge_window_increments(spark, rows, local, "test-delta-log", version)

    s3 = local_s3._client("s3")
    root = tmp_path / "local" / "delta"
    for path in root.rglob("*"):
        if path.is_file():
            s3.upload_file(str(path), local_s3.bucket, f"kdq/delta/{path.relative_to(root).as_posix()}")
    settings = local_s3.settings()
    remote = make_config(tmp_path / "remote", paths=settings["paths"], spark={"conf": settings["spark_conf"]})
    assert delta_log.storage_options(remote)["AWS_ENDPOINT_URL"] == local_s3.endpoint

    for spec in ALL_TABLES:
        assert delta_log.table_state(remote, spec) == delta_log.table_state(local, spec), spec.name
    assert delta_log.table_state(remote, WINDOW_COUNTS).compactable == {"2026-11-24-00", "2026-11-24-01"}
    later = DAY_MS + 2 * 86_400_000
    today = DAY + dt.timedelta(days=2)
    remote_plan = plan_from_log(remote, 30, 168, today, later)
    assert remote_plan == plan_from_log(local, 30, 168, today, later)
    assert [s.describe() for s in remote_plan if not s.skipped] == [
        "OPTIMIZE window_counts WHERE (window_date = DATE'2026-11-24' AND window_hour IN (0, 1))"]
