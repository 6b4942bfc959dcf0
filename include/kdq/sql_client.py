"""Spark Connect sessions to kdq's SQL endpoint, logged in with the endpoint's password.

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

import os
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
