"""The plugin pieces that need no Airflow run: the supervisor lock and the maintenance statements."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest

PLUGINS_FOLDER = Path(__file__).resolve().parents[2] / "plugins"
if str(PLUGINS_FOLDER) not in sys.path:
    sys.path.insert(0, str(PLUGINS_FOLDER))

from kdq_airflow.maintenance import maintenance_statements  # noqa: E402
from kdq_airflow.stream import LockHeld, supervisor_lock  # noqa: E402
from tests.conftest import make_config  # noqa: E402


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    lock = tmp_path / "stream" / "supervisor.lock"
    with supervisor_lock(lock):
        assert lock.read_text() == str(os.getpid())
        holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            lock.write_text(str(holder.pid))  # as if another live supervisor held it
            with pytest.raises(LockHeld, match=str(holder.pid)):
                with supervisor_lock(lock):
                    pass
            lock.write_text(str(os.getpid()))
        finally:
            holder.kill()
            holder.wait()
    assert not lock.exists()


def test_lock_of_a_dead_supervisor_is_taken_over(tmp_path: Path) -> None:
    lock = tmp_path / "supervisor.lock"
    lock.write_text(str(dead_pid()))
    with supervisor_lock(lock):
        assert lock.read_text() == str(os.getpid())
    assert not lock.exists()


def test_maintenance_touches_only_closed_partitions(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    statements = maintenance_statements(config, dt.date(2026, 11, 22), archive_retention_days=30)
    optimize = [s for s in statements if s.startswith("OPTIMIZE")]
    assert len(optimize) == 2
    assert "event_hour < '2026-11-22-00'" in optimize[0]
    assert "window_date < DATE'2026-11-22'" in optimize[1]
    [delete] = [s for s in statements if s.startswith("DELETE")]
    assert delete.endswith("WHERE event_hour < '2026-10-23-00'")
    vacuums = [s for s in statements if s.startswith("VACUUM")]
    assert len(vacuums) == 5 and all(s.endswith("RETAIN 168 HOURS") for s in vacuums)


def test_maintenance_rejects_unsafe_settings(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with pytest.raises(ValueError, match="vacuum_retain_hours"):
        maintenance_statements(config, dt.date(2026, 11, 22), 30, vacuum_retain_hours=24)
    with pytest.raises(ValueError, match="archive_retention_days"):
        maintenance_statements(config, dt.date(2026, 11, 22), 0)
