"""The provisioned Grafana dashboard queries exactly what the pipeline writes to InfluxDB.

The InfluxDB contract (PRODUCT.md and the writers in include/kdq):

- measurement = topic name, integer fields ``valid`` and ``invalid``, time = window start;
- ``kdq.corrections``: tags topic, status, reason; fields old_count, new_count, delta;
- ``kdq.stream``: tag topic; fields late_rows, input_rows, lag_messages.

A panel that filters on another measurement or field would show "No data" forever,
which nobody notices until the day they need the dashboard.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

PROJECT_ROOT = Path(__file__).resolve().parents[2]
GRAFANA = PROJECT_ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "kdq-data-quality.json"
DATASOURCE = GRAFANA / "provisioning" / "datasources" / "influxdb.yml"
PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "kdq.yml"

TOPIC_FIELDS = {"valid", "invalid"}
CONTRACT_FIELDS = {
    "kdq.corrections": {"old_count", "new_count", "delta"},
    "kdq.stream": {"late_rows", "input_rows", "lag_messages"},
}
CONTRACT_TAGS = {"kdq.corrections": {"topic", "status", "reason"}, "kdq.stream": {"topic"}}
TOPIC_MEASUREMENT = re.compile(r"r\._measurement\s*=~\s*/\^\$\{topic(:regex)?\}\$/|r\._measurement\s*==\s*v\.topic")
TOPIC_TAG = re.compile(r"r\.topic\s*=~\s*/\^\$\{topic(:regex)?\}\$/|r\.topic\s*==\s*v\.topic")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def datasource() -> dict[str, Any]:
    (source,) = yaml.safe_load(DATASOURCE.read_text())["datasources"]
    return source


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        if panel.get("type") == "row":
            yield from _panels(panel.get("panels") or [])
        else:
            yield panel


def _queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (panel["title"], target["query"])
        for panel in _panels(dashboard["panels"])
        for target in panel.get("targets") or []
    ]


def _measurements(query: str) -> set[str]:
    return set(re.findall(r'r\._measurement\s*==\s*"([^"]+)"', query))


def _fields(query: str) -> set[str]:
    return set(re.findall(r'r\._field\s*==\s*"([^"]+)"', query))


def test_datasource_is_influxdb2_flux(datasource: dict[str, Any]) -> None:
    assert datasource["type"] == "influxdb"
    assert datasource["url"] == "http://influxdb:8086"
    assert datasource["uid"]
    data = datasource["jsonData"]
    assert data["version"] == "Flux"
    assert data["organization"] == "kdq"
    assert data["defaultBucket"] == "kdq"
    # Grafana expands $VAR in provisioning files; the token itself never sits in the repo.
    assert datasource["secureJsonData"]["token"] in ("$KDQ_INFLUXDB_TOKEN", "${KDQ_INFLUXDB_TOKEN}")


def test_every_panel_uses_the_provisioned_datasource(dashboard: dict[str, Any], datasource: dict[str, Any]) -> None:
    panels = list(_panels(dashboard["panels"]))
    assert panels
    for panel in panels:
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        assert panel["datasource"]["uid"] == datasource["uid"], panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"])["uid"] == datasource["uid"], panel["title"]
    for variable in dashboard["templating"]["list"]:
        assert variable["datasource"]["uid"] == datasource["uid"], variable["name"]


def test_topic_variable_lists_topic_measurements_only(dashboard: dict[str, Any]) -> None:
    (topic,) = [v for v in dashboard["templating"]["list"] if v["name"] == "topic"]
    query = topic["query"] if isinstance(topic["query"], str) else topic["query"]["query"]
    assert 'import "influxdata/influxdb/schema"' in query
    assert 'schema.measurements(bucket: "kdq")' in query
    # The pipeline's own measurements (kdq.corrections, kdq.stream) are not topics.
    assert re.search(r'not\s+strings\.hasPrefix\(v:\s*r\._value,\s*prefix:\s*"kdq\."\)', query) or re.search(
        r"!~\s*/\^kdq\\\.", query
    ), query


def test_every_query_reads_the_kdq_bucket_in_the_time_range(
    dashboard: dict[str, Any], datasource: dict[str, Any]
) -> None:
    bucket = datasource["jsonData"]["defaultBucket"]
    for title, query in _queries(dashboard):
        assert f'from(bucket: "{bucket}")' in query, title
        assert "range(start: v.timeRangeStart, stop: v.timeRangeStop)" in query, title
        for opening, closing in ("()", "{}", "[]"):
            assert query.count(opening) == query.count(closing), f"{title}: unbalanced {opening}{closing}"


def test_every_query_filters_on_contract_measurement_and_fields(dashboard: dict[str, Any]) -> None:
    for title, query in _queries(dashboard):
        named = _measurements(query)
        fields = _fields(query)
        assert fields, f"{title}: query does not filter on fields"
        if TOPIC_MEASUREMENT.search(query):
            assert not named, f"{title}: mixes the topic measurement with {named}"
            assert fields <= TOPIC_FIELDS, f"{title}: fields {fields - TOPIC_FIELDS} are not written for topics"
        else:
            assert len(named) == 1, f"{title}: expected one measurement filter, got {named}"
            (measurement,) = named
            assert measurement in CONTRACT_FIELDS, f"{title}: measurement {measurement!r} is not written by kdq"
            extra = fields - CONTRACT_FIELDS[measurement]
            assert not extra, f"{title}: {measurement} has no fields {extra}"
            assert TOPIC_TAG.search(query), f"{title}: {measurement} is not filtered on the topic variable"
            for tag in re.findall(r"\br\.([a-z_]+)\b", query):
                assert tag.startswith("_") or tag in CONTRACT_TAGS[measurement], (
                    f"{title}: {measurement} has no tag {tag}"
                )


def test_topic_counts_panel(dashboard: dict[str, Any]) -> None:
    matching = [
        (title, query)
        for title, query in _queries(dashboard)
        if TOPIC_MEASUREMENT.search(query) and _fields(query) == TOPIC_FIELDS and "pivot(" not in query
    ]
    assert matching, "no panel shows valid and invalid per topic over time"


def test_invalid_ratio_panel(dashboard: dict[str, Any]) -> None:
    ratio = [
        (title, query)
        for title, query in _queries(dashboard)
        if TOPIC_MEASUREMENT.search(query)
        and _fields(query) == TOPIC_FIELDS
        and re.search(r'pivot\(rowKey: \["_time"\], columnKey: \["_field"\], valueColumn: "_value"\)', query)
    ]
    assert ratio, "no time-series panel pivots valid/invalid to compute the invalid ratio"
    for title, query in ratio:
        assert "map(fn:" in query, title
        assert re.search(r"invalid\s*/\s*\(valid\s*\+\s*invalid\)", query), (
            f"{title}: ratio is not invalid / (valid + invalid)"
        )
        assert "> 0.0" in query, f"{title}: a window with no messages would divide by zero"


def test_corrections_panels(dashboard: dict[str, Any]) -> None:
    queries = [(t, q) for t, q in _queries(dashboard) if _measurements(q) == {"kdq.corrections"}]
    assert queries, "no panel shows kdq.corrections"
    assert set().union(*(_fields(q) for _, q in queries)) == CONTRACT_FIELDS["kdq.corrections"]


def test_late_rows_panel(dashboard: dict[str, Any]) -> None:
    queries = [(t, q) for t, q in _queries(dashboard) if _measurements(q) == {"kdq.stream"}]
    assert any("late_rows" in _fields(q) for _, q in queries), "no panel shows kdq.stream late_rows"


def test_dashboard_identity(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "kdq-data-quality"
    every = [*dashboard["panels"], *(p for row in dashboard["panels"] for p in row.get("panels") or [])]
    ids = [panel["id"] for panel in every]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(ids)}"


def test_provider_path_is_where_compose_mounts_the_dashboards() -> None:
    (provider,) = yaml.safe_load(PROVIDERS.read_text())["providers"]
    assert provider["type"] == "file"
    path = provider["options"]["path"]
    # Raw file, not `docker-compose config`: PyYAML applies the anchors, and the
    # mounts use no interpolation. test_compose.py checks the resolved form.
    compose = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
    mounts = {}
    for volume in compose["services"]["grafana"]["volumes"]:
        source, target, *_ = volume.split(":")
        mounts[target] = source
    assert path in mounts, f"provider reads {path}, compose mounts {sorted(mounts)}"
    assert (PROJECT_ROOT / mounts[path]).resolve() == DASHBOARD.parent
    assert (PROJECT_ROOT / mounts["/etc/grafana/provisioning"]).resolve() == PROVIDERS.parents[1]
    home = compose["services"]["grafana"]["environment"].get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        assert home == f"{path.rstrip('/')}/{DASHBOARD.name}"
    # Grafana's provisioning expands $KDQ_INFLUXDB_TOKEN from its own environment.
    assert "KDQ_INFLUXDB_TOKEN" in compose["services"]["grafana"]["environment"]
