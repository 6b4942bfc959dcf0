"""
### kdq stream stop

Manual only. Stops the speed layer gracefully: SIGTERM to its driver, which finishes the running
micro-batch (MERGEs and offsets committed together) and exits; SIGKILL only after the timeout.
Pause `kdq_stream_supervisor` first, or its next run starts the stream again.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG

from kdq_airflow.defaults import kdq_default_args, kdq_start_date
from kdq_airflow.stream import StopStreamOperator

with DAG(
    dag_id="kdq_stream_stop",
    doc_md=__doc__,
    schedule=None,
    start_date=kdq_start_date(),
    catchup=False,
    tags=["kdq", "speed-layer"],
    default_args=kdq_default_args(retry_delay=timedelta(seconds=30), execution_timeout=timedelta(minutes=5)),
):
    StopStreamOperator(task_id="stop_stream")
