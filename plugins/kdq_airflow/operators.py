"""Operators that run kdq's Spark jobs (``spark_jobs/<job>.py``) through the Spark provider's hook."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException


def submit_settings(config: Any, job: str) -> dict[str, Any]:
    """SparkSubmitHook keyword arguments equivalent to ``kdq.spark.submit.submit_command`` for ``job``.

    The same ``spark_conf`` the CLI uses, so a job run by Airflow and by ``kdq job`` sees the same
    session settings; for local masters that includes the cached connector jars (``--jars``, which
    also reach the driver's classpath, unlike a later ``spark.jars`` conf).
    """
    from kdq.spark.session import spark_conf
    from kdq.stream_process import child_env

    conf = spark_conf(config, f"kdq-{job}")
    return {
        "name": conf.pop("spark.app.name"),
        "jars": conf.pop("spark.jars", None),
        "driver_memory": conf.pop("spark.driver.memory"),
        "conf": dict(sorted(conf.items())),
        # PATH puts this environment's spark-submit (shipped by pyspark) first: the hook runs the
        # binary named by the connection, looked up on the child's PATH.
        "env_vars": child_env(config),
    }


class KdqSparkJobOperator(BaseOperator):
    """Run ``spark_jobs/<job>.py`` with spark-submit; the task fails when the job exits non-zero.

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

    def execute(self, context: Any) -> None:
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        from kdq.config import load_config
        from kdq.spark.submit import job_path

        config = load_config(self.config_path)
        # An optional argument renders to an empty string when unset (``--topics`` of a rebuild).
        args = [str(a) for a in self.job_args if str(a).strip()]
        self.log.info("spark job %s %s", self.job, args)
        if self.config_path:
            args = ["--config", self.config_path, *args]
        self._hook = SparkSubmitHook(conn_id=self.conn_id, application_args=args, **submit_settings(config, self.job))
        try:
            self._hook.submit(str(job_path(self.job)))
        except AirflowException:
            raise
        except Exception as exc:  # e.g. spark-submit missing: still a failed task with the reason
            raise AirflowException(f"kdq job {self.job} could not be submitted: {exc}") from exc

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.on_kill()


class MaintenanceOperator(BaseOperator):
    """OPTIMIZE / VACUUM / archive retention of kdq's Delta tables (see :mod:`kdq_airflow.maintenance`)."""

    template_fields: Sequence[str] = ("config_path",)

    def __init__(
        self,
        *,
        archive_retention_days: int = 30,
        vacuum_retain_hours: int = 168,
        config_path: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.archive_retention_days = archive_retention_days
        self.vacuum_retain_hours = vacuum_retain_hours
        self.config_path = config_path

    def execute(self, context: Any) -> dict:
        from kdq.config import load_config
        from kdq_airflow.maintenance import run_maintenance

        return run_maintenance(
            load_config(self.config_path),
            archive_retention_days=self.archive_retention_days,
            vacuum_retain_hours=self.vacuum_retain_hours,
        )
