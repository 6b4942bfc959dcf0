"""The demo as the local run's background process: ``kdq demo`` detached, stopped gracefully, its statistics."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from kdq.config import Config
from kdq.procs import ManagedProcess
from kdq.traffic.generator import TrafficSpec
from kdq.traffic.producer import run_demo


def demo_process(config: Config) -> ManagedProcess:
    folder = config.data_dir / "demo"
    return ManagedProcess(
        name="demo",
        pid_file=folder / "demo.pid",
        log_file=folder / "demo.log",
        marker=f"--stats-file={folder / 'stats.json'}",  # unique per data folder
    )


def start_demo(config: Config, demo_args: Sequence[str] = ()) -> int:
    """``kdq demo <demo_args>`` detached (no-op if it already runs); returns its pid."""
    process = demo_process(config)
    config_args = ["--config", config.source] if config.source != "defaults" else []
    command = [sys.executable, "-m", "kdq.cli", *config_args, "demo", *demo_args, process.marker]
    return process.start(command, cwd=config.base_dir)


def stop_demo(config: Config, timeout: float = 40.0) -> bool:
    """SIGTERM: the generator flushes what it produced and exits."""
    return demo_process(config).stop(timeout=timeout)


def read_stats(config: Config) -> dict | None:
    try:
        return json.loads((config.data_dir / "demo" / "stats.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def main_loop(config: Config, spec: TrafficSpec, stats_file: Path | None) -> dict:
    """``run_demo`` with SIGTERM/SIGINT as a graceful stop (flush, final stats), for the CLI."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return run_demo(config, spec, stop=stop, stats_file=stats_file)
