"""A single-node Kafka broker in KRaft mode (combined broker + controller), from the Maven jars."""

from __future__ import annotations

import base64
import shutil
import subprocess
import uuid
from pathlib import Path

from kdq.config import Config
from kdq.stack.procs import ManagedProcess, StackError, port_open, wait_until

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


class LocalKafka:
    def __init__(self, config: Config, port: int, controller_port: int) -> None:
        self.config = config
        self.port = port
        self.controller_port = controller_port
        self.home = config.data_dir / "kafka"
        self.properties = self.home / "server.properties"
        self.process = ManagedProcess(
            name="kafka",
            pid_file=self.home / "kafka.pid",
            log_file=self.home / "kafka.log",
            marker=str(self.properties),
        )

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

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

    def _write_config(self) -> None:
        kafka = self.config.kafka
        max_bytes = kafka.max_message_bytes
        # Local-stack settings. Retention is by time of the *record timestamp*,
        # and tests and demos replay old event times, so time retention is off;
        # the timestamp-skew limits are opened because rejecting a record with a
        # wrong clock is our job (future_timestamp), not the broker's.
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.home / "data"),
            "num.partitions": str(kafka.local_partitions),
            "auto.create.topics.enable": "true",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
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
        self.home.mkdir(parents=True, exist_ok=True)
        self.properties.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.home / "log4j2.properties").write_text(LOG4J2)

    def _command(self, main: str, *args: str, heap: str = "768m") -> list[str]:
        return [
            self._java(),
            f"-Xmx{heap}",
            "-Xms128m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            "-cp",
            str(self.jars() / "*"),
            main,
            *args,
        ]

    def _format_storage(self) -> None:
        if (self.home / "data" / "meta.properties").exists():
            return
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        result = subprocess.run(
            self._command(
                # --opt=value: a cluster id may start with "-" and must not read as an option
                "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", f"--config={self.properties}", heap="256m"
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise StackError(f"kafka: formatting the KRaft storage failed:\n{result.stdout}\n{result.stderr}")

    def healthy(self, timeout: float = 3.0) -> bool:
        if not port_open(self.port):
            return False
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, **self.config.kafka.client})
        metadata = admin.list_topics(timeout=timeout)
        return bool(metadata.brokers)

    def start(self, timeout: float = 90.0) -> None:
        if self.process.running():
            wait_until(self.healthy, timeout, "kafka", alive=self.process.running, log=self.process.log_tail)
            return
        for port in (self.port, self.controller_port):
            if port_open(port):
                raise StackError(f"kafka: port {port} is already in use by another program")
        self._write_config()
        self._format_storage()
        self.process.start(self._command("kafka.Kafka", str(self.properties), heap="1g"))
        wait_until(self.healthy, timeout, "kafka", alive=self.process.running, log=self.process.log_tail)

    def stop(self) -> bool:
        return self.process.stop(timeout=30)

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap, **self.config.kafka.client})
        futures = admin.create_topics([NewTopic(name, partitions, 1, config=config or {})], operation_timeout=30)
        try:
            futures[name].result(timeout=60)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
