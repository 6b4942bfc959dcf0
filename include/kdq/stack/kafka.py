"""Local Kafka in KRaft mode, from the Maven jars: one combined broker + controller node (the default
stack), or several such nodes forming one controller quorum (``kdq up --cluster``: three nodes, topics at
replication factor 3 and ``min.insync.replicas`` 2, so one broker can die without losing an acknowledged
record or blocking a producer with ``acks=all``).

Node 1 keeps the single broker's folder (``<data_dir>/kafka``) and ports; nodes 2.. live in
``<data_dir>/kafka-<n>``. Every node is a ManagedProcess of its own, so a test can kill and restart one.

With ``sasl`` (:class:`KafkaSasl`) every listener authenticates as docker-compose.yml's brokers do: the client
and inter-broker listener ``INTERNAL`` is ``SASL_PLAINTEXT`` with SCRAM-SHA-512 (users created when the storage
is formatted, ``--add-scram``: KRaft keeps SCRAM credentials in its metadata log), the controller listener
``SASL_PLAINTEXT`` with SASL/PLAIN and a user of its own. Without it (the default) both are ``PLAINTEXT``."""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kdq.config import Config
from kdq.procs import ManagedProcess, StackError, port_open, wait_until

LOG4J2 = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
"""


SCRAM = "SCRAM-SHA-512"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"


@dataclass(frozen=True)
class KafkaSasl:
    """The local broker's users, as docker-compose.yml configures them (deploy/kafka/start.sh).

    ``users``: SCRAM-SHA-512 users (name → password) created at format time, the ones clients log in as;
    ``admin``: the brokers' own SCRAM user (inter-broker connections); ``controller_password``: SASL/PLAIN
    password of user ``controller`` on the controller listener. Users are created when a node's storage is
    formatted only: a node started before keeps the users it was formatted with."""

    users: Mapping[str, str]
    admin_password: str = field(default_factory=lambda: secrets.token_hex(32))
    controller_password: str = field(default_factory=lambda: secrets.token_hex(32))
    admin: str = "admin"

    def __post_init__(self) -> None:
        for name, password in self.scram_users().items():
            # The --add-scram and JAAS syntaxes (start.sh refuses the same characters).
            if not name or any(c in name + password for c in ',]"\\\n') or not password:
                raise StackError(
                    f"kafka SASL user {name!r}: names and passwords must be non-empty and free of , ] \" \\ "
                    "and line breaks (generate passwords with `openssl rand -hex 32`)"
                )
        if any(c in self.controller_password for c in '"\\\n') or not self.controller_password:
            raise StackError('kafka SASL controller password: must be non-empty and free of " \\ and line breaks')

    def scram_users(self) -> dict[str, str]:
        return {self.admin: self.admin_password, **self.users}

    def client(self, user: str) -> dict[str, str]:
        """``kafka.client`` settings (librdkafka's form, as KDQ_KAFKA__CLIENT in docker-compose.yml) of ``user``."""
        return {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": SCRAM,
            "sasl.username": user,
            "sasl.password": self.scram_users()[user],
        }

    def listener_properties(self) -> dict[str, str]:
        """The SASL part of server.properties (listeners ``INTERNAL`` and ``CONTROLLER``)."""
        controller = self.controller_password
        return {
            "listener.security.protocol.map": "INTERNAL:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": SCRAM,
            "sasl.mechanism.inter.broker.protocol": SCRAM,
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            # The server side (user_controller) and the node's own login to the controllers.
            "listener.name.controller.plain.sasl.jaas.config": (
                f'{PLAIN_MODULE} required username="controller" password="{controller}" user_controller="{controller}";'
            ),
            # The brokers' own login for inter-broker connections; clients are checked against the SCRAM users.
            "listener.name.internal.scram-sha-512.sasl.jaas.config": (
                f'{SCRAM_MODULE} required username="{self.admin}" password="{self.admin_password}";'
            ),
        }

    def format_arguments(self) -> list[str]:
        """``kafka-storage format`` options creating the SCRAM users."""
        return [f"--add-scram={SCRAM}=[name={n},password={p}]" for n, p in self.scram_users().items()]


@dataclass(frozen=True)
class KafkaNode:
    """One KRaft process (broker and controller) of the local Kafka."""

    node_id: int
    port: int
    controller_port: int
    home: Path

    @property
    def properties(self) -> Path:
        return self.home / "server.properties"

    @property
    def process(self) -> ManagedProcess:
        name = "kafka" if self.node_id == 1 else f"kafka-{self.node_id}"
        return ManagedProcess(
            name=name, pid_file=self.home / "kafka.pid", log_file=self.home / "kafka.log", marker=str(self.properties)
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


class LocalKafka:
    """``extra_nodes``: (port, controller_port) of nodes 2.. ; none is the single-broker stack of old.
    ``sasl``: authenticated listeners (:class:`KafkaSasl`); ``config.kafka.client`` then carries the login of
    one of its users (:meth:`KafkaSasl.client`), which the health check and :meth:`create_topic` use."""

    def __init__(
        self,
        config: Config,
        port: int,
        controller_port: int,
        extra_nodes: Sequence[tuple[int, int]] = (),
        sasl: KafkaSasl | None = None,
    ) -> None:
        self.config = config
        self.sasl = sasl
        self.port = port
        self.controller_port = controller_port
        self.home = config.data_dir / "kafka"
        self.nodes = [KafkaNode(1, port, controller_port, self.home)] + [
            KafkaNode(i, p, c, config.data_dir / f"kafka-{i}") for i, (p, c) in enumerate(extra_nodes, start=2)
        ]
        self.properties = self.nodes[0].properties
        self.process = self.nodes[0].process

    @property
    def replication_factor(self) -> int:
        """Of every topic kdq creates and of the internal topics: one copy per node, up to three."""
        return min(3, len(self.nodes))

    @property
    def min_insync_replicas(self) -> int:
        # RF 3 with 2 in sync: an acks=all write survives one broker's loss and is still accepted while it is down.
        return 2 if self.replication_factor >= 3 else 1

    @property
    def bootstrap(self) -> str:
        # Every node: a client started while one broker is down still finds the cluster.
        return ",".join(node.address for node in self.nodes)

    def jars(self) -> Path:
        folder = self.config.jars_dir / "kafka"
        if not any(folder.glob("kafka_2.13-*.jar")):
            raise StackError(
                f"Kafka broker jars missing in {folder}: run `make setup` (scripts/setup.sh fetches "
                "org.apache.kafka:kafka_2.13 from Maven Central)"
            )
        return folder

    def _java(self) -> str:
        java = shutil.which("java")
        if java is None:
            raise StackError("java not found on PATH: install a Java 17 JRE (Debian: openjdk-17-jre-headless)")
        return java

    def server_properties(self, node: KafkaNode) -> dict[str, str]:
        kafka = self.config.kafka
        max_bytes = kafka.max_message_bytes
        rf, isr = str(self.replication_factor), str(self.min_insync_replicas)
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        # Local-stack settings. Retention is by time of the *record timestamp*,
        # and tests and demos replay old event times, so time retention is off;
        # the timestamp-skew limits are opened because rejecting a record with a
        # wrong clock is our job (future_timestamp), not the broker's.
        listener = "INTERNAL" if self.sasl else "PLAINTEXT"
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"{listener}://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
            "advertised.listeners": f"{listener}://127.0.0.1:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": listener,
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.home / "data"),
            "num.partitions": str(kafka.local_partitions),
            "auto.create.topics.enable": "true",
            "default.replication.factor": rf,
            "min.insync.replicas": isr,
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": isr,
            "group.initial.rebalance.delay.ms": "0",
            "log.retention.ms": "-1",
            "message.max.bytes": str(max_bytes),
            "replica.fetch.max.bytes": str(max_bytes),
            "log.message.timestamp.before.max.ms": "9223372036854775807",
            "log.message.timestamp.after.max.ms": "9223372036854775807",
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
            "num.network.threads": "2",
            "num.io.threads": "4",
        }
        if len(self.nodes) > 1:
            # A restarted broker takes its partitions' leadership back soon (the test restarts one mid-stream).
            props["leader.imbalance.check.interval.seconds"] = "10"
        if self.sasl:
            props.update(self.sasl.listener_properties())
        return props

    def _write_config(self, node: KafkaNode) -> None:
        node.home.mkdir(parents=True, exist_ok=True)
        text = "".join(f"{k}={v}\n" for k, v in self.server_properties(node).items())
        # Owner-only: with SASL the file holds the brokers' passwords.
        fd = os.open(node.properties, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        node.properties.chmod(0o600)
        (node.home / "log4j2.properties").write_text(LOG4J2)

    def _command(self, node: KafkaNode, main: str, *args: str, heap: str = "768m") -> list[str]:
        return [
            self._java(),
            f"-Xmx{heap}",
            "-Xms128m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={node.home / 'log4j2.properties'}",
            "-cp",
            str(self.jars() / "*"),
            main,
            *args,
        ]

    def _cluster_id(self) -> str:
        """One id for every node of the quorum, kept beside node 1's data (nodes are formatted one by one)."""
        path = self.home / "cluster.id"
        if path.exists():
            return path.read_text().strip()
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        self.home.mkdir(parents=True, exist_ok=True)
        path.write_text(cluster_id)
        return cluster_id

    def _format_storage(self, node: KafkaNode) -> None:
        if (node.home / "data" / "meta.properties").exists():
            return
        result = subprocess.run(
            self._command(
                # --opt=value: a cluster id may start with "-" and must not read as an option
                node, "kafka.tools.StorageTool", "format", f"--cluster-id={self._cluster_id()}",
                f"--config={node.properties}", *(self.sasl.format_arguments() if self.sasl else ()), heap="256m",
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise StackError(f"{node.process.name}: formatting the KRaft storage failed:\n{result.stdout}\n{result.stderr}")

    def healthy(self, timeout: float = 3.0) -> bool:
        """Every node answers and is registered as a broker."""
        if not all(port_open(node.port) for node in self.nodes):
            return False
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, **self.config.kafka.client})
        metadata = admin.list_topics(timeout=timeout)
        return len(metadata.brokers) >= len(self.nodes)

    def running(self) -> bool:
        return any(node.process.running() for node in self.nodes)

    def _alive(self) -> bool:
        return all(node.process.running() for node in self.nodes)

    def _logs(self) -> str:
        return "\n".join(f"--- {n.process.name}\n{n.process.log_tail(15 if len(self.nodes) > 1 else 30)}" for n in self.nodes)

    def start(self, timeout: float = 90.0) -> None:
        """Start every node that is not running (a quorum needs a majority up to elect), then wait for all."""
        for node in self.nodes:
            if node.process.running():
                continue
            for port in (node.port, node.controller_port):
                if port_open(port):
                    raise StackError(f"{node.process.name}: port {port} is already in use by another program")
            self._write_config(node)
            self._format_storage(node)
        heap = "1g" if len(self.nodes) == 1 else "512m"
        for node in self.nodes:
            if not node.process.running():
                node.process.start(self._command(node, "kafka.Kafka", str(node.properties), heap=heap))
        wait_until(self.healthy, timeout, "kafka", alive=self._alive, log=self._logs)

    def stop(self) -> bool:
        """Every node at once: stopped one by one, the last node would be a controller without a majority,
        and its shutdown would wait out the SIGKILL timeout (30 s measured)."""
        if len(self.nodes) == 1:
            return self.process.stop(timeout=30)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(self.nodes)) as pool:
            return any(pool.map(lambda node: node.process.stop(timeout=30), self.nodes))

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        """At the stack's replication factor; on the cluster with ``min.insync.replicas`` 2 (unless given)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        settings = dict(config or {})
        if self.replication_factor > 1:
            settings.setdefault("min.insync.replicas", str(self.min_insync_replicas))
        admin = AdminClient({"bootstrap.servers": self.bootstrap, **self.config.kafka.client})
        topic = NewTopic(name, partitions, self.replication_factor, config=settings)
        futures = admin.create_topics([topic], operation_timeout=30)
        try:
            futures[name].result(timeout=60)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
