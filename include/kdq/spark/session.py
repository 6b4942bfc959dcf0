"""The one SparkSession factory used by every job, the CLI and the tests.

Tables are registered by location in each session (in-memory catalog) rather
than in a shared Hive/Derby metastore: the embedded Derby metastore admits a
single process, and the stream, the batch jobs, the CLI and the tests are
separate processes. Registering ``CREATE TABLE ... USING delta LOCATION`` is
idempotent and cheap (it reads only the Delta log's last checkpoint), so every
session sees every table by name.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from kdq import storage
from kdq.config import Config, ConfigError
from kdq.tables import AUTO_COMPACT_MIN_FILES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The jars scripts/setup.sh copies from Maven Central (jvm/spark-connectors/pom.xml).
REQUIRED_JAR_PREFIXES = (
    "spark-sql-kafka-0-10_2.13-",
    "spark-token-provider-kafka-0-10_2.13-",
    "kafka-clients-",
    "commons-pool2-",
    "delta-spark_2.13-",
    "delta-storage-",
)


# S3A's jar in <jars_dir>/hadoop-aws (jvm/hadoop-aws/pom.xml), at the Hadoop version inside pyspark.
HADOOP_AWS_PREFIX = "hadoop-aws-"
# kdq's DynamoDB log store (jvm/hadoop-aws/kdq-dynamodb) and the AWS SDK v2 DynamoDB module it uses.
DYNAMODB_LOG_STORE_JARS = ("kdq-dynamodb", "dynamodb-2.")

# kdq's own JVM functions (the record classifier), built from jvm/kdq-spark-functions by scripts/setup.sh.
KDQ_FUNCTIONS_JAR = Path("kdq") / "kdq-spark-functions.jar"


def connector_jars(config: Config) -> list[Path]:
    """The cached Kafka-connector and Delta jars and kdq's functions jar; a clear error when set-up has not
    made them."""
    folder = config.jars_dir / "spark"
    jars = sorted(folder.glob("*.jar"))
    missing = [p for p in REQUIRED_JAR_PREFIXES if not any(j.name.startswith(p) for j in jars)]
    if missing:
        raise ConfigError(
            f"paths.jars_dir: {folder} lacks {', '.join(m.rstrip('-') for m in missing)}; "
            "run `make setup` (scripts/setup.sh) to fetch them with Maven"
        )
    functions = config.jars_dir / KDQ_FUNCTIONS_JAR
    if not functions.is_file():
        raise ConfigError(
            f"paths.jars_dir: {functions} is missing; run `make setup` (scripts/setup.sh builds it from "
            "jvm/kdq-spark-functions with Maven)"
        )
    return [*jars, functions, *storage_jars(config)]


def storage_jars(config: Config) -> list[Path]:
    """The S3A connector (hadoop-aws and the AWS SDK modules it uses) and kdq's DynamoDB log store when tables and
    checkpoints are on ``s3a://`` (``paths.storage_uri``): fetched and built only on demand, by `make setup-s3`
    (jvm/hadoop-aws/pom.xml, jvm/hadoop-aws/kdq-dynamodb)."""
    if storage.scheme(config.paths.storage_uri) != "s3a":
        return []
    folder = config.jars_dir / "hadoop-aws"
    jars = sorted(folder.glob("*.jar"))
    if not any(j.name.startswith(HADOOP_AWS_PREFIX) for j in jars):
        raise ConfigError(
            f"paths.storage_uri = {config.paths.storage_uri!r} needs the S3A connector, but {folder} has no "
            f"{HADOOP_AWS_PREFIX}*.jar: run `make setup-s3` (KDQ_SETUP_S3=1 scripts/setup.sh) to fetch hadoop-aws "
            "and the AWS SDK with Maven"
        )
    log_store = {**storage.log_store_conf(config), **config.spark.conf}.get(storage.S3A_LOG_STORE_KEY, "")
    missing = [p for p in DYNAMODB_LOG_STORE_JARS if not any(j.name.startswith(p) for j in jars)]
    if log_store == storage.DYNAMODB_LOG_STORE and missing:
        raise ConfigError(
            f"kdq's DynamoDB log store ({storage.S3A_LOG_STORE_KEY} = {log_store}) needs {', '.join(m + '*.jar' for m in missing)} in "
            f"{folder}: run `make setup-s3` (KDQ_SETUP_S3=1 scripts/setup.sh) to fetch and build them with Maven"
        )
    return jars


def on_this_machine(master: str) -> bool:
    """local[...] or a standalone master on loopback: its executors can use this machine's jars and Python.
    A remote cluster gets its jars and Python from the deployment (--packages, [spark.conf]; deploy/)."""
    return master.startswith("local") or master.startswith(("spark://127.0.0.1:", "spark://localhost:"))


def spark_conf(config: Config, app_name: str) -> dict[str, str]:
    """Every setting the factory applies, as a plain dict (spark-submit --conf uses the same). Refuses (ConfigError)
    tables on s3a:// whose concurrent commits are not coordinated (:func:`kdq.storage.check_commits_coordinated`)."""
    storage.check_commits_coordinated(config)
    conf = {
        "spark.app.name": app_name,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.catalogImplementation": "in-memory",
        "spark.sql.warehouse.dir": storage.warehouse_location(config),
        "spark.sql.shuffle.partitions": str(config.spark.shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": str(config.spark.ui_enabled).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": config.spark.driver_memory,
        # Delta reads its log with this many partitions; the default (50) makes
        # every small MERGE schedule 50 tasks on a 2-core machine.
        "spark.databricks.delta.snapshotPartitions": "2",
        # Per-commit overheads that cost more than the write itself for the
        # small commits of a micro-batch: the post-commit checksum (a full
        # state reconstruction) and source materialisation of MERGE (our MERGE
        # sources are local, deterministic rows).
        "spark.databricks.delta.writeChecksumFile.enabled": "false",
        "spark.databricks.delta.merge.materializeSource": "none",
        # spark.kafka.consumer.cache.capacity stays Spark's 64: kept open, a thousand partitions' idle consumers
        # ran a 2 GB driver out of memory in a one-million-record catch-up over 1,000 topics (benchmarks/PERF_NOTES.md,
        # "nineteenth pass"), although they saved ~1.5 s a batch of reopening them.
        # Spark keeps each Kafka partition's last poll (its records) for reuse by a next batch starting inside it,
        # 5 minutes by default, however many partitions were read: a one-million-record catch-up over 1,000 topics
        # ended with ~0.5 GB of them on a 2 GB heap. Kept a second, they serve only a batch that follows at once;
        # peak RSS 2.75 -> 2.27 GB (benchmarks/PERF_NOTES.md, "twenty-fourth pass").
        "spark.kafka.consumer.fetchedData.cache.timeout": "1s",
        "spark.kafka.consumer.fetchedData.cache.evictorThreadRunInterval": "1s",
        # Small files an hour of window_counts or summaries may hold before the writer's auto compaction folds
        # them (kdq.tables.AUTO_COMPACT_MIN_FILES; the tables' delta.autoOptimize.autoCompact property).
        "spark.databricks.delta.autoCompact.minNumFiles": str(AUTO_COMPACT_MIN_FILES),
        # Partitioned writes (the raw archive by event_hour) keep one open file per partition value instead of
        # sorting every row by it first: a micro-batch spans one or two event hours, and the sort of its 1 KB
        # rows cost ~2.4 core-µs per record (benchmarks/count_path_floor.py: 20.5 → 18.1). Beyond 4 partition
        # values in one task Spark falls back to the sort.
        "spark.sql.maxConcurrentOutputFileWriters": "4",
        # The raw archive's `value` (the record itself, ~1 KB, nearly always distinct) in plain encoding: Parquet
        # would first build a dictionary of every value of a row group and throw it away once it outgrows the
        # page, ~3 core-µs per record of the archive write (benchmarks/PERF_NOTES.md, "twentieth pass"). Only
        # the archive has a column of that name (kdq.tables).
        "spark.hadoop.parquet.enable.dictionary#value": "false",
        # Timestamps as Parquet's INT64 microseconds instead of the legacy INT96: Parquet dictionary-encodes the
        # 12-byte INT96 values through a hash map of byte arrays, ~1.6 core-µs per record for the archive's four
        # timestamps (PERF_NOTES, "twentieth pass"). Readers take both (Spark, pyarrow in kdq.spark.push_reads).
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # Throughput collector: on 2 cores G1's concurrent marking and write
        # barriers cost the classification ~20 % (benchmarks/results/sweep.md,
        # parallel_gc); the longer pauses of a few-GB heap are far below a
        # micro-batch. Set [spark.conf] to override.
        "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
        "spark.executor.extraJavaOptions": "-XX:+UseParallelGC",
        # The stream's appends run on writer threads in their own pools beside the
        # MERGEs; fair sharing between pools lets a MERGE's small jobs in between
        # an archive write's tasks. Jobs that name no pool share the FIFO default.
        "spark.scheduler.mode": "FAIR",
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
    }
    master = config.spark_master()
    if on_this_machine(master):
        # Also on a standalone master on loopback (kdq up --cluster): --jars ships them to the executors
        # (fetched from the driver), so the workers need nothing installed.
        conf["spark.jars"] = ",".join(str(p) for p in connector_jars(config))
        # FileContext on file: (every Delta commit, every streaming checkpoint file) through kdq's process-free
        # local file system: Hadoop's forks chmod and readlink per file without its native library, ~50 ms a
        # rename on two busy cores (io.kdq.spark.fs.NioLocalFileSystem; benchmarks/PERF_NOTES.md, "the small batch's latency"). Only
        # where kdq's jar is on the class path, i.e. here.
        conf["spark.hadoop.fs.AbstractFileSystem.file.impl"] = "io.kdq.spark.fs.NioLocalFileSystem$Fs"
        # Python workers (the summaries' driver-side helpers, any pandas UDF) must
        # run in this interpreter, not whatever python3 is first on PATH; executors
        # of a loopback cluster run on this machine, so the venv's is theirs too.
        conf["spark.pyspark.python"] = sys.executable
        conf["spark.pyspark.driver.python"] = sys.executable
    if master.startswith("spark://") and on_this_machine(master):
        # Executors of a 1-core, 2 GB worker (kdq.stack.spark_cluster); [spark.conf] overrides.
        conf["spark.executor.memory"] = "1g"
        conf["spark.executor.cores"] = "1"
    # Commits to tables on s3a:// coordinated through DynamoDB (paths.dynamodb_table); [spark.conf] overrides.
    conf.update(storage.log_store_conf(config))
    conf.update(registry_conf(config))
    conf.update(config.spark.conf)
    return conf


def registry_conf(config: Config) -> dict[str, str]:
    """Where the classifier's registry-backed rules find the Schema Registry (io.kdq.spark.registry.RegistryConnection
    reads these in every JVM). Empty when no registry is configured or recorded by the local stack: a rule with
    ``registry = true`` then stops its job at start, naming the rule. The password and token are secrets (Spark's UI
    redacts them; spark-submit gets them in a properties file, kdq.spark.submit)."""
    try:
        url = config.registry_url()
    except ConfigError:
        return {}
    conf = {
        "spark.kdq.registry.url": url,
        "spark.kdq.registry.timeout.ms": str(int(config.registry.timeout_seconds * 1000)),
    }
    if config.registry.username:
        conf["spark.kdq.registry.username"] = config.registry.username
        conf["spark.kdq.registry.password"] = config.registry.password
    elif config.registry.bearer_token:
        conf["spark.kdq.registry.bearer.token"] = config.registry.bearer_token
        if config.registry.logical_cluster:
            conf["spark.kdq.registry.logical.cluster"] = config.registry.logical_cluster
    if config.registry.ca_file:
        # Read by every JVM that judges records: on a cluster the file must be at this path on the workers too.
        conf["spark.kdq.registry.ca.file"] = str(config.path(config.registry.ca_file))
    return conf


def build_session(
    config: Config, app_name: str = "kdq", master: str | None = None, conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A SparkSession with Delta and the Kafka connector, and every kdq table registered by name. ``conf``: a job's
    own settings over kdq's (the SQL endpoint's ``spark.sql.extensions`` adds its read-only rule to Delta's: the
    builder's value would otherwise replace the one spark-submit was given)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master or config.spark_master())
    for key, value in {**spark_conf(config, app_name), **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    from kdq.spark.storage import prepare
    from kdq.spark.tables import register_tables

    prepare(spark, config)  # tables and checkpoints on a URI: usable, or a ConfigError naming the fix

    register_tables(spark, config)
    return spark


# Spark's code generation pays for itself on a pass over many rows. On a query over a few hundred (the stream's
# per-batch MERGE, read-back and reason append) generating and compiling the code is most of the query's cost,
# and the literals that change every batch defeat the compile cache (benchmarks/PERF_NOTES.md,
# "the per-batch queries interpreted").
SMALL_QUERY_CONF = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


def small_query_session(spark: SparkSession) -> SparkSession:
    """A session of the same application for queries over a few hundred rows, interpreted rather than
    compiled. It shares the context, jars, tables and cache; its SQL settings are its own, so the big passes
    keep code generation. Delta's session-wide txnAppId/txnVersion guard then belongs to this session: its
    MERGEs stay on one thread."""
    session = spark.newSession()
    for key, value in SMALL_QUERY_CONF.items():
        session.conf.set(key, value)
    return session


def exit_when_jvm_dies(spark: SparkSession, interval_seconds: float = 2.0) -> threading.Thread:
    """Start a daemon thread that ends this Python driver (exit code 70) once its Spark JVM is gone.

    For long-running jobs only (the stream): when the JVM is SIGKILLed (OOM killer, an operator), a
    Python driver blocked in a callback or between py4j calls can linger without a JVM, holding the
    stream's pid file and heartbeat and so delaying the supervisor's restart (seen in the chaos run).
    Under spark-submit the JVM is this process's parent (its death re-parents us); when this process
    launched the JVM itself (pyspark in a plain interpreter), the gateway's process handle says so.
    """
    launched = getattr(spark.sparkContext._gateway, "proc", None)
    parent = os.getppid()

    def gone() -> bool:
        return launched.poll() is not None if launched is not None else os.getppid() != parent

    def say_gone() -> None:
        logging.getLogger("kdq.spark").error("the Spark JVM is gone (killed?): this driver exits too")
        logging.shutdown()

    def watch() -> None:
        while not gone():
            time.sleep(interval_seconds)
        # Mostly unseen: under spark-submit this process's output is piped through the dead JVM, and a write to
        # that pipe can block for good when another process still holds its read end (a CI run saw the driver
        # linger past 30 s): the last word gets two seconds on a thread of its own, then the exit comes anyway.
        last_word = threading.Thread(target=say_gone, name="kdq-jvm-gone-log", daemon=True)
        last_word.start()
        last_word.join(2.0)
        os._exit(70)

    thread = threading.Thread(target=watch, name="kdq-jvm-watchdog", daemon=True)
    thread.start()
    return thread
