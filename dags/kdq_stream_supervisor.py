"""
### kdq stream supervisor

Every two minutes (`KDQ_AIRFLOW_SUPERVISOR_SECONDS` in Airflow's environment changes it): checks the
speed layer's heartbeat (`<data_dir>/stream/heartbeat.json`) and process, and starts it **detached**
through spark-submit when it is not running or its heartbeat is stale, so no worker slot is held while
it runs. An OS lock (`flock`) on a file next to the heartbeat guarantees that two supervisors never start
two streams (the kernel releases it when a supervisor dies). A driver still starting up beats `starting`
and is left alone (up to `stream.max_startup_seconds`). After repeated restarts without a healthy
heartbeat the task **fails** and restarts are spaced out (doubling, capped at
`stream.supervisor_max_backoff_seconds`): look at its log, which ends with the stream's log tail.
While another driver holds the checkpoint's lease (one driver per checkpoint) nothing is started: the
task returns `owned_elsewhere`.

A micro-batch running longer than `stream.max_batch_seconds` (doubling per attempt of the same batch) is
**hung**: the stream is stopped and started again. A micro-batch that failed `stream.max_batch_failures`
times in a row is **not** restarted again: the task fails with the error, the batch's offset ranges and the
way out (`kdq quarantine-offsets`, `kdq quarantine-batch`, `kdq stream-failure --clear`; docs/operations.md,
"When a batch keeps failing"). Transient failures (disk full, a storage, S3, DynamoDB or Kafka outage) never
count: the stream is restarted until the outage ends (docs/operations.md, "The supervisor under long faults").

Pausing this DAG does **not** stop the stream; trigger `kdq_stream_stop` for that.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG

from kdq_airflow.defaults import kdq_default_args, kdq_start_date, kdq_supervisor_interval
from kdq_airflow.stream import EnsureStreamRunningOperator

with DAG(
    dag_id="kdq_stream_supervisor",
    doc_md=__doc__,
    schedule=kdq_supervisor_interval(),
    start_date=kdq_start_date(),
    catchup=False,
    max_active_runs=1,
    tags=["kdq", "speed-layer"],
    default_args=kdq_default_args(retry_delay=timedelta(seconds=20), execution_timeout=timedelta(minutes=5)),
):
    EnsureStreamRunningOperator(task_id="ensure_stream_running")
