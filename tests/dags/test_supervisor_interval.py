"""The stream supervisor's schedule: two minutes, or KDQ_AIRFLOW_SUPERVISOR_SECONDS (the chaos run uses 30 s)."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest

PLUGINS_FOLDER = Path(__file__).resolve().parents[2] / "plugins"
if str(PLUGINS_FOLDER) not in sys.path:
    sys.path.insert(0, str(PLUGINS_FOLDER))

from kdq.stack.airflow import SUPERVISOR_INTERVAL_ENV as SET_BY_THE_LOCAL_RUN  # noqa: E402
from kdq_airflow.defaults import SUPERVISOR_INTERVAL_ENV, kdq_supervisor_interval  # noqa: E402


def test_supervisor_interval_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert SET_BY_THE_LOCAL_RUN == SUPERVISOR_INTERVAL_ENV
    monkeypatch.delenv(SUPERVISOR_INTERVAL_ENV, raising=False)
    assert kdq_supervisor_interval() == timedelta(minutes=2)
    monkeypatch.setenv(SUPERVISOR_INTERVAL_ENV, "30")
    assert kdq_supervisor_interval() == timedelta(seconds=30)
    monkeypatch.setenv(SUPERVISOR_INTERVAL_ENV, " 45.5 ")
    assert kdq_supervisor_interval() == timedelta(seconds=45.5)
    for bad in ("5", "0", "-30", "nan", "soon"):
        monkeypatch.setenv(SUPERVISOR_INTERVAL_ENV, bad)
        with pytest.raises(ValueError, match=SUPERVISOR_INTERVAL_ENV):
            kdq_supervisor_interval()
