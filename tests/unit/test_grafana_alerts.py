"""The provisioned Grafana alert rules (deploy/grafana/provisioning/alerting) are equivalent to kdq's shipped
expectations and query what the pipeline writes: the thresholds are read from config/rules/topics.toml and
kdq.expectations_config's defaults, the measurements and fields from kdq.influx.count_points. Grafana itself
does not run here (the compose deployment is validated with `docker-compose config`); these checks keep the
file from drifting away from the product."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kdq.influx import count_points
from kdq.rules import load_rules

PROJECT_ROOT = Path(__file__).resolve().parents[2]
GRAFANA = PROJECT_ROOT / "deploy" / "grafana"
ALERTS = GRAFANA / "provisioning" / "alerting" / "kdq-expectations.yml"
DATASOURCE = GRAFANA / "provisioning" / "datasources" / "influxdb.yml"


@pytest.fixture(scope="module")
def rules() -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    assert document["apiVersion"] == 1
    (group,) = document["groups"]
    assert group["interval"] == "1m" and group["folder"] == "kdq"
    return {rule["uid"]: rule for rule in group["rules"]}


def _query(rule: dict[str, Any]) -> str:
    (query,) = [d["model"]["query"] for d in rule["data"] if d["datasourceUid"] != "__expr__"]
    return query


def _threshold(rule: dict[str, Any]) -> tuple[str, float]:
    (condition,) = [d["model"] for d in rule["data"] if d["refId"] == rule["condition"]]
    assert condition["type"] == "threshold"
    (evaluator,) = [c["evaluator"] for c in condition["conditions"]]
    (value,) = evaluator["params"]
    return evaluator["type"], float(value)


def test_every_rule_reads_the_provisioned_datasource_and_is_well_formed(rules: dict[str, dict[str, Any]]) -> None:
    (datasource,) = yaml.safe_load(DATASOURCE.read_text())["datasources"]
    assert set(rules) == {"kdq-invalid-ratio", "kdq-silence"}
    (point,) = count_points([{"topic": "t", "window_start_ms": 0, "valid": 1, "invalid": 2}])
    for uid, rule in rules.items():
        refs = {d["refId"]: d for d in rule["data"]}
        assert rule["condition"] in refs, uid
        for d in rule["data"]:
            assert d["datasourceUid"] in (datasource["uid"], "__expr__"), uid
            assert d["model"]["refId"] == d["refId"], uid
            expression = d["model"].get("expression")
            assert expression is None or expression in refs, uid  # expressions chain to queries that exist
        query = _query(rule)
        # Counts are the measurements named by topics with the fields count_points writes, one alert per topic.
        assert set(re.findall(r'r\._field == "([a-z]+)"', query)) == set(point.fields) == {"valid", "invalid"}
        assert 'group(columns: ["topic"])' in query and "topic: r._measurement" in query
        assert rule["labels"]["source"] == "kdq" and "{{ $labels.topic }}" in rule["annotations"]["summary"]


def test_the_invalid_ratio_rule_is_the_shipped_expectation(rules: dict[str, dict[str, Any]]) -> None:
    (shipped,) = [e for e in load_rules(PROJECT_ROOT / "config" / "rules").expectations.defaults
                  if e.name == "invalid_ratio"]
    rule = rules["kdq-invalid-ratio"]
    assert _threshold(rule) == ("gt", shipped.threshold)
    query = _query(rule)
    assert f"if total >= {float(shipped.min_records)} then" in query
    assert f"range(start: -{shipped.over_minutes + 1}m, stop: -1m)" in query  # the last complete minutes


def test_the_silence_rule_is_the_default_silence_expectation(rules: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    (tmp_path / "topics.toml").write_text("[expectations]\nsilence = {}\n")  # every key at its default
    (silence,) = load_rules(tmp_path).expectations.defaults
    rule = rules["kdq-silence"]
    assert silence.threshold == 1  # "no record at all", which is what seconds-since-the-last-window measures
    assert _threshold(rule) == ("gt", silence.over_minutes * 60.0)
    # Lookback one day, not the expectation's week: the query reads every point of its range each minute.
    assert "range(start: -1d)" in _query(rule) and rule["noDataState"] == "OK"
