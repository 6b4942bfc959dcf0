"""Airflow standalone running for real (scheduler, DAG processor, API server, triggerer): a backfill of the
hourly DAG executed by the scheduler, the REST API behind a simple-auth-manager login, and the UI in a
headless Chromium (a screenshot of the DAG list is kept in ``test-artifacts/``).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
import requests

from kdq.stack.airflow import USERNAME
from tests.conftest import PROJECT_ROOT

# slow: Airflow standalone (and a browser) for minutes; `make test-slow`, not CI (its time budget).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOURLY = "kdq_hourly_recompute"
SUPERVISOR = "kdq_stream_supervisor"
STOP = "kdq_stream_stop"
KDQ_DAGS = {
    "kdq_stream_supervisor", "kdq_stream_stop", "kdq_hourly_recompute", "kdq_rebuild", "kdq_maintenance", "kdq_expectations",
}
ARTIFACTS = PROJECT_ROOT / "test-artifacts"


class Api:
    """The REST API as a user sees it: a JWT from POST /auth/token, then /api/v2 with a bearer token."""

    def __init__(self, base_url: str, password: str) -> None:
        self.base_url = base_url
        response = requests.post(f"{base_url}/auth/token", json={"username": USERNAME, "password": password}, timeout=10)
        assert response.status_code == 201, response.text
        self.token = response.json()["access_token"]

    def call(self, method: str, path: str, **kwargs) -> dict:
        response = requests.request(method, f"{self.base_url}/api/v2/{path}",
                                    headers={"Authorization": f"Bearer {self.token}"}, timeout=15, **kwargs)
        assert response.ok, f"{method} {path}: {response.status_code} {response.text}"
        return response.json()

    def runs(self, dag_id: str, **params) -> list[dict]:
        return self.call("GET", f"dags/{dag_id}/dagRuns", params={"limit": 100, **params})["dag_runs"]

    def xcom(self, dag_id: str, run_id: str, task_id: str):
        """A task's return value (None when it returned nothing)."""
        response = requests.get(
            f"{self.base_url}/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value",
            headers={"Authorization": f"Bearer {self.token}"}, params={"deserialize": True}, timeout=15,
        )
        if response.status_code == 404:
            return None
        assert response.ok, response.text
        return response.json()["value"]

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        tis = self.call("GET", f"dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti["state"] for ti in tis}


def wait_runs(api: Api, dag_id: str, select, expected: int, timeout: float) -> list[dict]:
    """Poll until ``expected`` runs chosen by ``select`` have finished; fail at once when one failed."""
    deadline = time.monotonic() + timeout
    runs: list[dict] = []
    while time.monotonic() < deadline:
        runs = [r for r in api.runs(dag_id) if select(r)]
        failed = [r for r in runs if r["state"] == "failed"]
        assert not failed, [(r["dag_run_id"], api.task_states(dag_id, r["dag_run_id"])) for r in failed]
        if len(runs) == expected and all(r["state"] == "success" for r in runs):
            return runs
        time.sleep(3)
    raise AssertionError(f"{dag_id}: not {expected} successful runs within {timeout:.0f}s: "
                         f"{[(r['dag_run_id'], r['state']) for r in runs]}")


@pytest.fixture(scope="module")
def api(airflow_services) -> Iterator[Api]:
    client = Api(airflow_services.airflow.url, airflow_services.airflow.password())
    yield client
    # The scheduler runs on for the session: leave every DAG paused as the session's Airflow starts them,
    # so no scheduled run of the hourly DAG starts under a later test once the clock passes the hour.
    for dag_id in KDQ_DAGS:
        client.call("PATCH", f"dags/{dag_id}", json={"is_paused": True})


@pytest.fixture(scope="module")
def backfill(airflow_services, api) -> tuple[list[datetime], list[dict]]:
    """`airflow backfill create` over the three full hours before the DAGs' start date, run by the scheduler.

    Before the start date on purpose (backfills are exempt from it): once the clock passes the next hour,
    the unpaused DAG has a scheduled run of its own for [start, start + 1 h), and a backfill skips an
    interval that already has a run, so hours relative to *now* would make this depend on the time of day.
    """
    api.call("PATCH", f"dags/{HOURLY}", json={"is_paused": False})  # the scheduler runs no paused DAG's backfill
    last = airflow_services.start - timedelta(hours=1)
    hours = [last - timedelta(hours=2), last - timedelta(hours=1), last]
    airflow_services.airflow.cli(
        "backfill", "create", "--dag-id", HOURLY, "--from-date", hours[0].isoformat(),
        "--to-date", hours[-1].isoformat(), "--max-active-runs", "1", timeout=120,
    )
    runs = wait_runs(api, HOURLY, lambda r: r["run_type"] == "backfill", 3, timeout=900)
    return hours, runs


@pytest.mark.timeout(1200)
def test_backfill_of_three_hours_runs_through_the_scheduler(api, backfill) -> None:
    hours, runs = backfill
    by_interval = sorted(
        (datetime.fromisoformat(r["data_interval_start"]), datetime.fromisoformat(r["data_interval_end"]), r)
        for r in runs
    )
    # One run per hour, each over its own data interval [h, h + 1 h), with every task done.
    assert [(s, e) for s, e, _ in by_interval] == [(h, h + timedelta(hours=1)) for h in hours]
    for _, _, run in by_interval:
        assert api.task_states(HOURLY, run["dag_run_id"]) == {
            "recompute": "success", "push_corrections": "success", "influx_catch_up": "success", "reconcile": "success",
        }
        # The jobs' JSON summaries are the tasks' XComs: nothing was late in these hours, so the push
        # task submitted no job, and the reconciliation found nothing wrong.
        recompute = api.xcom(HOURLY, run["dag_run_id"], "recompute")
        assert (recompute["late_windows"], recompute["corrections"], recompute["ok"]) == (0, 0, True), recompute
        assert recompute["run_id"] == run["dag_run_id"]
        assert api.xcom(HOURLY, run["dag_run_id"], "push_corrections") is None
        assert api.xcom(HOURLY, run["dag_run_id"], "reconcile")["ok"] is True


@pytest.mark.timeout(900)
def test_ui_lists_the_dags_with_their_last_run(airflow_services, api, backfill) -> None:
    # A manual run through the scheduler (a no-op: no stream runs now), so a second DAG has a last run.
    api.call("PATCH", f"dags/{STOP}", json={"is_paused": False})
    triggered = api.call("POST", f"dags/{STOP}/dagRuns", json={"logical_date": None})
    wait_runs(api, STOP, lambda r: r["dag_run_id"] == triggered["dag_run_id"], 1, timeout=300)

    dags = {d["dag_id"]: d for d in api.call("GET", "dags", params={"limit": 100})["dags"]}
    assert set(dags) == KDQ_DAGS
    last_state = {}
    for dag_id in KDQ_DAGS:
        latest = api.runs(dag_id, order_by="-run_after", limit=1)
        last_state[dag_id] = latest[0]["state"] if latest else None
    # The supervisor has runs only when test_airflow_dag_runs.py ran before in this session.
    assert last_state.pop(SUPERVISOR) in (None, "success")
    # Paused (dags_are_paused_at_creation): its runs are test_quality_page.py's `dags test`, when it ran before.
    assert last_state.pop("kdq_expectations") in (None, "success")
    assert last_state == {
        "kdq_hourly_recompute": "success",
        "kdq_stream_stop": "success",
        "kdq_rebuild": None,
        "kdq_maintenance": None,
    }
    assert all("kdq" in {t["name"] for t in dags[d]["tags"]} for d in KDQ_DAGS)

    # The UI itself: log in through the simple auth manager's form, open the DAG list, keep a screenshot.
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.set_page_load_timeout(60)
        driver.get(f"{airflow_services.airflow.url}/")
        wait = WebDriverWait(driver, 60)
        username = wait.until(lambda d: d.find_element(By.NAME, "username"))
        username.send_keys(USERNAME)
        password = driver.find_element(By.NAME, "password")
        password.send_keys(airflow_services.airflow.password())
        password.send_keys(Keys.ENTER)
        wait.until(lambda d: "/auth/login" not in d.current_url)
        driver.get(f"{airflow_services.airflow.url}/dags")

        def dag_list_text(d) -> str | None:
            body = d.find_element(By.TAG_NAME, "body").text
            return body if all(dag_id in body for dag_id in KDQ_DAGS) else None

        text = wait.until(dag_list_text)
        time.sleep(1)  # let the last-run badges render
        ARTIFACTS.mkdir(exist_ok=True)
        screenshot = ARTIFACTS / "airflow-dag-list.png"
        assert driver.save_screenshot(str(screenshot))
        (ARTIFACTS / "airflow-dag-list.txt").write_text(text)
    finally:
        driver.quit()

    data = screenshot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1400, 1000) or width >= 800, (width, height)
    assert len(data) > 20_000, len(data)  # a rendered page, not a blank image
