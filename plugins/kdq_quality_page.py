"""Registers kdq's data-quality page with Airflow: the web app (``kdq_airflow.quality_app``) mounted on the
API server at ``/kdq``, and a top-level entry "Data quality" in the UI's navigation that frames it.

Airflow imports every ``.py`` file of the plugins folder and registers each AirflowPlugin subclass it finds,
so the class lives in this file only (a re-export from ``kdq_airflow/__init__.py`` would register it twice).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from kdq_airflow.quality_app import PAGE_PATH, URL_PREFIX, URL_ROUTE, create_app


class KdqQualityPagePlugin(AirflowPlugin):
    name = "kdq_quality_page"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "kdq data quality"}]
    external_views = [
        {
            "name": "Data quality",
            "href": f"{URL_PREFIX}{PAGE_PATH}",
            "url_route": URL_ROUTE,
            "destination": "nav",
            "nav_top_level": True,
            "icon": f"{URL_PREFIX}/icon.svg",
        }
    ]
