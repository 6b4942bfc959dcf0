"""Real services for integration tests: one local stack (Kafka KRaft + InfluxDB 1.x) per test session.

The stack runs on free loopback ports with all its data under a temporary
folder, and is stopped in ``finally`` so no broker or influxd outlives the run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kdq.config import Config
from kdq.stack.manager import LocalStack
from tests.conftest import make_config


@pytest.fixture(scope="session")
def stack_config(tmp_path_factory: pytest.TempPathFactory) -> Config:
    return make_config(tmp_path_factory.mktemp("stack"))


@pytest.fixture(scope="session")
def local_stack(stack_config: Config) -> Iterator[LocalStack]:
    stack = LocalStack(stack_config)
    try:
        statuses = stack.up()
        assert all(s.healthy for s in statuses), [s.line() for s in statuses]
        yield stack
    finally:
        stack.down()


@pytest.fixture
def topic_name() -> str:
    """A fresh topic per test, so tests never see each other's records."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def table_dir(tmp_path: Path) -> Path:
    return tmp_path / "tables"
