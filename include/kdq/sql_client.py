"""Spark Connect sessions to kdq's SQL endpoint, logged in with the endpoint's password; and `kdq sql`'s light
client (:class:`LightConnectClient`: one ExecutePlan call per statement, no PySpark session).

The endpoint requires ``KDQ_SQL_PASSWORD`` on both protocols when it is set (:mod:`kdq.stack.sql_endpoint`):
the Thrift server as a JDBC password, Spark Connect as its pre-shared bearer token
(``spark.connect.authenticate.token``; the server reads it from ``SPARK_CONNECT_AUTHENTICATE_TOKEN`` in its
environment, never from the command line). kdq's own clients (``kdq sql``, the data-quality page, the
benchmarks) open their sessions here, with the password from their environment.

How the token travels: over TLS when the URL says ``use_ssl=true`` (Spark's own client); otherwise as the
``authorization: Bearer`` header of a plaintext gRPC channel. Spark's client refuses a token without TLS
except to ``localhost``; kdq sends it in the clear on purpose, but only where the Connect port is: on loopback
locally, and on the compose deployment's private network, where the endpoint's Connect port is never published
(docs/security.md). A Spark Connect server does not terminate TLS itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
import urllib.parse
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PASSWORD_ENV = "KDQ_SQL_PASSWORD"


def connect_builder(url: str, password: str | None = None) -> Any:
    """A ``SparkSession.Builder`` for Spark Connect at ``url`` (``sc://host:port``), with ``password`` (default:
    ``KDQ_SQL_PASSWORD`` from the environment; none when unset or empty) as the bearer token. Call its
    ``getOrCreate()`` or ``create()``."""
    from pyspark.sql.connect.client import DefaultChannelBuilder
    from pyspark.sql.connect.session import SparkSession

    if password is None:
        password = os.environ.get(PASSWORD_ENV) or None
    channel = DefaultChannelBuilder(url)
    if password:
        if channel.use_ssl:
            channel.set(DefaultChannelBuilder.PARAM_TOKEN, password)
        else:
            # Every parameter that is not the channel's own goes as gRPC metadata on each call: the header
            # Spark's PreSharedKeyAuthenticationInterceptor checks, without Spark's TLS-only rule for tokens.
            channel.set("authorization", f"Bearer {password}")
    return SparkSession.builder.channelBuilder(channel)


def connect_session(url: str, password: str | None = None) -> Any:
    """A new Spark Connect session (``connect_builder(url, password).create()``)."""
    return connect_builder(url, password).create()


# ---------------------------------------------------------------------------------------------------------------
# The light client of `kdq sql`: one Spark Connect request per statement, without PySpark's client.
#
# Importing PySpark's Connect client (pyspark.sql.connect: pandas, numpy, PySpark's whole SQL layer) takes about a
# second of CPU, several on a loaded 2-core machine, before the first byte goes out; its session then asks the
# server for settings, and `spark.sql(q).show()` analyses the statement on the server twice (SqlCommand, then the
# ShowString plan). `kdq sql` only prints a table, and Spark Connect can format it on the server: a ShowString
# relation over the SQL relation is exactly what PySpark's `DataFrame.show()` sends, so the printed table is Spark's
# own, byte for byte. Here that plan goes out as one ExecutePlan call over grpcio with PySpark's generated protobuf
# messages (loaded without PySpark's package initialisation), its one-cell Arrow answer read with pyarrow.
# ---------------------------------------------------------------------------------------------------------------

CONNECT_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"  # PySpark's client reads a token there too
DEFAULT_CONNECT_PORT = 15002
_CHANNEL_PARAMS = ("token", "use_ssl", "user_id", "user_agent", "session_id")
_SERVICE = "/spark.connect.SparkConnectService/"
_MAX_MESSAGE = 128 * 1024 * 1024  # PySpark's default


class SqlError(Exception):
    """The endpoint refused or failed a statement (its message), or could not be reached."""


@dataclass(frozen=True)
class ConnectTarget:
    """How to reach a Spark Connect endpoint: what PySpark's ``DefaultChannelBuilder`` makes of an ``sc://`` URL,
    with kdq's password applied as :func:`connect_builder` applies it."""

    endpoint: str  # host:port for grpc
    host: str
    use_ssl: bool = False
    token: str | None = None  # sent as call credentials (over TLS, or to localhost over local credentials)
    metadata: tuple[tuple[str, str], ...] = ()  # sent as headers on each call
    user_id: str | None = None

    @property
    def secure(self) -> bool:
        return self.use_ssl or self.token is not None


def connect_target(url: str, password: str | None = None, env: Mapping[str, str] | None = None) -> ConnectTarget:
    """Parse ``sc://host[:port][/;key=value...]`` as PySpark does and add the password (default: ``KDQ_SQL_PASSWORD``
    from ``env``): Spark's token over TLS when the URL says ``use_ssl=true``, else the ``authorization: Bearer``
    header of a plaintext channel (see the module's docstring). Raises ValueError on a malformed URL."""
    env = os.environ if env is None else env
    if not url.startswith("sc://"):
        raise ValueError(f"a Spark Connect URL starts with sc://, not {url!r}")
    parsed = urllib.parse.urlparse("http" + url[2:])
    if parsed.path not in ("", "/"):
        raise ValueError(f"a Spark Connect URL has no path ({parsed.path!r} in {url!r})")
    params: dict[str, str] = {}
    for part in parsed.params.split(";") if parsed.params else ():
        key, sep, value = part.partition("=")
        if not sep or "=" in value:
            raise ValueError(f"parameter {part!r} of a Spark Connect URL is not key=value")
        params[key] = urllib.parse.unquote(value)
    if not parsed.hostname:
        raise ValueError(f"no host in the Spark Connect URL {url!r}")
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    use_ssl = params.get("use_ssl", "").lower() == "true"
    if password is None:
        password = env.get(PASSWORD_ENV) or None
    if password:
        if use_ssl:
            params["token"] = password
        else:
            params["authorization"] = f"Bearer {password}"
    return ConnectTarget(
        endpoint=f"{host}:{parsed.port or DEFAULT_CONNECT_PORT}",
        host=host,
        use_ssl=use_ssl,
        token=params.get("token", env.get(CONNECT_TOKEN_ENV)),
        metadata=tuple((k, v) for k, v in params.items() if k not in _CHANNEL_PARAMS),
        user_id=params.get("user_id") or env.get("SPARK_USER") or env.get("USER") or None,
    )


def connect_protos() -> Any:
    """PySpark's generated Spark Connect messages (``pyspark.sql.connect.proto.base_pb2``) without running the
    ``__init__`` of ``pyspark``, ``pyspark.sql`` and ``pyspark.sql.connect`` (which import PySpark's whole SQL layer,
    pandas and numpy): those packages are stood in for by empty ones while the messages load, then removed again,
    so a later ``import pyspark`` in the same process initialises them as usual."""
    name = "pyspark.sql.connect.proto.base_pb2"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("pyspark is not installed")
    root = Path(list(spec.submodule_search_locations)[0])
    stand_ins = {}
    for package in ("pyspark", "pyspark.sql", "pyspark.sql.connect", "pyspark.sql.connect.proto"):
        if package not in sys.modules:
            module = types.ModuleType(package)
            module.__path__ = [str(root.joinpath(*package.split(".")[1:]))]
            sys.modules[package] = stand_ins[package] = module
    try:
        return importlib.import_module(name)
    finally:
        for package, module in stand_ins.items():
            if sys.modules.get(package) is module:
                del sys.modules[package]


def show_request(pb: Any, statement: str, limit: int, session_id: str, user_id: str | None) -> Any:
    """The ExecutePlanRequest of ``spark.sql(statement).show(limit, truncate=False)``: a ShowString relation (Spark
    formats the table) over the SQL relation."""
    request = pb.ExecutePlanRequest(session_id=session_id, client_type="kdq-sql")
    if user_id:
        request.user_context.user_id = user_id
    show = request.plan.root.show_string
    show.input.sql.query = statement
    show.num_rows = limit
    show.truncate = 0
    show.vertical = False
    return request


def shown_table(responses: Any) -> str:
    """The one string cell of a ShowString plan's answer (Arrow IPC batches in ExecutePlanResponse messages)."""
    import pyarrow as pa
    import pyarrow.ipc

    tables = [pyarrow.ipc.open_stream(r.arrow_batch.data).read_all() for r in responses if r.HasField("arrow_batch")]
    tables = [t for t in tables if t.num_rows]
    if not tables:
        raise SqlError("the endpoint answered with no table")
    return pa.concat_tables(tables).column(0)[0].as_py()


class LightConnectClient:
    """One Spark Connect session on a grpc channel: ``show(statement, limit)`` returns the table ``show()`` would
    print; ``close()`` releases the session on the server (as ``SparkSession.stop()`` does) and the channel."""

    def __init__(self, url: str, password: str | None = None, timeout: float | None = None) -> None:
        import grpc

        self._grpc = grpc
        self._pb = connect_protos()
        self.target = connect_target(url, password)
        self.timeout = timeout
        self.session_id = str(uuid.uuid4())
        options = [("grpc.max_send_message_length", _MAX_MESSAGE), ("grpc.max_receive_message_length", _MAX_MESSAGE)]
        target = self.target
        if not target.secure:
            self._channel = grpc.insecure_channel(target.endpoint, options=options)
        else:
            if not target.use_ssl and target.host == "localhost":
                credentials = grpc.local_channel_credentials()
            else:
                credentials = grpc.ssl_channel_credentials()
            if target.token is not None:
                credentials = grpc.composite_channel_credentials(
                    credentials, grpc.access_token_call_credentials(target.token)
                )
            self._channel = grpc.secure_channel(target.endpoint, credentials, options=options)
        pb = self._pb
        self._execute = self._channel.unary_stream(
            _SERVICE + "ExecutePlan", request_serializer=pb.ExecutePlanRequest.SerializeToString,
            response_deserializer=pb.ExecutePlanResponse.FromString)
        self._release = self._channel.unary_unary(
            _SERVICE + "ReleaseSession", request_serializer=pb.ReleaseSessionRequest.SerializeToString,
            response_deserializer=pb.ReleaseSessionResponse.FromString)
        self._used = False

    def show(self, statement: str, limit: int = 20) -> str:
        request = show_request(self._pb, statement, limit, self.session_id, self.target.user_id)
        self._used = True
        try:
            return shown_table(self._execute(request, metadata=self.target.metadata, timeout=self.timeout))
        except self._grpc.RpcError as exc:
            raise SqlError(_rpc_message(exc)) from None

    def close(self) -> None:
        try:
            if self._used:
                request = self._pb.ReleaseSessionRequest(session_id=self.session_id, client_type="kdq-sql")
                if self.target.user_id:
                    request.user_context.user_id = self.target.user_id
                self._release(request, metadata=self.target.metadata, timeout=10)
        except self._grpc.RpcError:
            pass  # the endpoint went away: nothing of this session is left to release
        finally:
            self._channel.close()

    def __enter__(self) -> LightConnectClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _rpc_message(exc: Any) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code is not None and code.name in ("UNAVAILABLE", "UNAUTHENTICATED", "DEADLINE_EXCEEDED", "PERMISSION_DENIED"):
        return f"{code.name}: {details}"
    return details or str(exc)
