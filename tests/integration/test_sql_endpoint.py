"""The always-on SQL endpoint: started by the stack's own code on a private data folder, rows written by
kdq's writers, numbers read back over the wire by real clients (Spark Connect, beeline over HiveServer2)
and by `kdq sql`; stopped with its ports freed."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from kdq.config import Config
from kdq.procs import port_open, quiet_port
from kdq.stack.manager import LocalStack
from kdq.stack.sql_endpoint import LocalSqlEndpoint, running_endpoint
from tests.conftest import PROJECT_ROOT
from tests.integration.helpers import W0, write_config_file

BEELINE = PROJECT_ROOT / ".venv" / "bin" / "beeline"
# pyspark's launch scripts find SPARK_HOME through the first python3 on PATH: the venv's.
CHILD_ENV = {"PATH": f"{PROJECT_ROOT / '.venv' / 'bin'}:/usr/bin:/bin"}

# kdq's client: logged in with KDQ_SQL_PASSWORD from its environment when the test passes one.
CONNECT_QUERY = """
import json, sys
from kdq.sql_client import connect_builder
spark = connect_builder(sys.argv[1]).getOrCreate()
rows = spark.sql(sys.argv[2]).collect()
print(json.dumps([list(r) for r in rows]))
spark.stop()
"""

# `kdq sql`'s light client (one ExecutePlan call per statement): the same password from KDQ_SQL_PASSWORD.
LIGHT_QUERY = """
import sys
from kdq.sql_client import LightConnectClient, SqlError
with LightConnectClient(sys.argv[1], timeout=120) as client:
    try:
        print(client.show(sys.argv[2], 5))
    except SqlError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        sys.exit(1)
"""


@pytest.fixture(scope="module")
def endpoint(spark, spark_config: Config, spark_data_dir) -> Iterator[LocalSqlEndpoint]:
    """The endpoint over the ``spark`` fixture's tables (same data folder; a config file, so the spark-submit
    child loads exactly these settings), ports chosen and recorded by LocalStack; stopped in ``finally``. One
    endpoint for the module's tests (each writes its own topics)."""
    config = write_config_file(spark_config, spark_data_dir / "kdq-sql-endpoint.toml")
    endpoint = LocalStack(config).sql_endpoint
    try:
        endpoint.start(timeout=300)
        yield endpoint
    finally:
        endpoint.stop()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (port_open(endpoint.connect_port) or port_open(endpoint.thrift_port)):
            time.sleep(0.5)
        assert not port_open(endpoint.connect_port) and not port_open(endpoint.thrift_port)
        assert not endpoint.process.running()


def _client_env(password: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KDQ_SQL_PASSWORD", "SPARK_CONNECT_AUTHENTICATE_TOKEN")}
    return {**env, "KDQ_SQL_PASSWORD": password} if password is not None else env


def _run_connect(url: str, query: str, password: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CONNECT_QUERY, url, query], capture_output=True, text=True,
                          timeout=180, cwd=PROJECT_ROOT, env=_client_env(password))


def _connect(url: str, query: str, password: str | None = None) -> list[list]:
    done = _run_connect(url, query, password)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _run_beeline(url: str, query: str, user: str = "kdq", password: str | None = None) -> subprocess.CompletedProcess:
    login = ["-n", user, *(["-p", password] if password is not None else [])]
    return subprocess.run([str(BEELINE), "-u", url, *login, "--silent=true", "--outputformat=csv2", "-e", query],
                          capture_output=True, text=True, timeout=180, cwd=PROJECT_ROOT, env=CHILD_ENV)


def _beeline(url: str, query: str, password: str | None = None) -> list[dict]:
    done = _run_beeline(url, query, password=password)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    # With --silent the result's header follows the prompt ("0: jdbc:hive2://...> w,status,count").
    lines = [line.split("> ", 1)[-1] if line.startswith("0: jdbc") else line for line in done.stdout.splitlines()]
    lines = [line for line in lines if line and not line.startswith("WARNING")]
    return list(csv.DictReader(io.StringIO("\n".join(lines))))


def test_counts_over_spark_connect_jdbc_and_kdq_sql(spark, endpoint: LocalSqlEndpoint) -> None:
    from kdq.spark.writers import merge_window_increments

    config = endpoint.config
    topic = f"sql-{uuid.uuid4().hex[:8]}"
    app = f"test-{uuid.uuid4().hex[:8]}"
    first = [
        {"topic": topic, "window_start_ms": W0, "status": "valid", "count": 5, "rules_version": "r1"},
        {"topic": topic, "window_start_ms": W0, "status": "invalid", "count": 1, "rules_version": "r1"},
        {"topic": topic, "window_start_ms": W0 + 1000, "status": "invalid", "count": 1, "rules_version": "r1"},
    ]
    # Written after the endpoint started: a query sees the latest commit, not the snapshot of its start.
    merge_window_increments(spark, first, config, app, 0)
    late = [{"topic": topic, "window_start_ms": W0, "status": "valid", "count": 1, "rules_version": "r1"}]
    merge_window_increments(spark, late, config, app, 1)
    per_window = (
        f"SELECT unix_millis(window_start) AS w, status, count FROM kdq.window_counts "
        f"WHERE topic = '{topic}' ORDER BY w, status"
    )
    expected = [[W0, "invalid", 1], [W0, "valid", 6], [W0 + 1000, "invalid", 1]]

    assert _connect(endpoint.connect_url, per_window) == expected
    jdbc = _beeline(endpoint.jdbc_url, per_window)
    assert [[int(r["w"]), r["status"], int(r["count"])] for r in jdbc] == expected
    # The endpoint keeps window_counts' snapshot current itself while clients query (kdq.spark.sql_server.
    # SnapshotRefresher); a query right after a commit, whether or not the refresher has seen it, reads it.
    assert "keeping the snapshot of window_counts current" in endpoint.process.log_tail(200)
    for version in (2, 3):
        merge_window_increments(spark, late, config, app, version)
        expected[1][2] += 1
        assert _connect(endpoint.connect_url, per_window) == expected
    # Both doors' sessions start with the small-query defaults (kdq.stack.sql_endpoint.CLIENT_SESSION_DEFAULTS):
    # JDBC statements take the Thrift server's copy of the endpoint's own session settings, not the command line's.
    setting = "SET spark.sql.shuffle.partitions"
    assert _connect(endpoint.connect_url, setting) == [["spark.sql.shuffle.partitions", "1"]]
    assert _beeline(endpoint.jdbc_url, setting) == [{"key": "spark.sql.shuffle.partitions", "value": "1"}]
    # Views are registered too (and shared by every client session).
    tables = _connect(endpoint.connect_url, "SHOW TABLES IN kdq")
    assert {"window_counts", "raw_archive", "corrections", "invalid_reason_counts"} <= {t[1] for t in tables}

    # `kdq sql` finds the endpoint through the stack state and says so on stderr; its light client prints the
    # table exactly as `show(50, truncate=False)` prints it, statement after statement.
    assert running_endpoint(config) is not None
    sums = f"SELECT status, sum(count) AS n FROM kdq.window_counts WHERE topic = '{topic}' GROUP BY 1 ORDER BY 1"
    typed = f"SELECT '{topic}' AS t, array(1, 2) AS a, map('k', 1.5D) AS m, named_struct('x', NULL) AS s, DATE'2026-01-02' AS d"
    # This checkout's package first (the venv's editable install may point at another worktree).
    kdq_env = {**CHILD_ENV, "KDQ_CONFIG": config.source, "PYTHONPATH": str(PROJECT_ROOT / "include")}
    done = subprocess.run([sys.executable, "-m", "kdq.cli", "sql", sums, typed],
                          capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT, env=kdq_env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"through the SQL endpoint {endpoint.connect_url}" in done.stderr
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in done.stdout.splitlines() if line.startswith("|")]
    assert cells[:3] == [["status", "n"], ["invalid", "2"], ["valid", str(expected[1][2])]]
    assert done.stdout == "".join(spark.sql(q)._jdf.showString(50, 0, False) + "\n" for q in (sums, typed))
    # A refused statement: its message on stderr, exit status 1, no traceback.
    refused = subprocess.run([sys.executable, "-m", "kdq.cli", "sql", "SELECT * FROM kdq.no_such_table"],
                             capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT, env=kdq_env)
    assert refused.returncode == 1 and "TABLE_OR_VIEW_NOT_FOUND" in refused.stderr, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr


@dataclass(frozen=True)
class SecuredEndpoint:
    """The endpoint as the compose deployment runs it: its ports, its password, and what a JDBC client needs to
    trust its TLS certificate."""

    endpoint: LocalSqlEndpoint
    password: str
    truststore: Path
    truststore_password: str
    keystore_password: str
    log: Path

    @property
    def connect_url(self) -> str:
        return self.endpoint.connect_url

    @property
    def plaintext_jdbc_url(self) -> str:
        return self.endpoint.jdbc_url

    @property
    def jdbc_url(self) -> str:
        return f"{self.endpoint.jdbc_url};ssl=true;sslTrustStore={self.truststore};trustStorePassword={self.truststore_password}"


@pytest.fixture(scope="module")
def secured_endpoint(spark, spark_config: Config, spark_data_dir) -> Iterator[SecuredEndpoint]:
    """The endpoint started exactly as the compose service starts it: `kdq sql-endpoint --host 0.0.0.0 ...
    --self-signed-tls` in the foreground, with KDQ_SQL_PASSWORD and a keystore path that does not exist yet (so it
    creates a self-signed one, as on a compose deployment's first start) in its environment. Clients trust the
    certificate it writes beside the keystore. SIGTERM stops it, in ``finally``."""
    config = write_config_file(spark_config, spark_data_dir / "kdq-sql-password.toml")
    endpoint = LocalSqlEndpoint(config, quiet_port(), quiet_port())
    tls = spark_data_dir / f"tls-{uuid.uuid4().hex[:8]}"
    keystore, password, keystore_password = tls / "kdq-sql.p12", f"pw-{uuid.uuid4().hex}", f"ks-{uuid.uuid4().hex}"
    env = {**_client_env(None), **CHILD_ENV, "KDQ_CONFIG": config.source, "KDQ_SQL_PASSWORD": password,
           "KDQ_SQL_TLS_KEYSTORE": str(keystore), "KDQ_SQL_TLS_KEYSTORE_PASSWORD": keystore_password}
    env.pop("KDQ_SQL_USER", None)
    command = [str(PROJECT_ROOT / ".venv" / "bin" / "kdq"), "sql-endpoint", "--host", "0.0.0.0",
               "--connect-port", str(endpoint.connect_port), "--thrift-port", str(endpoint.thrift_port),
               "--self-signed-tls", "--tls-name", "sql-endpoint", "--tls-name", "localhost"]
    log_path = spark_data_dir / f"kdq-sql-endpoint-foreground-{uuid.uuid4().hex[:8]}.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT)
    try:
        deadline = time.monotonic() + 300
        while not (port_open(endpoint.connect_port) and port_open(endpoint.thrift_port)):
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "kdq sql-endpoint did not open its ports within 300 s"
            time.sleep(1)
        # What a JDBC client does with the certificate the endpoint wrote: a trust store of it.
        truststore, truststore_password = tls / "client-truststore.p12", f"ts-{uuid.uuid4().hex[:8]}"
        subprocess.run(["keytool", "-importcert", "-noprompt", "-alias", "kdq-sql", "-file", f"{keystore}.crt",
                        "-keystore", str(truststore), "-storetype", "PKCS12", "-storepass", truststore_password],
                       check=True, capture_output=True, timeout=120)
        yield SecuredEndpoint(endpoint, password, truststore, truststore_password, keystore_password, log_path)
    finally:
        family = [proc.pid]
        try:
            family += [child.pid for child in psutil.Process(proc.pid).children(recursive=True)]
        except psutil.Error:
            pass
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
        # SIGTERM reaches the JVM only (as a container stop does); its Python driver must follow it.
        processes = []
        for pid in family:
            try:
                processes.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        alive = psutil.wait_procs(processes, timeout=30)[1]
        for leftover in alive:
            leftover.kill()
        assert not alive, f"processes left after SIGTERM of kdq sql-endpoint: {[p.pid for p in alive]}"


def test_both_protocols_require_the_password_and_jdbc_speaks_tls(secured_endpoint: SecuredEndpoint) -> None:
    """The compose deployment's settings: JDBC clients log in as KDQ_SQL_USER (default kdq) with
    KDQ_SQL_PASSWORD (io.kdq.spark.sqlendpoint.SqlPasswordAuthenticator) over TLS only; Spark Connect clients present the same
    password as their bearer token (Spark's PreSharedKeyAuthenticationInterceptor); nothing is answered to a wrong
    or missing password, or to a plaintext JDBC client."""
    secured, password = secured_endpoint, secured_endpoint.password
    query = "SELECT count(*) AS n FROM kdq.window_counts"
    rows = _beeline(secured.jdbc_url, query, password=password)
    assert len(rows) == 1 and int(rows[0]["n"]) >= 0
    for user, wrong in (("kdq", "wrong"), ("kdq", None), ("someone", password)):
        refused = _run_beeline(secured.jdbc_url, query, user=user, password=wrong)
        output = refused.stdout + refused.stderr
        assert refused.returncode != 0 and "Error" in output, (user, wrong, output[-2000:])
        assert "n\n" not in refused.stdout  # no result header: nothing was answered
    # The right password in the clear, to the TLS port: the handshake fails, nothing is answered.
    plaintext = _run_beeline(secured.plaintext_jdbc_url, query, password=password)
    assert plaintext.returncode != 0 and "n\n" not in plaintext.stdout, plaintext.stdout[-2000:]
    assert "Could not open client transport" in plaintext.stdout + plaintext.stderr, plaintext.stderr[-2000:]

    # No client reads the server's settings: ${key} is not substituted, SET output is redacted.
    leaks = _beeline(secured.jdbc_url, "SELECT '${hive.server2.keystore.password}' AS v", password=password)
    assert leaks == [{"v": "${hive.server2.keystore.password}"}]
    listed = _run_beeline(secured.jdbc_url, "SET hive.server2.keystore.password", password=password)
    assert secured.keystore_password not in listed.stdout + listed.stderr
    # Settings in the JDBC URL (applied by the Thrift server when it opens the session, without a SET): refused.
    url_setting = _run_beeline(f"{secured.jdbc_url}?spark.sql.catalog.probe=org.example.Probe", query, password=password)
    assert url_setting.returncode != 0 and "n\n" not in url_setting.stdout
    assert ("kdq SQL endpoint is read-only: the setting spark.sql.catalog.probe of this session"
            in url_setting.stdout + url_setting.stderr), url_setting.stdout[-2000:]

    assert _connect(secured.connect_url, query, password=password)[0][0] >= 0
    for wrong in (None, "wrong"):
        refused = _run_connect(secured.connect_url, query, password=wrong)
        assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr, (wrong, refused.stderr[-2000:])
    # `kdq sql`'s light client too.
    light = subprocess.run([sys.executable, "-c", LIGHT_QUERY, secured.connect_url, query], capture_output=True,
                           text=True, timeout=180, cwd=PROJECT_ROOT, env=_client_env(password))
    assert light.returncode == 0, light.stderr[-2000:]
    assert light.stdout.splitlines()[1].replace(" ", "") == "|n|", light.stdout
    for wrong in (None, "wrong"):
        refused = subprocess.run([sys.executable, "-c", LIGHT_QUERY, secured.connect_url, query], capture_output=True,
                                 text=True, timeout=180, cwd=PROJECT_ROOT, env=_client_env(wrong))
        assert refused.returncode == 1 and "refused: UNAUTHENTICATED" in refused.stderr, (wrong, refused.stderr[-2000:])
        assert refused.stdout == ""
    # The endpoint said how it is protected, and no password is on its command line or in its log.
    said = secured.log.read_text(errors="replace")
    assert "(password required on both, Thrift over TLS)" in said and "created a self-signed keystore" in said
    assert password not in said and secured.keystore_password not in said
    endpoint_processes = [p for p in psutil.process_iter(["cmdline"])
                          if f"spark.kdq.sqlEndpoint.dataDir={secured.endpoint.config.data_dir}" in " ".join(p.info["cmdline"] or [])]
    assert endpoint_processes
    for process in endpoint_processes:
        command_line = " ".join(process.info["cmdline"])
        assert password not in command_line and secured.keystore_password not in command_line


# Each statement a client must not run, over JDBC and over Spark Connect's SQL; a refusal names what it refused.
REFUSED_SQL = {
    "CREATE TABLE kdq.probe (a INT) USING delta": "CreateTable is not allowed",
    "DROP TABLE kdq.window_counts": "DropTable is not allowed (only queries of the kdq tables and views)",
    "DELETE FROM kdq.window_counts": "DeleteCommand is not allowed",
    "INSERT INTO kdq.window_counts SELECT * FROM kdq.window_counts LIMIT 1": "AppendData is not allowed",
    "MERGE INTO kdq.window_counts t USING (SELECT * FROM kdq.window_counts LIMIT 1) s ON t.topic = s.topic "
    "WHEN MATCHED THEN DELETE": "MergeIntoCommand is not allowed",
    "ALTER TABLE kdq.window_counts ADD COLUMNS (probe INT)": "AddColumns is not allowed",
    "SELECT java_method('java.lang.System', 'getenv', 'HOME')": "(CallMethodViaReflection) is not allowed",
    "SELECT reflect('java.lang.System', 'getenv', 'HOME')": "(CallMethodViaReflection) is not allowed",
    "ADD JAR /tmp/kdq-probe.jar": "AddJarsCommand is not allowed",
    "CREATE FUNCTION kdq.probe AS 'java.lang.Object'": "CreateFunctionCommand is not allowed",
    "SET spark.kdq.sql.readOnly=false": "SET spark.kdq.sql.readOnly is not allowed",
    "SELECT TRANSFORM(topic) USING 'cat /etc/hostname' AS (x) FROM kdq.window_counts":
        "TRANSFORM ... USING (ScriptTransformation) is not allowed",
    "SELECT * FROM text.`/etc/hostname`": "reading file:/etc/hostname (outside the kdq tables' locations) is not allowed",
}
# Allowed: SHOW, DESCRIBE, a session setting a BI tool sends, USE.
ALLOWED_SQL = [
    "SHOW TABLES IN kdq",
    "DESCRIBE kdq.window_counts",
    "SET spark.sql.session.timeZone=UTC",
    "USE kdq",
]
REFUSAL = "kdq SQL endpoint is read-only: "

CONNECT_CHECKS = """
import json, os, sys, tempfile
from pyspark.sql.connect.functions import udf  # a Connect session made by a builder, not by .remote(url)
from kdq.sql_client import connect_builder
spark = connect_builder(sys.argv[1]).getOrCreate()
statements, allowed, topic = json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
def outcome(action):
    try:
        return {"ok": True, "rows": action()}
    except Exception as e:  # the client's exception, with the server's message
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
def rows(df):
    return [[str(v) for v in r] for r in df.collect()]
def upload_python_file():
    path = os.path.join(tempfile.mkdtemp(), "kdq_probe.py")
    with open(path, "w") as f:
        f.write("x = 1\\n")
    spark.addArtifacts(path, pyfile=True)
results = {"sql": {s: outcome(lambda s=s: rows(spark.sql(s))) for s in statements},
           "allowed": {s: outcome(lambda s=s: rows(spark.sql(s))) for s in allowed}}
table = spark.table("kdq.window_counts").where(f"topic = '{topic}'")
results["api"] = {
    "python udf": outcome(lambda: rows(spark.range(1).select(udf(lambda x: x)("id")))),
    "conf.set": outcome(lambda: spark.conf.set("spark.kdq.sql.readOnly", "false")),
    "write": outcome(lambda: table.write.format("delta").mode("append").saveAsTable("kdq.window_counts")),
    "read.text": outcome(lambda: rows(spark.read.text("/etc/hostname"))),
    "cache": outcome(lambda: table.cache().count()),
    "catalog.dropTable": outcome(lambda: spark.catalog.dropTable("kdq.window_counts")),
    "addArtifacts": outcome(upload_python_file),
}
spark.conf.set("spark.sql.session.timeZone", "UTC")  # a session setting: allowed
table.createOrReplaceTempView("mine")  # a temporary view of the client's own: allowed
results["reads"] = {
    "table": rows(table.groupBy("status").sum("count").orderBy("status")),
    "view": rows(spark.sql("SELECT status, sum(count) FROM mine GROUP BY status ORDER BY status")),
}
print(json.dumps(results))
spark.stop()
"""


def _beeline_each(url: str, statements: list[str], folder: Path, password: str | None = None) -> dict[str, str]:
    """Every statement in one beeline session (one JVM: a beeline start costs seconds on the loaded machine), each
    after a marker query, errors not stopping it (a script file with --force); the output (stdout and stderr in
    order) of each statement."""
    script = folder / f"beeline-{uuid.uuid4().hex[:8]}.sql"
    # A marker after the last statement too: each statement's output is what lies between two markers.
    script.write_text("".join(f"SELECT 'kdq-marker-{i}' AS m;\n{statement};\n" for i, statement in enumerate(statements))
                      + f"SELECT 'kdq-marker-{len(statements)}' AS m;\n")
    done = subprocess.run(
        [str(BEELINE), "-u", url, "-n", "kdq", *(["-p", password] if password is not None else []), "--silent=true",
         "--outputformat=csv2", "--force=true", "-f", str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, cwd=PROJECT_ROOT, env=CHILD_ENV,
    )
    output, outputs = done.stdout, {}
    (folder / f"{script.stem}.out").write_text(output)
    for i, statement in enumerate(statements):
        start = output.find(f"kdq-marker-{i}")
        end = output.find(f"kdq-marker-{i + 1}")
        assert 0 <= start < end, output[-3000:]
        outputs[statement] = output[start:end]
    return outputs


def _window_counts_state(spark) -> tuple[int, int]:
    """(rows, Delta version) of kdq.window_counts, read by the test's own session."""
    rows = spark.sql("SELECT count(*) FROM kdq.window_counts").first()[0]
    version = spark.sql("DESCRIBE HISTORY kdq.window_counts LIMIT 1").first()["version"]
    return rows, version


def test_the_endpoint_is_read_only_over_jdbc_and_spark_connect(spark, secured_endpoint: SecuredEndpoint) -> None:
    """Read-only: every statement that writes, changes state or runs code is refused over both protocols with a
    message naming it (io.kdq.spark.sqlendpoint.ReadOnlyExtension's check rule; Spark Connect's other requests by
    io.kdq.spark.sqlendpoint.ReadOnlyConnectInterceptor), and the tables are unchanged afterwards; reads keep working,
    including of a commit made after the endpoint started (Delta's log replay passes the rule). On the endpoint as
    the compose deployment runs it, logged in with the right password (JDBC over TLS)."""
    from kdq.spark.writers import merge_window_increments

    endpoint, password = secured_endpoint.endpoint, secured_endpoint.password

    topic = f"ro-{uuid.uuid4().hex[:8]}"
    rows = [{"topic": topic, "window_start_ms": W0, "status": "valid", "count": 3, "rules_version": "r1"},
            {"topic": topic, "window_start_ms": W0, "status": "invalid", "count": 2, "rules_version": "r1"}]
    merge_window_increments(spark, rows, endpoint.config, f"test-{uuid.uuid4().hex[:8]}", 0)
    before = _window_counts_state(spark)

    statements = list(REFUSED_SQL)
    done = subprocess.run(
        [sys.executable, "-c", CONNECT_CHECKS, endpoint.connect_url, json.dumps(statements), json.dumps(ALLOWED_SQL),
         topic],
        capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT, env=_client_env(password),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    connect = json.loads(done.stdout.strip().splitlines()[-1])
    (endpoint.home / "read-only-connect.json").write_text(json.dumps(connect, indent=1))  # what the clients saw
    assert connect["reads"] == {"table": [["invalid", "2"], ["valid", "3"]], "view": [["invalid", "2"], ["valid", "3"]]}
    # PySpark raises an AnalysisException for each, from the check rule as from the interceptor.
    for statement, expected in REFUSED_SQL.items():
        result = connect["sql"][statement]
        assert not result["ok"] and result["error"].startswith(f"AnalysisException: {REFUSAL}"), (statement, result)
        assert expected in result["error"], (statement, result)
    for statement in ALLOWED_SQL:
        assert connect["allowed"][statement]["ok"], (statement, connect["allowed"][statement])
    # `kdq sql`'s light client sends the same plans' SQL (inside a ShowString): refused alike.
    for statement in ("DROP TABLE kdq.window_counts", "SELECT reflect('java.lang.System', 'getenv', 'HOME')"):
        light = subprocess.run([sys.executable, "-c", LIGHT_QUERY, endpoint.connect_url, statement], capture_output=True,
                               text=True, timeout=180, cwd=PROJECT_ROOT, env=_client_env(password))
        assert light.returncode == 1 and f"refused: {REFUSAL}" in light.stderr, (statement, light.stderr[-2000:])
        assert REFUSED_SQL[statement] in light.stderr, (statement, light.stderr[-2000:])
    api_expected = {
        "python udf": "a user-defined function of the client is not allowed",
        "conf.set": "setting spark.kdq.sql.readOnly is not allowed",
        "write": "WRITE_OPERATION",
        "read.text": "reading a data source by format or path (text) is not allowed",
        "cache": "persist/cache of a DataFrame is not allowed",
        "catalog.dropTable": "the catalog call DROP_TABLE is not allowed",
        "addArtifacts": "uploading the artifact pyfiles/kdq_probe.py is not allowed",
    }
    for action, expected in api_expected.items():
        result = connect["api"][action]
        assert not result["ok"] and result["error"].startswith(f"AnalysisException: {REFUSAL}"), (action, result)
        assert expected in result["error"], (action, result)

    count = f"SELECT count(*) AS kdq_rows FROM kdq.window_counts WHERE topic = '{topic}'"
    endpoint.home.mkdir(parents=True, exist_ok=True)
    jdbc = _beeline_each(secured_endpoint.jdbc_url, [*statements, *ALLOWED_SQL, count], endpoint.home, password)
    for statement, expected in REFUSED_SQL.items():
        assert REFUSAL in jdbc[statement] and expected in jdbc[statement], (statement, jdbc[statement][-1500:])
    for statement in ALLOWED_SQL:
        assert "Error" not in jdbc[statement], (statement, jdbc[statement][-1500:])
    # (beeline's own progress lines may come in between while the query runs a job)
    assert re.search(r"kdq_rows\s*\n\s*2\s*\n", jdbc[count]), jdbc[count]

    # Nothing changed: the same rows and Delta version, no new table.
    assert _window_counts_state(spark) == before
    assert not spark.catalog.tableExists("kdq.probe")
    # The endpoint's log names each refusal (for whoever runs it).
    assert "refused: kdq SQL endpoint is read-only: DropTable" in secured_endpoint.log.read_text(errors="replace")
