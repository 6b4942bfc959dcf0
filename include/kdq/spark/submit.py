"""spark-submit command lines for kdq's jobs (the CLI wraps these locally; Airflow uses the same pieces)."""

from __future__ import annotations

import os
import shutil
import sys
import zipfile
from pathlib import Path

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


def cores_max(config: Config, job: str) -> int:
    """The core cap of ``job``'s application (its ``spark.cores.max``; 0: none). Only the long-running ones have
    one (``spark.stream_cores_max``, ``spark.sql_endpoint_cores_max``): a standalone application takes every free
    core by default and the stream and the SQL endpoint never give theirs back, so without a cap the batch jobs
    would wait for them. The compose deployment sets the stream's (docs/cluster.md)."""
    return {"stream_counts": config.spark.stream_cores_max, "sql_endpoint": config.spark.sql_endpoint_cores_max}.get(job, 0)


def submit_command(config: Config, job: str, job_args: list[str], app_name: str | None = None) -> list[str]:
    conf = spark_conf(config, app_name or f"kdq-{job}")
    if cores_max(config, job):
        conf["spark.cores.max"] = str(cores_max(config, job))  # wins over a spark.cores.max of [spark.conf]
    master = config.spark_master()
    command = [spark_submit_binary(), "--master", master, "--name", conf.pop("spark.app.name")]
    if "spark.jars" in conf:
        # --jars puts them on the driver's classpath too (a conf set later would not).
        command += ["--jars", conf.pop("spark.jars")]
    if not master.startswith("local"):
        # Executors are separate JVMs whose Python workers import kdq (the job's functions are pickled by
        # reference): the package goes with the application.
        command += ["--py-files", str(package_zip(config))]
    command += ["--driver-memory", conf.pop("spark.driver.memory")]
    for key, value in sorted(conf.items()):
        command += ["--conf", f"{key}={value}"]
    return [*command, str(job_path(job)), *job_args]

