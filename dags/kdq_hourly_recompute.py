"""
### kdq hourly recompute

The batch layer for one hour of **ingest time** (the run's data interval):

1. `recompute`: `spark_jobs/batch_recompute.py` counts the interval's late and uncounted records,
   MERGEs the differences into `window_counts` (one `corrections` row each) and pushes the corrected
   windows to the metrics topic and InfluxDB. Emits the `kdq://window_counts` Asset.
2. `influx_catch_up`: pushes every window updated since the stream's first failed InfluxDB push.
3. `reconcile`: offsets and counts of the interval checked against Kafka and the archive; fails the
   run when there is a gap or a mismatch.

Every task reads and writes only its interval and is idempotent (re-running changes nothing), so
catchup is on: `airflow backfill create --dag-id kdq_hourly_recompute --from-date ... --to-date ...`
recomputes a range.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, Asset

from kdq_airflow.operators import KdqSparkJobOperator

WINDOW_COUNTS = Asset("kdq://window_counts")
INTERVAL = ["--start={{ data_interval_start }}", "--end={{ data_interval_end }}"]

with DAG(
    dag_id="kdq_hourly_recompute",
    doc_md=__doc__,
    schedule="@hourly",
    start_date=datetime(2026, 11, 1, tzinfo=UTC),
    catchup=True,
    max_active_runs=1,  # concurrent MERGEs into window_counts would conflict
    tags=["kdq", "batch-layer"],
    default_args={
        "owner": "kdq",
        "retries": 3,
        "retry_delay": timedelta(minutes=1),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(minutes=20),
        "execution_timeout": timedelta(minutes=30),
    },
):
    recompute = KdqSparkJobOperator(
        task_id="recompute",
        job="batch_recompute",
        job_args=[*INTERVAL, "--run-id={{ run_id }}"],
        outlets=[WINDOW_COUNTS],
    )
    catch_up = KdqSparkJobOperator(task_id="influx_catch_up", job="influx_catch_up")
    reconcile = KdqSparkJobOperator(
        task_id="reconcile",
        job="reconcile",
        job_args=["--from={{ data_interval_start }}", "--to={{ data_interval_end }}"],
    )
    recompute >> catch_up >> reconcile
