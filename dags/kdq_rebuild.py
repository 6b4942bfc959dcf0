"""
### kdq rebuild

Manual, from the **Trigger** form: re-classifies the archived records of every window starting in
[`from`, `to`) with the **current** rules (after a rule change), MERGEs the differences into
`window_counts` and records them in `corrections` with reason `rule_change` (or `rebuild`), then pushes
the corrected windows to the metrics topic and InfluxDB. Running it again changes nothing.

Times are ISO-8601 (UTC when no zone is given); leave `topics` empty for every topic. `reason` is
kept with the run's parameters (and in the task log) for the audit trail.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from kdq.airflow_pools import BATCH_POOL
from kdq_airflow.defaults import kdq_default_args, kdq_start_date
from kdq_airflow.operators import KdqSparkJobOperator

with DAG(
    dag_id="kdq_rebuild",
    doc_md=__doc__,
    schedule=None,
    start_date=kdq_start_date(),
    catchup=False,
    tags=["kdq", "batch-layer"],
    default_args=kdq_default_args(retry_delay=timedelta(minutes=2), execution_timeout=timedelta(hours=4), pool=BATCH_POOL),
    params={
        "topics": Param(
            "", type="string", title="Topics", description="Comma-separated topic names; empty means all topics."
        ),
        "from": Param(
            type="string",
            format="date-time",
            title="From",
            description="First window start to rebuild (inclusive, event time).",
        ),
        "to": Param(
            type="string",
            format="date-time",
            title="To",
            description="Window start bound (exclusive, event time); must be after From.",
        ),
        "reason": Param(
            "rule change",
            type="string",
            minLength=1,
            title="Reason",
            description="Why the rebuild is needed (logged with the run).",
        ),
    },
):
    KdqSparkJobOperator(
        task_id="rebuild",
        job="rebuild",
        job_args=[
            "--from={{ params['from'] }}",
            "--to={{ params['to'] }}",
            "{{ '--topics=' ~ params.topics if params.topics else '' }}",
            "--run-id={{ run_id }}",
        ],
    )
