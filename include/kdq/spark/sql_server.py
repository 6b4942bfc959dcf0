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
from kdq.spark.tables import table_path
from kdq.spark.writers import delta_snapshot
from kdq.tables import WINDOW_COUNTS, TableSpec

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


# The table the stream commits to in every micro-batch (every few seconds) that clients, dashboards and the quality page
# read most: the endpoint keeps its snapshot current itself (SnapshotRefresher). summaries is committed as often but
# read far less; refreshing it too doubled the refresher's work for queries that are rare.
FRESH_TABLES = (WINDOW_COUNTS,)
# The refresher works while clients query: until this long after the last Spark job it did not run itself.
ACTIVE_CLIENTS_SECONDS = 600.0


def jobs_started(spark: SparkSession) -> int | None:
    """How many Spark jobs this driver has started (the DAG scheduler's next job id), or None where that cannot be
    read (then the refresher treats clients as always active)."""
    try:
        return int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())
    except Exception:  # noqa: BLE001 - an internal of Spark's scheduler: without it, refresh always
        return None


class SnapshotRefresher:
    """Keeps the endpoint's Delta snapshot of the stream's busiest table current, so that no client query pays for it.

    Every query first brings its table's snapshot up to date (Delta lists the log); when the stream has committed
    since, the first query after the commit also pays for the new snapshot: the log's new entries read and the
    table's state rebuilt (Spark jobs over the checkpoint and the commits since), which every later query of that
    version reuses (one cache per table in the JVM, shared by every session of both doors). Beside ``make run``'s
    stream (a commit every ~10 s) that was half the time of a day's GROUP BY over JDBC: median 1.08 s for the
    queries that paid it against 0.51 s for those that did not (24 of 88), and whichever door came first after a
    commit paid (benchmarks/PERF_NOTES.md, issue 25, fourteenth pass).

    So a thread looks at the table's latest version every ``interval`` seconds (a listing of its ``_delta_log``, no
    Spark job; on object storage a LIST request per table and interval) and, when it moved, builds the new
    snapshot's state (``Snapshot.numOfFiles``: the reconstruction job whose cached result the queries' file listing
    reads) before a client asks. A query still sees every commit made before it starts (Delta's update on each
    query stays): it never reads an older snapshot, it only finds the newest one ready more often. The work is
    the same the first query after each commit did (~0.3-0.5 s on two cores), so it is done only while clients
    query: until ``active_seconds`` after the last Spark job that was not the refresher's. Failures are logged
    once and tried again at the next interval: the refresher only ever saves clients time."""

    def __init__(self, spark: SparkSession, config: Config, interval: float,
                 tables: tuple[TableSpec, ...] = FRESH_TABLES, active_seconds: float = ACTIVE_CLIENTS_SECONDS) -> None:
        self.spark = spark
        self.interval = interval
        self.active_seconds = active_seconds
        self.tables = [(spec.name, table_path(config, spec)) for spec in tables]
        self.versions: dict[str, int] = {}
        self.refreshes = 0
        self._failing: set[str] = set()
        self._jobs_seen = jobs_started(spark)
        self._active_at = time.monotonic()  # the start-up's warm-up counts as a client: refresh from the start

    def refresh_once(self) -> list[str]:
        """Bring every table whose log moved up to date (its state built); returns their names."""
        refreshed = []
        for name, path in self.tables:
            try:
                snapshot = delta_snapshot(self.spark, path)
                version = int(snapshot.version())
                if version < 0 or self.versions.get(name) == version:  # not created yet, or nothing new
                    continue
                snapshot.numOfFiles()
                self.versions[name] = version
                self.refreshes += 1
                refreshed.append(name)
                self._failing.discard(name)
            except Exception as exc:  # noqa: BLE001 - a failed refresh only leaves the work to the next query
                if name not in self._failing:
                    log.warning("could not refresh the snapshot of %s (tried again every %.1f s): %s",
                                name, self.interval, str(exc).splitlines()[0][:300])
                self._failing.add(name)
        return refreshed

    def clients_active(self) -> bool:
        """Whether a Spark job other than the refresher's started within ``active_seconds``."""
        jobs = jobs_started(self.spark)
        if jobs is None:
            return True
        if self._jobs_seen is None or jobs > self._jobs_seen:
            self._active_at = time.monotonic()
        self._jobs_seen = jobs
        return time.monotonic() - self._active_at <= self.active_seconds

    def tick(self) -> list[str]:
        """One look: refresh what moved while clients are active. The refresher's own jobs are not activity."""
        if not self.clients_active():
            return []
        refreshed = self.refresh_once()
        self._jobs_seen = jobs_started(self.spark)  # (a client's job started meanwhile is seen at its next one)
        return refreshed

    def run(self, stop: threading.Event) -> None:
        self.spark.sparkContext.setJobDescription("kdq: keeping window_counts' snapshot current")
        while not stop.wait(self.interval):
            self.tick()

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="kdq-snapshot-refresher", daemon=True)
        thread.start()
        return thread


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
    interval = config.spark.sql_endpoint_refresh_seconds
    if interval > 0:
        refresher = SnapshotRefresher(spark, config, interval)
        refresher.start(stop)
        log.info("keeping the snapshot of %s current while clients query (a look every %.1f s)",
                 ", ".join(name for name, _ in refresher.tables), interval)
    stop.wait()
    log.info("stopping the SQL endpoint")
    jvm.org.apache.spark.sql.connect.service.SparkConnectService.stop(
        jvm.scala.Option.empty(), jvm.scala.Option.empty()
    )
    if thrift is not None:
        thrift.stop()
    return EndpointReport()
