"""
### kdq maintenance

Daily housekeeping of the Delta tables (`spark_jobs/maintenance.py`, submitted like the other jobs), on **closed partitions only** (older than today, UTC; the
stream MERGEs into today's, and compacting them would make its MERGEs fail on conflicts), and only **where something
changed**. The `plan` task reads each table's Delta log without Spark (delta-rs, under a second) and logs every
step with what it would do or why it is skipped; when every step is skipped, the Spark job is skipped too (no
session start). Otherwise `optimize_vacuum_retention` plans again in Spark and runs the steps (its report says
what each did):

* `OPTIMIZE` of `raw_archive` (by `event_hour`), `window_counts` and `summaries` (by `window_date`), with a `WHERE`
  naming exactly the closed partitions that received files since they were compacted (two or more small files);
  no OPTIMIZE at all when there are none;
* raw archive retention: rows of `event_hour` partitions older than `archive_retention_days` are first
  *retired* (their counts go to `retired_counts`, which every later recompute adds), then deleted, so a
  record arriving after its hour was deleted adds to the window's full count; skipped when the archive has no
  partition before the cutoff, and (with a log line) while the stream has an uncommitted micro-batch from before
  the retirement instant;
* `VACUUM ... LITE RETAIN 168 HOURS` of every table (Delta's safe minimum, so no reader loses files; LITE reads
  the removed files from the log instead of listing the directories), a `FULL` one on Sundays (also removes
  files of writes that died before their commit); skipped on a table with nothing removed since its last VACUUM.

It stays in the background: one core (`local[1]`, or `spark.cores.max=1` on a cluster) and spark-submit under
`nice -n 10`, so the stream and the SQL endpoint keep theirs.

It runs once a day at a quiet hour (`30 3 * * *` UTC; `KDQ_AIRFLOW_MAINTENANCE_CRON` changes it) and never
at once when Airflow first starts (`make run` at any hour): the first run waits for the next quiet hour.

Checkpoint and metadata cleanup needs no task: the stream trims its own ledger and progress files,
and Spark drops old checkpoint batches itself.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG

from kdq.airflow_pools import BATCH_POOL
from kdq_airflow.defaults import kdq_default_args, kdq_maintenance_timetable
from kdq_airflow.operators import MaintenanceOperator, MaintenancePlanOperator

with DAG(
    dag_id="kdq_maintenance",
    doc_md=__doc__,
    schedule=kdq_maintenance_timetable(),  # no start date: the first run waits for the next quiet hour
    catchup=False,
    max_active_runs=1,
    tags=["kdq", "maintenance"],
    default_args=kdq_default_args(retries=2, retry_delay=timedelta(minutes=5), execution_timeout=timedelta(hours=2)),
):
    # The plan reads the Delta logs without Spark (under a second): outside the batch pool, so it does not wait
    # behind a recompute to find nothing to do; the Spark job runs only when a step has work.
    (
        MaintenancePlanOperator(task_id="plan", archive_retention_days=30, vacuum_retain_hours=168)
        >> MaintenanceOperator(
            task_id="optimize_vacuum_retention", archive_retention_days=30, vacuum_retain_hours=168, pool=BATCH_POOL
        )
    )
