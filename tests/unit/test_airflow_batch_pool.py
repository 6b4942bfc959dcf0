"""The batch jobs' pool is created at the local Airflow's start through its REST API; a 5xx answer (standalone's
SQLite "Database error" while another part holds its write lock) is retried until a deadline, not fatal."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from kdq.airflow_pools import BATCH_POOL
from kdq.procs import StackError
from kdq.stack.airflow import LocalAirflow
from tests.conftest import make_config


def response(status: int, text: str = "") -> requests.Response:
    r = requests.Response()
    r.status_code = status
    r._content = text.encode()
    return r


class FakeApi:
    def __init__(self, answers: list[requests.Response]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str]] = []

    def request(self, method: str, path: str, **_kwargs) -> requests.Response:
        self.calls.append((method, path))
        return self.answers.pop(0)


def airflow_with(tmp_path: Path, monkeypatch, api: FakeApi) -> LocalAirflow:
    airflow = LocalAirflow(make_config(tmp_path), 8999)
    monkeypatch.setattr(airflow, "api", lambda: api)
    return airflow


def test_a_database_error_is_retried_until_the_pool_is_made(tmp_path: Path, monkeypatch) -> None:
    error = '{"detail":{"reason":"Database error"}}'
    api = FakeApi([response(500, error), response(404), response(500, error), response(201)])
    airflow_with(tmp_path, monkeypatch, api).ensure_batch_pool(timeout=10, pause=0.01)
    assert api.calls == [("GET", f"pools/{BATCH_POOL}")] * 2 + [("POST", "pools")] * 2


def test_an_error_that_outlasts_the_deadline_fails_the_start_with_the_answer(tmp_path: Path, monkeypatch) -> None:
    api = FakeApi([response(404)] + [response(503, "still locked")] * 100)
    with pytest.raises(StackError, match="creating pool .* failed: 503 still locked"):
        airflow_with(tmp_path, monkeypatch, api).ensure_batch_pool(timeout=0.05, pause=0.01)


def test_an_existing_pool_is_kept(tmp_path: Path, monkeypatch) -> None:
    api = FakeApi([response(200)])
    airflow_with(tmp_path, monkeypatch, api).ensure_batch_pool(timeout=1, pause=0.01)
    assert api.calls == [("GET", f"pools/{BATCH_POOL}")]
