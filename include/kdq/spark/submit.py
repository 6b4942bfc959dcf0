"""spark-submit command lines for kdq's jobs (the CLI wraps these locally; Airflow uses the same pieces)."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from kdq import storage
from kdq.config import SECRET_KEY as CONFIG_SECRET_KEY
from kdq.config import Config, ConfigError
from kdq.spark.session import spark_conf

PROJECT_ROOT = Path(__file__).resolve().parents[3]
JOBS_DIR = PROJECT_ROOT / "spark_jobs"


def spark_submit_binary() -> str:
    """spark-submit from the same environment as this Python (pyspark ships it)."""
    local = Path(sys.executable).parent / "spark-submit"
    found = str(local) if local.exists() else shutil.which("spark-submit")
    if not found:
        raise ConfigError("spark-submit not found: install pyspark (make setup) or put SPARK_HOME/bin on PATH")
    return found


def job_path(name: str) -> Path:
    path = JOBS_DIR / f"{name}.py"
    if not path.is_file():
        raise ConfigError(f"no Spark job named {name!r} in {JOBS_DIR}")
    return path


def package_zip(config: Config) -> Path:
    """The kdq package as a zip for ``--py-files`` (what `make package` builds as dist/kdq.zip), rebuilt
    under the data folder whenever a source file is newer, so executors never run stale code."""
    source = PROJECT_ROOT / "include" / "kdq"
    files = sorted(p for p in source.rglob("*") if p.suffix in (".py", ".typed"))
    target = config.data_dir / "spark-submit" / "kdq.zip"
    if target.exists() and target.stat().st_mtime >= max(p.stat().st_mtime for p in files):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            archive.write(path, path.relative_to(source.parent))
    partial.replace(target)  # atomic: a concurrent submit sees the old zip or the new one
    return target


# Jobs that must stay in the background: the daily maintenance runs beside the stream and the SQL
# endpoint and may take its time, so it gets one core (spark.cores.max on a cluster, local[1] on this machine).
BACKGROUND_JOBS = {"maintenance": 1}  # job -> its cores
# The two long-running applications; every other job (the batch layer's recompute, push, reconcile and catch-up, a
# rebuild, a backfill, the maintenance) is batch work submitted beside them, under nice: its driver JVM and, in local
# mode, its tasks give way to the stream and the SQL endpoint when the cores are busy (benchmarks.local_run: the
# hourly recompute and the maintenance at the stream's priority made its batches 1.2x slower and SQL 1.2-1.6x).
LONG_RUNNING_JOBS = frozenset({"stream_counts", "sql_endpoint"})
BATCH_NICENESS = 10  # relative: the local stack's Airflow already runs at kdq.procs.SERVICE_NICENESS
# Batch jobs someone waits for within the minute: the expectations run (an incident opens within a minute of its
# records) stays out of the idle class, which on a saturated machine could hold it for minutes; nice only.
PROMPT_BATCH_JOBS = frozenset({"evaluate_expectations"})
# The batch jobs' own session (kdq.background_session): niceness 19 is CFS weight 15, against the stream's session's
# 110 (kdq.procs.SERVICE_NICENESS) and the SQL endpoint's 1024; a job still gets every cycle they leave.
BATCH_SESSION_NICENESS = 19
BACKGROUND_SESSION = Path(__file__).resolve().parents[1] / "background_session.py"


def cores_max(config: Config, job: str) -> int:
    """The core cap of ``job``'s application (its ``spark.cores.max``; 0: none). The long-running ones have
    one (``spark.stream_cores_max``, ``spark.sql_endpoint_cores_max``): a standalone application takes every free
    core by default and the stream and the SQL endpoint never give theirs back, so without a cap the batch jobs
    would wait for them. The compose deployment sets the stream's (docs/cluster.md). The background jobs
    (:data:`BACKGROUND_JOBS`) have theirs so that they never take the cores the other two need."""
    caps = {"stream_counts": config.spark.stream_cores_max, "sql_endpoint": config.spark.sql_endpoint_cores_max}
    return caps.get(job, BACKGROUND_JOBS.get(job, 0))


def capped_master(master: str, job: str) -> str:
    """``master`` for ``job``: a local master (``local[2]``, ``local[*]``) becomes ``local[<cores>]`` for a
    background job (``spark.cores.max`` does not limit local mode); any other master is unchanged."""
    cores = BACKGROUND_JOBS.get(job)
    if cores and master.split("[", 1)[0] == "local":
        return f"local[{cores}]"
    return master


def priority_prefix(job: str) -> list[str]:
    """What the spark-submit command line of ``job`` starts with: for a batch job (every job but
    :data:`LONG_RUNNING_JOBS`) ``chrt --idle 0`` (Linux's SCHED_IDLE class: CPU time only when no other process
    wants it) and ``nice -n 10`` (which also lowers its I/O priority, and is what remains where there is no
    ``chrt``), so it runs below the stream and the SQL endpoint; else nothing. On Linux a batch job also runs in a
    session of its own at niceness :data:`BATCH_SESSION_NICENESS` (:mod:`kdq.background_session`).

    Why SCHED_IDLE and not nice alone: nice +9 below the stream still gives a CPU-bound batch job about an eighth of
    a core the stream wants (CFS weights 110 against 15); with the daily jobs running, the stream's p99 produce ->
    visible was 1.39x its quiet figure (benchmarks/results/local_run.md). An idle-class job uses the cycles the
    stream and the endpoint leave, which under `make run` is a fifth of the machine or more. The expectations run
    (:data:`PROMPT_BATCH_JOBS`) gets ``nice`` only: an incident is due within a minute.

    Why a session of its own: with Linux's autogroup the kernel shares the CPU between sessions before the idle
    class applies, so an idle-class job in Airflow's session made that session compete with the stream's as an
    equal (the module doc of :mod:`kdq.background_session`). The expectations run stays in its starter's session:
    at the batch session's weight it would wait on a busy stream, and its incident is due within the minute."""
    if job in LONG_RUNNING_JOBS:
        return []
    idle = job not in PROMPT_BATCH_JOBS and sys.platform.startswith("linux") and shutil.which("chrt")
    prefix = ["chrt", "--idle", "0"] if idle else []
    if shutil.which("nice"):
        prefix += ["nice", "-n", str(BATCH_NICENESS)]
    if idle:
        prefix += [sys.executable, str(BACKGROUND_SESSION), str(BATCH_SESSION_NICENESS)]
    return prefix


# The keys whose values are secrets (S3 keys, passwords, tokens, Azure account keys, private keys): Spark's own
# default of spark.redaction.regex and what Hadoop and the Kafka clients treat as secret (kdq.config.SECRET_KEY,
# also what configuration errors never show). They go to spark-submit in a properties file only this user can read,
# never as --conf arguments, which every user of the machine sees in the process list for as long as the
# application runs, and which Airflow's SparkSubmitHook logs masking only *secret*/*password* keys.
SECRET_KEY = CONFIG_SECRET_KEY


@dataclass(frozen=True)
class Submission:
    """What spark-submit gets for one kdq job: the CLI's command line (:func:`submit_command`) and Airflow's
    SparkSubmitHook (plugins/kdq_airflow/operators.py ``submit_settings``) are both made from it."""

    master: str
    name: str
    driver_memory: str
    jars: str | None  # --jars: also on the driver's classpath (a later spark.jars conf would not be)
    py_files: str | None  # --py-files: the kdq package, for executors in JVMs of their own
    conf: dict[str, str]  # every other setting (--conf), secrets excepted
    properties_file: Path | None  # the secrets of ``conf`` (--properties-file), or None


def submission_conf(config: Config, job: str, app_name: str | None = None) -> dict[str, str]:
    """Every Spark setting of ``job``'s submission (secrets included; :func:`submission` splits them off)."""
    conf = spark_conf(config, app_name or f"kdq-{job}")
    if cores_max(config, job):
        conf["spark.cores.max"] = str(cores_max(config, job))  # wins over a spark.cores.max of [spark.conf]
    return conf


def conf_argument(key: str, value: str) -> str:
    """One ``--conf`` argument of the command line."""
    return f"{key}={value}"


# The setting whose --conf argument identifies a kdq job's process as belonging to one deployment: the warehouse
# dir is under the storage root (the data folder, or paths.storage_uri) and on every job's command line.
MARKER_KEY = "spark.sql.warehouse.dir"


def process_marker(config: Config, job: str) -> str:
    """A fragment of ``job``'s spark-submit command line (:func:`submit_command`) by which a process is recognised
    as that job of this deployment (``kdq.spark.stream_process``): built from the same settings as the command line, so
    the two cannot disagree (with ``paths.storage_uri`` they once did, and a second driver went unseen)."""
    try:
        value = submission_conf(config, job)[MARKER_KEY]
    except ConfigError:  # no submission possible now (e.g. jars missing): `kdq status` must still answer
        value = {MARKER_KEY: storage.warehouse_location(config), **config.spark.conf}[MARKER_KEY]
    return conf_argument(MARKER_KEY, value)


def submission(config: Config, job: str, app_name: str | None = None) -> Submission:
    conf = submission_conf(config, job, app_name)
    master = capped_master(config.spark_master(), job)
    secrets = {key: conf.pop(key) for key in sorted(conf) if SECRET_KEY.search(key)}
    return Submission(
        master=master,
        name=conf.pop("spark.app.name"),
        driver_memory=conf.pop("spark.driver.memory"),
        jars=conf.pop("spark.jars", None),
        # Executors are separate JVMs whose Python workers import kdq (the job's functions are pickled by
        # reference): the package goes with the application.
        py_files=None if master.startswith("local") else str(package_zip(config)),
        conf=dict(sorted(conf.items())),
        properties_file=secrets_file(config, secrets),
    )


def secrets_file(config: Config, secrets: dict[str, str]) -> Path | None:
    """``secrets`` as a Java properties file readable by this user only (mode 0600), under the data folder;
    named by its content, so concurrent submits share one file and a changed secret gets a new one."""
    if not secrets:
        return None
    text = "".join(f"{_escape(key)}={_escape(value)}\n" for key, value in sorted(secrets.items()))
    target = config.data_dir / "spark-submit" / f"secrets-{hashlib.sha256(text.encode()).hexdigest()[:16]}.properties"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:  # Spark reads it as UTF-8
        out.write(text)
    partial.replace(target)
    return target


def _escape(text: str) -> str:
    """A key or value as java.util.Properties.load reads it back verbatim."""
    special = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\f": "\\f",
               "=": "\\=", ":": "\\:", "#": "\\#", "!": "\\!"}
    escaped = "".join(special.get(char, char) for char in text)
    return "\\" + escaped if escaped.startswith(" ") else escaped


def submit_command(config: Config, job: str, job_args: list[str], app_name: str | None = None) -> list[str]:
    parts = submission(config, job, app_name)
    command = [*priority_prefix(job), spark_submit_binary(), "--master", parts.master, "--name", parts.name]
    if parts.jars:
        command += ["--jars", parts.jars]
    if parts.py_files:
        command += ["--py-files", parts.py_files]
    if parts.properties_file:
        # --load-spark-defaults: a properties file would otherwise replace conf/spark-defaults.conf.
        command += ["--properties-file", str(parts.properties_file), "--load-spark-defaults"]
    command += ["--driver-memory", parts.driver_memory]
    for key, value in parts.conf.items():
        command += ["--conf", conf_argument(key, value)]
    return [*command, str(job_path(job)), *job_args]
