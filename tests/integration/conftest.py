"""Real services for integration tests: one local stack (Kafka KRaft + InfluxDB 1.x) per test session.

The stack runs on free loopback ports with all its data under a temporary
folder, and is stopped in ``finally`` so no broker or influxd outlives the run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kdq.config import Config
from kdq.stack.airflow import LocalAirflow
from kdq.stack.manager import LocalStack
from kdq.stack.registry import LocalRegistry
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


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    """The local stack's Schema Registry (Apicurio, storage on disk in its own data folder) for the session, on a
    port that stays its own across a restart (quiet_port); clients use ``schema_registry.url`` (the
    Confluent-compatible API). A test may stop and start it again: the same port and schemas come back."""
    from kdq.procs import quiet_port

    registry = LocalRegistry(make_config(tmp_path_factory.mktemp("registry")), quiet_port())
    try:
        registry.start(timeout=180)
        yield registry
    finally:
        registry.stop()


@pytest.fixture
def topic_name() -> str:
    """A fresh topic per test, so tests never see each other's records."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def table_dir(tmp_path: Path) -> Path:
    return tmp_path / "tables"


@dataclass(frozen=True)
class AirflowSetup:
    """A local Airflow (its own home and SQLite database) whose DAGs drive an isolated kdq config."""

    config: Config
    airflow: LocalAirflow
    prefix: str  # the stream of this config sees only topics starting with it
    start: datetime  # the DAGs' start date (the hour the session's Airflow was set up in)


@pytest.fixture(scope="session")
def airflow_local(local_stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowSetup]:
    """One Airflow home and metadata database for every Airflow test, against the session's stack.

    Only the database is created here (what `airflow dags test` needs); :func:`airflow_services` starts the
    scheduler, DAG processor, API server and triggerer. DAGs start paused, and their start date is the
    current hour: an unpaused hourly DAG has no scheduled run before the next hour, while test runs for
    later logical dates still get their tasks (Airflow creates none for a manual run before the start date;
    backfills are exempt). The stream a supervisor DAG starts and Airflow itself are stopped (process
    groups) at the end.
    """
    from kdq.procs import free_port
    from kdq.stack.airflow import START_DATE_ENV, LocalAirflow, floor_hour
    from tests.integration.helpers import isolated_config, write_config_file

    data_dir = tmp_path_factory.mktemp("airflow")
    prefix = f"af{uuid.uuid4().hex[:6]}"
    # Spark jobs and the stream in C1-only JIT: they start faster, and test batches are small.
    config = isolated_config(
        local_stack, data_dir, prefix,
        spark={"conf": {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}},
    )
    config = write_config_file(config, data_dir / "kdq.toml")
    start = floor_hour(datetime.now(UTC))
    setup = AirflowSetup(config, LocalAirflow(config, free_port(), paused=True,
                                              extra_env={START_DATE_ENV: start.isoformat()}), prefix, start)
    try:
        setup.airflow.migrate()
        _AIRFLOW_IN_USE.append(setup)
        yield setup
    finally:
        _stop_airflow(setup)


_AIRFLOW_FIXTURES = {"airflow_local", "airflow_services"}
_AIRFLOW_IN_USE: list[AirflowSetup] = []


def _stop_airflow(setup: AirflowSetup) -> None:
    """Airflow and the stream its supervisor DAG started (process groups); stopping twice is harmless."""
    from kdq.spark.stream_process import stop_stream

    setup.airflow.stop(timeout=60)
    stop_stream(setup.config, timeout=60)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Airflow stops after the last test that uses it, not at the session's end: its scheduler, DAG processor,
    API server and triggerer take a fifth of a core while idle, which the rest of the suite (the unit tests
    included) would otherwise pay for. After the test's own teardown, which may still call Airflow's API."""
    yield
    if not _AIRFLOW_IN_USE or not _AIRFLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
        return
    later = item.session.items[item.session.items.index(item) + 1:]
    if not any(_AIRFLOW_FIXTURES & set(getattr(other, "fixturenames", ())) for other in later):
        _stop_airflow(_AIRFLOW_IN_USE.pop())


@pytest.fixture(scope="session")
def airflow_services(airflow_local: AirflowSetup) -> AirflowSetup:
    """Airflow standalone (scheduler, DAG processor, API server, triggerer) on the shared home, until the
    session ends (airflow_local stops it); healthy and with every kdq DAG parsed."""
    airflow_local.airflow.start(timeout=300)
    airflow_local.airflow.wait_for_dags(timeout=180)
    return airflow_local
