"""Shared fixtures: one local SparkSession per test session, config pointed at tmp dirs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kdq.config import Config, load_config

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def make_config(data_dir: Path, **sections: dict) -> Config:
    """A Config that keeps every file of a test under ``data_dir`` and reads no kdq.toml/env."""
    overrides: dict[str, dict] = {
        "paths": {"data_dir": str(data_dir), "jars_dir": str(PROJECT_ROOT / ".cache" / "jars")},
    }
    for name, values in sections.items():
        overrides.setdefault(name, {}).update(values)
    return load_config(path=PROJECT_ROOT / "kdq.toml", env={}, overrides=overrides)


@pytest.fixture(scope="session")
def spark_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spark")


@pytest.fixture(scope="session")
def spark_config(spark_data_dir: Path) -> Config:
    return make_config(spark_data_dir, spark={"master": "local[2]", "shuffle_partitions": 2})


@pytest.fixture(scope="session")
def spark(spark_config: Config) -> Iterator:
    """One local SparkSession (Delta + Kafka connector) shared by all tests; UI off."""
    from kdq.spark.session import build_session

    session = build_session(spark_config, app_name="kdq-tests")
    try:
        yield session
    finally:
        session.stop()
