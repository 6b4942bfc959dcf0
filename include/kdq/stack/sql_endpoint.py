"""The always-on SQL endpoint of the local stack (spark_jobs/sql_endpoint.py) as a managed process.

One Spark driver in local mode, started through spark-submit with kdq's session conf (Delta, the same
jars and settings as every job), serving Spark Connect and the Spark Thrift Server (HiveServer2) on
loopback ports recorded in the stack state. Its ports open only once every kdq table is registered,
so "port open" is the health check.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from kdq.config import Config
from kdq.procs import INTERACTIVE_NICENESS, ManagedProcess, StackError, port_open, wait_until

# Every client session's defaults: small queries. A day's GROUP BY over window_counts ran 5 Spark jobs with
# adaptive execution and kdq's 4 shuffle partitions (9-10 when the stream had committed since the last query:
# Delta's log replay runs under the same settings), 2 (4) without it and with one partition: no re-planning
# stage per shuffle, no sampling job for an ORDER BY's range partitioning. Median of 30 interleaved queries in one
# driver beside the stream: 0.58 s → 0.42 s (two partitions: 0.38 s, within the noise, one job more); the
# endpoint's figures are in benchmarks/results/sql_endpoint_with_stream.md. A client may SET them back.
# They go on the command line (Spark Connect's sessions start from the SparkConf) and into the endpoint's own
# session (spark_jobs/sql_endpoint.session_conf): the Thrift server copies that session's settings into every
# JDBC statement, which ran with kdq's 4 partitions, one job more than Connect, while only the command line had them.
CLIENT_SESSION_DEFAULTS = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "1",
}

# Loopback only: locally there is no authentication unless KDQ_SQL_PASSWORD is set (anyone on this
# machine may read the counts, as they may read the Delta files); set, it is required on JDBC and Spark Connect. Each JDBC/Connect client gets its own session of the one driver
# (singleSession false): SET and temporary views stay per client, tables and views are shared.
ENDPOINT_CONF = {
    # HiveServer2 reads its settings from the Hadoop conf the session builds (spark.hadoop.*).
    "spark.hadoop.hive.server2.transport.mode": "binary",
    "spark.sql.hive.thriftServer.singleSession": "false",
    # No ${key} substitution in client SQL: it would read any setting of a session, the server's own included (the
    # Thrift server copies its HiveConf, TLS keystore password and all, into each session); the read-only rule
    # refuses turning it back on.
    "spark.sql.variable.substitute": "false",
    **CLIENT_SESSION_DEFAULTS,
}

# Set in the endpoint's environment, it turns on the Thrift server's password (user: KDQ_SQL_USER, read by
# the Java provider itself).
PASSWORD_ENV = "KDQ_SQL_PASSWORD"


AUTHENTICATOR = "io.kdq.spark.sqlendpoint.SqlPasswordAuthenticator"

# The endpoint is read-only (kdq-spark-functions: io.kdq.spark.sqlendpoint.ReadOnlyExtension and its check rule, armed by
# kdq.spark.sql_server once the tables are registered; Spark Connect's requests that never become a plan go
# through the interceptor). Clients query the kdq tables and views; nothing they send writes or runs code.
READ_ONLY_EXTENSION = "io.kdq.spark.sqlendpoint.ReadOnlyExtension"
READ_ONLY_INTERCEPTOR = "io.kdq.spark.sqlendpoint.ReadOnlyConnectInterceptor"


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


# Spark Connect's pre-shared token (spark.connect.authenticate.token), read by the server from its environment so
# the password is on no command line: the same password as the Thrift server's.
CONNECT_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
# TLS of the Thrift server: a keystore file (PKCS12 or JKS, e.g. from `keytool -genkeypair`) and its password.
TLS_KEYSTORE_ENV = "KDQ_SQL_TLS_KEYSTORE"
TLS_KEYSTORE_PASSWORD_ENV = "KDQ_SQL_TLS_KEYSTORE_PASSWORD"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class EndpointSecurityError(ValueError):
    """The endpoint's security settings do not fit where it listens (raised before anything starts)."""


def security_check(env: Mapping[str, str], bind_host: str) -> None:
    """Refuse settings that would open the endpoint wider than meant: beyond loopback both protocols need the
    password and the Thrift server TLS; a keystore must exist and come with its password. The message names the
    variable and the problem, never a value."""
    keystore = env.get(TLS_KEYSTORE_ENV, "")
    if keystore:
        if not Path(keystore).is_file():
            raise EndpointSecurityError(f"{TLS_KEYSTORE_ENV}: no such keystore file: {keystore}")
        if not env.get(TLS_KEYSTORE_PASSWORD_ENV):
            raise EndpointSecurityError(f"{TLS_KEYSTORE_ENV} is set but {TLS_KEYSTORE_PASSWORD_ENV} is not")
    if bind_host not in LOOPBACK_HOSTS:
        missing = [name for name in (PASSWORD_ENV, TLS_KEYSTORE_ENV) if not env.get(name)]
        if missing:
            raise EndpointSecurityError(
                f"the SQL endpoint listens on {bind_host}, beyond loopback: set {' and '.join(missing)} "
                f"(clients log in with {PASSWORD_ENV} on JDBC and Spark Connect; the Thrift port speaks TLS with the "
                f"keystore {TLS_KEYSTORE_ENV}), or listen on 127.0.0.1"
            )


def endpoint_env(env: Mapping[str, str]) -> dict[str, str]:
    """What the endpoint's process gets in its environment besides kdq's child env: Spark Connect's token."""
    return {CONNECT_TOKEN_ENV: env[PASSWORD_ENV]} if env.get(PASSWORD_ENV) else {}


def thrift_tls_conf(env: Mapping[str, str]) -> dict[str, str]:
    """HiveServer2's TLS on the Thrift port when ``KDQ_SQL_TLS_KEYSTORE`` is set: a client must connect with
    ``ssl=true`` (and trust the certificate); a plaintext client is refused. The keystore's password is not here
    (the job sets it on the running session: kdq.spark.sql_server.serve), so it is on no command line."""
    if not env.get(TLS_KEYSTORE_ENV):
        return {}
    return {
        "spark.hadoop.hive.server2.use.SSL": "true",
        "spark.hadoop.hive.server2.keystore.path": str(Path(env[TLS_KEYSTORE_ENV]).resolve()),
    }


def self_signed_keystore(keystore: Path, password: str, names: Sequence[str]) -> bool:
    """Create ``keystore`` (PKCS12) with a new RSA key and a self-signed certificate for ``names`` (host names and
    IP addresses, its subject alternative names) unless it exists, and the certificate in PEM beside it
    (``<keystore>.crt``: what clients import into their trust store). JDK's keytool; the password goes through
    its environment, not its command line. Returns whether it created the keystore."""
    if keystore.exists():
        return False
    keytool = shutil.which("keytool") or str(Path(os.environ.get("JAVA_HOME", "/usr")) / "bin" / "keytool")
    if not Path(keytool).exists():
        raise EndpointSecurityError("keytool (the JDK's) is not on PATH nor in $JAVA_HOME/bin: cannot create a keystore")
    keystore.parent.mkdir(parents=True, exist_ok=True)
    san = ",".join(f"ip:{name}" if _is_ip(name) else f"dns:{name}" for name in dict.fromkeys(names))
    env = {**os.environ, "KDQ_KEYTOOL_STOREPASS": password}
    store = ["-keystore", str(keystore), "-storetype", "PKCS12", "-storepass:env", "KDQ_KEYTOOL_STOREPASS"]
    for args in (
        ["-genkeypair", "-alias", "kdq-sql", "-keyalg", "RSA", "-keysize", "3072", "-validity", "825",
         "-dname", "CN=kdq-sql-endpoint", "-ext", f"SAN={san}", *store],
        ["-exportcert", "-rfc", "-alias", "kdq-sql", "-file", f"{keystore}.crt", *store],
    ):
        done = subprocess.run([keytool, *args], env=env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            keystore.unlink(missing_ok=True)
            raise EndpointSecurityError(f"keytool {args[0]} failed: {(done.stderr or done.stdout).strip()[-500:]}")
    keystore.chmod(0o600)
    return True


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def thrift_auth_conf(env: Mapping[str, str], driver_java_options: str = "") -> dict[str, str]:
    """Password authentication of the Thrift server when ``KDQ_SQL_PASSWORD`` is set (the compose
    deployment sets it; locally it is optional): HiveServer2's CUSTOM mode with kdq's provider
    (``io.kdq.spark.sqlendpoint.SqlPasswordAuthenticator`` in the kdq-spark-functions jar), which reads the expected
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
            niceness=INTERACTIVE_NICENESS,  # it answers people: the one process of the stack at full priority
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
            **thrift_tls_conf(os.environ),
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
        from kdq.spark.stream_process import child_env

        if not self.process.running():
            try:
                security_check(os.environ, self.bind_host)
            except EndpointSecurityError as exc:
                raise StackError(f"sql-endpoint: {exc}") from None
            for port in (self.connect_port, self.thrift_port):
                if port_open(port):
                    raise StackError(f"sql-endpoint: port {port} is already in use by another program")
            self.home.mkdir(parents=True, exist_ok=True)
            self.process.start(self.command(), env={**child_env(self.config), **endpoint_env(os.environ)},
                               cwd=self.config.base_dir)
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
