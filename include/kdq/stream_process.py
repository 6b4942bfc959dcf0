"""The speed layer as a local background process: start detached via spark-submit, stop gracefully."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from kdq.config import Config
from kdq.stack.procs import ManagedProcess


def stream_process(config: Config) -> ManagedProcess:
    folder = config.data_dir / "stream"
    return ManagedProcess(
        name="stream",
        pid_file=folder / "stream.pid",
        log_file=folder / "stream.log",
        # The warehouse dir is in the command line and unique per data folder.
        marker=f"spark.sql.warehouse.dir={config.data_dir / 'warehouse'}",
    )


def child_env(config: Config, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "TZ": "UTC",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }
    if config.source != "defaults":
        env["KDQ_CONFIG"] = config.source
    return {**env, **(extra or {})}


def start_stream(config: Config, job_args: list[str] | None = None, extra_env: dict[str, str] | None = None) -> int:
    """Start the speed layer detached (no-op if it already runs); returns its pid."""
    from kdq.spark.submit import submit_command

    process = stream_process(config)
    command = submit_command(config, "stream_counts", job_args or [], app_name="kdq-speed-layer")
    return process.start(command, env=child_env(config, extra_env), cwd=config.base_dir)


def stop_stream(config: Config, timeout: float = 150.0) -> bool:
    """SIGTERM: the job finishes its current micro-batch, then exits; SIGKILL after ``timeout``."""
    return stream_process(config).stop(timeout=timeout, graceful_child="stream_counts.py")
