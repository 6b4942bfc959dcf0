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
