"""The SQL endpoint's process definition: its command line, where `kdq sql` looks for it, and how `kdq
status` lists it when it died (no process is started here; tests/integration/test_sql_endpoint.py does)."""

from __future__ import annotations

import json

from kdq.stack.manager import LocalStack
from kdq.stack.sql_endpoint import running_endpoint
from tests.conftest import make_config


def test_command_binds_loopback_on_the_recorded_ports(tmp_path) -> None:
    config = make_config(tmp_path)
    stack = LocalStack(config)
    endpoint = stack.sql_endpoint
    state = json.loads(config.state_file.read_text())
    assert (state["sql_connect_port"], state["sql_thrift_port"]) == (endpoint.connect_port, endpoint.thrift_port)
    command = endpoint.command()
    confs = {command[i + 1].split("=", 1)[0]: command[i + 1].split("=", 1)[1]
             for i, part in enumerate(command) if part == "--conf"}
    assert confs["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert confs["spark.hadoop.hive.server2.thrift.bind.host"] == "127.0.0.1"
    assert confs["spark.connect.grpc.binding.port"] == str(endpoint.connect_port)
    assert confs["spark.hadoop.hive.server2.thrift.port"] == str(endpoint.thrift_port)
    # kdq's own session conf (Delta) reaches the endpoint's session, followed by the read-only rule (once on the
    # command line), and Spark Connect gets the read-only interceptor.
    assert confs["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension,io.kdq.spark.sqlendpoint.ReadOnlyExtension"
    assert sum(part.startswith("spark.sql.extensions=") for part in command) == 1
    assert confs["spark.connect.grpc.interceptor.classes"] == "io.kdq.spark.sqlendpoint.ReadOnlyConnectInterceptor"
    assert any(endpoint.process.marker in part for part in command)
    # Delta's classes on the driver class path as well (the Thrift server's threads need them).
    assert "delta-spark" in command[command.index("--driver-class-path") + 1]
    assert command[-7].endswith("sql_endpoint.py")
    assert command[-6:] == [
        "--host", "127.0.0.1", "--connect-port", str(endpoint.connect_port), "--thrift-port", str(endpoint.thrift_port)
    ]
    # Client sessions default to small-query settings, over kdq's own shuffle partitions (once on the command line).
    assert (confs["spark.sql.adaptive.enabled"], confs["spark.sql.shuffle.partitions"]) == ("false", "1")
    assert sum(part.startswith("spark.sql.shuffle.partitions=") for part in command) == 1
    # No password in the environment: no authentication conf (the compose deployment sets KDQ_SQL_PASSWORD).
    assert "spark.hadoop.hive.server2.authentication" not in confs


def test_password_turns_on_the_thrift_servers_custom_authentication(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KDQ_SQL_PASSWORD", "s3cret")
    endpoint = LocalStack(make_config(tmp_path)).sql_endpoint
    command = endpoint.command()
    confs = {command[i + 1].split("=", 1)[0]: command[i + 1].split("=", 1)[1]
             for i, part in enumerate(command) if part == "--conf"}
    assert confs["spark.hadoop.hive.server2.authentication"] == "CUSTOM"
    # Hive reads the provider class from a JVM system property, appended to the session's own Java options.
    options = confs["spark.driver.extraJavaOptions"]
    assert "-Dhive.server2.custom.authentication.class=io.kdq.spark.sqlendpoint.SqlPasswordAuthenticator" in options
    assert "-XX:+UseParallelGC" in options
    assert "s3cret" not in " ".join(command)  # the secret stays in the environment, off the command line


def test_read_only_conf_keeps_the_configured_extensions_and_interceptors() -> None:
    from kdq.stack.sql_endpoint import read_only_conf

    conf = read_only_conf({"spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension, x.Other",
                           "spark.connect.grpc.interceptor.classes": "x.Audit"})
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension,x.Other,io.kdq.spark.sqlendpoint.ReadOnlyExtension"
    assert conf["spark.connect.grpc.interceptor.classes"] == "x.Audit,io.kdq.spark.sqlendpoint.ReadOnlyConnectInterceptor"
    again = read_only_conf(conf)
    assert again == conf  # never twice
    assert read_only_conf({})["spark.sql.extensions"] == "io.kdq.spark.sqlendpoint.ReadOnlyExtension"


def test_a_container_binds_every_interface(tmp_path) -> None:
    from kdq.stack.sql_endpoint import LocalSqlEndpoint

    command = LocalSqlEndpoint(make_config(tmp_path), 15002, 10000, bind_host="0.0.0.0").command()
    assert "spark.connect.grpc.binding.address=0.0.0.0" in command
    assert "spark.hadoop.hive.server2.thrift.bind.host=0.0.0.0" in command
    assert command[-6:-4] == ["--host", "0.0.0.0"]


def test_not_started_dead_and_unknown_endpoints(tmp_path) -> None:
    config = make_config(tmp_path)
    assert running_endpoint(config) is None  # no stack state at all
    stack = LocalStack(config)
    assert running_endpoint(config) is None  # ports recorded, nothing listening
    assert "sql" not in [s.name for s in stack.status()]  # never started: not listed
    endpoint = stack.sql_endpoint
    endpoint.process.pid_file.parent.mkdir(parents=True)
    endpoint.process.pid_file.write_text("999999999")  # started, then died (a pid file `down` did not remove)
    sql = next(s for s in stack.status() if s.name == "sql")
    assert not sql.running and not sql.healthy and "stopped" in sql.line()
    assert not stack.sql_endpoint.stop()  # nothing to stop; the stale pid file goes
    assert not endpoint.process.pid_file.exists()
