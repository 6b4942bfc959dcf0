"""`kdq up` / `status` / `up` again / `down` on a stack of its own (the broker, InfluxDB, the SQL endpoint and the Schema
Registry): healthy, idempotent, nothing left behind."""

from __future__ import annotations

import subprocess
import sys

import psutil

from kdq.procs import SERVICE_NICENESS, port_open
from kdq.stack.manager import LocalStack
from tests.conftest import PROJECT_ROOT, make_config


def _kdq(config_dir, *args: str) -> subprocess.CompletedProcess:
    env = {
        "PATH": f"{PROJECT_ROOT / '.venv' / 'bin'}:/usr/bin:/bin",
        "KDQ_PATHS__DATA_DIR": str(config_dir),
        "KDQ_PATHS__JARS_DIR": str(PROJECT_ROOT / ".cache" / "jars"),
        # This checkout's kdq, whichever one the virtualenv's editable install names (a git worktree shares it).
        "PYTHONPATH": str(PROJECT_ROOT / "include"),
    }
    return subprocess.run(
        [sys.executable, "-m", "kdq.cli", *args], capture_output=True, text=True, env=env, cwd=PROJECT_ROOT, timeout=180
    )


def test_up_status_up_down_leaves_nothing(tmp_path) -> None:
    config = make_config(tmp_path)
    stack = LocalStack(config)
    try:
        first = _kdq(tmp_path, "up")
        assert first.returncode == 0, first.stdout + first.stderr
        status = _kdq(tmp_path, "status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert "kafka" in status.stdout and "influxdb" in status.stdout
        assert f"registry       {stack.registry.url}" in status.stdout, status.stdout
        assert status.stdout.count("healthy") >= 4 and "NOT healthy" not in status.stdout
        pids = {stack.kafka.process.process().pid, stack.influx.process.process().pid, stack.registry.process.process().pid}
        # The broker, InfluxDB and the registry give way to the SQL endpoint (kdq.procs.SERVICE_NICENESS).
        assert {psutil.Process(pid).nice() for pid in pids} == {SERVICE_NICENESS}

        again = _kdq(tmp_path, "up")
        assert again.returncode == 0, again.stdout + again.stderr
        # Starting twice is harmless: the same processes keep running.
        assert {stack.kafka.process.process().pid, stack.influx.process.process().pid,
                stack.registry.process.process().pid} == pids

        down = _kdq(tmp_path, "down")
        assert down.returncode == 0 and all(name in down.stdout for name in ("kafka", "influxdb", "registry")), down.stdout
        assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
        for port in (stack.kafka.port, stack.kafka.controller_port, stack.influx.port, stack.influx.rpc_port, stack.registry.port):
            assert not port_open(port), f"port {port} still open after down"
        stopped = _kdq(tmp_path, "status")
        assert stopped.returncode == 1 and "stopped" in stopped.stdout
    finally:
        stack.down()
