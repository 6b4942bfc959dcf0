"""Operators that run kdq's Spark jobs (``spark_jobs/<job>.py``) through the Spark provider's hook."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException


def submit_settings(config: Any, job: str) -> dict[str, Any]:
    """SparkSubmitHook keyword arguments equivalent to ``kdq.spark.submit.submit_command`` for ``job``.

    The same :func:`kdq.spark.submit.submission` the CLI uses, so a job run by Airflow and by ``kdq job``
    sees the same session settings: for masters on this machine the cached connector jars (``--jars``,
    which also reach the driver's classpath, unlike a later ``spark.jars`` conf), for any cluster master
    the kdq package (``--py-files``), and secrets of ``[spark.conf]`` in a ``--properties-file`` only this
    user can read, not on the command line. The master is the connection's (``spark_default``).
    """
    from kdq.spark.stream_process import child_env
    from kdq.spark.submit import submission

    parts = submission(config, job)
    return {
        "name": parts.name,
        "jars": parts.jars,
        "py_files": parts.py_files,
        "driver_memory": parts.driver_memory,
        "conf": parts.conf,
        "properties_file": str(parts.properties_file) if parts.properties_file else None,
        # PATH puts this environment's spark-submit (shipped by pyspark) first: the hook runs the
        # binary named by the connection, looked up on the child's PATH.
        "env_vars": child_env(config),
    }


def _report_hook(job: str | None = None, **kwargs: Any) -> Any:
    """A SparkSubmitHook that also keeps the last JSON object line of the job's output: every kdq job
    prints its report that way (:mod:`kdq.job_reports`), and the operator returns it (the task's XCom,
    shown in the UI).

    Overrides the provider's log processing (pinned provider version), still letting it see every line.
    A batch job (every job but the stream and the SQL endpoint) runs its spark-submit under ``nice``
    (``kdq.spark.submit.priority_prefix``); a background job (``kdq.spark.submit.BACKGROUND_JOBS``: the
    maintenance) also has a local master of the connection capped to its cores (``local[1]``), as ``kdq job``
    does (``kdq.spark.submit.submit_command``); a cluster master is capped by ``spark.cores.max`` in the job's
    conf.
    """
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from kdq.spark.submit import capped_master, priority_prefix

    prefix = priority_prefix(job) if job else []

    class ReportHook(SparkSubmitHook):
        report: dict | None = None

        def _get_spark_binary_path(self) -> list[str]:
            return [*prefix, *super()._get_spark_binary_path()]

        def _process_spark_submit_log(self, itr: Any) -> None:
            def tee(lines: Any) -> Any:
                for raw in lines:
                    text = raw.strip() if isinstance(raw, str) else raw
                    if isinstance(text, str) and text.startswith("{") and text.endswith("}"):
                        try:
                            parsed = json.loads(text)
                        except ValueError:
                            parsed = None
                        if isinstance(parsed, dict):
                            self.report = parsed
                    yield raw

            super()._process_spark_submit_log(tee(itr))

    hook = ReportHook(**kwargs)
    if job:
        hook._connection["master"] = capped_master(hook._connection["master"], job)
    return hook


class KdqSparkJobOperator(BaseOperator):
    """Run ``spark_jobs/<job>.py`` with spark-submit; the task fails when the job exits non-zero.

    Returns the job's report (its last JSON line on stdout; schema: :mod:`kdq.job_reports`) as the task's XCom.

    :param job: a file name in ``spark_jobs/`` without ``.py`` (``batch_recompute``, ``rebuild``, ...)
    :param job_args: the job's own arguments (templated: ``--start={{ data_interval_start }}``)
    :param conn_id: the Spark connection (its master: local mode locally, a cluster in the compose deployment)
    :param config_path: kdq config file (templated); default ``$KDQ_CONFIG`` or ``kdq.toml``
    """

    template_fields: Sequence[str] = ("job_args", "config_path")
    ui_color = "#f4a460"

    def __init__(
        self,
        *,
        job: str,
        job_args: list[str] | None = None,
        conn_id: str = "spark_default",
        config_path: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.job_args = list(job_args or [])
        self.conn_id = conn_id
        self.config_path = config_path
        self._hook = None

    def execute(self, context: Any) -> dict | None:
        from kdq.config import load_config
        from kdq.spark.submit import job_path

        config = load_config(self.config_path)
        # An optional argument renders to an empty string when unset (``--topics`` of a rebuild).
        args = [str(a) for a in self.job_args if str(a).strip()]
        self.log.info("spark job %s %s", self.job, args)
        if self.config_path:
            args = ["--config", self.config_path, *args]
        settings = submit_settings(config, self.job)
        settings["env_vars"] = {**settings["env_vars"], **self.job_env()}
        self._hook = _report_hook(job=self.job, conn_id=self.conn_id, application_args=args, **settings)
        try:
            self._hook.submit(str(job_path(self.job)))
        except AirflowException:
            raise
        except Exception as exc:  # e.g. spark-submit missing: still a failed task with the reason
            raise AirflowException(f"kdq job {self.job} could not be submitted: {exc}") from exc
        return self._hook.report

    def job_env(self) -> dict[str, str]:
        """Environment variables for the job beyond kdq's own (a subclass's secrets: never on the command line)."""
        return {}

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.on_kill()


class PushCorrectionsOperator(KdqSparkJobOperator):
    """``spark_jobs/push_corrections.py`` for the data interval, unless the recompute found no late window.

    Corrections of an interval only ever come from its late windows (archive rows ingested in it that
    the stream did not count), a fact of the interval itself: when the recompute task's report
    (:class:`kdq.job_reports.RecomputeReport`) has no late window, for the counts or the streaming
    summaries, no run of this interval can have recorded a correction, and the push would only start a
    Spark session to read an empty result. With late windows it always runs, also when this attempt
    recorded nothing new (an earlier attempt's push may have failed), and without a report.
    """

    def __init__(self, *, recompute_task_id: str = "recompute", job: str = "push_corrections", **kwargs: Any) -> None:
        super().__init__(job=job, **kwargs)
        self.recompute_task_id = recompute_task_id

    def execute(self, context: Any) -> dict | None:
        from kdq.job_reports import RecomputeReport

        printed = context["ti"].xcom_pull(task_ids=self.recompute_task_id)
        # Only a report that says so skips the push: no XCom, or one without late_windows, pushes.
        if isinstance(printed, dict) and "late_windows" in printed and not RecomputeReport.from_dict(printed).found_late_windows:
            self.log.info("the recompute found no late window in this interval: nothing to push")
            return None
        return super().execute(context)


class InfluxCatchUpOperator(KdqSparkJobOperator):
    """``spark_jobs/influx_catch_up.py``, submitted only when a push to InfluxDB is pending.

    The stream and the push task record their first failed InfluxDB write in
    ``<data_dir>/stream/influx_push_state.json``; with nothing recorded there the job would start a
    Spark session only to find nothing to do, so the task reads that small file first and succeeds
    without submitting (one JVM start less per hour).
    """

    def __init__(self, *, job: str = "influx_catch_up", **kwargs: Any) -> None:
        super().__init__(job=job, **kwargs)

    def execute(self, context: Any) -> dict | None:
        from kdq.config import load_config
        from kdq.stream.state import stream_status

        config = load_config(self.config_path)
        pending = stream_status(config)["influx_push"].get("pending_since_ms")
        if not config.influxdb.enabled or (pending is None and not self.job_args):
            self.log.info("no InfluxDB push pending (influxdb.enabled=%s): nothing to catch up", config.influxdb.enabled)
            return None
        self.log.info("InfluxDB push pending since %s ms: submitting the catch-up", pending)
        return super().execute(context)


class MaintenanceOperator(KdqSparkJobOperator):
    """``spark_jobs/maintenance.py``: OPTIMIZE / retention / VACUUM of kdq's Delta tables where something
    changed (:mod:`kdq.spark.maintenance`), submitted like every other kdq job, in the background: one core
    and ``nice`` (:func:`_report_hook`)."""

    def __init__(self, *, archive_retention_days: int = 30, vacuum_retain_hours: int = 168, **kwargs: Any) -> None:
        super().__init__(
            job="maintenance",
            job_args=[f"--archive-retention-days={int(archive_retention_days)}", f"--vacuum-retain-hours={int(vacuum_retain_hours)}"],
            **kwargs,
        )


def _maintenance_has_work(archive_retention_days: int, vacuum_retain_hours: int, config_path: str | None) -> bool:
    from kdq.config import load_config
    from kdq.spark.maintenance import maintenance_has_work

    return maintenance_has_work(load_config(config_path), archive_retention_days, vacuum_retain_hours)


class MaintenancePlanOperator(ShortCircuitOperator):
    """Plan the daily maintenance from the tables' Delta logs in the task's own process (delta-rs, no Spark:
    :func:`kdq.spark.maintenance.maintenance_has_work`) and skip the Spark job downstream when every step
    would be skipped. Light (well under a second of work), so it runs outside the batch jobs' pool and never
    waits behind a recompute to find that there is nothing to do."""

    ui_color = "#f4a460"

    def __init__(self, *, archive_retention_days: int = 30, vacuum_retain_hours: int = 168,
                 config_path: str | None = None, **kwargs: Any) -> None:
        super().__init__(
            python_callable=_maintenance_has_work,
            op_kwargs={"archive_retention_days": int(archive_retention_days),
                       "vacuum_retain_hours": int(vacuum_retain_hours), "config_path": config_path},
            **kwargs,
        )


def _flag(value: Any, default: bool) -> bool:
    if value is None:
        return default
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")


def channel_from_connection(conn: Any) -> dict[str, Any]:
    """A notification channel (:func:`kdq.notify.channels_from_json`) from an Airflow connection, named by its id.

    ``smtp`` (apache-airflow-providers-smtp's type): host, port, login, password; extras ``from_email``,
    ``disable_ssl`` / ``disable_tls`` (the provider's meaning: SMTPS unless disabled, else STARTTLS unless
    disabled), ``timeout``, and kdq's ``to`` (an address or a list). ``http`` / ``https``: the URL is the host
    (with or without its scheme), port and extra ``endpoint``; extra ``headers`` are sent with every POST, and a
    password without an Authorization header becomes ``Authorization: Bearer <password>``.
    """
    extra = conn.extra_dejson or {}
    kind = (conn.conn_type or "").lower()
    if kind == "smtp":
        to = extra.get("to") or []
        return {
            "name": conn.conn_id, "kind": "smtp", "host": conn.host, "port": conn.port,
            "from": extra.get("from_email") or conn.login, "to": [a.strip() for a in to.split(",")] if isinstance(to, str) else to,
            "login": conn.login, "password": conn.password, "ssl": not _flag(extra.get("disable_ssl"), False),
            "starttls": not _flag(extra.get("disable_tls"), False), "timeout": float(extra.get("timeout", 10)),
        }
    if kind in ("http", "https"):
        host = conn.host or ""
        base = host if "://" in host else f"{conn.schema or kind}://{host}"
        url = f"{base.rstrip('/')}{f':{conn.port}' if conn.port else ''}{extra.get('endpoint', '')}"
        headers = dict(extra.get("headers") or {})
        if conn.password and not any(k.lower() == "authorization" for k in headers):
            headers["Authorization"] = f"Bearer {conn.password}"
        return {"name": conn.conn_id, "kind": "webhook", "url": url, "headers": headers,
                "timeout": float(extra.get("timeout", 10))}
    raise AirflowException(f"connection {conn.conn_id!r}: type {conn.conn_type!r} is no notification channel "
                           "(smtp, http or https)")


class ExpectationsOperator(KdqSparkJobOperator):
    """``spark_jobs/evaluate_expectations.py --deliver``: evaluate the expectations, update ``kdq.incidents``,
    and send the pending notifications through the channels of ``channel_conn_ids`` (Airflow connections;
    a missing one is skipped with a log line, its notifications wait in the outbox until it exists).

    The channels reach the job as ``KDQ_NOTIFY_CHANNELS`` in its environment, never on its command line."""

    def __init__(self, *, channel_conn_ids: Sequence[str] = (), horizon_minutes: int | None = None,
                 every_seconds: float = 0.0, for_seconds: float = 0.0, **kwargs: Any) -> None:
        job_args = ["--deliver", *([f"--horizon-minutes={int(horizon_minutes)}"] if horizon_minutes else [])]
        if every_seconds:  # evaluate again in the same session (see the job's --every)
            job_args += [f"--every={every_seconds:g}", f"--for-seconds={for_seconds:g}"]
        super().__init__(job="evaluate_expectations", job_args=job_args, **kwargs)
        self.channel_conn_ids = list(channel_conn_ids)

    def job_env(self) -> dict[str, str]:
        from airflow.sdk import BaseHook

        from kdq.notify import CHANNELS_ENV

        channels = []
        for conn_id in self.channel_conn_ids:
            try:
                conn = BaseHook.get_connection(conn_id)
            except Exception:  # AirflowNotFoundException: the channel is not set up (yet)
                self.log.info("no Airflow connection %r: that channel is not notified", conn_id)
                continue
            channels.append(channel_from_connection(conn))
        self.log.info("notification channels: %s", [c["name"] for c in channels] or "none")
        return {CHANNELS_ENV: json.dumps(channels)}
