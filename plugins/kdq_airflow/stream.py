"""Keep the speed layer running from Airflow: the supervisor's operator and a graceful stop.

The check itself (what is healthy, when to restart, a hung or blocked micro-batch, the backoff, the lock) is
:func:`kdq.supervisor.ensure_stream_running`; the operator only calls it and fails its task with
:class:`kdq.supervisor.StreamDown`'s message as an ``AirflowException``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

if TYPE_CHECKING:
    from kdq.config import Config


def ensure_stream_running(config: Config, **settings: Any) -> str:
    """:func:`kdq.supervisor.ensure_stream_running` (same arguments and results), with its
    :class:`~kdq.supervisor.StreamDown` raised as an ``AirflowException``: the crash loop or the blocked batch
    shows as a failed task."""
    from kdq import supervisor

    try:
        return supervisor.ensure_stream_running(config, **settings)
    except supervisor.StreamDown as exc:
        # Only the message, as before the check moved: it can hold the stream's log tail, which a chained
        # traceback would print twice in the task log.
        raise AirflowException(str(exc)) from None


class EnsureStreamRunningOperator(BaseOperator):
    """Start the speed layer when it is not running or its heartbeat is stale (see the module doc)."""

    template_fields: Sequence[str] = ("config_path",)

    def __init__(
        self,
        *,
        config_path: str | None = None,
        stale_after_seconds: float = 120.0,
        startup_grace_seconds: float = 180.0,
        max_restarts: int = 3,
        backoff_seconds: float = 120.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config_path = config_path
        self.stale_after_seconds = stale_after_seconds
        self.startup_grace_seconds = startup_grace_seconds
        self.max_restarts = max_restarts
        self.backoff_seconds = backoff_seconds

    def execute(self, context: Any) -> str:
        from kdq.config import load_config

        return ensure_stream_running(
            load_config(self.config_path),
            stale_after_seconds=self.stale_after_seconds,
            startup_grace_seconds=self.startup_grace_seconds,
            max_restarts=self.max_restarts,
            backoff_seconds=self.backoff_seconds,
            log=self.log,
        )


class StopStreamOperator(BaseOperator):
    """SIGTERM the speed layer: its current micro-batch finishes, then it exits (SIGKILL after ``timeout``)."""

    template_fields: Sequence[str] = ("config_path",)

    def __init__(self, *, config_path: str | None = None, timeout: float = 150.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config_path = config_path
        self.timeout = timeout

    def execute(self, context: Any) -> bool:
        from kdq.config import load_config
        from kdq.spark.stream_process import stop_stream

        stopped = stop_stream(load_config(self.config_path), timeout=self.timeout)
        self.log.info("speed layer %s", "stopped" if stopped else "was not running")
        return stopped
