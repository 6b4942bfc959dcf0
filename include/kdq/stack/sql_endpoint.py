"""The always-on SQL endpoint of the local stack (spark_jobs/sql_endpoint.py) as a managed process.

One Spark driver in local mode, started through spark-submit with kdq's session conf (Delta, the same
jars and settings as every job), serving Spark Connect and the Spark Thrift Server (HiveServer2) on
loopback ports recorded in the stack state. Its ports open only once every kdq table is registered,
so "port open" is the health check.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from kdq.config import Config
from kdq.stack.procs import ManagedProcess, StackError, port_open, wait_until

# Loopback only: locally there is no authentication unless KDQ_SQL_PASSWORD is set (anyone on this
# machine may read the counts, as they may read the Delta files). Each JDBC/Connect client gets its own session of the one driver
# (singleSession false): SET and temporary views stay per client, tables and views are shared.
ENDPOINT_CONF = {
    # HiveServer2 reads its settings from the Hadoop conf the session builds (spark.hadoop.*).
    "spark.hadoop.hive.server2.transport.mode": "binary",
    "spark.sql.hive.thriftServer.singleSession": "false",
}

# Set in the endpoint's environment, it turns on the Thrift server's password (user: KDQ_SQL_USER, read by
# the Java provider itself).
PASSWORD_ENV = "KDQ_SQL_PASSWORD"


AUTHENTICATOR = "io.kdq.spark.SqlPasswordAuthenticator"

# The endpoint is read-only (kdq-spark-functions: io.kdq.spark.ReadOnlyExtension and its check rule, armed by
# kdq.spark.sql_server once the tables are registered; Spark Connect's requests that never become a plan go
# through the interceptor). Clients query the kdq tables and views; nothing they send writes or runs code.
READ_ONLY_EXTENSION = "io.kdq.spark.ReadOnlyExtension"
READ_ONLY_INTERCEPTOR = "io.kdq.spark.ReadOnlyConnectInterceptor"


def _with(listed: str, name: str) -> str:
    """``name`` appended to a comma-separated list of class names (once)."""
    names = [part.strip() for part in listed.split(",") if part.strip()]
    return ",".join(names if name in names else [*names, name])


def read_only_conf(session_conf: Mapping[str, str]) -> dict[str, str]:
    """The read-only extension after the session's own (Delta's ``io.delta.sql.DeltaSparkSessionExtension``,
    any of ``[spark.conf]``), and the Spark Connect interceptor after any configured one."""
    return {
        "spark.sql.extensions": _with(session_conf.get("spark.sql.extensions", ""), READ_ONLY_EXTENSION),
        "spark.connect.grpc.interceptor.classes": _with(
            session_conf.get("spark.connect.grpc.interceptor.classes", ""), READ_ONLY_INTERCEPTOR
        ),
    }


def thrift_auth_conf(env: Mapping[str, str], driver_java_options: str = "") -> dict[str, str]:
    """Password authentication of the Thrift server when ``KDQ_SQL_PASSWORD`` is set (the compose
    deployment sets it; locally it is optional): HiveServer2's CUSTOM mode with kdq's provider
    (``io.kdq.spark.SqlPasswordAuthenticator`` in the kdq-spark-functions jar), which reads the expected
    ``KDQ_SQL_USER`` (default ``kdq``) and password from the endpoint's own environment.

    The provider's class name must be a JVM system property: Hive's CUSTOM mode reads it from a fresh
    ``HiveConf`` (hive-site.xml and system properties), not from the session's Hadoop conf, so it is
    appended to the driver's Java options (``driver_java_options``: the ones the session conf sets)."""
    if not env.get(PASSWORD_ENV):
        return {}
    return {
        "spark.hadoop.hive.server2.authentication": "CUSTOM",
        "spark.driver.extraJavaOptions": f"{driver_java_options} -Dhive.server2.custom.authentication.class={AUTHENTICATOR}".strip(),
    }


class LocalSqlEndpoint:
    def __init__(self, config: Config, connect_port: int, thrift_port: int, bind_host: str = "127.0.0.1") -> None:
        """``bind_host``: the address both servers listen on; loopback except in a container
        (``kdq sql-endpoint --host 0.0.0.0`` in the compose deployment, behind a published loopback port)."""
        self.config = config
        self.bind_host = bind_host
        self.connect_port = connect_port
        self.thrift_port = thrift_port
        self.home = config.data_dir / "sql-endpoint"
        self.process = ManagedProcess(
            name="sql-endpoint",
            pid_file=self.home / "sql-endpoint.pid",
            log_file=self.home / "sql-endpoint.log",
            # A conf only this process carries, unique per data folder (the stream's command line has the
            # same warehouse dir).
            marker=f"spark.kdq.sqlEndpoint.dataDir={config.data_dir}",
        )

    @property
    def connect_url(self) -> str:
        return f"sc://127.0.0.1:{self.connect_port}"

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:hive2://127.0.0.1:{self.thrift_port}/{self.config.spark.database}"

    def healthy(self) -> bool:
        return self.process.running() and port_open(self.connect_port) and port_open(self.thrift_port)

    def command(self) -> list[str]:
        from kdq.spark.submit import submit_command

        command = submit_command(
            self.config,
            "sql_endpoint",
            ["--host", self.bind_host, "--connect-port", str(self.connect_port), "--thrift-port", str(self.thrift_port)],
            app_name="kdq-sql-endpoint",
        )
        session_conf = self._session_conf()
        conf = {
            **ENDPOINT_CONF,
            **read_only_conf(session_conf),
            "spark.connect.grpc.binding.address": self.bind_host,
            "spark.hadoop.hive.server2.thrift.bind.host": self.bind_host,
            **thrift_auth_conf(os.environ, session_conf.get("spark.driver.extraJavaOptions", "")),
            "spark.connect.grpc.binding.port": str(self.connect_port),
            "spark.hadoop.hive.server2.thrift.port": str(self.thrift_port),
            "spark.kdq.sqlEndpoint.dataDir": str(self.config.data_dir),
        }
        extra = [part for key, value in conf.items() for part in ("--conf", f"{key}={value}")]
        if "--jars" in command:
            # The Thrift server's worker threads resolve classes (DeltaCatalog) through the system class
            # loader, not the one --jars extends: the same jars go on the driver's class path too.
            jars = command[command.index("--jars") + 1]
            extra += ["--driver-class-path", jars.replace(",", ":")]
        script = command.index(next(part for part in command if part.endswith("sql_endpoint.py")))
        # One value per key on the command line: the session's own spark.sql.extensions gives way to the one above.
        head, i = [], 0
        while i < script:
            if command[i] == "--conf" and command[i + 1].split("=", 1)[0] in conf:
                i += 2
                continue
            head.append(command[i])
            i += 1
        return [*head, *extra, *command[script:]]

    def _session_conf(self) -> dict[str, str]:
        from kdq.spark.session import spark_conf

        return spark_conf(self.config, "kdq-sql-endpoint")

    def start(self, timeout: float = 240.0, wait: bool = True) -> None:
        """Start (no-op when running); with ``wait``, block until both ports answer or raise StackError."""
        from kdq.stream_process import child_env

        if not self.process.running():
            for port in (self.connect_port, self.thrift_port):
                if port_open(port):
                    raise StackError(f"sql-endpoint: port {port} is already in use by another program")
            self.home.mkdir(parents=True, exist_ok=True)
            self.process.start(self.command(), env=child_env(self.config), cwd=self.config.base_dir)
        if wait:
            self.wait(timeout)

    def wait(self, timeout: float = 240.0) -> None:
        wait_until(self.healthy, timeout, "sql-endpoint", interval=0.5, alive=self.process.running,
                   log=self.process.log_tail)

    def stop(self) -> bool:
        return self.process.stop(timeout=30)


def running_endpoint(config: Config) -> LocalSqlEndpoint | None:
    """The local stack's endpoint when it runs and answers, from the ports in the stack state (read only:
    nothing is chosen or written here)."""
    state = config.local_state()
    connect_port, thrift_port = int(state.get("sql_connect_port") or 0), int(state.get("sql_thrift_port") or 0)
    if not connect_port or not thrift_port:
        return None
    endpoint = LocalSqlEndpoint(config, connect_port, thrift_port)
    return endpoint if endpoint.healthy() else None
