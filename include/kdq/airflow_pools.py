"""The Airflow pool of kdq's batch jobs: shared by the DAG files (``plugins/kdq_airflow/defaults.py``), the
local run that creates it (``kdq.stack.airflow``) and the compose deployment's ``airflow-init`` (by name).

The batch jobs' tasks (the daily maintenance, the hourly recompute's tasks, rebuilds) run in this pool of one
slot, so at most one of them runs at a time and, with the local run's two task slots (``core.parallelism``),
the stream supervisor always finds one free. Without it the daily maintenance and a recompute held both slots
for minutes and the supervisor's runs waited 96-169 s for a slot (``python -m benchmarks.local_run``): a
stream that died then stayed down that long. A task of a pool that does not exist is not scheduled (Airflow
shows a warning on its DAG), so whoever starts Airflow creates it.
"""

BATCH_POOL = "kdq_batch_jobs"
BATCH_POOL_SLOTS = 1
BATCH_POOL_DESCRIPTION = "kdq's batch jobs, one at a time: the stream supervisor keeps a task slot"
