"""The local stack's Schema Registry: Apicurio Registry 3, the Quarkus application `make setup` unpacks
from Maven Central (jvm/schema-registry/pom.xml) into ``<jars_dir>/schema-registry``, as a managed process.

Clients use its Confluent-compatible API (``/apis/ccompat/v7``), the one every registry kdq may be pointed at
speaks (Confluent, Karapace, Redpanda): the local registry is just the default ``registry.url``
(:meth:`kdq.config.Config.registry_url`).

Its schemas are on disk, in an H2 database file under ``<data_dir>/registry/db`` (Apicurio's SQL storage with
the H2 driver it ships; its default is an in-memory database, lost on every restart), so a restart of the stack
finds every schema under the same id: a schema id is written into every record of a topic, and a registry that
forgot it would make the topic's history undecodable. It listens on loopback only and has no authentication,
like the rest of the local stack.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import requests

from kdq.config import LOCAL_REGISTRY_API, Config
from kdq.procs import ManagedProcess, StackError, port_open, wait_until

# Measured on the 2-core machine (docs/operations.md, "The Schema Registry"): started and answering in about
# 10-15 s, 200-250 MB resident. The heap holds the schemas of the registry's own cache and the requests; 256 MB is
# several times what it needs for thousands of schemas. C1 only (TieredStopAtLevel=1): the registry answers a
# handful of requests per new schema id (kdq's readers cache every schema), so C2's compile work at start, on cores
# the broker and the stream share, buys nothing; the serial collector keeps no GC threads per core.
JVM_OPTIONS = (
    "-Xms32m",
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:ReservedCodeCacheSize=64m",
    "-Xss512k",
    "-Djava.awt.headless=true",
)


class LocalRegistry:
    def __init__(self, config: Config, port: int) -> None:
        self.config = config
        self.port = port
        self.home = config.data_dir / "registry"
        self.database = self.home / "db" / "registry"
        self.process = ManagedProcess(
            name="registry",
            pid_file=self.home / "registry.pid",
            log_file=self.home / "registry.log",
            # The datasource URL names this data folder's database: unique per stack.
            marker=f"jdbc:h2:file:{self.database}",
        )

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The Confluent-compatible API: what ``registry.url`` would be set to for this registry."""
        return f"{self.address}{LOCAL_REGISTRY_API}"

    def app_dir(self) -> Path:
        return self.config.jars_dir / "schema-registry"

    def runner_jar(self) -> Path:
        jars = sorted(self.app_dir().glob("apicurio-registry-app-*-runner.jar"))
        if not jars:
            raise StackError(
                f"the Schema Registry is missing in {self.app_dir()}: run `make setup` (scripts/setup.sh fetches "
                "io.apicurio:apicurio-registry-app:tar.gz:all from Maven Central, jvm/schema-registry/pom.xml)"
            )
        return jars[-1]

    def command(self) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise StackError("java not found on PATH: install a Java 17 JRE (Debian: openjdk-17-jre-headless)")
        settings = {
            # Loopback only, on the recorded port (Quarkus reads -D system properties before its own files).
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": str(self.port),
            # Storage on disk: Apicurio's SQL storage on an H2 file (apicurio.sql.init creates the tables on the
            # first start and leaves them on the next).
            "apicurio.storage.kind": "sql",
            "apicurio.storage.sql.kind": "h2",
            # WRITE_DELAY=0: H2 writes each commit to the file at once instead of up to half a second later. A
            # registry killed in that half second forgot a schema it had answered with an id, which a producer may
            # already have written into records (tests/integration/test_registry.py kills it right after a
            # registration); a registry takes a handful of writes per new schema, so the cost is nil.
            "apicurio.datasource.url": f"jdbc:h2:file:{self.database};WRITE_DELAY=0",
            "apicurio.datasource.username": "sa",
            "apicurio.datasource.password": "sa",
            # Apicurio opens 20 connections up front (sized for a database server); one embedded file needs few.
            "apicurio.datasource.jdbc.initial-size": "2",
            "apicurio.datasource.jdbc.min-size": "2",
            "apicurio.datasource.jdbc.max-size": "10",
            # As in Confluent's registry, a subject or a version may be deleted through the ccompat API (Apicurio 3
            # refuses deletes by default); a test or a demo that resets a subject needs it.
            "apicurio.rest.deletion.artifact.enabled": "true",
            "apicurio.rest.deletion.artifact-version.enabled": "true",
            "apicurio.rest.deletion.group.enabled": "true",
        }
        return [
            java,
            *JVM_OPTIONS,
            *(f"-D{key}={value}" for key, value in settings.items()),
            "-jar",
            str(self.runner_jar()),
        ]

    def healthy(self, timeout: float = 3.0) -> bool:
        """The Confluent-compatible API lists the subjects: the API kdq uses answers and its storage is open."""
        if not port_open(self.port):
            return False
        response = requests.get(f"{self.url}/subjects", timeout=timeout)
        return response.status_code == 200 and isinstance(response.json(), list)

    def start(self, timeout: float = 180.0, wait: bool = True) -> None:
        """Start (no-op when running); with ``wait``, block until healthy or raise StackError."""
        if not self.process.running():
            command = self.command()
            if port_open(self.port):
                raise StackError(f"registry: port {self.port} is already in use by another program")
            self.database.parent.mkdir(parents=True, exist_ok=True)
            self.process.start(command, cwd=self.home)
        if wait:
            self.wait(timeout)

    def wait(self, timeout: float = 180.0) -> None:
        wait_until(self.healthy, timeout, "registry", interval=0.5, alive=self.process.running,
                   log=self.process.log_tail)

    def stop(self) -> bool:
        # Quarkus closes the datasource on SIGTERM (H2 writes its file and releases the lock) in about a second.
        return self.process.stop(timeout=30)
