"""The chaos run's set-up and small shared helpers: its clock, polling, its private config, the code's state, and
the orphans it leaves (see :mod:`benchmarks.chaos`)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import psutil

from benchmarks import chaos_logic as cl
from benchmarks.__main__ import make_config as bench_config
from benchmarks.speed import write_config
from kdq.config import Config
from kdq.procs import quiet_port

PROJECT = Path(__file__).resolve().parents[1]


def _now() -> float:
    return time.monotonic()


class Clock:
    """Seconds since the fault phase began (negative before), the time base of every event and fault."""

    def __init__(self) -> None:
        self.t0 = _now()

    def t(self) -> float:
        return round(_now() - self.t0, 1)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _wait(check, timeout: float, interval: float = 1.0, stop: threading.Event | None = None):
    """Poll ``check`` until it returns something true; None at the deadline (or when ``stop`` is set)."""
    deadline = _now() + timeout
    while _now() < deadline:
        try:
            value = check()
        except Exception:  # a probe that fails means "not yet"
            value = None
        if value:
            return value
        if stop is not None and stop.wait(interval):
            return None
        if stop is None:
            time.sleep(interval)
    return None


# -- set-up ---------------------------------------------------------------------------------------------


def chaos_config(work: Path, storage: dict | None = None) -> Config:
    """The benchmark's private config (defaults, no kdq.toml, no KDQ_* variables) with the chaos rules,
    its components on ports below the ephemeral range (:func:`quiet_port`); ``storage``: the s3a variant's
    settings (:meth:`kdq.stack.moto.LocalS3.settings`), tables and checkpoints on s3a://."""
    rng = random.Random()
    rules = work / "rules"
    rules.mkdir(parents=True, exist_ok=True)
    for name in ("orders.schema.json", "payments.schema.json"):
        shutil.copy(PROJECT / "config" / "rules" / name, rules / name)
    (rules / "events.schema.json").write_text(json.dumps(cl.EVENTS_SCHEMA, indent=1))
    (rules / "topics.toml").write_text(cl.TOPICS_TOML)
    config = bench_config(
        work / "data",
        rules,
        # 256 KiB: the too_large poison (300 KB) is too large, deep nesting (100 KB) is not.
        stream={"max_value_bytes": 256 * 1024, "allowed_lateness_seconds": 60, "trigger_interval_seconds": 5},
        # As in the Airflow integration tests: C1-only JIT and the serial GC start a JVM faster, which
        # matters for a stream restarted every minute or two on 2 shared cores; batches here are small.
        spark={"conf": {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
                        **(storage or {}).get("spark_conf", {})}},
        paths=(storage or {}).get("paths", {}),
        kafka={"local_port": quiet_port(rng), "local_controller_port": quiet_port(rng)},
        influxdb={"local_port": quiet_port(rng), "local_rpc_port": quiet_port(rng)},
    ).with_summaries(cl.SUMMARIES)
    return write_config(config, work / "kdq.toml")


def code_state() -> dict:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=PROJECT, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    dirty = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines() if line.strip()]
    return {"commit": git("rev-parse", "--short", "HEAD").strip(), "dirty": dirty}

def _iso_s(text: str | None) -> float | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def kill_orphans(work: Path) -> list[str]:
    """Processes of this run left behind (e.g. a Python driver whose JVM was killed): their command line
    names the run's unique work folder, or their environment its config file (KDQ_CONFIG). Killed by pid."""
    found = []
    marker = str(work)
    me = psutil.Process()
    # Not this process, its children (the check's own JVM) or its parents (a `timeout` wrapping the run).
    own = {me.pid, *(p.pid for p in me.children(recursive=True)), *(p.pid for p in me.parents())}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid in own:
            continue
        try:
            ours = any(marker in part for part in proc.info["cmdline"] or [])
            ours = ours or proc.environ().get("KDQ_CONFIG", "").startswith(marker)
            if ours:
                found.append(f"{proc.pid} {' '.join(proc.info['cmdline'] or [])[:100]}")
                proc.kill()
        except psutil.Error:
            continue
    return found
