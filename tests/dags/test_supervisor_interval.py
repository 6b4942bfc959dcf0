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


def test_recompute_interval_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recompute DAG's intervals: an hour, or KDQ_AIRFLOW_RECOMPUTE_MINUTES (the chaos run uses 5)."""
    import pendulum
    from airflow.serialization.encoders import coerce_to_core_timetable

    from kdq.stack.airflow import RECOMPUTE_MINUTES_ENV as SET_BY_THE_CHAOS_RUN
    from kdq_airflow.defaults import RECOMPUTE_MINUTES_ENV, kdq_recompute_minutes, kdq_recompute_timetable

    assert SET_BY_THE_CHAOS_RUN == RECOMPUTE_MINUTES_ENV
    monkeypatch.delenv(RECOMPUTE_MINUTES_ENV, raising=False)
    assert kdq_recompute_minutes() == 60
    monkeypatch.setenv(RECOMPUTE_MINUTES_ENV, "5")
    assert kdq_recompute_minutes() == 5
    interval = coerce_to_core_timetable(kdq_recompute_timetable()).infer_manual_data_interval(
        run_after=pendulum.datetime(2026, 11, 27, 10, 7, 30, tz="UTC")
    )
    assert (interval.start, interval.end) == (
        pendulum.datetime(2026, 11, 27, 10, 0, tz="UTC"), pendulum.datetime(2026, 11, 27, 10, 5, tz="UTC")
    )
    for bad in ("7", "0", "90", "-5", "hourly"):
        monkeypatch.setenv(RECOMPUTE_MINUTES_ENV, bad)
        with pytest.raises(ValueError, match=RECOMPUTE_MINUTES_ENV):
            kdq_recompute_minutes()
