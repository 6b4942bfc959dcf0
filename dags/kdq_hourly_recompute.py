"""
### kdq hourly recompute

The batch layer for one hour of **ingest time**, the run's data interval `[logical date, +1 h)`:

1. `recompute`: `spark_jobs/batch_recompute.py --skip-push` counts the interval's late and uncounted
   records and MERGEs the differences into `window_counts` (one `corrections` row each), then
   (`--compact-closed-hours`) compacts the closed hours of the day's tables. Emits the `kdq://window_counts` Asset.
2. `push_corrections`: `spark_jobs/push_corrections.py` sends the current absolute count of every window
   the interval's corrections touched to the metrics topic and InfluxDB (a failed InfluxDB write is
   recorded for the catch-up and fails the task; a retry pushes again, harmlessly). Succeeds without a
   Spark job when the recompute's report (its XCom, `kdq.job_reports.RecomputeReport`) has no late window in the interval.
3. `influx_catch_up`: pushes every window updated since the first failed InfluxDB push of the stream or
   of step 2; succeeds at once, without a Spark job, when nothing is pending.
4. `reconcile`: offsets and counts of the interval checked against Kafka and the archive; fails the
   run when there is a gap or a mismatch. The counts check covers the windows of the interval and every
   window its late rows touched; rows too late for the stream that arrived after the interval ended are
   the next run's to count, so they are no mismatch here (`--after-recompute`). It depends on the
   recompute only, not on steps 2 and 3: it reads Delta, Kafka and the archive, never InfluxDB, so an
   InfluxDB outage (a failing push or catch-up) does not skip the reconcile of every hour it lasts.

`recompute >> [push_corrections >> influx_catch_up, reconcile]`.

Every task reads and writes only its interval and is idempotent (re-running changes nothing), so
catchup is on, and a range is recomputed with
`airflow backfill create --dag-id kdq_hourly_recompute --from-date 2026-11-22T09:00:00+00:00
--to-date 2026-11-22T11:00:00+00:00 --max-active-runs 1` (runs for 09:00, 10:00 and 11:00).
A manual run (UI **Trigger**, `airflow dags test`) recomputes the last full hour before its logical date.
The schedule is an explicit data-interval timetable: Airflow 3 turns a bare `"@hourly"` into a trigger
timetable whose data interval is empty. `KDQ_AIRFLOW_RECOMPUTE_MINUTES` (a divisor of 60) shortens the
intervals; the chaos run uses 5 minutes so the batch layer runs beside the stream several times.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Asset

from kdq.airflow_pools import BATCH_POOL
from kdq_airflow.defaults import kdq_default_args, kdq_recompute_timetable, kdq_start_date
from kdq_airflow.operators import InfluxCatchUpOperator, KdqSparkJobOperator, PushCorrectionsOperator

WINDOW_COUNTS = Asset("kdq://window_counts")
INTERVAL = ["--start={{ data_interval_start }}", "--end={{ data_interval_end }}"]

with DAG(
    dag_id="kdq_hourly_recompute",
    doc_md=__doc__,
    schedule=kdq_recompute_timetable(),  # hourly; KDQ_AIRFLOW_RECOMPUTE_MINUTES shortens it (the chaos run)
    start_date=kdq_start_date(),
    catchup=True,
    max_active_runs=1,  # concurrent MERGEs into window_counts would conflict
    tags=["kdq", "batch-layer"],
    default_args=kdq_default_args(retries=3, max_retry_delay=timedelta(minutes=20), pool=BATCH_POOL),
):
    recompute = KdqSparkJobOperator(
        task_id="recompute",
        job="batch_recompute",
        job_args=[*INTERVAL, "--run-id={{ run_id }}", "--skip-push", "--compact-closed-hours"],
        outlets=[WINDOW_COUNTS],
    )
    push = PushCorrectionsOperator(task_id="push_corrections", job_args=INTERVAL)
    catch_up = InfluxCatchUpOperator(task_id="influx_catch_up")
    reconcile = KdqSparkJobOperator(
        task_id="reconcile",
        job="reconcile",
        job_args=["--from={{ data_interval_start }}", "--to={{ data_interval_end }}", "--after-recompute"],
    )
    # The reconcile needs no InfluxDB: it must not be upstream_failed while InfluxDB is down.
    recompute >> push >> catch_up
    recompute >> reconcile
