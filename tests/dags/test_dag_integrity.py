"""DagBag integrity and parse hygiene, in the style of Airflow's ``test_example_dags.py``.

The DAG folder is parsed once, in a fresh interpreter with its own AIRFLOW_HOME (so neither the
developer's Airflow settings nor modules other tests imported can hide a problem): sockets and
connection/Variable lookups are booby-trapped while the DagBag fills, and the interpreter reports
what it saw as JSON. Parsing needs no metadata database, and the test checks none was created.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DAGS_FOLDER = PROJECT_ROOT / "dags"
PLUGINS_FOLDER = PROJECT_ROOT / "plugins"

EXPECTED_DAGS = {
    "kdq_stream_supervisor",
    "kdq_stream_stop",
    "kdq_hourly_recompute",
    "kdq_rebuild",
    "kdq_maintenance",
    "kdq_expectations",
}
# Modules whose import at parse time would cost seconds per parse or start a JVM.
FORBIDDEN_MODULE_PREFIXES = ("pyspark", "py4j", "delta", "kdq.spark", "confluent_kafka", "kafka", "influxdb")

PARSE_SCRIPT = r"""
import json, socket, sys

attempts = []

def refuse(kind):
    def _refuse(*args, **kwargs):
        attempts.append(f"{kind} {args[1:] if kind == 'socket.connect' else args}")
        raise OSError(f"parse hygiene: {kind} at parse time")
    return _refuse

socket.socket.connect = refuse("socket.connect")
socket.socket.connect_ex = refuse("socket.connect")
socket.create_connection = refuse("socket.create_connection")

from airflow.dag_processing.dagbag import DagBag
from airflow.sdk import BaseHook, Variable

BaseHook.get_connection = classmethod(refuse("BaseHook.get_connection"))
Variable.get = staticmethod(refuse("Variable.get"))

before = set(sys.modules)
bag = DagBag(dag_folder=sys.argv[1])
new_modules = sorted(set(sys.modules) - before)

dags = {}
for dag_id, dag in bag.dags.items():
    dags[dag_id] = {
        "tags": sorted(dag.tags or []),
        "doc_md": dag.doc_md,
        "retries": (dag.default_args or {}).get("retries"),
        "retry_delay": bool((dag.default_args or {}).get("retry_delay")),
        "catchup": dag.catchup,
        "schedule": str(dag.schedule) if dag.schedule is not None else None,
        "max_active_runs": dag.max_active_runs,
        "timetable": type(dag.timetable).__name__,
        "start_date": dag.start_date.isoformat() if dag.start_date else None,
        "params": {
            k: {**dag.params.get_param(k).schema, "description": dag.params.get_param(k).description}
            for k in dag.params
        },
        "tasks": {
            t.task_id: {
                "type": type(t).__name__,
                "outlets": [getattr(o, "uri", str(o)) for o in t.outlets],
                "retries": t.retries,
                "execution_timeout": t.execution_timeout.total_seconds() if t.execution_timeout else None,
                "template_fields": list(t.template_fields),
                "job_args": list(getattr(t, "job_args", []) or []),
                "upstream": sorted(t.upstream_task_ids),
                "pool": t.pool,
            }
            for t in dag.tasks
        },
    }
print("@@RESULT@@" + json.dumps({
    "import_errors": {str(k): v for k, v in bag.import_errors.items()},
    "dags": dags,
    "attempts": attempts,
    "new_modules": new_modules,
}))
"""


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    home = tmp_path_factory.mktemp("airflow_home")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW") and k != "KDQ_CONFIG"},
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS_FOLDER),
        "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        # A config that does not exist: any parse-time load_config() would fail the import.
        "KDQ_CONFIG": str(home / "no-such-kdq.toml"),
    }
    done = subprocess.run(
        [sys.executable, "-c", PARSE_SCRIPT, str(DAGS_FOLDER)],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("@@RESULT@@")), None)
    assert line is not None, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(line.removeprefix("@@RESULT@@"))
    result["db_files"] = sorted(p.name for p in home.rglob("*.db"))
    return result


def test_no_import_errors(parsed: dict) -> None:
    assert parsed["import_errors"] == {}


def test_expected_dags_exist(parsed: dict) -> None:
    assert set(parsed["dags"]) == EXPECTED_DAGS


@pytest.mark.parametrize("dag_id", sorted(EXPECTED_DAGS))
def test_dag_has_tags_doc_and_retries(parsed: dict, dag_id: str) -> None:
    dag = parsed["dags"][dag_id]
    assert "kdq" in dag["tags"]
    assert dag["doc_md"] and dag["doc_md"].lstrip().startswith("###"), "doc_md must be the Markdown module docstring"
    assert dag["retries"] is not None and dag["retries"] >= 1
    assert dag["retry_delay"]
    for task_id, task in dag["tasks"].items():
        assert task["retries"] >= 1, task_id
        assert task["execution_timeout"], f"{dag_id}.{task_id} has no execution_timeout"


def test_hourly_recompute_is_interval_driven_and_emits_the_asset(parsed: dict) -> None:
    dag = parsed["dags"]["kdq_hourly_recompute"]
    assert dag["catchup"] is True
    # A bare "@hourly" is a trigger timetable in Airflow 3: its data interval is empty.
    assert dag["timetable"] == "CronDataIntervalTimetable"
    assert list(dag["tasks"]) == ["recompute", "push_corrections", "influx_catch_up", "reconcile"]
    tasks = dag["tasks"]
    assert tasks["recompute"]["outlets"] == ["kdq://window_counts/"]
    assert "job_args" in tasks["recompute"]["template_fields"]
    assert "--skip-push" in tasks["recompute"]["job_args"]  # the push is its own task
    assert "--compact-closed-hours" in tasks["recompute"]["job_args"]  # the stream's files of closed hours, hourly
    interval = ["--start={{ data_interval_start }}", "--end={{ data_interval_end }}"]
    assert tasks["push_corrections"]["job_args"] == interval
    assert (tasks["push_corrections"]["type"], tasks["influx_catch_up"]["type"]) == (
        "PushCorrectionsOperator", "InfluxCatchUpOperator",
    )


def test_hourly_reconcile_does_not_wait_for_influxdb(parsed: dict) -> None:
    """Reconcile checks Delta against Kafka and the archive; it must run while InfluxDB is down:
    a push or catch-up failing for a day must not leave every hour's reconcile upstream_failed."""
    tasks = parsed["dags"]["kdq_hourly_recompute"]["tasks"]

    def ancestors(task_id: str) -> set[str]:
        found: set[str] = set()
        todo = list(tasks[task_id]["upstream"])
        while todo:
            current = todo.pop()
            if current not in found:
                found.add(current)
                todo.extend(tasks[current]["upstream"])
        return found

    assert ancestors("reconcile") == {"recompute"}
    assert tasks["push_corrections"]["upstream"] == ["recompute"]
    assert tasks["influx_catch_up"]["upstream"] == ["push_corrections"]


def test_default_start_date_without_the_local_override(parsed: dict) -> None:
    # KDQ_AIRFLOW_START_DATE is unset here: the fixed deployment start date. The maintenance has none (below).
    dags = {dag_id: dag for dag_id, dag in parsed["dags"].items() if dag_id != "kdq_maintenance"}
    assert {dag["start_date"] for dag in dags.values()} == {"2026-11-01T00:00:00+00:00"}


def test_maintenance_schedule_of_the_dag_file(parsed: dict) -> None:
    dag = parsed["dags"]["kdq_maintenance"]
    assert dag["start_date"] is None and dag["catchup"] is False
    assert dag["timetable"] == "CronTriggerTimetable"
    # The plan (no Spark) decides whether the Spark job runs at all: a short circuit before it.
    tasks = dag["tasks"]
    assert tasks["plan"]["type"] == "MaintenancePlanOperator" and tasks["plan"]["upstream"] == []
    assert tasks["optimize_vacuum_retention"]["upstream"] == ["plan"]


def test_supervisor_runs_one_at_a_time_and_stop_is_manual(parsed: dict) -> None:
    supervisor = parsed["dags"]["kdq_stream_supervisor"]
    assert supervisor["max_active_runs"] == 1 and supervisor["catchup"] is False
    assert parsed["dags"]["kdq_stream_stop"]["schedule"] is None


def test_batch_jobs_share_one_pool_and_the_supervisor_keeps_a_slot(parsed: dict) -> None:
    """The batch jobs' Spark tasks run in kdq's one-slot pool; the stream's own DAGs stay in the default pool, so
    with two task slots a supervisor run never waits for a maintenance or a recompute to end. The maintenance's
    plan (no Spark: the Delta logs read by delta-rs) stays outside the pool, so it never waits behind a recompute
    to find nothing to do."""
    from kdq.airflow_pools import BATCH_POOL, BATCH_POOL_SLOTS

    assert BATCH_POOL_SLOTS == 1
    pools = {
        (dag_id, task_id): task["pool"] for dag_id, dag in parsed["dags"].items() for task_id, task in dag["tasks"].items()
    }
    batch = {"kdq_maintenance", "kdq_hourly_recompute", "kdq_rebuild"}
    light = {("kdq_maintenance", "plan")}
    assert pools[("kdq_maintenance", "plan")] == "default_pool"
    assert {key for key, pool in pools.items() if pool == BATCH_POOL} == {
        key for key in pools if key[0] in batch and key not in light
    }
    assert {pools[key] for key in pools if key[0] in {"kdq_stream_supervisor", "kdq_stream_stop"}} == {"default_pool"}
    compose = (PROJECT_ROOT / "docker-compose.yml").read_text()
    assert f"airflow pools set {BATCH_POOL} {BATCH_POOL_SLOTS} " in compose, "the deployment creates the pool"


def test_expectations_evaluate_every_15_s_one_run_at_a_time_and_deliver(parsed: dict) -> None:
    dag = parsed["dags"]["kdq_expectations"]
    assert (dag["max_active_runs"], dag["catchup"], dag["schedule"]) == (1, False, "0:01:00")
    task = dag["tasks"]["evaluate_and_notify"]
    # One Spark start-up per run, then an evaluation every 15 s for 59 minutes: always on, restarted within a minute.
    assert task["type"] == "ExpectationsOperator"
    assert task["job_args"] == ["--deliver", "--every=15", "--for-seconds=3540"]


def test_rebuild_params_form(parsed: dict) -> None:
    params = parsed["dags"]["kdq_rebuild"]["params"]
    assert set(params) == {"topics", "from", "to", "reason"}
    for name, schema in params.items():
        assert schema.get("type") == "string", name
        assert schema.get("description"), name
    assert params["from"]["format"] == params["to"]["format"] == "date-time"


def test_parsing_opens_no_connection_and_touches_no_database(parsed: dict) -> None:
    assert parsed["attempts"] == []
    assert parsed["db_files"] == []


def test_parsing_imports_no_spark_or_clients(parsed: dict) -> None:
    heavy = [m for m in parsed["new_modules"] if m.startswith(FORBIDDEN_MODULE_PREFIXES)]
    assert heavy == []
