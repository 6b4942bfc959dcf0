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
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from kdq.config import Config, load_config

PROJECT_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = PROJECT_ROOT / "docker-compose.yml"

KAFKA_NODES = ("kafka-1", "kafka-2", "kafka-3")
SPARK_WORKERS = ("spark-worker-1", "spark-worker-2")
REQUIRED_SERVICES = {
    *KAFKA_NODES,
    "spark-master",
    *SPARK_WORKERS,
    "postgres",
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "influxdb",
    "grafana",
    "sql-endpoint",
    "registry-db-init",
    "schema-registry",
}
AIRFLOW_SERVICES = (
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
)
DATA_DIR = "/opt/kdq/data"
# Secrets: no defaults, each one required (`${VAR:?message}`). The values here are test values.
SECRETS = {
    "_AIRFLOW_WWW_USER_PASSWORD": "test-airflow-admin",
    "AIRFLOW_JWT_SECRET": "test-jwt",
    "AIRFLOW_API_SECRET_KEY": "test-api-key",
    "AIRFLOW_FERNET_KEY": "dGVzdC1mZXJuZXQta2V5LXRlc3QtZmVybmV0LWtleTA=",
    "KDQ_POSTGRES_PASSWORD": "test-postgres",
    "KDQ_KAFKA_PASSWORD": "test-kafka-kdq",
    "KDQ_KAFKA_ADMIN_PASSWORD": "test-kafka-admin",
    "KDQ_KAFKA_CONTROLLER_PASSWORD": "test-kafka-controller",
    "KDQ_SPARK_AUTH_SECRET": "test-spark-secret",
    "KDQ_INFLUXDB_PASSWORD": "test-influx-password",
    "KDQ_INFLUXDB_TOKEN": "test-influx-token",
    "GRAFANA_ADMIN_PASSWORD": "test-grafana-admin",
    "GRAFANA_SECRET_KEY": "test-grafana-key",
    "KDQ_SQL_PASSWORD": "test-sql-password",
    "KDQ_SQL_TLS_KEYSTORE_PASSWORD": "test-sql-keystore",
    "KDQ_REGISTRY_DB_PASSWORD": "test-registry-db",
}
# Optional variables (harmless defaults in the file).
OPTIONAL_VARIABLES = (
    "KDQ_BIND_ADDRESS",
    "KDQ_KAFKA_EXTERNAL_HOST",
    "KDQ_KAFKA_USERNAME",
    "KDQ_KAFKA_ADMIN_USERNAME",
    "AIRFLOW_UID",
    "SPARK_IMAGE",
    "KDQ_AIRFLOW_START_DATE",
    "_AIRFLOW_WWW_USER_USERNAME",
    "KDQ_STORAGE_URI",
    "KDQ_S3_ENDPOINT",
    "KDQ_S3_REGION",
    "KDQ_S3_PATH_STYLE_ACCESS",
    "KDQ_DYNAMODB_TABLE",
    "KDQ_DYNAMODB_REGION",
    "KDQ_DYNAMODB_ENDPOINT",
    "KDQ_REGISTRY_BIND_ADDRESS",
)
# Passed through to the containers when set (S3A's default credential chain reads them), never interpolated.
AWS_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
# kdq settings that carry a secret, in the environment of the container running kdq's jobs only (the scheduler).
JOB_SETTINGS = ("KDQ_KAFKA__CLIENT", "KDQ_SPARK__CONF", "KDQ_INFLUXDB__TOKEN")
# The SQL endpoint's login, held by the API server only (the data-quality page queries through it).
PAGE_SETTINGS = ("KDQ_SQL_PASSWORD",)
AIRFLOW_CORE_SECRETS = {"AIRFLOW_API_SECRET_KEY", "AIRFLOW_FERNET_KEY", "AIRFLOW_JWT_SECRET", "KDQ_POSTGRES_PASSWORD"}
# The secrets each service may receive, and nothing more. Airflow's components hold Airflow's own; the
# scheduler also the ones kdq's jobs use (Kafka, the Spark cluster, InfluxDB, S3); the SQL endpoint only its login
# and the storage credentials it reads the tables with.
ALLOWED_SECRETS = {
    **{node: {"KDQ_KAFKA_ADMIN_PASSWORD", "KDQ_KAFKA_CONTROLLER_PASSWORD", "KDQ_KAFKA_PASSWORD"} for node in KAFKA_NODES},
    "spark-master": {"KDQ_SPARK_AUTH_SECRET"},
    **{worker: {"KDQ_SPARK_AUTH_SECRET", *AWS_CREDENTIALS} for worker in SPARK_WORKERS},
    "postgres": {"KDQ_POSTGRES_PASSWORD"},
    "airflow-init": AIRFLOW_CORE_SECRETS | {"_AIRFLOW_WWW_USER_PASSWORD"},
    # The data-quality page logs in to the SQL endpoint's Spark Connect.
    "airflow-apiserver": AIRFLOW_CORE_SECRETS | {"KDQ_SQL_PASSWORD"},
    "airflow-dag-processor": AIRFLOW_CORE_SECRETS,
    "airflow-triggerer": AIRFLOW_CORE_SECRETS,
    "airflow-scheduler": AIRFLOW_CORE_SECRETS | {"KDQ_KAFKA_PASSWORD", "KDQ_SPARK_AUTH_SECRET", "KDQ_INFLUXDB_TOKEN", *AWS_CREDENTIALS},
    "influxdb": {"KDQ_INFLUXDB_PASSWORD", "KDQ_INFLUXDB_TOKEN"},
    "grafana": {"GRAFANA_ADMIN_PASSWORD", "GRAFANA_SECRET_KEY", "KDQ_INFLUXDB_TOKEN"},
    "sql-endpoint": {"KDQ_SQL_PASSWORD", "KDQ_SQL_TLS_KEYSTORE_PASSWORD", *AWS_CREDENTIALS},
    # Creates the registry's database and user as Airflow's database owner; the registry holds its own login only.
    "registry-db-init": {"KDQ_POSTGRES_PASSWORD", "KDQ_REGISTRY_DB_PASSWORD"},
    "schema-registry": {"KDQ_REGISTRY_DB_PASSWORD"},
}
# Unset in the test's process environment, so only the env file below counts.
COMPOSE_VARIABLES = (*SECRETS, *OPTIONAL_VARIABLES, *AWS_CREDENTIALS)


def _docker_compose() -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail(
            "docker-compose is not on PATH: `make setup` installs Debian's docker-compose "
            "(apt-get install docker-compose), which validates docker-compose.yml without a Docker engine"
        )
    return exe


def _run_compose(*args: str, variables: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """docker-compose with exactly ``variables`` (default: every secret) and nothing from the caller's
    shell or a developer's own .env (--env-file replaces it)."""
    env = {k: v for k, v in os.environ.items() if k not in COMPOSE_VARIABLES and not k.startswith("COMPOSE_")}
    with tempfile.TemporaryDirectory() as folder:
        env_file = Path(folder) / "compose.env"
        values = SECRETS if variables is None else variables
        env_file.write_text("".join(f"{name}={value}\n" for name, value in values.items()))
        return subprocess.run(
            [_docker_compose(), "-f", str(COMPOSE_FILE), "--env-file", str(env_file), *args],
            cwd=PROJECT_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The resolved compose model, as `docker compose up` would see it with every secret set."""
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


def _port_bindings(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(host address, host port, container port) of every published port; "" = every interface."""
    bindings = []
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            bindings.append((str(port.get("host_ip", "")), int(port["published"]), int(port["target"])))
        else:
            parts = str(port).split("/")[0].split(":")
            host_ip = parts[0] if len(parts) == 3 else ""
            bindings.append((host_ip, int(parts[-2]) if len(parts) > 1 else int(parts[-1]), int(parts[-1])))
    return bindings


def _command(service: dict[str, Any]) -> str:
    command = service.get("command") or []
    return command if isinstance(command, str) else " ".join(command)


def test_required_services_exist(compose: dict[str, Any]) -> None:
    missing = REQUIRED_SERVICES - set(compose["services"])
    assert not missing, f"docker-compose.yml lacks services: {sorted(missing)}"


def test_named_volumes_exist_and_are_used(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    expected = {
        **dict.fromkeys(KAFKA_NODES, "/var/lib/kafka/data"),
        "postgres": "/var/lib/postgresql/data",
        "influxdb": "/var/lib/influxdb2",
        **dict.fromkeys(SPARK_WORKERS, DATA_DIR),
        "airflow-scheduler": DATA_DIR,
    }
    for name, target in expected.items():
        source = _volume_targets(compose["services"][name]).get(target)
        assert source, f"{name}: nothing mounted at {target}"
        assert source in declared, f"{name}: {target} is mounted from {source!r}, not a declared named volume"
    assert "kdq-data" in declared
    # Each Kafka node its own log directory.
    logs = {_volume_targets(compose["services"][name])["/var/lib/kafka/data"] for name in KAFKA_NODES}
    assert len(logs) == len(KAFKA_NODES), logs


def test_kafka_is_a_three_node_kraft_quorum(compose: dict[str, Any]) -> None:
    """The tested cluster shape (docs/cluster.md): three nodes, each broker and controller of one quorum."""
    services = compose["services"]
    assert not [name for name in services if "zookeeper" in name], "KRaft needs no ZooKeeper service"
    assert not [name for name in services if name.startswith("kafka") and name not in KAFKA_NODES], "only the three nodes"
    voters = f"1@{KAFKA_NODES[0]}:9093,2@{KAFKA_NODES[1]}:9093,3@{KAFKA_NODES[2]}:9093"
    cluster_ids, external_ports = set(), set()
    for number, name in enumerate(KAFKA_NODES, start=1):
        kafka = services[name]
        assert kafka["image"] == "apache/kafka:4.1.1"
        env = _env(kafka)
        assert not any("ZOOKEEPER" in key for key in env), env
        roles = set(env.get("KAFKA_PROCESS_ROLES", "").split(","))
        assert {"broker", "controller"} <= roles, f"KAFKA_PROCESS_ROLES={env.get('KAFKA_PROCESS_ROLES')!r}"
        assert env["KAFKA_NODE_ID"] == str(number)
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == voters
        cluster_ids.add(env["CLUSTER_ID"])
        assert f"INTERNAL://{name}:9092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
        # Host clients reach each node on its own published port, the one it advertises.
        external = next(a for a in env["KAFKA_ADVERTISED_LISTENERS"].split(",") if a.startswith("EXTERNAL://"))
        port = int(external.rsplit(":", 1)[1])
        assert f"EXTERNAL://:{port}" in env["KAFKA_LISTENERS"].split(",")
        assert _published_ports(kafka) == {port: port}
        external_ports.add(port)
        # kafka.max_message_bytes: values up to 8 MiB are counted (as too_large when over
        # stream.max_value_bytes), not rejected by the broker.
        assert int(env["KAFKA_MESSAGE_MAX_BYTES"]) == 8388608
        assert (
            int(env["KAFKA_MESSAGE_MAX_BYTES"])
            >= load_config(path=PROJECT_ROOT / "kdq.toml", env={}).kafka.max_message_bytes
        )
        health = " ".join(kafka["healthcheck"]["test"])
        # The health check authenticates like any client (start.sh writes its settings).
        assert "9092" in health and "--command-config /tmp/kdq-admin.properties" in health
    assert len(cluster_ids) == 1, "one cluster"
    assert external_ports == {9094, 9095, 9096}


def _broker_properties(env: dict[str, str]) -> dict[str, str]:
    """The apache/kafka image's (and deploy/kafka/start.sh's) rule: KAFKA_X_Y -> x.y, ___ -> -, __ -> _."""
    excluded = {"KAFKA_HEAP_OPTS", "KAFKA_OPTS", "KAFKA_VERSION", "KAFKA_LOG4J_OPTS", "KAFKA_JMX_OPTS"}
    props = {}
    for name, value in env.items():
        if not name.startswith("KAFKA_") or name in excluded:
            continue
        key = name[len("KAFKA_"):].lower().replace("_", ".").replace("...", "-").replace("..", "_")
        props[key] = value
    return props


def test_kafka_topic_settings_are_the_tested_shapes(compose: dict[str, Any]) -> None:
    """The broker settings `kdq up --cluster` writes (kdq.stack.kafka.LocalKafka with three nodes): RF 3 and
    min.insync.replicas 2 for every topic and the internal ones; the same message size, timestamp and
    leadership settings; the same heap. Retention is the one documented difference (docs/cluster.md)."""
    import kdq.stack.kafka as local_kafka
    from tests.conftest import make_config

    with tempfile.TemporaryDirectory() as folder:
        config = make_config(Path(folder))
        stack = local_kafka.LocalKafka(config, 1, 2, [(3, 4), (5, 6)])
        stack._write_config(stack.nodes[0])
        tested = dict(
            line.split("=", 1) for line in stack.nodes[0].properties.read_text().splitlines() if "=" in line
        )
    assert tested["default.replication.factor"] == "3" and tested["min.insync.replicas"] == "2"
    # Deliberately different (docs/cluster.md, "Compose deployment vs the tested shape"): listeners and
    # addresses, where logs go, time retention (the local stack replays old event times).
    different = {
        "process.roles", "node.id", "controller.quorum.voters", "listeners", "advertised.listeners",
        "controller.listener.names", "inter.broker.listener.name", "listener.security.protocol.map", "log.dirs",
        "log.retention.ms", "auto.create.topics.enable",
    }
    for name in KAFKA_NODES:
        props = _broker_properties(_env(compose["services"][name]))
        for key, value in tested.items():
            if key in different:
                continue
            assert props.get(key) == value, f"{name}: {key} = {props.get(key)!r}, the tested shape has {value!r}"
        assert "log.retention.ms" not in props, "compose keeps Kafka's time retention (documented difference)"
        # auto.create.topics.enable: Kafka's default (true) in both.
        assert props.get("auto.create.topics.enable", "true") == tested["auto.create.topics.enable"]
        heap = _env(compose["services"][name])["KAFKA_HEAP_OPTS"]
        assert "-Xmx512m" in heap.split()


def test_spark_standalone_master_and_workers(compose: dict[str, Any]) -> None:
    master = compose["services"]["spark-master"]
    workers = [compose["services"][name] for name in SPARK_WORKERS]
    assert not [n for n in compose["services"] if n.startswith("spark-worker") and n not in SPARK_WORKERS]
    airflow_image = compose["services"]["airflow-scheduler"]["image"]
    for service in (master, *workers):
        # Same image as the driver (Airflow): one Spark (pyspark 4.2.0) and one Python version.
        assert service["image"] == airflow_image, service["image"]
        # Through bash: the Airflow image's entrypoint would run `airflow spark-class ...` otherwise.
        assert service["command"][0] == "bash", service["command"]
    assert "spark-class org.apache.spark.deploy.master.Master" in _command(master)
    # The UI only: drivers reach the master's RPC port on the compose network.
    assert _published_ports(master) == {8080: 8080}
    for worker in workers:
        assert "spark-class org.apache.spark.deploy.worker.Worker" in _command(worker)
        assert "spark://spark-master:7077" in _command(worker)
        assert not _published_ports(worker)
        assert _depends_on(worker).get("spark-master") == "service_healthy"
        # Driver (in Airflow) and executors (on the workers) write the same tables:
        # same volume and same uid, or one side cannot write what the other created.
        assert _volume_targets(worker)[DATA_DIR] == _volume_targets(compose["services"]["airflow-scheduler"])[DATA_DIR]
        assert worker["user"] == compose["services"]["airflow-scheduler"]["user"]


def test_spark_resources_are_the_tested_shapes(compose: dict[str, Any]) -> None:
    """`kdq up --cluster` (kdq.stack.spark_cluster, kdq.spark.session): two workers of 1 core / 2 GB,
    384 MB daemons, worker clean-up, no REST server; 1-core 1 GB executors."""
    from kdq.spark.session import spark_conf
    from kdq.stack import spark_cluster
    from tests.conftest import make_config

    for name in SPARK_WORKERS:
        env = _env(compose["services"][name])
        assert env["SPARK_WORKER_CORES"] == str(spark_cluster.WORKER_CORES)
        assert env["SPARK_WORKER_MEMORY"] == spark_cluster.WORKER_MEMORY
        assert env["SPARK_DAEMON_MEMORY"] == spark_cluster.DAEMON_MEMORY
        opts = env["SPARK_WORKER_OPTS"].split()
        assert {"-Dspark.worker.cleanup.enabled=true", "-Dspark.worker.cleanup.appDataTtl=3600"} <= set(opts), opts
    master = _env(compose["services"]["spark-master"])
    assert master["SPARK_DAEMON_MEMORY"] == spark_cluster.DAEMON_MEMORY
    assert "-Dspark.master.rest.enabled=false" in master["SPARK_MASTER_OPTS"].split()
    with tempfile.TemporaryDirectory() as folder:
        tested = spark_conf(make_config(Path(folder), spark={"master": "spark://127.0.0.1:7077"}), "x")
    deployed = spark_conf(_kdq_config(compose), "x")
    for key in ("spark.executor.cores", "spark.executor.memory"):
        assert deployed[key] == tested[key], key


def test_jobs_ship_the_images_jars_and_the_package(compose: dict[str, Any]) -> None:
    """As on the tested shape, every application takes the Kafka connector, Delta and kdq's functions jar with
    --jars (the executors fetch them from the driver) and the kdq package with --py-files."""
    from kdq.spark.session import KDQ_FUNCTIONS_JAR, REQUIRED_JAR_PREFIXES
    from kdq.spark.submit import submit_command

    config = _kdq_config(compose)
    env = _env(compose["services"]["airflow-scheduler"])
    jars_dir = env["KDQ_PATHS__JARS_DIR"]
    assert config.jars_dir == Path(jars_dir)
    shipped = config.spark.conf["spark.jars"].split(",")
    # paths.jars_dir's layout: every connector jar is in spark/ (a glob spark-submit resolves), the functions jar in kdq/.
    assert f"{jars_dir}/spark/*" in shipped
    assert f"{jars_dir}/{KDQ_FUNCTIONS_JAR.as_posix()}" in shipped
    # The S3A connector too (jvm/hadoop-aws, built by the image), so KDQ_STORAGE_URI = s3a://... needs no other change.
    assert f"{jars_dir}/hadoop-aws/*" in shipped
    assert REQUIRED_JAR_PREFIXES, "the connector jars kdq needs"
    with tempfile.TemporaryDirectory() as folder:
        local = load_config(path=PROJECT_ROOT / "kdq.toml", env={**{k: v for k, v in env.items() if k.startswith("KDQ_")
                                                                       and k not in ("KDQ_CONFIG", "KDQ_PATHS__DATA_DIR")}},
                            overrides={"paths": {"data_dir": folder}})
        command = submit_command(local, "stream_counts", [])
    assert command[command.index("--master") + 1] == "spark://spark-master:7077"
    assert command[command.index("--jars") + 1] == config.spark.conf["spark.jars"]
    package = command[command.index("--py-files") + 1]
    assert package.endswith("kdq.zip")


def test_the_image_builds_kdqs_jars() -> None:
    """The Dockerfile builds the jars scripts/setup.sh builds, from the same poms, into the image's
    paths.jars_dir (KDQ_PATHS__JARS_DIR), so the driver in any kdq container has them."""
    text = (PROJECT_ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.MULTILINE)
    assert len(stages) == 2 and stages[0][1] == "jars" and "maven" in stages[0][0], stages
    assert "eclipse-temurin-17" in stages[0][0], "the jars are built for Java 17, as setup.sh's"
    builder = text.split("\nFROM ", 2)[1]
    assert re.search(r"mvn .*-f jvm/spark-connectors/pom\.xml dependency:copy-dependencies", builder)
    assert "-DexcludeTransitive=true" in builder, "only the listed artifacts, as setup.sh"
    assert "-DoutputDirectory=/opt/kdq/jars/spark" in builder
    assert re.search(r"mvn .*-f jvm/kdq-spark-functions/pom\.xml .*package", builder)
    assert "target/kdq-spark-functions.jar /opt/kdq/jars/kdq/" in builder
    # The S3A connector as `make setup-s3` fetches it: the same pom, scope and exclusions (what pyspark ships),
    # into paths.jars_dir/hadoop-aws, where kdq looks for it (kdq.spark.session.storage_jars).
    runs = [run.replace("\\\n", " ") for run in re.findall(r"^RUN (.*?)(?<!\\)$", builder, re.MULTILINE | re.DOTALL)]
    hadoop_aws = next((run for run in runs if "-f jvm/hadoop-aws/pom.xml dependency:copy-dependencies" in run), None)
    assert hadoop_aws, f"the image builds no S3A connector (jvm/hadoop-aws): {runs}"
    assert "-DoutputDirectory=/opt/kdq/jars/hadoop-aws" in hadoop_aws
    assert "COPY jvm/hadoop-aws/pom.xml jvm/hadoop-aws/pom.xml" in builder
    # Every module's parent (jvm/pom.xml), on disk before the first mvn reads a module.
    assert builder.index("COPY jvm/pom.xml jvm/pom.xml") < builder.index("RUN mvn")
    assert re.search(r"^COPY --from=jars /opt/kdq/jars /opt/kdq/jars$", text, re.MULTILINE)
    assert re.search(r"^ENV KDQ_PATHS__JARS_DIR=/opt/kdq/jars$", text, re.MULTILINE)
    setup = (PROJECT_ROOT / "scripts" / "setup.sh").read_text()
    assert "fetch_jars spark jvm/spark-connectors -DexcludeTransitive=true" in setup
    assert "kdq/kdq-spark-functions.jar" in setup
    s3_step = re.search(r"fetch_jars hadoop-aws jvm/hadoop-aws (.*?)\n(?!\s)", setup, re.DOTALL)
    assert s3_step, "scripts/setup.sh's KDQ_SETUP_S3 step"

    def flags(command: str) -> set[str]:
        return {f for f in command.split() if f.startswith(("-DincludeScope=", "-DexcludeGroupIds=", "-DexcludeTransitive="))}

    assert flags(hadoop_aws) == flags(s3_step.group(1)), "the image's S3A jars differ from make setup-s3's"
    # The modules setup.sh builds into the same folder (kdq's glue for Delta's DynamoDB log store).
    for module in sorted(set(re.findall(r"(jvm/hadoop-aws/[\w-]+)", setup)) - {"jvm/hadoop-aws/pom"}):
        name = module.rsplit("/", 1)[1]
        assert re.search(rf"mvn .*-f {module}/pom\.xml .*package", builder), f"the image does not build {module}"
        assert f"{module}/target/{name}.jar /opt/kdq/jars/hadoop-aws/" in builder
    # The build context keeps the jvm sources (and leaves local build output out).
    ignored = (PROJECT_ROOT / ".dockerignore").read_text().split()
    assert "jvm" not in ignored and "jvm/*/target" in ignored and "jvm/*/*/target" in ignored


def test_the_stream_does_not_take_every_core(compose: dict[str, Any]) -> None:
    """A standalone application takes every free core, and the stream holds its executors for good: its
    application is capped (spark.cores.max) so the batch jobs get the other worker."""
    from kdq.spark.submit import submit_command

    config = _kdq_config(compose)
    cores = sum(int(_env(compose["services"][name])["SPARK_WORKER_CORES"]) for name in SPARK_WORKERS)
    with tempfile.TemporaryDirectory() as folder:
        local = load_config(path=PROJECT_ROOT / "kdq.toml", env={
            k: v for k, v in _env(compose["services"]["airflow-scheduler"]).items()
            if k.startswith("KDQ_") and k not in ("KDQ_CONFIG", "KDQ_PATHS__DATA_DIR")
        }, overrides={"paths": {"data_dir": folder}})
        stream = submit_command(local, "stream_counts", [])
        batch = submit_command(local, "batch_recompute", [])
    confs = [stream[i + 1] for i, part in enumerate(stream) if part == "--conf"]
    cap = int(next(c.split("=", 1)[1] for c in confs if c.startswith("spark.cores.max=")))
    executor_cores = int(config.spark.conf["spark.executor.cores"])
    assert executor_cores <= cap < cores, (cap, cores)
    batch_confs = [batch[i + 1] for i, part in enumerate(batch) if part == "--conf"]
    assert not [c for c in batch_confs if c.startswith("spark.cores.max=")], "batch jobs take what is free"
    # The SQL endpoint stays a local driver of its own: it never holds the cluster's cores.
    assert _env(compose["services"]["sql-endpoint"])["KDQ_SPARK__MASTER"].startswith("local")


def test_tables_go_to_object_storage_with_the_storage_variables() -> None:
    """KDQ_STORAGE_URI puts the tables and checkpoints on s3a:// (paths.storage_uri), the KDQ_S3_* variables
    become the fs.s3a settings of every job, and S3 credentials reach the drivers (Airflow, the SQL endpoint) and
    the executors (the workers' environment); KDQ_DYNAMODB_* name the table that coordinates Delta's commits on
    s3a://. Left unset, the kdq-data volume holds the tables and the fs.s3a settings are empty, which S3A reads
    as unset."""
    s3 = {
        "KDQ_STORAGE_URI": "s3a://kdq-tables/prod",
        "KDQ_S3_ENDPOINT": "http://minio:9000",
        "KDQ_S3_REGION": "us-east-1",
        "KDQ_S3_PATH_STYLE_ACCESS": "true",
        "KDQ_DYNAMODB_TABLE": "kdq_delta_log",
        "KDQ_DYNAMODB_REGION": "eu-west-3",
        "KDQ_DYNAMODB_ENDPOINT": "http://dynamodb-local:8000",
        "AWS_ACCESS_KEY_ID": "test-access-key-id",
        "AWS_SECRET_ACCESS_KEY": "test-secret-access-key",
    }
    for variables, storage_uri in ((SECRETS, ""), ({**SECRETS, **s3}, s3["KDQ_STORAGE_URI"])):
        resolved = _run_compose("config", variables=variables)
        assert resolved.returncode == 0, resolved.stderr
        services = yaml.safe_load(resolved.stdout)["services"]
        config = _kdq_config({"services": services})
        assert config.paths.storage_uri == storage_uri
        # Delta's commits on s3a:// coordinated by a DynamoDB table (kdq refuses s3a:// without one: the stream and
        # the batch jobs are separate writers).
        assert config.paths.dynamodb_table == variables.get("KDQ_DYNAMODB_TABLE", "")
        assert config.paths.dynamodb_region == variables.get("KDQ_DYNAMODB_REGION", "us-east-1")
        assert config.paths.dynamodb_endpoint == variables.get("KDQ_DYNAMODB_ENDPOINT", "")
        conf = config.spark.conf
        assert conf["spark.hadoop.fs.s3a.endpoint"] == variables.get("KDQ_S3_ENDPOINT", "")
        assert conf["spark.hadoop.fs.s3a.endpoint.region"] == variables.get("KDQ_S3_REGION", "")
        assert conf["spark.hadoop.fs.s3a.path.style.access"] == variables.get("KDQ_S3_PATH_STYLE_ACCESS", "false")
        for name in ("airflow-scheduler", "sql-endpoint", *SPARK_WORKERS):
            env = _env(services[name])
            for credential in AWS_CREDENTIALS:
                assert env.get(credential, "") == variables.get(credential, ""), (name, credential)
        assert "AWS_SECRET_ACCESS_KEY" not in (services["spark-master"].get("environment") or {})
        # What a job gets from these settings: the S3A jars with --jars, the fs.s3a settings and, on s3a://, the
        # log store's as --conf (kdq refuses to build the command for s3a:// without a DynamoDB table).
        command = _submit_command(services, "batch_recompute")
        assert "/opt/kdq/jars/hadoop-aws/*" in command[command.index("--jars") + 1].split(",")
        confs = dict(c.split("=", 1) for c in (command[i + 1] for i, part in enumerate(command) if part == "--conf"))
        assert confs["spark.hadoop.fs.s3a.path.style.access"] == variables.get("KDQ_S3_PATH_STYLE_ACCESS", "false")
        log_store = {k: v for k, v in confs.items() if k.startswith(("spark.delta.logStore", "spark.kdq.dynamodb"))}
        if storage_uri:
            assert log_store == {"spark.delta.logStore.s3a.impl": "io.kdq.storage.DynamoDBLogStore",
                                 "spark.kdq.dynamodb.table": "kdq_delta_log", "spark.kdq.dynamodb.region": "eu-west-3",
                                 "spark.kdq.dynamodb.endpoint": "http://dynamodb-local:8000"}, log_store
        else:
            assert not log_store, log_store


def _submit_command(services: dict[str, Any], job: str) -> list[str]:
    """The spark-submit command kdq builds for ``job`` with the scheduler's KDQ_* settings (data_dir a temporary
    folder: kdq writes kdq.zip there)."""
    from kdq.spark.submit import submit_command

    env = {k: v for k, v in _env(services["airflow-scheduler"]).items()
           if k.startswith("KDQ_") and k not in ("KDQ_CONFIG", "KDQ_PATHS__DATA_DIR")}
    with tempfile.TemporaryDirectory() as folder:
        config = load_config(path=PROJECT_ROOT / "kdq.toml", env=env, overrides={"paths": {"data_dir": folder}})
        return submit_command(config, job, [])


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
        # Airflow's spark_default connection names the master (client mode: the driver in this container).
        assert env.get("AIRFLOW_CONN_SPARK_DEFAULT") == "spark://spark-master:7077?deploy-mode=client", name
        if name != "airflow-init":
            assert _depends_on(service).get("airflow-init") == "service_completed_successfully", name
            assert _depends_on(service).get("postgres") == "service_healthy", name
            assert "healthcheck" in service, name
    assert len(urls) == 1, f"Airflow services disagree on the metadata DB: {urls}"
    url = urls.pop()
    password = SECRETS["KDQ_POSTGRES_PASSWORD"]
    assert url == f"postgresql+psycopg2://airflow:{password}@postgres/airflow"
    pg = _env(services["postgres"])
    assert (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"]) == ("airflow", password, "airflow")
    assert not _published_ports(services["postgres"])
    assert services["postgres"]["image"] == "postgres:16"
    # The API server on host 8081: host 8080 is the Spark master UI.
    assert services["airflow-apiserver"]["command"] in ("api-server", ["api-server"])
    assert _published_ports(services["airflow-apiserver"]) == {8080: 8081}
    # LocalExecutor runs the Spark drivers in the scheduler: the pipeline's services must be up.
    deps = _depends_on(services["airflow-scheduler"])
    assert {deps.get(s) for s in (*KAFKA_NODES, "spark-master", "influxdb")} == {"service_healthy"}, deps


def test_airflow_mounts_project(compose: dict[str, Any]) -> None:
    mounts = _volume_targets(compose["services"]["airflow-scheduler"])
    for folder in ("dags", "plugins", "include", "spark_jobs", "config"):
        assert Path(mounts.get(f"/opt/airflow/{folder}", "")).resolve() == PROJECT_ROOT / folder, (folder, mounts)
    assert Path(mounts["/opt/airflow/kdq.toml"]).resolve() == PROJECT_ROOT / "kdq.toml"
    assert mounts[DATA_DIR] == "kdq-data"


def test_kdq_settings_point_at_the_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    envs = [_env(services[name]) for name in AIRFLOW_SERVICES]
    # The scheduler alone runs kdq's jobs, so it alone holds their secret-bearing settings (JOB_SETTINGS), the API
    # server alone the SQL endpoint's login (PAGE_SETTINGS); on the others every Airflow service agrees.
    kdq_envs = [{k: v for k, v in env.items() if k.startswith("KDQ_") and k not in (*JOB_SETTINGS, *PAGE_SETTINGS)}
                for env in envs]
    assert all(e == kdq_envs[0] for e in kdq_envs), "Airflow services disagree on KDQ_* settings"
    env = _env(services["airflow-scheduler"])
    assert set(JOB_SETTINGS) <= set(env)
    assert env["KDQ_KAFKA__BOOTSTRAP_SERVERS"] == ",".join(f"{node}:9092" for node in KAFKA_NODES)
    assert env["KDQ_SPARK__MASTER"] == "spark://spark-master:7077"
    assert env["KDQ_INFLUXDB__VERSION"] == "2"
    assert env["KDQ_INFLUXDB__URL"] == "http://influxdb:8086"
    assert env["KDQ_PATHS__DATA_DIR"] == DATA_DIR
    assert env["KDQ_CONFIG"] == "/opt/airflow/kdq.toml" and "/opt/airflow/kdq.toml" in _volume_targets(
        services["airflow-scheduler"]
    )

    # Every host:port a setting names is a service of this file listening on that port.
    master_cmd = _command(services["spark-master"]).split()
    listening = {
        **{
            node: {int(listener.rsplit(":", 1)[1]) for listener in _env(services[node])["KAFKA_LISTENERS"].split(",")}
            for node in KAFKA_NODES
        },
        "spark-master": {int(master_cmd[master_cmd.index("--port") + 1])},
        "influxdb": set(_published_ports(services["influxdb"])),
        "schema-registry": set(_published_ports(services["schema-registry"])),
    }
    addresses = [
        *(address.split(":") for address in env["KDQ_KAFKA__BOOTSTRAP_SERVERS"].split(",")),
        re.match(r"spark://([^:]+):(\d+)$", env["KDQ_SPARK__MASTER"]).groups(),
        re.match(r"https?://([^:]+):(\d+)$", env["KDQ_INFLUXDB__URL"]).groups(),
        re.match(r"https?://([^:]+):(\d+)/apis/ccompat/v7$", env["KDQ_REGISTRY__URL"]).groups(),
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
    assert token == SECRETS["KDQ_INFLUXDB_TOKEN"]
    assert token == env["KDQ_INFLUXDB__TOKEN"] == _env(services["grafana"])["KDQ_INFLUXDB_TOKEN"]


def test_compose_kdq_settings_are_a_valid_kdq_config(compose: dict[str, Any]) -> None:
    """The containers' KDQ_* variables load through kdq's own loader (a typo'd key or bad value fails here, not at 3 am)."""
    env = {k: v for k, v in _env(compose["services"]["airflow-scheduler"]).items() if k.startswith("KDQ_")}
    env.pop("KDQ_CONFIG")  # the container path of the same kdq.toml loaded here
    config = load_config(path=PROJECT_ROOT / "kdq.toml", env=env)
    assert config.kafka_bootstrap() == "kafka-1:9092,kafka-2:9092,kafka-3:9092"
    assert config.spark.master == "spark://spark-master:7077"
    assert config.influxdb.version == 2
    assert config.influx_url() == "http://influxdb:8086"
    assert (config.influxdb.org, config.influxdb.bucket) == ("kdq", "kdq")
    assert config.data_dir == Path(DATA_DIR)
    assert config.registry_url() == "http://schema-registry:8080/apis/ccompat/v7"


def test_schema_registry_is_the_local_stacks_with_its_schemas_in_postgres(compose: dict[str, Any]) -> None:
    """The Schema Registry `make run` starts (the version of jvm/schema-registry/pom.xml), its storage a database
    of its own on the deployment's PostgreSQL (created by registry-db-init, idempotently, before it starts), with the
    local stack's heap; healthy when its Confluent-compatible API answers."""
    services = compose["services"]
    pom = (PROJECT_ROOT / "jvm" / "schema-registry" / "pom.xml").read_text()
    version = re.search(r"<apicurio.version>([^<]+)</apicurio.version>", pom).group(1)
    registry = services["schema-registry"]
    assert registry["image"] == f"apicurio/apicurio-registry:{version}"
    env = _env(registry)
    assert env["APICURIO_STORAGE_KIND"] == "sql" and env["APICURIO_STORAGE_SQL_KIND"] == "postgresql"
    assert env["APICURIO_DATASOURCE_URL"] == "jdbc:postgresql://postgres:5432/registry"
    assert env["APICURIO_DATASOURCE_USERNAME"] == "registry"
    assert env["APICURIO_DATASOURCE_PASSWORD"] == SECRETS["KDQ_REGISTRY_DB_PASSWORD"]
    assert "-Xmx256m" in env["JAVA_OPTS_APPEND"]
    assert _depends_on(registry) == {"registry-db-init": "service_completed_successfully"}
    assert "/apis/ccompat/v7/subjects" in " ".join(registry["healthcheck"]["test"])
    init = services["registry-db-init"]
    assert init["image"] == services["postgres"]["image"]
    assert _depends_on(init) == {"postgres": "service_healthy"}
    script = Path(_volume_targets(init)["/opt/kdq/registry-db.sql"])
    sql = script.read_text()
    # Idempotent (run on every `up`), the password from the environment (on no command line).
    assert "\\getenv registry_password KDQ_REGISTRY_DB_PASSWORD" in sql
    assert "WHERE NOT EXISTS (SELECT FROM pg_roles" in sql and "WHERE NOT EXISTS (SELECT FROM pg_database" in sql
    assert SECRETS["KDQ_REGISTRY_DB_PASSWORD"] not in _command(init)


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
    # `COPY . /opt/airflow/` copies the whole context.
    assert re.search(r"^COPY\s.*\s\.\s", text, re.MULTILINE)


# --- Security: secrets, published ports, image contents, Kafka SASL, Spark authentication ---


@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_missing_secret_stops_compose_naming_it(missing: str) -> None:
    """No default secrets: compose refuses the file, naming the variable, whether it is unset or empty."""
    unset = _run_compose("config", "-q", variables={k: v for k, v in SECRETS.items() if k != missing})
    assert unset.returncode != 0, f"compose accepted the file without {missing}"
    assert missing in unset.stderr, unset.stderr
    empty = _run_compose("config", "-q", variables={**SECRETS, missing: ""})
    assert empty.returncode != 0 and missing in empty.stderr, empty.stderr


def test_no_secret_has_a_default_in_the_file() -> None:
    text = COMPOSE_FILE.read_text()
    references = re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}", text)
    names = {name for name, _, _ in references}
    assert set(SECRETS) <= names, f"not referenced: {sorted(set(SECRETS) - names)}"
    for name, operator, message in references:
        if name in SECRETS:
            assert operator == ":?", f"${{{name}}} must be written ${{{name}:?message}}"
            assert name in message, f"the message of ${{{name}:?...}} should name {name}: {message!r}"
        elif re.search(r"PASSWORD|SECRET|TOKEN|FERNET|_KEY\b", name):
            pytest.fail(f"{name} looks like a secret but is not in SECRETS (and the test's list is the documented one)")
    # The documented template lists every secret, with no usable value.
    example = dict(
        line.split("=", 1)
        for line in (PROJECT_ROOT / ".env.example").read_text().splitlines()
        if re.match(r"^\w+=", line)
    )
    for name in SECRETS:
        assert example.get(name) == "", f".env.example: {name} must be listed and left empty"


def test_all_secrets_set_validates() -> None:
    result = _run_compose("config", "-q")
    assert result.returncode == 0, result.stderr


def test_published_ports_bind_to_loopback_unless_told_otherwise(compose: dict[str, Any]) -> None:
    published = {name: _port_bindings(service) for name, service in compose["services"].items() if service.get("ports")}
    # Only what a person uses from the host: the UIs, InfluxDB, Kafka for producers on the host.
    assert set(published) == {
        "airflow-apiserver", "grafana", "spark-master", "influxdb", *KAFKA_NODES, "sql-endpoint", "schema-registry",
    }, published
    for name, bindings in published.items():
        for host_ip, _, _ in bindings:
            assert host_ip == "127.0.0.1", f"{name} publishes {bindings}: not bound to 127.0.0.1"
    exposed = _run_compose("config", variables={**SECRETS, "KDQ_BIND_ADDRESS": "0.0.0.0"})
    assert exposed.returncode == 0, exposed.stderr
    for name, service in yaml.safe_load(exposed.stdout)["services"].items():
        for host_ip, _, _ in _port_bindings(service):
            # The registry has no authentication: exposing every UI does not expose it (its own variable does).
            expected = "127.0.0.1" if name == "schema-registry" else "0.0.0.0"
            assert host_ip == expected, f"{name} publishes on {host_ip}, expected {expected}"
    registry = _run_compose("config", variables={**SECRETS, "KDQ_REGISTRY_BIND_ADDRESS": "0.0.0.0"})
    assert registry.returncode == 0, registry.stderr
    assert _port_bindings(yaml.safe_load(registry.stdout)["services"]["schema-registry"]) == [("0.0.0.0", 8085, 8080)]


def test_dockerignore_keeps_env_files_out_of_the_image() -> None:
    patterns = [
        line.strip()
        for line in (PROJECT_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for required in (".env", ".env.*", "**/.env", "**/.env.*", ".git", ".venv", ".cache", ".local", "test-artifacts"):
        assert required in patterns, f".dockerignore lacks {required}"
    # Later lines win in .dockerignore: nothing may re-include .env after excluding it.
    assert not [p for p in patterns if p.startswith("!") and p not in ("!.env.example",)], patterns


def _kafka_env(compose: dict[str, Any], node: str = KAFKA_NODES[0]) -> dict[str, str]:
    return _env(compose["services"][node])


def _kdq_config(compose: dict[str, Any]) -> Config:
    env = {k: v for k, v in _env(compose["services"]["airflow-scheduler"]).items() if k.startswith("KDQ_")}
    env.pop("KDQ_CONFIG")
    return load_config(path=PROJECT_ROOT / "kdq.toml", env=env)


@pytest.mark.parametrize("node", KAFKA_NODES)
def test_kafka_listeners_require_sasl(compose: dict[str, Any], node: str) -> None:
    env = _kafka_env(compose, node)
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    listeners = dict(re.match(r"(\w+)://(.*)$", item).groups() for item in env["KAFKA_LISTENERS"].split(","))
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    mechanisms = env["KAFKA_SASL_ENABLED_MECHANISMS"].split(",")
    assert mechanisms == ["SCRAM-SHA-512"], mechanisms
    for name in listeners:
        assert protocols[name] == "SASL_PLAINTEXT", f"listener {name} is {protocols[name]}"
        if name == controller:
            # The quorum's nodes reach each other's controller listener over the compose network: SASL/PLAIN
            # (KRaft cannot use SCRAM there), a user of its own, the same password on every node.
            assert env["KAFKA_SASL_MECHANISM_CONTROLLER_PROTOCOL"] == "PLAIN"
            assert env[f"KAFKA_LISTENER_NAME_{name}_SASL_ENABLED_MECHANISMS"] == "PLAIN"
            jaas = env[f"KAFKA_LISTENER_NAME_{name}_PLAIN_SASL_JAAS_CONFIG"]
            password = SECRETS["KDQ_KAFKA_CONTROLLER_PASSWORD"]
            assert jaas.startswith("org.apache.kafka.common.security.plain.PlainLoginModule required")
            assert f'username="controller" password="{password}" user_controller="{password}";' in jaas, jaas
            continue
        # Every SASL listener has its JAAS login module (the broker refuses to start without one).
        jaas = env.get(f"KAFKA_LISTENER_NAME_{name}_SCRAM___SHA___512_SASL_JAAS_CONFIG", "")
        assert "ScramLoginModule required" in jaas, f"listener {name} has no SCRAM JAAS config"
    advertised = [item.split("://")[0] for item in env["KAFKA_ADVERTISED_LISTENERS"].split(",")]
    assert controller not in advertised and set(advertised) <= set(listeners)
    # The broker's own (inter-broker) user is the admin user start.sh creates.
    inter = env["KAFKA_INTER_BROKER_LISTENER_NAME"]
    assert protocols[inter] == "SASL_PLAINTEXT" and env["KAFKA_SASL_MECHANISM_INTER_BROKER_PROTOCOL"] in mechanisms
    jaas = env[f"KAFKA_LISTENER_NAME_{inter}_SCRAM___SHA___512_SASL_JAAS_CONFIG"]
    assert f'username="{env["KDQ_KAFKA_ADMIN_USERNAME"]}"' in jaas
    assert f'password="{SECRETS["KDQ_KAFKA_ADMIN_PASSWORD"]}"' in jaas
    # start.sh: users created at format time, before the image's own start-up.
    kafka = compose["services"][node]
    script = PROJECT_ROOT / "deploy/kafka/start.sh"
    assert Path(_volume_targets(kafka)["/opt/kdq/kafka"]).resolve() == script.parent
    assert kafka["command"] == ["bash", "/opt/kdq/kafka/start.sh"]
    text = script.read_text()
    assert "--add-scram" in text and "exec /etc/kafka/docker/run" in text
    subprocess.run(["bash", "-n", str(script)], check=True)
    # Variables the script reads must not start with KAFKA_ (the image turns those into broker properties).
    for name in ("KDQ_KAFKA_USERNAME", "KDQ_KAFKA_PASSWORD", "KDQ_KAFKA_ADMIN_USERNAME", "KDQ_KAFKA_ADMIN_PASSWORD"):
        assert env[name], name
    assert env["KDQ_KAFKA_PASSWORD"] == SECRETS["KDQ_KAFKA_PASSWORD"]


def test_local_sasl_broker_mirrors_the_compose_listeners(compose: dict[str, Any]) -> None:
    """kdq.stack.kafka's SASL option (tests/integration/test_kafka_sasl.py) writes the compose nodes' SASL
    settings: the same mechanisms per listener, the same JAAS lines (users and passwords substituted), the
    inter-broker listener INTERNAL; only the EXTERNAL listener (the Docker host's port) has no local twin."""
    from kdq.stack.kafka import KafkaSasl, LocalKafka
    from tests.conftest import make_config

    env = _kafka_env(compose, "kafka-1")
    compose_props = _broker_properties(env)
    sasl = KafkaSasl(
        users={env["KDQ_KAFKA_USERNAME"]: SECRETS["KDQ_KAFKA_PASSWORD"]},
        admin=env["KDQ_KAFKA_ADMIN_USERNAME"],
        admin_password=SECRETS["KDQ_KAFKA_ADMIN_PASSWORD"],
        controller_password=SECRETS["KDQ_KAFKA_CONTROLLER_PASSWORD"],
    )
    with tempfile.TemporaryDirectory() as folder:
        kafka = LocalKafka(make_config(Path(folder)), 1, 2, sasl=sasl)
        local = kafka.server_properties(kafka.nodes[0])
    sasl_keys = {k for k in compose_props if k.startswith(("sasl.", "listener.name."))} - {
        "listener.name.external.scram-sha-512.sasl.jaas.config"
    }
    assert sasl_keys == {k for k in local if k.startswith(("sasl.", "listener.name."))}
    for key in sasl_keys | {"inter.broker.listener.name", "controller.listener.names"}:
        assert " ".join(local[key].split()) == " ".join(compose_props[key].split()), key
    protocols = dict(item.split(":") for item in local["listener.security.protocol.map"].split(","))
    assert protocols == {"INTERNAL": "SASL_PLAINTEXT", "CONTROLLER": "SASL_PLAINTEXT"}
    assert local["listeners"] == "INTERNAL://127.0.0.1:1,CONTROLLER://127.0.0.1:2"
    assert local["advertised.listeners"] == "INTERNAL://127.0.0.1:1"
    # The users start.sh creates at format time.
    assert sasl.format_arguments() == [
        f"--add-scram=SCRAM-SHA-512=[name={env['KDQ_KAFKA_ADMIN_USERNAME']},password={SECRETS['KDQ_KAFKA_ADMIN_PASSWORD']}]",
        f"--add-scram=SCRAM-SHA-512=[name={env['KDQ_KAFKA_USERNAME']},password={SECRETS['KDQ_KAFKA_PASSWORD']}]",
    ]
    # The kdq user's client settings are the compose file's KDQ_KAFKA__CLIENT.
    assert sasl.client(env["KDQ_KAFKA_USERNAME"]) == _kdq_config(compose).kafka.client


def test_kdq_kafka_clients_authenticate_as_the_kdq_user(compose: dict[str, Any]) -> None:
    config = _kdq_config(compose)
    kafka = _kafka_env(compose)
    client = config.kafka.client
    assert client["security.protocol"] == "SASL_PLAINTEXT"
    assert client["sasl.mechanism"] == kafka["KAFKA_SASL_ENABLED_MECHANISMS"]
    assert client["sasl.username"] == kafka["KDQ_KAFKA_USERNAME"]
    assert client["sasl.password"] == kafka["KDQ_KAFKA_PASSWORD"] == SECRETS["KDQ_KAFKA_PASSWORD"]


def test_librdkafka_accepts_the_kdq_client_settings(compose: dict[str, Any]) -> None:
    """librdkafka rejects properties it does not know (sasl.jaas.config among them) when a client is created."""
    import confluent_kafka
    from confluent_kafka import admin as admin_module

    conf = _kdq_config(compose).kafka_client_conf()
    # Creating a client validates every property; it then tries `kafka` in the background
    # (unresolvable here), which log_level 0 keeps quiet.
    producer = confluent_kafka.Producer({**conf, "log_level": 0})
    admin = admin_module.AdminClient({**conf, "log_level": 0})
    del producer, admin
    with pytest.raises(confluent_kafka.KafkaException, match="JAAS"):
        confluent_kafka.Producer({**conf, "sasl.jaas.config": "x", "log_level": 0})


def test_spark_kafka_source_gets_a_jaas_config(compose: dict[str, Any]) -> None:
    """The Java client needs sasl.jaas.config; kdq.client holds librdkafka's username/password form."""
    options = _kdq_config(compose).spark_kafka_options()
    assert options["kafka.security.protocol"] == "SASL_PLAINTEXT"
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    jaas = options["kafka.sasl.jaas.config"]
    assert jaas.startswith("org.apache.kafka.common.security.scram.ScramLoginModule required")
    assert f'password="{SECRETS["KDQ_KAFKA_PASSWORD"]}"' in jaas


def test_spark_services_and_driver_authenticate(compose: dict[str, Any]) -> None:
    from kdq.spark.session import spark_conf

    services = compose["services"]
    secret = SECRETS["KDQ_SPARK_AUTH_SECRET"]
    for name, opts_var in (("spark-master", "SPARK_MASTER_OPTS"), *((w, "SPARK_WORKER_OPTS") for w in SPARK_WORKERS)):
        env = _env(services[name])
        opts = env[opts_var].split()
        assert "-Dspark.authenticate=true" in opts, (name, opts)
        assert "-Dspark.network.crypto.enabled=true" in opts, (name, opts)
        # The secret comes from Spark's _SPARK_AUTH_SECRET, never a command line.
        assert env["_SPARK_AUTH_SECRET"] == secret, name
        assert secret not in _command(services[name]) and secret not in env[opts_var], name
    # The driver: the spark-submit settings kdq builds (Airflow's SparkSubmitHook uses the same spark_conf).
    conf = spark_conf(_kdq_config(compose), "kdq-test")
    assert conf["spark.authenticate"] == "true"
    assert conf["spark.authenticate.secret"] == secret
    assert conf["spark.network.crypto.enabled"] == "true"


def test_sql_endpoint_publishes_only_jdbc_with_a_password(compose: dict[str, Any]) -> None:
    """The always-on SQL endpoint runs the local stack's command in the foreground, as its own local
    driver; only the Thrift (JDBC) port leaves the compose network, and it requires KDQ_SQL_PASSWORD."""
    service = compose["services"]["sql-endpoint"]
    command = " ".join(service["command"])
    assert "kdq sql-endpoint --host 0.0.0.0" in command and "--thrift-port 10000" in command
    assert [(published, target) for _, published, target in _port_bindings(service)] == [(10000, 10000)], service["ports"]
    env = service["environment"]
    assert env["KDQ_SQL_PASSWORD"] == SECRETS["KDQ_SQL_PASSWORD"]
    assert env["KDQ_SPARK__MASTER"].startswith("local")
    # The Airflow UI's data-quality page reaches it over the compose network (Spark Connect, not published).
    assert compose["services"]["airflow-apiserver"]["environment"]["KDQ_SQL_ENDPOINT_URL"] == "sc://sql-endpoint:15002"


def test_core_caps_apply_to_their_own_application(tmp_path: Path) -> None:
    """spark.stream_cores_max / spark.sql_endpoint_cores_max become spark.cores.max of the stream's / the SQL
    endpoint's application only, winning over a spark.cores.max of [spark.conf] (which every other job keeps)."""
    from kdq.spark.submit import submit_command

    config = load_config(path=PROJECT_ROOT / "kdq.toml", env={}, overrides={
        "paths": {"data_dir": str(tmp_path)},
        "spark": {"conf": {"spark.cores.max": "8"}, "stream_cores_max": 2, "sql_endpoint_cores_max": 1},
    })

    def cores(job: str) -> list[str]:
        command = submit_command(config, job, [])
        return [command[i + 1] for i, part in enumerate(command) if part == "--conf" and "cores.max" in command[i + 1]]

    assert cores("stream_counts") == ["spark.cores.max=2"]
    assert cores("sql_endpoint") == ["spark.cores.max=1"]
    assert cores("batch_recompute") == ["spark.cores.max=8"]


def test_each_service_receives_only_the_secrets_it_uses() -> None:
    """Per service, the secrets found anywhere in its resolved definition (environment, command, files
    it is given), by value, against ALLOWED_SECRETS. The SQL endpoint answers queries from outside Airflow: a query
    that reads its environment (java_method('java.lang.System', 'getenv', ...)) must find no Airflow, Kafka,
    InfluxDB or Spark secret there."""
    aws = {name: f"test-{name.lower().replace('_', '-')}" for name in AWS_CREDENTIALS}
    resolved = _run_compose("config", variables={**SECRETS, **aws})
    assert resolved.returncode == 0, resolved.stderr
    services = yaml.safe_load(resolved.stdout)["services"]
    values = {**SECRETS, **aws}
    found = {
        name: {secret for secret, value in values.items() if value in yaml.safe_dump(service)}
        for name, service in services.items()
    }
    assert set(found) == set(ALLOWED_SECRETS), "a service without an allow-list entry (or one removed)"
    extra = {name: sorted(found[name] - ALLOWED_SECRETS[name]) for name in found if found[name] - ALLOWED_SECRETS[name]}
    assert extra == {}, f"services holding secrets they do not use: {extra}"
    # What the endpoint may hold, it holds: its login; and no service lost a secret it needs.
    missing = {name: sorted(ALLOWED_SECRETS[name] - found[name]) for name in found if ALLOWED_SECRETS[name] - found[name]}
    assert missing == {}, f"services without a secret they use: {missing}"
