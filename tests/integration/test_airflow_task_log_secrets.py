"""No secret in the Airflow task log of a failing kdq job.

The session's Airflow (``airflow_services``: scheduler, LocalExecutor, API server) runs a real ``kdq_rebuild``
task twice, triggered through the REST API like a user does, while the kdq config its tasks load
(``KDQ_CONFIG``, the session's kdq.toml) holds known secret values in every place Spark, Hadoop, a Kafka client or
InfluxDB take one from ([kafka.client], [spark.conf], influxdb.password/token and credentials in influxdb.url):

* a config error in the task itself: ``isolation.level = read_uncommitted`` beside the secrets, refused when the
  operator loads the config (the error shows [kafka.client], redacted);
* a failing Spark job: a valid config, the secrets handed to spark-submit (the Spark ones in its private
  properties file), and a ``spark.serializer`` that does not exist, so the job's SparkContext fails to start.

Each time the task fails, its log names the problem, and no secret appears in the log file Airflow wrote nor in
the log the API serves (what the UI shows). The config file is restored, the DAG paused again and the runs deleted
afterwards, so later Airflow tests see the session's Airflow as before.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from kdq.config import Config

# slow: Airflow standalone (and a browser) for minutes; `make test-slow`, not CI (its time budget).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAG = "kdq_rebuild"
TASK = "rebuild"
MARK = f"kdqleak{uuid.uuid4().hex[:10]}"  # every secret below contains it; alphanumeric, so JSON logs keep it as is


def _secret(n: int) -> str:
    return f"{MARK}x{n:02d}"


def _pem(n: int) -> str:
    return f"-----BEGIN PRIVATE KEY-----\nMIIE{_secret(n)}\n-----END PRIVATE KEY-----"


# Values the Kafka clients treat as secret. No setting that changes how the clients connect to the session's
# broker: none is used before the job fails, but a job that got that far must still reach it.
KAFKA_SECRETS = {
    "ssl.key.password": _secret(1),
    "ssl.keystore.password": _secret(2),
    "ssl.truststore.password": _secret(3),
    "ssl.keystore.key": _pem(4),
    "sasl.oauthbearer.client.secret": _secret(5),
}
SPARK_SECRETS = {
    "spark.authenticate.secret": _secret(10),
    "spark.hadoop.fs.s3a.secret.key": _secret(11),
    "spark.hadoop.fs.s3a.access.key": _secret(12),
    "spark.hadoop.fs.s3a.session.token": _secret(13),
    "spark.hadoop.fs.azure.account.key.kdq.dfs.core.windows.net": _secret(14),
    "spark.ssl.keyPassword": _secret(15),
}
JAAS = f'org.apache.kafka.common.security.plain.PlainLoginModule required username="kdq" password="{_secret(6)}";'


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def _write_config(config: Config, path: Path, changes: dict[str, dict]) -> None:
    """The session's config with ``changes`` (merged into its sections; dict settings merged key by key) as a
    TOML file, not validated: a change may be one kdq refuses."""
    lines = []
    for name in ("paths", "kafka", "spark", "stream", "influxdb"):
        values = getattr(config, name).model_dump()
        for key, value in changes.get(name, {}).items():
            values[key] = {**values[key], **value} if isinstance(values.get(key), dict) else value
        lines.append(f"[{name}]")
        for key, value in values.items():
            if isinstance(value, dict):
                inner = ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items())
                lines.append(f"{key} = {{ {inner} }}")
            else:
                if name == "paths" and isinstance(value, Path):
                    value = str(config.path(value))
                lines.append(f"{key} = {_toml_value(value)}")
    path.write_text("\n".join(lines) + "\n")


def _secrets_everywhere(config: Config) -> dict[str, dict]:
    url = config.influx_url()
    return {
        "kafka": {"client": KAFKA_SECRETS},
        "spark": {"conf": SPARK_SECRETS},
        "influxdb": {"password": _secret(20), "token": _secret(21), "username": "kdq",
                     "url": url.replace("://", f"://kdq:{_secret(22)}@", 1)},
    }


@pytest.fixture
def api(airflow_services):
    return airflow_services.airflow.api()


@pytest.fixture
def kdq_toml(airflow_services) -> Iterator[Path]:
    """The session's config file (the tasks' KDQ_CONFIG), restored afterwards; the DAG paused again."""
    path = Path(airflow_services.config.source)
    original = path.read_text()
    try:
        yield path
    finally:
        path.write_text(original)
        airflow_services.airflow.api().request("PATCH", f"dags/{DAG}", json={"is_paused": True}).raise_for_status()


def _run_until_the_first_attempt_fails(api, timeout: float = 420) -> tuple[str, dict]:
    """Trigger the DAG (unpaused only meanwhile); wait until the task's first attempt has failed (it is then up
    for retry); pause the DAG and return the run id and the task instance."""
    api.request("PATCH", f"dags/{DAG}", json={"is_paused": False}).raise_for_status()
    response = api.request("POST", f"dags/{DAG}/dagRuns", json={
        "logical_date": None,
        "conf": {"from": "2023-11-14T00:00:00+00:00", "to": "2023-11-14T01:00:00+00:00", "reason": "task log secrets test"},
    })
    assert response.ok, response.text
    run_id = response.json()["dag_run_id"]
    deadline = time.monotonic() + timeout
    ti: dict = {}
    try:
        while time.monotonic() < deadline:
            response = api.request("GET", f"dags/{DAG}/dagRuns/{run_id}/taskInstances/{TASK}")
            if response.status_code != 404:  # 404: the scheduler has not created the task instance yet
                response.raise_for_status()
                ti = response.json()
                if ti["state"] in ("up_for_retry", "failed", "success"):
                    return run_id, ti
            time.sleep(2)
        raise AssertionError(f"{DAG} {run_id}: the task did not finish an attempt within {timeout:.0f}s: {ti}")
    finally:
        api.request("PATCH", f"dags/{DAG}", json={"is_paused": True}).raise_for_status()


def _task_log(airflow, api, run_id: str, try_number: int = 1) -> str:
    """The attempt's log file under Airflow's log folder, and the log the API serves for it (the UI's)."""
    folder = airflow.home / "logs" / f"dag_id={DAG}"

    def read() -> str | None:
        files = [p for p in folder.rglob("*.log") if f"run_id={run_id}" in str(p) and f"attempt={try_number}" in p.name]
        return "\n".join(p.read_text(errors="replace") for p in files) if files else None

    # The supervisor reports the state as the task process ends: its last lines may still be on their way.
    deadline, text, previous = time.monotonic() + 60, None, None
    while time.monotonic() < deadline:
        text = read()
        if text is not None and text == previous:
            break
        previous = text
        time.sleep(2)
    assert text, f"no log file of {run_id} attempt {try_number} under {folder}"
    response = requests.get(
        f"{api.base_url}/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/{TASK}/logs/{try_number}",
        params={"full_content": True}, timeout=30,
        headers={"Authorization": f"Bearer {api.token()}", "Accept": "application/json"},
    )
    assert response.ok, response.text
    return text + "\n" + response.text


def _forget(api, run_id: str) -> None:
    """End the run (its task is up for retry) and delete it: no retry under the restored config, and the DAG's
    last run is again what it was."""
    response = api.request("PATCH", f"dags/{DAG}/dagRuns/{run_id}", json={"state": "failed"})
    assert response.ok, response.text
    response = api.request("DELETE", f"dags/{DAG}/dagRuns/{run_id}")
    assert response.status_code in (204, 404), response.text


def _leaks(text: str) -> list[str]:
    return sorted({text[max(i - 60, 0): i + 40] for i in _find_all(text, MARK)})


def _find_all(text: str, needle: str) -> Iterator[int]:
    start = text.find(needle)
    while start >= 0:
        yield start
        start = text.find(needle, start + 1)


def _failed_attempt_log(airflow_services, api) -> str:
    """Trigger the DAG, wait for its task's first attempt to fail, and return that attempt's log (the run is
    ended and deleted afterwards, so no retry runs)."""
    run_id, ti = _run_until_the_first_attempt_fails(api)
    try:
        assert ti["state"] in ("up_for_retry", "failed"), ti
        return _task_log(airflow_services.airflow, api, run_id)
    finally:
        _forget(api, run_id)


@pytest.mark.timeout(1200)
def test_a_config_error_in_the_task_names_the_key_not_the_secrets(airflow_services, api, kdq_toml) -> None:
    config = airflow_services.config
    changes = _secrets_everywhere(config)
    changes["kafka"]["client"] = {**changes["kafka"]["client"], "sasl.jaas.config": JAAS,
                                  "isolation.level": "read_uncommitted"}
    _write_config(config, kdq_toml, changes)
    log = _failed_attempt_log(airflow_services, api)
    assert "ConfigError" in log and "isolation.level" in log and "read_committed" in log, log[-4000:]
    assert "kafka.client" in log, log[-4000:]
    assert not _leaks(log), _leaks(log)


@pytest.mark.timeout(1200)
def test_a_failing_spark_job_logs_no_secret(airflow_services, api, kdq_toml) -> None:
    config = airflow_services.config
    changes = _secrets_everywhere(config)
    changes["spark"]["conf"] = {**changes["spark"]["conf"], "spark.serializer": "io.kdq.NoSuchSerializer"}
    _write_config(config, kdq_toml, changes)
    before = set((config.data_dir / "spark-submit").glob("secrets-*.properties"))
    log = _failed_attempt_log(airflow_services, api)
    # The job was submitted with the secrets (the Spark ones in its private properties file) and failed in Spark.
    written = set((config.data_dir / "spark-submit").glob("secrets-*.properties")) - before
    assert any(_secret(10) in p.read_text() for p in written), written
    assert "NoSuchSerializer" in log and "spark-submit" in log, log[-4000:]
    assert not _leaks(log), _leaks(log)
