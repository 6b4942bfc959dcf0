"""The always-on SQL endpoint: started by the stack's own code on a private data folder, rows written by
kdq's writers, numbers read back over the wire by real clients (Spark Connect, beeline over HiveServer2)
and by `kdq sql`; stopped with its ports freed."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import psutil
import pytest

from kdq.config import Config
from kdq.stack.manager import LocalStack
from kdq.stack.procs import port_open, quiet_port
from kdq.stack.sql_endpoint import LocalSqlEndpoint, running_endpoint
from tests.conftest import PROJECT_ROOT
from tests.integration.helpers import W0, write_config_file

BEELINE = PROJECT_ROOT / ".venv" / "bin" / "beeline"
# pyspark's launch scripts find SPARK_HOME through the first python3 on PATH: the venv's.
CHILD_ENV = {"PATH": f"{PROJECT_ROOT / '.venv' / 'bin'}:/usr/bin:/bin"}

CONNECT_QUERY = """
import json, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
rows = spark.sql(sys.argv[2]).collect()
print(json.dumps([list(r) for r in rows]))
spark.stop()
"""


@pytest.fixture
def endpoint(spark, spark_config: Config, spark_data_dir) -> Iterator[LocalSqlEndpoint]:
    """The endpoint over the ``spark`` fixture's tables (same data folder; a config file, so the spark-submit
    child loads exactly these settings), ports chosen and recorded by LocalStack; stopped in ``finally``."""
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


def _connect(url: str, query: str) -> list[list]:
    done = subprocess.run([sys.executable, "-c", CONNECT_QUERY, url, query], capture_output=True, text=True,
                          timeout=180, cwd=PROJECT_ROOT)
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
    # Views are registered too (and shared by every client session).
    tables = _connect(endpoint.connect_url, "SHOW TABLES IN kdq")
    assert {"window_counts", "raw_archive", "corrections", "invalid_reason_counts"} <= {t[1] for t in tables}

    # `kdq sql` finds the endpoint through the stack state and says so on stderr.
    assert running_endpoint(config) is not None
    done = subprocess.run(
        [sys.executable, "-m", "kdq.cli", "sql",
         f"SELECT status, sum(count) AS n FROM kdq.window_counts WHERE topic = '{topic}' GROUP BY 1 ORDER BY 1"],
        capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT,
        env={**CHILD_ENV, "KDQ_CONFIG": config.source},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"through the SQL endpoint {endpoint.connect_url}" in done.stderr
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in done.stdout.splitlines() if line.startswith("|")]
    assert cells == [["status", "n"], ["invalid", "2"], ["valid", "6"]]


@pytest.fixture
def password_endpoint(spark, spark_config: Config, spark_data_dir) -> Iterator[tuple[LocalSqlEndpoint, str]]:
    """The endpoint as a container runs it: `kdq sql-endpoint` in the foreground (the compose deployment's
    command), with KDQ_SQL_PASSWORD in its environment; SIGTERM stops it, in ``finally``."""
    config = write_config_file(spark_config, spark_data_dir / "kdq-sql-password.toml")
    endpoint = LocalSqlEndpoint(config, quiet_port(), quiet_port())
    password = f"pw-{uuid.uuid4().hex}"
    env = {**os.environ, **CHILD_ENV, "KDQ_CONFIG": config.source, "KDQ_SQL_PASSWORD": password}
    env.pop("KDQ_SQL_USER", None)
    command = [str(PROJECT_ROOT / ".venv" / "bin" / "kdq"), "sql-endpoint", "--host", "127.0.0.1",
               "--connect-port", str(endpoint.connect_port), "--thrift-port", str(endpoint.thrift_port)]
    log = open(spark_data_dir / "kdq-sql-endpoint-foreground.log", "wb")
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT)
    try:
        deadline = time.monotonic() + 300
        while not (port_open(endpoint.connect_port) and port_open(endpoint.thrift_port)):
            assert proc.poll() is None, (spark_data_dir / "kdq-sql-endpoint-foreground.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "kdq sql-endpoint did not open its ports within 300 s"
            time.sleep(1)
        yield endpoint, password
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


def test_thrift_server_requires_the_password_when_one_is_set(password_endpoint) -> None:
    """The compose deployment's setting: with KDQ_SQL_PASSWORD, JDBC clients must log in as KDQ_SQL_USER
    (default kdq) with that password (io.kdq.spark.SqlPasswordAuthenticator); the endpoint runs the way
    the compose service runs it (`kdq sql-endpoint` in the foreground) and stops on SIGTERM."""
    endpoint, password = password_endpoint
    query = "SELECT count(*) AS n FROM kdq.window_counts"
    rows = _beeline(endpoint.jdbc_url, query, password=password)
    assert len(rows) == 1 and int(rows[0]["n"]) >= 0
    for user, wrong in (("kdq", "wrong"), ("kdq", None), ("someone", password)):
        refused = _run_beeline(endpoint.jdbc_url, query, user=user, password=wrong)
        output = refused.stdout + refused.stderr
        assert refused.returncode != 0 and "Error" in output, (user, wrong, output[-2000:])
        assert "n\n" not in refused.stdout  # no result header: nothing was answered
