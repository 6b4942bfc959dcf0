"""The data-quality page's plugin as Airflow loads it from the plugins folder: no import error, registered once
(Airflow imports every .py file of the folder, so a re-export of the class would register it twice), its app
mounted outside Airflow's reserved prefixes, and the navigation entry pointing at the app's page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json
from airflow import plugins_manager
from airflow.api_fastapi.app import RESERVED_URL_PREFIXES
plugins, errors = plugins_manager._get_plugins()
apps, _ = plugins_manager.get_fastapi_plugins()
views, _ = plugins_manager._get_ui_plugins()
routes = [[getattr(r, "path", None) for r in a["app"].routes] for a in apps]
print("@@" + json.dumps({
    "names": [p.name for p in plugins], "errors": {str(k): v for k, v in errors.items()},
    "apps": [{"name": a["name"], "url_prefix": a["url_prefix"]} for a in apps], "routes": routes,
    "views": views, "reserved": RESERVED_URL_PREFIXES,
}))
"""


def test_quality_plugin_loads_from_the_plugins_folder(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
        "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'airflow.db'}",
        # Loading the plugin must not read kdq's configuration (only a page request does).
        "KDQ_CONFIG": str(tmp_path / "no-such-kdq.toml"),
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("@@"))
    result = json.loads(line[2:])
    assert result["errors"] == {}
    assert result["names"].count("kdq_quality_page") == 1, result["names"]
    [app] = [a for a in result["apps"] if a["name"] == "kdq data quality"]
    assert app["url_prefix"] == "/kdq"
    assert not any(app["url_prefix"].startswith(prefix) for prefix in result["reserved"])
    [routes] = [r for a, r in zip(result["apps"], result["routes"], strict=True) if a == app]
    assert "/quality" in routes and "/icon.svg" in routes
    [view] = [v for v in result["views"] if v["name"] == "Data quality"]
    assert view["href"] == "/kdq/quality" and view["icon"] == "/kdq/icon.svg"
    assert (view["url_route"], view["destination"], view["nav_top_level"]) == ("kdq-data-quality", "nav", True)


def test_a_deployment_names_its_endpoint_and_the_page_uses_it(tmp_path: Path, monkeypatch) -> None:
    """KDQ_SQL_ENDPOINT_URL (the compose deployment's sc://sql-endpoint:15002) wins over the local stack state,
    which here records no endpoint at all: the page's statements go to that URL."""
    from tests.conftest import make_config

    if str(PROJECT_ROOT / "plugins") not in sys.path:
        monkeypatch.syspath_prepend(str(PROJECT_ROOT / "plugins"))
    from kdq.quality_page import PageRange
    from kdq_airflow import quality_app

    asked: list[str] = []

    def query(url: str, queries: dict[str, str]) -> dict[str, list]:
        asked.append(url)
        return {name: [] for name in queries}

    monkeypatch.setattr(quality_app, "_query", query)
    monkeypatch.setattr(quality_app, "_listening", lambda url: url == "sc://sql-endpoint:15002")
    config = make_config(tmp_path)
    page = PageRange(now_ms=1_795_000_000_000)
    monkeypatch.delenv(quality_app.ENDPOINT_URL_ENV, raising=False)
    rows, error, _, _ = quality_app._rows(config, page)
    assert rows is None and "not running" in error and asked == []  # locally: nothing recorded, nothing asked
    monkeypatch.setenv(quality_app.ENDPOINT_URL_ENV, "sc://sql-endpoint:15002")
    rows, error, source, _ = quality_app._rows(config, page)
    assert error is None and source == "sc://sql-endpoint:15002" and asked == ["sc://sql-endpoint:15002"]
    assert set(rows) == {"counts", "reasons", "corrections", "incidents"}


def test_a_configured_endpoint_that_does_not_listen_is_reported_at_once(tmp_path: Path, monkeypatch) -> None:
    from kdq.procs import quiet_port
    from tests.conftest import make_config

    if str(PROJECT_ROOT / "plugins") not in sys.path:
        monkeypatch.syspath_prepend(str(PROJECT_ROOT / "plugins"))
    from kdq.quality_page import PageRange
    from kdq_airflow import quality_app

    url = f"sc://127.0.0.1:{quiet_port()}"  # nothing listens there
    monkeypatch.setenv(quality_app.ENDPOINT_URL_ENV, url)
    rows, error, source, _ = quality_app._rows(make_config(tmp_path), PageRange(now_ms=1_795_000_000_000))
    assert rows is None and source == url and error == f"the SQL endpoint {url} does not accept connections"


def test_only_a_commit_the_counts_read_makes_a_round_due(tmp_path: Path, monkeypatch) -> None:
    """The page asks its counts again when window_counts commits; the stream's other commits of each micro-batch
    (archive, reasons, summaries) do not move the fingerprint (their statements are renewed by age)."""
    from tests.conftest import make_config

    if str(PROJECT_ROOT / "plugins") not in sys.path:
        monkeypatch.syspath_prepend(str(PROJECT_ROOT / "plugins"))
    from kdq_airflow import quality_app

    monkeypatch.setenv(quality_app.ENDPOINT_URL_ENV, "sc://sql-endpoint:15002")
    config = make_config(tmp_path)
    logs = {name: tmp_path / "delta" / name / "_delta_log" for name in ("window_counts", "raw_archive", "summaries")}
    for folder in logs.values():
        folder.mkdir(parents=True)
    first = quality_app._generation(config)
    for step, name in enumerate(("raw_archive", "summaries"), start=1):
        (logs[name] / f"{step:020d}.json").write_text("{}")
        assert quality_app._generation(config) == first, name
    (logs["window_counts"] / f"{1:020d}.json").write_text("{}")
    os.utime(logs["window_counts"], ns=(1, 1))  # a different mtime even on a coarse clock
    assert quality_app._generation(config) != first
