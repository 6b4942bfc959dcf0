"""`kdq sql`'s light Spark Connect client (kdq.sql_client): the URL and password as PySpark's client takes them, the
one ExecutePlan call it makes, against a fake Spark Connect server in this process (grpcio, no Spark); the real
endpoint is tests/integration/test_sql_endpoint.py's."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import pyarrow as pa
import pytest

from kdq import sql_client
from kdq.sql_client import LightConnectClient, SqlError, connect_protos, connect_target
from tests.conftest import PROJECT_ROOT

TABLE = "+------+---+\n|status|n  |\n+------+---+\n|valid |6  |\n+------+---+\n"


def test_a_plain_url_on_loopback() -> None:
    target = connect_target("sc://127.0.0.1:15002", env={})
    assert (target.endpoint, target.secure, target.token, target.metadata) == ("127.0.0.1:15002", False, None, ())
    assert connect_target("sc://localhost", env={}).endpoint == "localhost:15002"
    assert connect_target("sc://[::1]:1", env={}).endpoint == "[::1]:1"


def test_the_password_is_a_bearer_header_in_plaintext_and_the_token_over_tls() -> None:
    plain = connect_target("sc://127.0.0.1:15002", env={"KDQ_SQL_PASSWORD": "s3cret"})
    assert not plain.secure and plain.token is None
    assert plain.metadata == (("authorization", "Bearer s3cret"),)
    tls = connect_target("sc://sql.example:443/;use_ssl=true", env={"KDQ_SQL_PASSWORD": "s3cret"})
    assert tls.secure and tls.use_ssl and tls.token == "s3cret" and tls.metadata == ()
    # An argument wins over the environment; an empty password is none.
    assert connect_target("sc://h:1", password="other", env={"KDQ_SQL_PASSWORD": "s3cret"}).metadata == (
        ("authorization", "Bearer other"),)
    assert connect_target("sc://h:1", env={"KDQ_SQL_PASSWORD": ""}).metadata == ()


def test_url_parameters_as_pysparks_client_takes_them() -> None:
    target = connect_target("sc://h:1/;use_ssl=true;token=t%3Dx;user_id=ann;x-trace=on", env={"USER": "bob"})
    assert (target.token, target.user_id, target.metadata) == ("t=x", "ann", (("x-trace", "on"),))
    assert connect_target("sc://h:1", env={"USER": "bob"}).user_id == "bob"
    assert connect_target("sc://h:1", env={"SPARK_USER": "sp", "USER": "bob"}).user_id == "sp"
    # A token in SPARK_CONNECT_AUTHENTICATE_TOKEN makes PySpark's channel secure: the same here.
    assert connect_target("sc://localhost:1", env={"SPARK_CONNECT_AUTHENTICATE_TOKEN": "t"}).secure
    for bad in ("http://h:1", "sc://h:1/path", "sc://h:1/;novalue", "sc://:1"):
        with pytest.raises(ValueError):
            connect_target(bad, env={})


def test_the_protos_load_without_pysparks_sql_layer() -> None:
    """What makes the client light: no pandas, numpy or pyspark.sql's session in the process; and a later
    ``import pyspark.sql`` still initialises PySpark as usual."""
    code = (
        "import json, sys\n"
        "from kdq.sql_client import connect_protos, show_request\n"
        "pb = connect_protos()\n"
        "show_request(pb, 'SELECT 1', 5, '00000000-0000-4000-8000-000000000000', None)\n"
        "heavy = sorted(m for m in ('pandas', 'pyspark.sql.session', 'pyspark.sql.connect.session', 'py4j') if m in sys.modules)\n"
        "import pyspark.sql\n"
        "print(json.dumps({'heavy': heavy, 'session': hasattr(pyspark.sql, 'SparkSession')}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(PROJECT_ROOT / "include")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"heavy": [], "session": True}


def test_the_request_is_pysparks_show() -> None:
    pb = connect_protos()
    request = sql_client.show_request(pb, "SELECT 1", 7, "s-1", "ann")
    show = request.plan.root.show_string
    assert (show.input.sql.query, show.num_rows, show.truncate, show.vertical) == ("SELECT 1", 7, 0, False)
    assert (request.session_id, request.user_context.user_id) == ("s-1", "ann")


@dataclass
class FakeConnect:
    """A Spark Connect server that answers every ShowString with TABLE, refuses queries containing "boom", and
    checks the bearer header when it has a password."""

    password: str | None = None
    executed: list = field(default_factory=list)
    released: list = field(default_factory=list)
    headers: list = field(default_factory=list)

    def execute(self, request, context):
        metadata = dict(context.invocation_metadata())
        self.headers.append(metadata)
        if self.password and metadata.get("authorization") != f"Bearer {self.password}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "Invalid authentication token")
        self.executed.append(request)
        query = request.plan.root.show_string.input.sql.query
        if "boom" in query:
            context.abort(grpc.StatusCode.INTERNAL, "[TABLE_OR_VIEW_NOT_FOUND] The table `boom` cannot be found.")
        pb = connect_protos()
        sink = pa.BufferOutputStream()
        table = pa.table({"show_string": [TABLE]})
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        yield pb.ExecutePlanResponse(session_id=request.session_id)  # e.g. the schema, no batch
        yield pb.ExecutePlanResponse(session_id=request.session_id,
                                     arrow_batch=pb.ExecutePlanResponse.ArrowBatch(row_count=1, data=sink.getvalue().to_pybytes()))

    def release(self, request, context):
        self.released.append(request.session_id)
        return connect_protos().ReleaseSessionResponse(session_id=request.session_id)


@pytest.fixture
def fake() -> Iterator[tuple[FakeConnect, str]]:
    pb = connect_protos()
    service = FakeConnect()
    handler = grpc.method_handlers_generic_handler("spark.connect.SparkConnectService", {
        "ExecutePlan": grpc.unary_stream_rpc_method_handler(
            service.execute, request_deserializer=pb.ExecutePlanRequest.FromString,
            response_serializer=pb.ExecutePlanResponse.SerializeToString),
        "ReleaseSession": grpc.unary_unary_rpc_method_handler(
            service.release, request_deserializer=pb.ReleaseSessionRequest.FromString,
            response_serializer=pb.ReleaseSessionResponse.SerializeToString),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield service, f"sc://127.0.0.1:{port}"
    finally:
        server.stop(None)


def test_one_call_per_statement_then_the_session_is_released(fake, monkeypatch) -> None:
    service, url = fake
    monkeypatch.delenv("KDQ_SQL_PASSWORD", raising=False)
    with LightConnectClient(url, timeout=30) as client:
        assert client.show("SELECT 1", 20) == TABLE
        assert client.show("SELECT 2", 5) == TABLE
    assert [r.plan.root.show_string.input.sql.query for r in service.executed] == ["SELECT 1", "SELECT 2"]
    assert {r.session_id for r in service.executed} == {client.session_id}
    assert service.released == [client.session_id]
    assert all("authorization" not in h for h in service.headers)


def test_the_password_reaches_the_server_and_a_wrong_one_is_refused(fake, monkeypatch) -> None:
    service, url = fake
    service.password = "s3cret"
    monkeypatch.setenv("KDQ_SQL_PASSWORD", "s3cret")
    with LightConnectClient(url, timeout=30) as client:
        assert client.show("SELECT 1") == TABLE
    with LightConnectClient(url, password="wrong", timeout=30) as client, pytest.raises(SqlError, match="UNAUTHENTICATED"):
        client.show("SELECT 1")


def test_kdq_sql_prints_each_table_and_stops_at_a_refused_statement(fake, monkeypatch, capsys) -> None:
    from kdq import cli_sql

    service, url = fake
    monkeypatch.delenv("KDQ_SQL_PASSWORD", raising=False)
    args = argparse.Namespace(statement=["SELECT 1", "SELECT boom", "SELECT 3"], limit=50)
    assert cli_sql.sql_through(url, args) == 1
    out, err = capsys.readouterr()
    assert out == TABLE + "\n"  # as print(df._show_string(...)) prints it
    assert "kdq sql: [TABLE_OR_VIEW_NOT_FOUND] The table `boom` cannot be found." in err
    assert len(service.executed) == 2 and service.executed[0].plan.root.show_string.num_rows == 50
    assert len(service.released) == 1
    args.statement = ["SELECT 1", "SELECT 2"]
    assert cli_sql.sql_through(url, args) == 0
    assert capsys.readouterr().out == (TABLE + "\n") * 2
