"""What every kdq DAG shares: default task arguments and the start date.

Both are read while Airflow parses the DAG files, so they are plain values: no connection, no file, only
the process environment (which the scheduler, the DAG processor and the task workers share).

The start date is fixed in a deployment (a moving ``start_date`` makes the scheduler skip or repeat
intervals). The local run (``make run``, :mod:`kdq.stack.airflow`) sets ``KDQ_AIRFLOW_START_DATE`` to the
hour Airflow was first started there (moved forward to at most a few hours ago on a later start): with
``catchup=True`` the hourly DAG then runs the hours since that start instead of every hour since
:data:`DEFAULT_START_DATE`; older hours remain reachable with ``airflow backfill create``, which does
not look at the start date.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

DEFAULT_START_DATE = datetime(2026, 11, 1, tzinfo=UTC)
START_DATE_ENV = "KDQ_AIRFLOW_START_DATE"
SUPERVISOR_INTERVAL_ENV = "KDQ_AIRFLOW_SUPERVISOR_SECONDS"
MAINTENANCE_CRON_ENV = "KDQ_AIRFLOW_MAINTENANCE_CRON"
RECOMPUTE_MINUTES_ENV = "KDQ_AIRFLOW_RECOMPUTE_MINUTES"
EXPECTATIONS_INTERVAL_ENV = "KDQ_AIRFLOW_EXPECTATIONS_SECONDS"
NOTIFY_CONNECTIONS_ENV = "KDQ_AIRFLOW_NOTIFY_CONNECTIONS"
DEFAULT_EXPECTATIONS_INTERVAL = timedelta(minutes=1)
DEFAULT_NOTIFY_CONNECTIONS = ("kdq_smtp", "kdq_webhook")
# The daily maintenance's quiet hour (UTC): after midnight's partitions closed, before a working day.
DEFAULT_MAINTENANCE_CRON = "30 3 * * *"
DEFAULT_SUPERVISOR_INTERVAL = timedelta(minutes=2)



def kdq_default_args(**overrides: Any) -> dict[str, Any]:
    """Task defaults of every kdq DAG (retries with exponential backoff, a timeout), with per-DAG overrides."""
    return {
        "owner": "kdq",
        "retries": 1,
        "retry_delay": timedelta(minutes=1),
        "retry_exponential_backoff": True,
        "execution_timeout": timedelta(minutes=30),
        **overrides,
    }


def kdq_start_date(default: datetime = DEFAULT_START_DATE) -> datetime:
    """``$KDQ_AIRFLOW_START_DATE`` (ISO-8601, UTC when no zone is given) or ``default``.

    A malformed value raises, so the DAG shows an import error naming the variable instead of silently
    scheduling from another date.
    """
    value = os.environ.get(START_DATE_ENV, "").strip()
    if not value:
        return default
    try:
        moment = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(f"{START_DATE_ENV}={value!r}: expected an ISO-8601 date-time") from exc
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def kdq_supervisor_interval(default: timedelta = DEFAULT_SUPERVISOR_INTERVAL) -> timedelta:
    """How often the stream supervisor checks the speed layer: ``$KDQ_AIRFLOW_SUPERVISOR_SECONDS`` or ``default``.

    The interval bounds how long a dead stream stays down before a restart begins. Two minutes suits a
    stream that rarely dies; the chaos run (``make chaos``) kills it every minute or so and checks every
    30 s. Below 10 s the supervisor's own task start-up would overlap the next run, so that is refused, as
    is a malformed value (an import error naming the variable, not a silently different schedule).
    """
    return _seconds_from_env(SUPERVISOR_INTERVAL_ENV, default, at_least=10)


def _seconds_from_env(name: str, default: timedelta, at_least: float) -> timedelta:
    """``$name`` as a number of seconds (at least ``at_least``), or ``default`` when unset; a malformed or too
    small value raises ValueError naming the variable (at DAG import: never a silently different schedule)."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= at_least:
        raise ValueError(f"{name}={value!r}: expected a number of seconds, at least {at_least:g}")
    return timedelta(seconds=seconds)


def kdq_maintenance_cron(default: str = DEFAULT_MAINTENANCE_CRON) -> str:
    """When the daily maintenance runs: ``$KDQ_AIRFLOW_MAINTENANCE_CRON`` (a five-field cron expression, UTC) or
    ``default``. A malformed value is an import error naming the variable."""
    value = os.environ.get(MAINTENANCE_CRON_ENV, "").strip() or default
    from croniter import croniter

    if len(value.split()) != 5 or not croniter.is_valid(value):
        raise ValueError(f"{MAINTENANCE_CRON_ENV}={value!r}: expected a five-field cron expression, e.g. {default!r}")
    return value


def kdq_maintenance_timetable():
    """The maintenance DAG's schedule: :func:`kdq_maintenance_cron`, UTC, first run at the next quiet hour.

    Used without a start date: with one, Airflow runs the latest past quiet hour as soon as the DAG is first
    unpaused (catchup=False still schedules the most recent interval), so `make run` at any hour started the
    maintenance at once. A zero timedelta, not False: Airflow 3.3 treats ``run_immediately=False`` like None
    (it runs a past time within 10 % of the period)."""
    from airflow.sdk import CronTriggerTimetable

    return CronTriggerTimetable(kdq_maintenance_cron(), timezone="UTC", run_immediately=timedelta(0))


def kdq_recompute_minutes(default: int = 60) -> int:
    """The length of the recompute DAG's intervals in minutes: ``$KDQ_AIRFLOW_RECOMPUTE_MINUTES`` or an hour.

    An hour in a deployment (late data is corrected within the hour after it arrived). The chaos run
    (``make chaos``) shortens it so the batch layer runs on its schedule several times beside the stream
    during a twenty-minute run. A divisor of 60 (the intervals are aligned to the hour, so every hour is
    covered by whole intervals); anything else is an import error naming the variable.
    """
    value = os.environ.get(RECOMPUTE_MINUTES_ENV, "").strip()
    if not value:
        return default
    minutes = int(value) if value.isdigit() else 0
    if minutes < 1 or 60 % minutes:
        raise ValueError(f"{RECOMPUTE_MINUTES_ENV}={value!r}: expected a number of minutes that divides 60 (5, 15, 60, ...)")
    return minutes


def kdq_recompute_timetable():
    """The recompute DAG's schedule: data intervals of :func:`kdq_recompute_minutes`, aligned to the hour, UTC.

    An explicit data-interval timetable: Airflow 3 turns a bare ``"@hourly"`` into a trigger timetable whose
    data interval is empty."""
    from airflow.sdk import CronDataIntervalTimetable

    minutes = kdq_recompute_minutes()
    return CronDataIntervalTimetable("@hourly" if minutes == 60 else f"*/{minutes} * * * *", timezone="UTC")


def kdq_expectations_interval(default: timedelta = DEFAULT_EXPECTATIONS_INTERVAL) -> timedelta:
    """How often the expectations are evaluated: ``$KDQ_AIRFLOW_EXPECTATIONS_SECONDS`` or every minute.

    The interval bounds how late an incident opens after its records were counted (it is due within a
    minute). At least 30 s: each run starts a Spark session, and a shorter interval would queue runs behind
    each other (the DAG runs one at a time). A malformed value is an import error naming the variable."""
    return _seconds_from_env(EXPECTATIONS_INTERVAL_ENV, default, at_least=30)


EXPECTATIONS_EVERY_SECONDS = 15.0
EXPECTATIONS_RUN_SECONDS = 3540.0  # a run of the kdq_expectations DAG evaluates for 59 minutes
EXPECTATIONS_RUN_ENV = "KDQ_AIRFLOW_EXPECTATIONS_RUN_SECONDS"


def kdq_expectations_repeat(default: timedelta = timedelta(seconds=EXPECTATIONS_RUN_SECONDS)) -> tuple[float, float]:
    """(every, for_seconds) of one run of the kdq_expectations DAG: an evaluation every 15 s for
    ``$KDQ_AIRFLOW_EXPECTATIONS_RUN_SECONDS`` (default 59 minutes) in one Spark session; 0: one evaluation per run.
    The DAG's schedule (every minute, one run at a time) starts the next run within a minute of one ending or
    failing, so the evaluator is always on, supervised like the stream. A run per minute evaluating once paid a
    Spark start-up for each evaluation, and on a saturated 2-core machine a start-up in the background took
    minutes (benchmarks.local_run saw evaluations 4 to 5 minutes apart): an incident is due within a minute of
    its records."""
    run_seconds = _seconds_from_env(EXPECTATIONS_RUN_ENV, default, at_least=0).total_seconds()
    return (EXPECTATIONS_EVERY_SECONDS if run_seconds else 0.0), run_seconds


def kdq_notify_connections(default: tuple[str, ...] = DEFAULT_NOTIFY_CONNECTIONS) -> tuple[str, ...]:
    """The Airflow connection ids of the notification channels: ``$KDQ_AIRFLOW_NOTIFY_CONNECTIONS``
    (comma-separated) or ``kdq_smtp,kdq_webhook``. Only ids here: a connection is looked up when the task runs,
    never while the DAG file is parsed."""
    value = os.environ.get(NOTIFY_CONNECTIONS_ENV)
    if value is None:
        return default
    return tuple(c.strip() for c in value.split(",") if c.strip())
