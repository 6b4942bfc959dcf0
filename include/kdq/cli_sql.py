"""The `kdq` commands for SQL on the Delta tables: `sql` (through the running SQL endpoint, else a Spark session
of its own) and `sql-endpoint` (the endpoint in the foreground, a container's main process)."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from kdq.config import Config


def sql_endpoint(config: Config, args: argparse.Namespace) -> int:
    """The SQL endpoint in the foreground (a container's main process): the same spark-submit command as
    the local stack's, bound to ``--host``; replaces this process, so signals reach the endpoint itself."""
    from kdq.spark.stream_process import child_env
    from kdq.stack.sql_endpoint import (
        PASSWORD_ENV,
        TLS_KEYSTORE_ENV,
        TLS_KEYSTORE_PASSWORD_ENV,
        EndpointSecurityError,
        LocalSqlEndpoint,
        endpoint_env,
        security_check,
        self_signed_keystore,
    )

    try:
        keystore = os.environ.get(TLS_KEYSTORE_ENV)
        if args.self_signed_tls and keystore and os.environ.get(TLS_KEYSTORE_PASSWORD_ENV):
            names = [socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1", *args.tls_name]
            if self_signed_keystore(Path(keystore), os.environ[TLS_KEYSTORE_PASSWORD_ENV], names):
                print(f"kdq sql-endpoint: created a self-signed keystore {keystore} for {', '.join(dict.fromkeys(names))}; "
                      f"clients trust its certificate {keystore}.crt", flush=True)
        security_check(os.environ, args.host)
    except EndpointSecurityError as exc:
        print(f"kdq sql-endpoint: {exc}", file=sys.stderr)
        return 2
    endpoint = LocalSqlEndpoint(config, args.connect_port, args.thrift_port, bind_host=args.host)
    command = endpoint.command()
    protections = [what for what, on in (("password required on both", os.environ.get(PASSWORD_ENV)),
                                         ("Thrift over TLS", os.environ.get(TLS_KEYSTORE_ENV))) if on]
    print(f"kdq sql-endpoint: Spark Connect on {args.host}:{args.connect_port}, Thrift on {args.host}:{args.thrift_port}"
          + (f" ({', '.join(protections)})" if protections else ""), flush=True)
    os.execvpe(command[0], command, {**os.environ, **child_env(config), **endpoint_env(os.environ)})
    return 0  # not reached


def sql(config: Config, args: argparse.Namespace) -> int:
    """Through the running SQL endpoint (kdq.sql_client's light client: one Spark Connect call per statement, the
    table formatted by Spark as ``show()`` formats it; well under a second end to end on an idle machine), else a
    Spark session of its own (a JVM start, about a minute); stderr says which."""
    from kdq.stack.sql_endpoint import running_endpoint

    endpoint = None if args.local else running_endpoint(config)
    if endpoint is not None:
        print(f"kdq sql: through the SQL endpoint {endpoint.connect_url}", file=sys.stderr)
        return sql_through(endpoint.connect_url, args)
    from kdq.spark.session import build_session

    why = "--local" if args.local else "the SQL endpoint is not running (`kdq up` or `make run` start it)"
    print(f"kdq sql: {why}; starting a Spark session of its own ({config.spark_master()})", file=sys.stderr)
    spark = build_session(config, app_name="kdq-sql")
    try:
        for statement in args.statement:
            spark.sql(statement).show(args.limit, truncate=False)
    finally:
        spark.stop()
    return 0


def sql_through(url: str, args: argparse.Namespace) -> int:
    """Each statement's table as ``show(limit, truncate=False)`` prints it, in order; the first refused one ends
    the command (its message on stderr, exit status 1)."""
    from kdq.sql_client import LightConnectClient, SqlError

    with LightConnectClient(url) as client:
        for statement in args.statement:
            try:
                table = client.show(statement, args.limit)
            except SqlError as exc:
                print(f"kdq sql: {exc}", file=sys.stderr)
                return 1
            print(table, flush=True)
    return 0
