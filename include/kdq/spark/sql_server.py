"""The always-on SQL endpoint's servers, started on a session whose tables are registered
(``spark_jobs/sql_endpoint.py`` calls :func:`serve`; :mod:`kdq.stack.sql_endpoint` starts that job).

Two protocols from one session (one JVM, one copy of Delta's snapshot caches):

* **Spark Connect** (gRPC, ``sc://host:P``): PySpark's ``SparkSession.builder.remote``, `kdq sql`;
* **Spark Thrift Server** (HiveServer2 binary protocol, ``jdbc:hive2://host:Q/kdq``): beeline, JDBC
  and ODBC clients, BI tools.

Both servers start only after every table and view is registered in the ``kdq`` schema (the session
factory creates missing tables first), so an open port means the names resolve: a client never sees a
half-registered catalog, and a table the stream creates later is already there because all of them are
created at start. Every client session is a new session over the same in-memory catalog (tables and
views are shared; SET and temporary views are per client). Reads go through Delta's snapshot
isolation: a query sees the last committed MERGE of the stream, never half of one.

The endpoint is read-only for its clients: before either port opens, :func:`make_read_only` arms kdq's check rule
(``io.kdq.spark.sqlendpoint.ReadOnlyExtension`` in ``spark.sql.extensions``, set by :mod:`kdq.stack.sql_endpoint`) in every
session of the driver, so DDL, DML, ``ADD JAR``, ``CREATE FUNCTION``, ``SET`` of non-session settings, reflection,
scripts, UDFs and reads outside the tables' locations are refused with ``kdq SQL endpoint is read-only: ...``;
Spark Connect requests that never become a plan are refused by ``io.kdq.spark.sqlendpoint.ReadOnlyConnectInterceptor``.

Runs until SIGTERM (``kdq down``), then stops both servers.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

from pyspark.sql import SparkSession

from kdq.config import Config
from kdq.job_reports import EndpointReport

log = logging.getLogger("kdq.sql_endpoint")


def warm_up(spark, config: Config) -> None:
    """One small aggregate over window_counts before the ports open: the first client query otherwise pays
    for Delta's and Spark's class loading, code generation and the first log replay (measured: 15 s cold
    vs 1 s warm on the 2-core machine). Only the last two days' partitions are read."""
    started = time.monotonic()
    spark.sql(
        f"SELECT status, sum(count) FROM {config.spark.database}.window_counts "
        "WHERE window_date >= date_sub(current_date(), 1) GROUP BY status"
    ).collect()
    log.info("warmed up in %.1f s", time.monotonic() - started)


READ_ONLY_EXTENSION = "io.kdq.spark.sqlendpoint.ReadOnlyExtension"


def make_read_only(spark: SparkSession) -> str:
    """Arm the read-only check in every session of this driver (the start-up's own writes, creating and
    registering the tables, are done): one-way, JVM-wide, not a setting a client could change. Raises when the
    extension is missing from the class path or from ``spark.sql.extensions``: the endpoint must not open then."""
    from py4j.java_gateway import JavaClass

    extension = spark.sparkContext._jvm.io.kdq.spark.sqlendpoint.ReadOnlyExtension
    if not isinstance(extension, JavaClass):
        raise RuntimeError(
            f"{READ_ONLY_EXTENSION} is not on the SQL endpoint's class path (kdq-spark-functions.jar: run `make setup`)"
        )
    return extension.enforce(spark._jsparkSession)


def serve(
    spark: SparkSession,
    config: Config,
    host: str,
    connect_port: int,
    thrift_port: int = 0,
    stop: threading.Event | None = None,
    keystore_password: str | None = None,
) -> EndpointReport:
    """Start the servers on the session (its tables registered), block until ``stop`` or SIGTERM.

    The ports are the session's (``spark.connect.grpc.binding.port``, ``hive.server2.thrift.port``, set
    by :mod:`kdq.stack.sql_endpoint`); ``host``/``connect_port``/``thrift_port`` name them in the log, and a
    ``thrift_port`` of 0 means no Thrift server. ``keystore_password``: the password of the Thrift server's TLS
    keystore (``hive.server2.keystore.path`` on the command line), set on the session's Hadoop conf only here, in
    the running JVM, so that it is on no command line and in no Spark UI page."""
    stop = stop or threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    jvm = spark.sparkContext._jvm
    warm_up(spark, config)
    log.info("%s", make_read_only(spark))
    thrift = None
    if thrift_port:
        if keystore_password:
            # HiveServer2 reads its settings from a copy of this conf made when it starts (startWithContext).
            spark.sparkContext._jsc.hadoopConfiguration().set("hive.server2.keystore.password", keystore_password)
        thrift = jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2.startWithContext(
            spark._jsparkSession.sqlContext()
        )
        log.info("Thrift server (HiveServer2) on %s:%d", host, thrift_port)
    jvm.org.apache.spark.sql.connect.service.SparkConnectService.start(spark.sparkContext._jsc.sc())
    log.info("Spark Connect on sc://%s:%d", host, connect_port)
    stop.wait()
    log.info("stopping the SQL endpoint")
    jvm.org.apache.spark.sql.connect.service.SparkConnectService.stop(
        jvm.scala.Option.empty(), jvm.scala.Option.empty()
    )
    if thrift is not None:
        thrift.stop()
    return EndpointReport()
