"""The cluster deployment (docker-compose.yml) is valid and wired to kdq's contracts.

There is no Docker engine in CI: the file is validated and its resolved form
(`docker-compose config`, which applies anchors, defaults and interpolation the
way `docker compose up` would) is checked, never started.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kdq.config import load_config

PROJECT_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = PROJECT_ROOT / "docker-compose.yml"

REQUIRED_SERVICES = {
    "kafka",
    "spark-master",
    "spark-worker",
    "postgres",
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "influxdb",
    "grafana",
}
AIRFLOW_SERVICES = (
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
)
DATA_DIR = "/opt/kdq/data"
# The variables compose interpolates; unset so the test sees the file's own defaults.
COMPOSE_VARIABLES = (
    "KDQ_INFLUXDB_TOKEN",
    "KDQ_INFLUXDB_PASSWORD",
    "AIRFLOW_UID",
    "AIRFLOW_JWT_SECRET",
    "GRAFANA_ADMIN_PASSWORD",
    "SPARK_IMAGE",
    "_AIRFLOW_WWW_USER_USERNAME",
    "_AIRFLOW_WWW_USER_PASSWORD",
)


def _docker_compose() -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail(
            "docker-compose is not on PATH: `make setup` installs Debian's docker-compose "
            "(apt-get install docker-compose), which validates docker-compose.yml without a Docker engine"
        )
    return exe


def _run_compose(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in COMPOSE_VARIABLES and not k.startswith("COMPOSE_")}
    return subprocess.run(
        [_docker_compose(), "-f", str(COMPOSE_FILE), *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The resolved compose model, as `docker compose up` would see it."""
    check = _run_compose("config", "-q")
    assert check.returncode == 0, f"docker-compose config -q failed ({check.returncode}):\n{check.stderr}"
    resolved = _run_compose("config")
    assert resolved.returncode == 0, f"docker-compose config failed ({resolved.returncode}):\n{resolved.stderr}"
    model = yaml.safe_load(resolved.stdout)
    assert isinstance(model, dict) and "services" in model, resolved.stdout
    return model


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def _volume_targets(service: dict[str, Any]) -> dict[str, str]:
    """container path -> source (volume name or absolute host path)."""
    targets = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            targets[volume["target"]] = str(volume.get("source", ""))
        else:
            source, target, *_ = volume.split(":")
            targets[target] = source
    return targets


def _depends_on(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def _published_ports(service: dict[str, Any]) -> dict[int, int]:
    """container port -> host port."""
    ports = {}
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            ports[int(port["target"])] = int(port["published"])
        else:
            host, _, container = str(port).rpartition(":")
            ports[int(container.split("/")[0])] = int(host.rsplit(":", 1)[-1] or container.split("/")[0])
    return ports


def test_required_services_exist(compose: dict[str, Any]) -> None:
    missing = REQUIRED_SERVICES - set(compose["services"])
    assert not missing, f"docker-compose.yml lacks services: {sorted(missing)}"


def test_named_volumes_exist_and_are_used(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    expected = {
        "kafka": "/var/lib/kafka/data",
        "postgres": "/var/lib/postgresql/data",
        "influxdb": "/var/lib/influxdb2",
        "spark-worker": DATA_DIR,
        "airflow-scheduler": DATA_DIR,
    }
    for name, target in expected.items():
        source = _volume_targets(compose["services"][name]).get(target)
        assert source, f"{name}: nothing mounted at {target}"
        assert source in declared, f"{name}: {target} is mounted from {source!r}, not a declared named volume"
    assert "kdq-data" in declared


def test_kafka_is_single_node_kraft(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert not [name for name in services if "zookeeper" in name], "KRaft needs no ZooKeeper service"
    kafka = services["kafka"]
    assert kafka["image"] == "apache/kafka:4.1.1"
    env = _env(kafka)
    assert not any("ZOOKEEPER" in key for key in env), env
    roles = set(env.get("KAFKA_PROCESS_ROLES", "").split(","))
    assert {"broker", "controller"} <= roles, f"KAFKA_PROCESS_ROLES={env.get('KAFKA_PROCESS_ROLES')!r}"
    node_id = env["KAFKA_NODE_ID"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{node_id}@kafka:9093"
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    # kafka.max_message_bytes: values up to 8 MiB are counted (as too_large when over
    # stream.max_value_bytes), not rejected by the broker.
    assert int(env["KAFKA_MESSAGE_MAX_BYTES"]) == 8388608
    assert (
        int(env["KAFKA_MESSAGE_MAX_BYTES"])
        >= load_config(path=PROJECT_ROOT / "kdq.toml", env={}).kafka.max_message_bytes
    )
    assert "healthcheck" in kafka and "9092" in " ".join(kafka["healthcheck"]["test"])


def test_spark_standalone_master_and_worker(compose: dict[str, Any]) -> None:
    master, worker = compose["services"]["spark-master"], compose["services"]["spark-worker"]
    airflow_image = compose["services"]["airflow-scheduler"]["image"]
    for service in (master, worker):
        # Same image as the driver (Airflow): one Spark (pyspark 4.2.0) and one Python version.
        assert service["image"] == airflow_image, service["image"]
    assert "org.apache.spark.deploy.master.Master" in master["command"]
    assert _published_ports(master) == {7077: 7077, 8080: 8080}
    assert "org.apache.spark.deploy.worker.Worker" in worker["command"]
    assert "spark://spark-master:7077" in worker["command"]
    assert _depends_on(worker).get("spark-master") == "service_healthy"
    # Driver (in Airflow) and executors (on the worker) write the same tables:
    # same volume and same uid, or one side cannot write what the other created.
    assert _volume_targets(worker)[DATA_DIR] == _volume_targets(compose["services"]["airflow-scheduler"])[DATA_DIR]
    assert worker["user"] == compose["services"]["airflow-scheduler"]["user"]


def test_airflow_services_share_image_and_metadata_db(compose: dict[str, Any]) -> None:
    services = compose["services"]
    urls = set()
    for name in AIRFLOW_SERVICES:
        service = services[name]
        assert service["image"] == "kdq-airflow:latest", f"{name}: {service['image']}"
        assert Path(service["build"]["context"]).resolve() == PROJECT_ROOT, f"{name}: {service['build']}"
        env = _env(service)
        assert env.get("AIRFLOW__CORE__EXECUTOR") == "LocalExecutor", name
        assert env.get("AIRFLOW__CORE__LOAD_EXAMPLES") == "false", name
        urls.add(env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"))
        assert env.get("AIRFLOW_CONN_SPARK_DEFAULT") == "spark://spark-master:7077?deploy-mode=client", name
        if name != "airflow-init":
            assert _depends_on(service).get("airflow-init") == "service_completed_successfully", name
            assert _depends_on(service).get("postgres") == "service_healthy", name
            assert "healthcheck" in service, name
    assert len(urls) == 1, f"Airflow services disagree on the metadata DB: {urls}"
    url = urls.pop()
    assert url == "postgresql+psycopg2://airflow:airflow@postgres/airflow"
    pg = _env(services["postgres"])
    assert (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"]) == ("airflow", "airflow", "airflow")
    assert services["postgres"]["image"] == "postgres:16"
    # The API server on host 8081: host 8080 is the Spark master UI.
    assert services["airflow-apiserver"]["command"] in ("api-server", ["api-server"])
    assert _published_ports(services["airflow-apiserver"]) == {8080: 8081}
    # LocalExecutor runs the Spark drivers in the scheduler: the pipeline's services must be up.
    deps = _depends_on(services["airflow-scheduler"])
    assert {deps.get(s) for s in ("kafka", "spark-master", "influxdb")} == {"service_healthy"}, deps


def test_airflow_mounts_project(compose: dict[str, Any]) -> None:
    mounts = _volume_targets(compose["services"]["airflow-scheduler"])
    for folder in ("dags", "plugins", "include", "spark_jobs", "config"):
        assert Path(mounts.get(f"/opt/airflow/{folder}", "")).resolve() == PROJECT_ROOT / folder, (folder, mounts)
    assert Path(mounts["/opt/airflow/kdq.toml"]).resolve() == PROJECT_ROOT / "kdq.toml"
    assert mounts[DATA_DIR] == "kdq-data"


def test_kdq_settings_point_at_the_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    envs = [_env(services[name]) for name in AIRFLOW_SERVICES]
    kdq_envs = [{k: v for k, v in env.items() if k.startswith("KDQ_")} for env in envs]
    assert all(e == kdq_envs[0] for e in kdq_envs), "Airflow services disagree on KDQ_* settings"
    env = kdq_envs[0]
    assert env["KDQ_KAFKA__BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert env["KDQ_SPARK__MASTER"] == "spark://spark-master:7077"
    assert env["KDQ_INFLUXDB__VERSION"] == "2"
    assert env["KDQ_INFLUXDB__URL"] == "http://influxdb:8086"
    assert env["KDQ_PATHS__DATA_DIR"] == DATA_DIR
    assert env["KDQ_CONFIG"] == "/opt/airflow/kdq.toml" and "/opt/airflow/kdq.toml" in _volume_targets(
        services["airflow-scheduler"]
    )

    # Every host:port a setting names is a service of this file listening on that port.
    kafka_env = _env(services["kafka"])
    master_cmd = services["spark-master"]["command"]
    listening = {
        "kafka": {int(listener.rsplit(":", 1)[1]) for listener in kafka_env["KAFKA_LISTENERS"].split(",")},
        "spark-master": {int(master_cmd[master_cmd.index("--port") + 1])},
        "influxdb": set(_published_ports(services["influxdb"])),
    }
    addresses = [
        env["KDQ_KAFKA__BOOTSTRAP_SERVERS"].split(":"),
        re.match(r"spark://([^:]+):(\d+)$", env["KDQ_SPARK__MASTER"]).groups(),
        re.match(r"https?://([^:]+):(\d+)$", env["KDQ_INFLUXDB__URL"]).groups(),
    ]
    for host, port in addresses:
        assert host in services, f"{host} is not a service"
        assert int(port) in listening[host], f"{host} does not listen on {port}: {listening[host]}"
    # The InfluxDB set-up, kdq and Grafana agree on org, bucket and token.
    influx = _env(services["influxdb"])
    assert services["influxdb"]["image"].startswith("influxdb:2.")
    assert influx["DOCKER_INFLUXDB_INIT_MODE"] == "setup"
    assert influx["DOCKER_INFLUXDB_INIT_ORG"] == env["KDQ_INFLUXDB__ORG"] == "kdq"
    assert influx["DOCKER_INFLUXDB_INIT_BUCKET"] == env["KDQ_INFLUXDB__BUCKET"] == "kdq"
    token = influx["DOCKER_INFLUXDB_INIT_ADMIN_TOKEN"]
    assert token and token == env["KDQ_INFLUXDB__TOKEN"] == _env(services["grafana"])["KDQ_INFLUXDB_TOKEN"]


def test_compose_kdq_settings_are_a_valid_kdq_config(compose: dict[str, Any]) -> None:
    """The containers' KDQ_* variables load through kdq's own loader (a typo'd key or bad value fails here, not at 3 am)."""
    env = {k: v for k, v in _env(compose["services"]["airflow-scheduler"]).items() if k.startswith("KDQ_")}
    env.pop("KDQ_CONFIG")  # the container path of the same kdq.toml loaded here
    config = load_config(path=PROJECT_ROOT / "kdq.toml", env=env)
    assert config.kafka_bootstrap() == "kafka:9092"
    assert config.spark.master == "spark://spark-master:7077"
    assert config.influxdb.version == 2
    assert config.influx_url() == "http://influxdb:8086"
    assert (config.influxdb.org, config.influxdb.bucket) == ("kdq", "kdq")
    assert config.data_dir == Path(DATA_DIR)


def test_grafana_mounts_provisioning(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    assert re.fullmatch(r"grafana/grafana:11\.[\d.]+", grafana["image"]), grafana["image"]
    mounts = _volume_targets(grafana)
    assert Path(mounts["/etc/grafana/provisioning"]).resolve() == PROJECT_ROOT / "deploy/grafana/provisioning"
    assert _depends_on(grafana).get("influxdb") == "service_healthy"


def test_every_service_with_dependents_has_a_healthcheck(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for dep, condition in _depends_on(service).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            if condition == "service_healthy":
                assert "healthcheck" in services[dep], (
                    f"{name} waits for {dep} to be healthy, but it has no healthcheck"
                )


def test_dockerfile_builds_the_airflow_image() -> None:
    text = (PROJECT_ROOT / "Dockerfile").read_text()
    base = re.search(r"^FROM\s+apache/airflow:(\S+)-python(\S+)", text, re.MULTILINE)
    assert base, "Dockerfile must build FROM apache/airflow:<version>-python<version>"
    assert base.group(1) == importlib.metadata.version("apache-airflow"), (
        "the image's Airflow differs from the one the tests run against"
    )
    assert "openjdk-17-jre-headless" in text, "the Spark driver needs a JRE"
    assert re.search(r"pip install .*-r \S*requirements\.txt", text)
    assert re.search(r"pip install .*--no-deps -e", text), "the kdq package must be installed"
    ignored = (PROJECT_ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".cache", ".local", ".git"} <= set(ignored)
