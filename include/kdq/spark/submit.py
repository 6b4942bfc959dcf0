"""spark-submit command lines for kdq's jobs (the CLI wraps these locally; Airflow uses the same pieces)."""

from __future__ import annotations

import shutil
import sys
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


def submit_command(config: Config, job: str, job_args: list[str], app_name: str | None = None) -> list[str]:
    conf = spark_conf(config, app_name or f"kdq-{job}")
    command = [spark_submit_binary(), "--master", config.spark.master, "--name", conf.pop("spark.app.name")]
    if "spark.jars" in conf:
        # --jars puts them on the driver's classpath too (a conf set later would not).
        command += ["--jars", conf.pop("spark.jars")]
    command += ["--driver-memory", conf.pop("spark.driver.memory")]
    for key, value in sorted(conf.items()):
        command += ["--conf", f"{key}={value}"]
    return [*command, str(job_path(job)), *job_args]

