"""The plugin pieces that need no Airflow run: the supervisor lock, the maintenance statements, the
shared DAG defaults, the local start date, and the operators' submissions (spark-submit replaced by a stand-in)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

PLUGINS_FOLDER = Path(__file__).resolve().parents[2] / "plugins"
if str(PLUGINS_FOLDER) not in sys.path:
    sys.path.insert(0, str(PLUGINS_FOLDER))

from kdq.spark.maintenance import maintenance_plan  # noqa: E402
from kdq.supervisor import LockHeld, supervisor_lock  # noqa: E402
from kdq_airflow.defaults import START_DATE_ENV, kdq_default_args, kdq_start_date  # noqa: E402
from tests.conftest import make_config  # noqa: E402


def test_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    lock = tmp_path / "stream" / "supervisor.lock"
    with supervisor_lock(lock):
        assert lock.read_text() == str(os.getpid())  # the holder, for the message
        with pytest.raises(LockHeld, match=str(os.getpid())):
            with supervisor_lock(lock):  # another open file description: the OS lock is exclusive
                pass
    with supervisor_lock(lock):  # released
        pass


def test_lock_of_a_dead_supervisor_is_taken_over(tmp_path: Path) -> None:
    """A supervisor killed while holding the lock: the kernel released it; the pid left in the file is ignored."""
    lock = tmp_path / "supervisor.lock"
    holder = subprocess.run(
        [sys.executable, "-c",
         "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); "
         "os.write(fd, str(os.getpid()).encode()); os._exit(9)", str(lock)],
        timeout=30,
    )
    assert holder.returncode == 9 and lock.read_text().strip()
    with supervisor_lock(lock):
        assert lock.read_text() == str(os.getpid())


def test_maintenance_touches_only_closed_partitions(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    steps = maintenance_plan(config, dt.date(2026, 11, 22), archive_retention_days=30)
    optimize = [s for s in steps if s.action == "optimize"]
    assert [(s.table, s.where) for s in optimize] == [
        ("raw_archive", "event_hour < '2026-11-22-00'"),
        ("window_counts", "window_date < DATE'2026-11-22'"),
        ("summaries", "window_date < DATE'2026-11-22'"),
    ]
    [retire] = [s for s in steps if s.action == "retire"]
    assert retire.table == "raw_archive" and retire.cutoff == dt.date(2026, 10, 23)
    # Rows ingested before midnight of the day before the run (a day of margin for slow writers).
    assert retire.retire_before_ms == int(dt.datetime(2026, 11, 21, tzinfo=dt.UTC).timestamp() * 1000)
    assert "ingest_time < '2026-11-21T00:00:00+00:00'" in retire.describe()
    vacuums = [s for s in steps if s.action == "vacuum"]
    from kdq.tables import ALL_TABLES

    assert {s.table for s in vacuums} == {spec.name for spec in ALL_TABLES} and {s.retain_hours for s in vacuums} == {168}
    # Retention comes after compaction and before the vacuum that removes the deleted files.
    assert [s.action for s in steps].index("retire") == 3 and steps[-1].action == "vacuum"


def test_a_summary_lateness_over_a_day_keeps_more_partitions_open(tmp_path: Path) -> None:
    config = make_config(tmp_path).with_summaries(
        [{"name": "lat", "topic": "ops", "value": "v", "window_seconds": 600, "allowed_lateness_seconds": 2 * 86400}]
    )
    optimize = [s for s in maintenance_plan(config, dt.date(2026, 11, 22), 30) if s.action == "optimize"]
    assert all("2026-11-21" in s.where for s in optimize), optimize


def test_maintenance_rejects_unsafe_settings(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with pytest.raises(ValueError, match="vacuum_retain_hours"):
        maintenance_plan(config, dt.date(2026, 11, 22), 30, vacuum_retain_hours=24)
    with pytest.raises(ValueError, match="archive_retention_days"):
        maintenance_plan(config, dt.date(2026, 11, 22), 0)


def test_default_args_are_shared_and_overridable() -> None:
    base = kdq_default_args()
    assert base["owner"] == "kdq" and base["retries"] >= 1 and base["retry_delay"] and base["execution_timeout"]
    hourly = kdq_default_args(retries=3, max_retry_delay=timedelta(minutes=20))
    assert hourly == {**base, "retries": 3, "max_retry_delay": timedelta(minutes=20)}


def test_start_date_from_the_local_override(monkeypatch: pytest.MonkeyPatch) -> None:
    default = datetime(2026, 11, 1, tzinfo=UTC)
    monkeypatch.delenv(START_DATE_ENV, raising=False)
    assert kdq_start_date(default) == default
    monkeypatch.setenv(START_DATE_ENV, "2026-11-22T17:00:00+00:00")
    assert kdq_start_date(default) == datetime(2026, 11, 22, 17, tzinfo=UTC)
    monkeypatch.setenv(START_DATE_ENV, "2026-11-22T18:00:00+01:00")
    assert kdq_start_date(default) == datetime(2026, 11, 22, 17, tzinfo=UTC)
    monkeypatch.setenv(START_DATE_ENV, "2026-11-22 17:00")  # no zone: UTC
    assert kdq_start_date(default) == datetime(2026, 11, 22, 17, tzinfo=UTC)
    monkeypatch.setenv(START_DATE_ENV, "yesterday")
    with pytest.raises(ValueError, match=START_DATE_ENV):
        kdq_start_date(default)


def test_local_run_start_date_bounds_the_catch_up() -> None:
    from kdq.stack.airflow import START_DATE_ENV as SET_BY_THE_LOCAL_RUN
    from kdq.stack.airflow import local_start_date

    assert SET_BY_THE_LOCAL_RUN == START_DATE_ENV
    first = datetime(2026, 11, 22, 9, 41, tzinfo=UTC)
    # Fresh start: the current hour, so the first scheduled run is for this hour, at its end.
    assert local_start_date(first, datetime(2026, 11, 22, 9, 42, tzinfo=UTC)) == datetime(2026, 11, 22, 9, tzinfo=UTC)
    # Restarted an hour later: the missed hour is caught up.
    assert local_start_date(first, datetime(2026, 11, 22, 11, 5, tzinfo=UTC)) == datetime(2026, 11, 22, 9, tzinfo=UTC)
    # Restarted days later: only the last two full hours.
    later = datetime(2026, 11, 25, 8, 30, tzinfo=UTC)
    assert local_start_date(first, later) == datetime(2026, 11, 25, 6, tzinfo=UTC)
    assert local_start_date(first, later, catchup_hours=0) == datetime(2026, 11, 25, 8, tzinfo=UTC)


def test_maintenance_is_a_spark_job_like_the_others() -> None:
    from kdq_airflow.operators import KdqSparkJobOperator, MaintenanceOperator

    task = MaintenanceOperator(task_id="m", archive_retention_days=7, vacuum_retain_hours=200)
    assert isinstance(task, KdqSparkJobOperator) and task.job == "maintenance"
    assert task.job_args == ["--archive-retention-days=7", "--vacuum-retain-hours=200"]
    from spark_jobs import maintenance

    args = maintenance.parse_args(task.job_args + ["--today", "2026-11-24"])
    assert (args.archive_retention_days, args.vacuum_retain_hours, args.today) == (7, 200, dt.date(2026, 11, 24))


# What spark-submit's place takes in the operator tests below: it prints what a kdq job prints (log lines, a JSON
# array, an earlier JSON object, then its report as the last JSON object line, here naming the command line it got)
# and exits with FAKE_SUBMIT_EXIT.
FAKE_SPARK_SUBMIT = """
import json, os, sys
print("26/11/28 12:00:00 INFO SparkContext: Running Spark version 4.0.1")
print(json.dumps([1, 2]))
print(json.dumps({"earlier": True}))
print("{not json}")
print(json.dumps({"ok": True, "argv": sys.argv[1:]}))
print("26/11/28 12:00:09 INFO SparkContext: Successfully stopped SparkContext")
sys.exit(int(os.environ.get("FAKE_SUBMIT_EXIT", "0")))
"""


class Submissions:
    """The operators' real path (execute -> submit_settings -> the report hook -> SparkSubmitHook.submit), with only
    the spark-submit process replaced: the hook's Popen records the command line and the environment, then runs
    :data:`FAKE_SPARK_SUBMIT` in its place with the hook's own pipes. ``missing`` makes the binary absent."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import subprocess
        from types import SimpleNamespace

        from airflow.providers.apache.spark.hooks import spark_submit

        self.commands: list[list[str]] = []
        self.envs: list[dict[str, str]] = []
        self.missing = False
        self._popen = subprocess.Popen
        monkeypatch.setattr(
            spark_submit, "subprocess", SimpleNamespace(Popen=self._run, PIPE=subprocess.PIPE, STDOUT=subprocess.STDOUT)
        )

    def _run(self, command: list[str], **kwargs):
        self.commands.append(list(command))
        self.envs.append(dict(kwargs.get("env") or {}))
        if self.missing:
            raise FileNotFoundError(2, "No such file or directory", command[0])
        return self._popen([sys.executable, "-c", FAKE_SPARK_SUBMIT, *command], **kwargs)

    def job_of(self, command: list[str]) -> str:
        """The job a command line submits: the application's file name in spark_jobs/."""
        return next(Path(part).stem for part in command if part.endswith(".py") and "spark_jobs" in part)


@pytest.fixture
def submissions(monkeypatch: pytest.MonkeyPatch) -> Submissions:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.delenv("FAKE_SUBMIT_EXIT", raising=False)
    return Submissions(monkeypatch)


def _config_file(tmp_path: Path, **spark: str) -> Path:
    from tests.conftest import PROJECT_ROOT

    path = tmp_path / "kdq.toml"
    lines = ["[paths]", f'data_dir = "{tmp_path / "data"}"', f'jars_dir = "{PROJECT_ROOT / ".cache" / "jars"}"', "[spark]"]
    lines += [f'{key} = "{value}"' for key, value in spark.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_spark_job_task_submits_the_job_and_returns_its_report(submissions: Submissions, tmp_path: Path) -> None:
    """execute submits spark_jobs/<job>.py with the CLI's submission, the config file and the job's arguments (an
    empty one dropped) on the command line, at batch priority, on the connection's master; it returns the last JSON
    object the job printed."""
    from kdq.config import load_config
    from kdq.spark.submit import job_path, priority_prefix, submission
    from kdq_airflow.operators import KdqSparkJobOperator

    config_file = _config_file(tmp_path)
    task = KdqSparkJobOperator(task_id="recompute", job="batch_recompute", config_path=str(config_file),
                               job_args=["--start=2026-11-28T10:00:00+00:00", "", "--skip-push"])
    report = task.execute({})

    [command] = submissions.commands
    prefix = priority_prefix("batch_recompute")
    assert prefix and command[: len(prefix)] == prefix  # below the stream: chrt --idle / nice
    assert command[len(prefix)] == "spark-submit"
    assert command[command.index("--master") + 1] == "local[2]"
    application = command.index(str(job_path("batch_recompute")))
    assert command[application + 1:] == [
        "--config", str(config_file), "--start=2026-11-28T10:00:00+00:00", "--skip-push"]
    parts = submission(load_config(config_file), "batch_recompute")
    assert command[command.index("--name") + 1] == parts.name
    if parts.jars:
        assert command[command.index("--jars") + 1] == parts.jars
    # The report is what the job printed last, not an earlier JSON line: here it names the command line the job got.
    assert report == {"ok": True, "argv": command}
    [env] = submissions.envs
    assert env["PYSPARK_PYTHON"] == sys.executable and env["PATH"].startswith(str(Path(sys.executable).parent))
    assert env["TZ"] == "UTC"


def test_a_failed_or_unsubmittable_job_fails_the_task(
    submissions: Submissions, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.sdk.exceptions import AirflowException

    from kdq_airflow.operators import KdqSparkJobOperator

    task = KdqSparkJobOperator(task_id="rebuild", job="rebuild", config_path=str(_config_file(tmp_path)))
    monkeypatch.setenv("FAKE_SUBMIT_EXIT", "3")
    with pytest.raises(AirflowException, match="Error code is: 3"):
        task.execute({})
    monkeypatch.delenv("FAKE_SUBMIT_EXIT")
    submissions.missing = True
    with pytest.raises(AirflowException, match="kdq job rebuild could not be submitted: .*No such file"):
        task.execute({})
    assert [submissions.job_of(c) for c in submissions.commands] == ["rebuild", "rebuild"]
    with pytest.raises(Exception, match="no Spark job named 'no_such_job'"):
        KdqSparkJobOperator(task_id="x", job="no_such_job", config_path=str(_config_file(tmp_path))).execute({})
    assert len(submissions.commands) == 2  # nothing run for a job that does not exist


def test_maintenance_is_submitted_on_one_core_with_its_arguments(submissions: Submissions, tmp_path: Path) -> None:
    from kdq_airflow.operators import MaintenanceOperator

    task = MaintenanceOperator(task_id="m", archive_retention_days=7, config_path=str(_config_file(tmp_path)))
    task.execute({})
    [command] = submissions.commands
    assert submissions.job_of(command) == "maintenance"
    assert command[command.index("--master") + 1] == "local[1]"  # the connection's local[2], capped
    assert command[-2:] == ["--archive-retention-days=7", "--vacuum-retain-hours=168"]


def test_the_expectations_channels_reach_the_job_in_its_environment_only(
    submissions: Submissions, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kdq.notify import CHANNELS_ENV
    from kdq_airflow.operators import ExpectationsOperator

    monkeypatch.setenv("AIRFLOW_CONN_KDQ_WEBHOOK", json.dumps({
        "conn_type": "http", "host": "hooks.example", "schema": "https", "password": "tok-5e0f"}))
    task = ExpectationsOperator(task_id="e", channel_conn_ids=["kdq_webhook"], config_path=str(_config_file(tmp_path)))
    task.execute({})
    [command], [env] = submissions.commands, submissions.envs
    assert submissions.job_of(command) == "evaluate_expectations" and command[-1] == "--deliver"
    assert "tok-5e0f" not in " ".join(command)
    [channel] = json.loads(env[CHANNELS_ENV])
    assert channel["url"] == "https://hooks.example" and channel["headers"] == {"Authorization": "Bearer tok-5e0f"}


def test_push_corrections_reads_the_recompute_report(submissions: Submissions, tmp_path: Path) -> None:
    """Skipped only when the recompute's report says no window was late; else push_corrections is submitted and
    its own report returned."""
    from kdq_airflow.operators import PushCorrectionsOperator

    class TaskInstance:
        def __init__(self, xcom):
            self.xcom = xcom

        def xcom_pull(self, task_ids):
            assert task_ids == "recompute"
            return self.xcom

    task = PushCorrectionsOperator(task_id="push_corrections", config_path=str(_config_file(tmp_path)))
    none_late = {"late_windows": 0, "corrections": 0, "summaries": {"late_windows": 0}, "ok": True}
    assert task.execute({"ti": TaskInstance(none_late)}) is None and submissions.commands == []
    summaries_late = {**none_late, "summaries": {"late_windows": 2}}
    pushes = [summaries_late, {**none_late, "late_windows": 1},
              None, {"ok": True}]  # no report, or not a recompute report: push anyway
    for number, printed in enumerate(pushes, start=1):
        report = task.execute({"ti": TaskInstance(printed)})
        assert len(submissions.commands) == number and report == {"ok": True, "argv": submissions.commands[-1]}
    assert [submissions.job_of(c) for c in submissions.commands] == ["push_corrections"] * 4


def test_the_influx_catch_up_is_submitted_only_with_a_push_pending(submissions: Submissions, tmp_path: Path) -> None:
    from kdq.config import load_config
    from kdq.stream.state import InfluxPushState
    from kdq_airflow.operators import InfluxCatchUpOperator

    config_file = _config_file(tmp_path)
    task = InfluxCatchUpOperator(task_id="influx_catch_up", config_path=str(config_file))
    assert load_config(config_file).influxdb.enabled
    assert task.execute({}) is None and submissions.commands == []  # nothing pending: no Spark session started
    InfluxPushState(load_config(config_file)).record_failure(1_700_000_000_000, "connection refused")
    report = task.execute({})
    [command] = submissions.commands
    assert submissions.job_of(command) == "influx_catch_up" and report == {"ok": True, "argv": command}


def test_airflow_submits_like_the_cli_with_secrets_off_the_command_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The operators' SparkSubmitHook gets the CLI's submission: the cluster master's --py-files, the jars, and
    [spark.conf]'s secrets in the private --properties-file (the hook masks secrets in its log, not in the
    process list)."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from kdq.spark.submit import submission
    from kdq_airflow.operators import submit_settings

    master = "spark://127.0.0.1:7077"
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": master}))
    config = make_config(tmp_path, spark={"master": master, "conf": {"spark.hadoop.fs.s3a.secret.key": "s3cr3t-81bd"}})
    command = SparkSubmitHook(conn_id="spark_default", **submit_settings(config, "batch_recompute"))._build_spark_submit_command(
        "spark_jobs/batch_recompute.py"
    )
    parts = submission(config, "batch_recompute")
    assert command[command.index("--master") + 1] == master
    assert command[command.index("--py-files") + 1] == parts.py_files and parts.py_files.endswith("kdq.zip")
    assert command[command.index("--jars") + 1] == parts.jars
    assert command[command.index("--properties-file") + 1] == str(parts.properties_file)
    assert "s3cr3t-81bd" not in " ".join(command) and "s3cr3t-81bd" in parts.properties_file.read_text()


@pytest.mark.parametrize(
    ("recorded", "master"),
    [
        ({}, "local[2]"),  # `kdq run`: the configured local master
        ({"cluster": True, "spark_master": "spark://127.0.0.1:7111"}, "spark://127.0.0.1:7111"),  # `kdq run --cluster`
    ],
)
def test_local_airflow_spark_default_names_the_stacks_master(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, recorded: dict, master: str
) -> None:
    """`kdq run`'s spark_default, as the Spark provider resolves it (SparkSubmitHook._resolve_connection): the
    master every kdq job of the data folder uses, client mode. On the cluster shape Airflow's environment also
    caps the stream (the supervisor's tasks load the config themselves)."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from kdq.config import load_config
    from kdq.stack.airflow import LocalAirflow

    config = make_config(tmp_path, spark={"master": "local[2]"})
    config.state_file.parent.mkdir(parents=True, exist_ok=True)
    config.state_file.write_text(json.dumps(recorded))
    env = LocalAirflow(config.reload_stack_addresses(), 8999).env()
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", env["AIRFLOW_CONN_SPARK_DEFAULT"])
    resolved = SparkSubmitHook(conn_id="spark_default")._connection
    assert (resolved["master"], resolved["deploy_mode"]) == (master, "client")
    tasks = load_config(
        path=Path(config.source),
        env={k: v for k, v in env.items() if k.startswith("KDQ_")},
        overrides={"paths": {"data_dir": str(tmp_path)}},
    )
    cluster = bool(recorded)
    assert (tasks.spark.stream_cores_max, tasks.spark.sql_endpoint_cores_max) == ((1, 1) if cluster else (0, 0))


def test_maintenance_waits_for_its_quiet_hour_on_a_first_start() -> None:
    """`make run` at any hour must not start the daily maintenance at once. With a start date and
    catchup=False Airflow schedules the latest past interval immediately; the maintenance has no start date and
    its trigger timetable waits for the next quiet hour, whatever the hour of the first start."""
    from unittest import mock

    import pendulum
    from airflow.timetables.base import TimeRestriction

    from kdq_airflow.defaults import DEFAULT_MAINTENANCE_CRON, kdq_maintenance_cron, kdq_maintenance_timetable

    assert kdq_maintenance_cron() == DEFAULT_MAINTENANCE_CRON
    from airflow.serialization.encoders import coerce_to_core_timetable

    timetable = coerce_to_core_timetable(kdq_maintenance_timetable())  # what the scheduler runs
    for hour, minute in ((0, 25), (3, 31), (3, 40), (12, 0), (23, 59)):
        now = pendulum.instance(datetime(2026, 11, 27, hour, minute, tzinfo=UTC))
        with mock.patch("airflow.timetables.trigger.utcnow", return_value=now):
            first = timetable.next_dagrun_info(
                last_automated_data_interval=None, restriction=TimeRestriction(earliest=None, latest=None, catchup=False)
            )
        assert first is not None and first.run_after > now, (hour, minute, first)
        assert first.run_after - now <= timedelta(days=1)
        assert (first.run_after.hour, first.run_after.minute) == (3, 30)


def test_a_malformed_maintenance_cron_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from kdq_airflow.defaults import MAINTENANCE_CRON_ENV, kdq_maintenance_cron

    monkeypatch.setenv(MAINTENANCE_CRON_ENV, "every night")
    with pytest.raises(ValueError, match=MAINTENANCE_CRON_ENV):
        kdq_maintenance_cron()
    monkeypatch.setenv(MAINTENANCE_CRON_ENV, "0 2 * * *")
    assert kdq_maintenance_cron() == "0 2 * * *"


def test_expectations_channels_come_from_airflow_connections_into_the_jobs_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An smtp and an http connection become kdq.notify channels (the SMTP provider's extras, same defaults), in
    ``KDQ_NOTIFY_CHANNELS`` of the job's environment, never in its command line; a missing connection is skipped."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from kdq.notify import CHANNELS_ENV, SmtpChannel, WebhookChannel, channels_from_json
    from kdq_airflow.operators import ExpectationsOperator, submit_settings

    monkeypatch.setenv("AIRFLOW_CONN_KDQ_SMTP", json.dumps({
        "conn_type": "smtp", "host": "mail.example", "port": 587, "login": "kdq", "password": "pw-7c1e",
        "extra": {"from_email": "kdq@example", "to": "a@example, b@example", "disable_ssl": True}}))
    monkeypatch.setenv("AIRFLOW_CONN_KDQ_WEBHOOK", json.dumps({
        "conn_type": "http", "host": "hooks.example", "schema": "https", "password": "tok-93ad",
        "extra": {"endpoint": "/kdq/incidents"}}))
    task = ExpectationsOperator(task_id="evaluate_and_notify", channel_conn_ids=["kdq_smtp", "kdq_webhook", "kdq_pager"])
    assert task.job == "evaluate_expectations" and task.job_args == ["--deliver"]
    env = task.job_env()
    mail, hook = channels_from_json(env[CHANNELS_ENV])
    assert mail == SmtpChannel("kdq_smtp", "mail.example", 587, "kdq@example", ("a@example", "b@example"), "kdq",
                               "pw-7c1e", ssl=False, starttls=True)
    assert isinstance(hook, WebhookChannel) and hook.url == "https://hooks.example/kdq/incidents"
    assert hook.headers == {"Authorization": "Bearer tok-93ad"}

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    settings = submit_settings(make_config(tmp_path), "evaluate_expectations")
    command = SparkSubmitHook(conn_id="spark_default", **settings)._build_spark_submit_command(
        "spark_jobs/evaluate_expectations.py")
    assert "pw-7c1e" not in " ".join(command) and "tok-93ad" not in " ".join(command)


def test_expectations_interval_and_connections_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from kdq_airflow.defaults import (
        EXPECTATIONS_INTERVAL_ENV,
        NOTIFY_CONNECTIONS_ENV,
        kdq_expectations_interval,
        kdq_notify_connections,
    )

    assert kdq_expectations_interval() == timedelta(minutes=1)
    assert kdq_notify_connections() == ("kdq_smtp", "kdq_webhook")
    monkeypatch.setenv(EXPECTATIONS_INTERVAL_ENV, "30")
    assert kdq_expectations_interval() == timedelta(seconds=30)
    monkeypatch.setenv(EXPECTATIONS_INTERVAL_ENV, "5")
    with pytest.raises(ValueError, match=EXPECTATIONS_INTERVAL_ENV):
        kdq_expectations_interval()
    monkeypatch.setenv(NOTIFY_CONNECTIONS_ENV, " ops_mail , ")
    assert kdq_notify_connections() == ("ops_mail",)


def test_an_expectations_run_evaluates_for_an_hour_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    from kdq_airflow.defaults import EXPECTATIONS_RUN_ENV, kdq_expectations_repeat

    monkeypatch.delenv(EXPECTATIONS_RUN_ENV, raising=False)
    assert kdq_expectations_repeat() == (15.0, 3540.0)
    monkeypatch.setenv(EXPECTATIONS_RUN_ENV, "0")  # one evaluation per run (a test's `airflow dags test`)
    assert kdq_expectations_repeat() == (0.0, 0.0)
    monkeypatch.setenv(EXPECTATIONS_RUN_ENV, "-5")
    with pytest.raises(ValueError, match=EXPECTATIONS_RUN_ENV):
        kdq_expectations_repeat()
