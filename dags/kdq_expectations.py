"""
### kdq expectations

The always-on evaluator: a run starts `spark_jobs/evaluate_expectations.py`, which looks every 15 s for 59 minutes
(`--every 15 --for-seconds 3540`, one Spark start-up an hour) and, when the counts, the incidents or the
stream's state changed since its last evaluation, judges the expectations of
`config/rules/topics.toml` (`[expectations]`, docs/expectations.md) on the per-minute counts of `window_counts`
and on the stream's last progress, updates the incidents in `kdq.incidents`, and sends
the notifications no channel has delivered yet:

* the channels are Airflow connections, by default `kdq_smtp` (type `smtp`) and `kdq_webhook` (type `http`);
  `KDQ_AIRFLOW_NOTIFY_CONNECTIONS` lists others. A missing connection is skipped (its notifications wait);
* a channel that fails is retried with backoff and then left for the next run: it never fails the task, and
  the evaluation is committed before anything is sent;
* a re-run (a retry of the task, a restart) evaluates the same counts to the same incidents: nothing is written
  or sent twice.

One run at a time, no catchup; scheduled every minute (`KDQ_AIRFLOW_EXPECTATIONS_SECONDS`, at least 30 s), so
the next run starts within a minute of one ending or failing. Each evaluation re-evaluates the last three hours
whatever ran before.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG

from kdq_airflow.defaults import (
    kdq_default_args,
    kdq_expectations_interval,
    kdq_expectations_repeat,
    kdq_notify_connections,
    kdq_start_date,
)
from kdq_airflow.operators import ExpectationsOperator

every, for_seconds = kdq_expectations_repeat()

with DAG(
    dag_id="kdq_expectations",
    doc_md=__doc__,
    schedule=kdq_expectations_interval(),
    start_date=kdq_start_date(),
    catchup=False,
    max_active_runs=1,
    tags=["kdq", "expectations"],
    # A run evaluates for an hour (for_seconds); past that and a quarter of an hour it is stuck.
    default_args=kdq_default_args(retry_delay=timedelta(seconds=20),
                                  execution_timeout=timedelta(seconds=for_seconds + 900)),
):
    ExpectationsOperator(task_id="evaluate_and_notify", channel_conn_ids=kdq_notify_connections(),
                         every_seconds=every, for_seconds=for_seconds)
