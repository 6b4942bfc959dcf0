"""The provisioned Grafana dashboard queries exactly what the pipeline writes to InfluxDB.

The InfluxDB contract is taken from the code that writes it, not restated here:

- counts (``kdq.influx.count_points``): measurement = topic name, integer fields ``valid`` and ``invalid``;
- streaming summaries (``kdq.summaries.summary_point``, for every summary of the repository's kdq.toml,
  which the compose deployment mounts): measurement = summary name, tags ``topic`` and the group fields,
  fields ``count``, ``rejected`` and the statistics (``mean``, ``p50``, ...);
- ``kdq.stream`` (the speed layer's per-batch health, ``kdq.spark.outputs.push_batch_influx``): tag ``topic``, the fields
  of its ``Point("kdq.stream", ...)`` literal.

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


def _written_contract() -> tuple[set[str], dict[str, set[str]], dict[str, set[str]], dict[str, set[str]]]:
    """(topic fields, {pipeline measurement: fields}, {measurement: tags}, {summary: fields}) from kdq's writers."""
    from kdq.config import load_config
    from kdq.influx import count_points
    from kdq.summaries import SummaryState, statistics, summary_point

    (point,) = count_points([{"topic": "t", "window_start_ms": 0, "valid": 1, "invalid": None}])
    topic_fields = set(point.fields)
    source = (PROJECT_ROOT / "include" / "kdq" / "spark" / "outputs.py").read_text()
    literal = re.search(r'Point\(\s*"kdq\.stream",[^{]*\{(?P<fields>[^}]*)\},\s*\{(?P<tags>[^}]*)\}', source)
    assert literal, 'outputs.py no longer writes Point("kdq.stream", ...): update the dashboard and this test'
    fields = {"kdq.stream": set(re.findall(r'"([a-z_]+)":', literal["fields"]))}
    tags = {"kdq.stream": set(re.findall(r'"([a-z_]+)":', literal["tags"]))}
    summaries = {}
    config = load_config(path=PROJECT_ROOT / "kdq.toml", env={})
    for summary in config.summaries:
        state = SummaryState.of_values([1.5, 2.5, "x"], summary)
        groups = {path: "g" for path in summary.group_by}
        point = summary_point(summary, "t", 0, groups, statistics(state, summary.percentiles))
        summaries[summary.name] = set(point.fields)
        tags[summary.name] = set(point.tags)
    return topic_fields, fields, tags, summaries


TOPIC_FIELDS, CONTRACT_FIELDS, CONTRACT_TAGS, SUMMARY_FIELDS = _written_contract()
SUMMARY_MEASUREMENT = re.compile(r"r\._measurement\s*=~\s*/\^\$\{summary(:regex)?\}\$/")
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
    # Topics are the measurements with a `valid` field: summaries (field `rejected`) are not topics.
    assert re.search(
        r'schema\.tagValues\(bucket: "kdq", tag: "_measurement", predicate: \(r\) => r\._field == "valid"', query
    ), query
    assert "valid" in TOPIC_FIELDS and not any("valid" in fields for fields in SUMMARY_FIELDS.values())
    # The pipeline's own measurements (kdq.stream) are not topics.
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
        elif SUMMARY_MEASUREMENT.search(query):
            assert not named, f"{title}: mixes the summary measurement with {named}"
            assert SUMMARY_FIELDS, "kdq.toml configures no summary: the summary panels would show nothing"
            for summary, written in SUMMARY_FIELDS.items():
                assert fields <= written, f"{title}: summary {summary!r} has no fields {fields - written}"
                assert TOPIC_TAG.search(query), f"{title}: summaries are not filtered on the topic variable"
                for tag in re.findall(r"\br\.([a-z_]+)\b", query):
                    assert tag.startswith("_") or tag in CONTRACT_TAGS[summary], f"{title}: {summary} has no tag {tag}"
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


def test_summary_variable_lists_summary_measurements(dashboard: dict[str, Any]) -> None:
    (summary,) = [v for v in dashboard["templating"]["list"] if v["name"] == "summary"]
    assert summary["multi"] and summary["includeAll"]
    assert re.search(
        r'schema\.tagValues\(bucket: "kdq", tag: "_measurement", predicate: \(r\) => r\._field == "rejected"',
        summary["query"],
    ), summary["query"]
    # `rejected` is written for every summary and for nothing else.
    assert all("rejected" in fields for fields in SUMMARY_FIELDS.values())
    assert "rejected" not in TOPIC_FIELDS and not any("rejected" in f for f in CONTRACT_FIELDS.values())


def test_summary_panels_show_every_statistic(dashboard: dict[str, Any]) -> None:
    """The streaming summaries (docs/summaries.md): percentiles, mean, min/max/stddev, count and
    rejected, each on a panel under the "Streaming summaries" row."""
    rows = [p for p in dashboard["panels"] if p.get("type") == "row"]
    (row,) = [r for r in rows if r["title"] == "Streaming summaries"]
    below = [p for p in dashboard["panels"] if p.get("type") != "row" and p["gridPos"]["y"] > row["gridPos"]["y"]]
    queries = [t["query"] for p in below for t in p["targets"] if SUMMARY_MEASUREMENT.search(t["query"])]
    assert queries, "no summary panel"
    shown = set().union(*(_fields(q) for q in queries))
    for summary, written in SUMMARY_FIELDS.items():
        assert written <= shown, f"summary {summary!r}: fields {written - shown} are on no panel"
    # Percentiles are exact per window: never averaged or summed across windows by the dashboard.
    for query in queries:
        if _fields(query) & {f for f in shown if re.fullmatch(r"p[0-9.]+", f)}:
            assert "aggregateWindow" not in query and "mean()" not in query and "sum()" not in query, query


def test_no_panel_uses_a_measurement_kdq_does_not_write(dashboard: dict[str, Any]) -> None:
    written = set(CONTRACT_FIELDS) | set(SUMMARY_FIELDS)
    for title, query in _queries(dashboard):
        for measurement in _measurements(query):
            assert measurement in written, f"{title}: kdq writes no measurement {measurement!r}"
