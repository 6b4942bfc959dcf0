"""Streaming summaries, pure logic: buckets, percentiles, statistics, merging, outputs and config."""

from __future__ import annotations

import json
import math
import random
from fractions import Fraction

import numpy as np
import pytest

from kdq.config import ConfigError, SummaryConfig, load_config
from kdq.influx import line_protocol
from kdq.summaries import (
    DEMO_TOPIC,
    MISSING,
    NOT_NUMERIC,
    OUT_OF_RANGE,
    SummaryState,
    bucket,
    merge,
    metric_key,
    metric_value,
    percentile,
    percentile_rank,
    reference_bucket,
    reject_reason,
    same_state,
    statistics,
    step_decimal,
    summary_point,
)


def summary(**kw) -> SummaryConfig:
    return SummaryConfig(name="db_wait", topic="ops", value="value", group_by=("env", "metric"), **kw)


DIGITS3 = summary(significant_digits=3)


@pytest.mark.parametrize(
    ("x", "digits", "expected"),
    [
        (9.995, 3, 9.99),
        (-9.995, 3, -9.99),
        (-12.345, 3, -12.3),
        (0.0, 3, 0.0),
        (-0.0, 3, 0.0),
        (0.29, 2, 0.29),  # 0.29 is 0.28999999999999998 in binary: truncating the binary would give 0.28
        (0.57, 2, 0.57),
        (1e-300, 3, 1e-300),
        (-1e-300, 3, -1e-300),
        (9.99e-301, 3, 0.0),  # below 1e-300: bucket 0
        (2e23, 3, 2e23),  # Java 17 prints 1.9999999999999998E23
        (999.9999999999999, 3, 999.0),
        (1000.0, 3, 1000.0),
        (1e150, 3, 1e150),
        (-1e150, 1, -1e150),
        (123456.789, 1, 100000.0),
        (7.0, 15, 7.0),
        (0.1 + 0.2, 15, 0.3),  # 0.30000000000000004 → 15 digits
        (0.1 + 0.2, 17, 0.30000000000000004),
    ],
)
def test_significant_digit_buckets(x, digits, expected) -> None:
    if digits > 15:
        with pytest.raises(ValueError):
            summary(significant_digits=digits)
        return
    s = summary(significant_digits=digits)
    assert bucket(x, s) == expected
    assert reference_bucket(x, s) == expected


@pytest.mark.parametrize(
    ("x", "step", "expected"),
    [(0.3, 0.1, 0.3), (-0.3, 0.1, -0.3), (1.7, 0.5, 1.5), (-1.2, 0.5, -1.5), (0.0, 0.5, 0.0), (12.0, 10.0, 10.0),
     (-0.0001, 0.001, -0.001), (0.7, 0.1, 0.7), (2.675, 0.01, 2.67)],
)
def test_step_buckets_floor_to_a_multiple(x, step, expected) -> None:
    s = summary(step=step)
    assert bucket(x, s) == expected == reference_bucket(x, s)


def test_buckets_equal_the_decimal_reference_on_random_values() -> None:
    rng = random.Random(7)
    values = [rng.uniform(-1e6, 1e6) for _ in range(3000)]
    values += [math.copysign(10 ** rng.uniform(-300, 150), rng.random() - 0.5) for _ in range(3000)]
    values += [round(rng.uniform(0, 100), rng.randrange(0, 6)) for _ in range(3000)]
    for digits in (1, 2, 3, 6, 15):
        s = summary(significant_digits=digits)
        assert [bucket(x, s) for x in values] == [reference_bucket(x, s) for x in values], digits
    for step in (0.5, 0.1, 0.25, 10.0, 0.001):
        s = summary(step=step)
        ok = [x for x in values if reject_reason(x, s) is None]
        assert [bucket(x, s) for x in ok] == [reference_bucket(x, s) for x in ok], step


def test_buckets_preserve_order() -> None:
    rng = random.Random(3)
    values = sorted(rng.uniform(-1000, 1000) for _ in range(2000))
    buckets = [bucket(x, DIGITS3) for x in values]
    assert buckets == sorted(buckets)


def test_step_decimal() -> None:
    assert step_decimal(0.5) == (5, -1)
    assert step_decimal(250.0) == (25, 1)
    assert step_decimal(0.001) == (1, -3)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, MISSING),
        ("NaN", NOT_NUMERIC),
        ("12.5", NOT_NUMERIC),
        (True, NOT_NUMERIC),
        ([1], NOT_NUMERIC),
        ({"v": 1}, NOT_NUMERIC),
        (1e308, OUT_OF_RANGE),
        (-1e308, OUT_OF_RANGE),
        (float("inf"), OUT_OF_RANGE),
        (float("nan"), OUT_OF_RANGE),
        (10**400, OUT_OF_RANGE),
        (1e150, None),
        (1.0000000000000002e150, OUT_OF_RANGE),
        (-1e150, None),
        (123456789012345678901234567890, None),
        (0, None),
    ],
)
def test_reject_reasons(value, reason) -> None:
    assert reject_reason(value, DIGITS3) == reason


def test_step_mode_rejects_values_beyond_1e12_steps() -> None:
    s = summary(step=0.5)
    assert reject_reason(4.9e11, s) is None
    assert reject_reason(5e11, s) == OUT_OF_RANGE


def test_percentile_rank_is_exact_integer_arithmetic() -> None:
    assert percentile_rank(99.9, 1000) == 999  # 99.9 * 1000 / 100 in floats is 999.0000000000001
    assert percentile_rank(7, 100) == 7  # 0.07 * 100 is 7.000000000000001
    assert percentile_rank(50, 1) == 1
    assert percentile_rank(50, 3) == 2
    assert percentile_rank(0.001, 5) == 1
    assert percentile_rank(100, 17) == 17


def test_percentiles_equal_numpy_inverted_cdf_of_truncated_values() -> None:
    rng = np.random.default_rng(11)
    for n in (1, 2, 3, 10, 99, 100, 1001, 5000):
        raw = rng.lognormal(3, 1.2, n) * rng.choice([1, 1, 1, -1], n)
        truncated = np.array([bucket(float(x), DIGITS3) for x in raw])
        state = SummaryState.of_values([float(x) for x in raw], DIGITS3)
        ordered = sorted(truncated)
        for q in (1, 25, 50, 90, 99, 99.9, 100):
            # the definition, with exact rational arithmetic: the ceil(q/100 * n)-th smallest
            rank = max(1, math.ceil(Fraction(str(q)) * n / 100))
            assert percentile(state.hist, q) == ordered[rank - 1], (n, q)
            if q != 99.9:  # numpy computes the rank in floats: 0.999 * 5000 = 4995.000000000001 → 4996
                assert percentile(state.hist, q) == float(np.percentile(truncated, q, method="inverted_cdf")), (n, q)
            # and it is the bucket of the exact nearest-rank percentile of the raw values
            assert percentile(state.hist, q) == bucket(sorted(raw)[rank - 1], DIGITS3)


def test_statistics_match_numpy() -> None:
    rng = np.random.default_rng(5)
    raw = rng.normal(250.0, 40.0, 4000)
    state = SummaryState.of_values([float(x) for x in raw], DIGITS3)
    stats = statistics(state, (50, 90, 99))
    assert stats["count"] == 4000
    assert stats["sum"] == pytest.approx(raw.sum(), rel=1e-12)
    assert stats["min"] == raw.min() and stats["max"] == raw.max()
    assert stats["mean"] == pytest.approx(raw.mean(), rel=1e-12)
    assert stats["stddev"] == pytest.approx(raw.std(ddof=0), rel=1e-9)
    assert list(stats) == ["count", "sum", "min", "max", "mean", "stddev", "p50", "p90", "p99", "rejected"]


def test_statistics_of_an_empty_state_and_extremes() -> None:
    state = SummaryState.of_values([None, "x", 1e308], DIGITS3)
    stats = statistics(state, (50,))
    assert stats == {"count": 0, "sum": None, "min": None, "max": None, "mean": None, "stddev": None, "p50": None, "rejected": 3}
    assert state.rejected == {MISSING: 1, NOT_NUMERIC: 1, OUT_OF_RANGE: 1}
    extreme = statistics(SummaryState.of_values([1e150, -1e150, 1e150], DIGITS3), (50,))
    assert extreme["sum"] == 1e150 and extreme["p50"] == 1e150
    assert math.isfinite(extreme["stddev"])
    single = statistics(SummaryState.of_values([3.5], DIGITS3), (50, 99))
    assert (single["stddev"], single["p50"], single["p99"]) == (0.0, 3.5, 3.5)


def test_merging_parts_equals_the_whole() -> None:
    rng = random.Random(2)
    values = [rng.lognormvariate(2, 1) for _ in range(3000)] + [None, "bad", 1e200]
    rng.shuffle(values)
    whole = SummaryState.of_values(values, DIGITS3)
    merged = SummaryState()
    for start in range(0, len(values), 217):
        merged = merge(merged, SummaryState.of_values(values[start : start + 217], DIGITS3))
    assert (merged.count, merged.min, merged.max, merged.hist, merged.rejected) == (
        whole.count, whole.min, whole.max, whole.hist, whole.rejected
    )
    assert merged.sum == pytest.approx(whole.sum, rel=1e-12)
    assert same_state(merged, whole)
    assert not same_state(merged, merge(merged, SummaryState.of_values([5.0], DIGITS3)))


def test_metric_key_value_and_influx_point() -> None:
    groups = {"metric": "db_wait", "env": "prod"}
    key = metric_key(DIGITS3, "ops", 1_700_000_400_000, groups)
    assert key == '{"summary":"db_wait","topic":"ops","window":1700000400000,"group":{"env":"prod","metric":"db_wait"}}'
    stats = statistics(SummaryState.of_values([1.0, 2.0, 4.0], DIGITS3), (50, 99))
    assert json.loads(metric_value(stats)) == {
        "count": 3, "sum": 7.0, "min": 1.0, "max": 4.0, "mean": 7 / 3,
        "stddev": pytest.approx(math.sqrt(14 / 9)), "p50": 2.0, "p99": 4.0, "rejected": 0,
    }
    point = summary_point(DIGITS3, "ops", 1_700_000_400_000, {"env": "prod", "metric": None}, stats)
    line = line_protocol(point)
    assert line.startswith("db_wait,env=prod,topic=ops count=3i,rejected=0i,sum=7.0,min=1.0,max=4.0,mean=")
    assert line.endswith(" 1700000400000")
    empty = summary_point(DIGITS3, "ops", 0, {}, statistics(SummaryState(rejected={MISSING: 2}), (50,)))
    assert dict(empty.fields) == {"count": 0, "rejected": 2}


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"name": "db wait"}, "summaries[0] (name 'db wait').name"),
        ({"value": ""}, "summaries[0] (name 'w').value"),
        ({"percentiles": [50, 101]}, "percentiles must be in (0, 100]"),
        ({"significant_digits": 3, "step": 0.5}, "set either significant_digits or step"),
        ({"significant_digits": 16}, "summaries[0] (name 'w').significant_digits"),
        ({"step": 0.1234}, "at most 3 significant digits"),
        ({"window_seconds": 7}, "summaries[0].window_seconds: 7 is not a multiple of stream.window_seconds (2)"),
        ({"topic": "re:(["}, "summaries[0] (name 'w').topic"),
        ({"windows_seconds": 600}, "summaries[0] (name 'w').windows_seconds"),
        ({"group_by": ["env", "env"]}, "group fields must be distinct"),
    ],
)
def test_bad_summary_definitions_name_the_key(tmp_path, entry, expected) -> None:
    base = {"name": "w", "topic": "ops", "value": "value"}
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in {**base, **entry}.items())
    path = tmp_path / "kdq.toml"
    path.write_text(f"[stream]\nwindow_seconds = 2\n[[summaries]]\n{body}\n")
    with pytest.raises(ConfigError) as error:
        load_config(path, env={})
    assert expected in str(error.value)


def test_summaries_load_from_the_file_and_duplicates_are_refused(tmp_path) -> None:
    path = tmp_path / "kdq.toml"
    path.write_text(
        '[[summaries]]\nname = "a"\ntopic = "re:ops\\\\..*"\nvalue = "m.value"\ngroup_by = ["env"]\nstep = 0.5\n'
        '[[summaries]]\nname = "b"\ntopic = "ops"\nvalue = "v"\npercentiles = [50, 99.9]\n'
    )
    config = load_config(path, env={})
    a, b = config.summaries
    assert (a.step, a.significant_digits, a.is_pattern, a.matches("ops.x"), a.matches("xops.x")) == (0.5, None, True, True, False)
    assert (b.significant_digits, b.percentiles, b.window_seconds) == (3, (50.0, 99.9), 600)
    with pytest.raises(ConfigError, match="summaries are defined in the config file only"):
        load_config(path, env={"KDQ_SUMMARIES__NAME": "x"})
    with pytest.raises(ConfigError, match="'a' is defined twice"):
        config.with_summaries([{"name": "a", "topic": "x", "value": "v"}] * 2)


def test_the_demo_config_defines_a_summary_for_the_demo_traffic() -> None:
    from kdq.traffic.generator import TrafficGenerator, TrafficSpec
    from tests.conftest import PROJECT_ROOT

    config = load_config(PROJECT_ROOT / "kdq.toml", env={})
    demo = [s for s in config.summaries if s.matches(DEMO_TOPIC)]
    assert demo, "kdq.toml needs a summary over the demo topic"
    spec = TrafficSpec(topics=((DEMO_TOPIC, "measurements"),), invalid_ratio=0.01, seed=1)
    records = TrafficGenerator(spec).records(4000, 1_700_000_000_000)
    docs = [json.loads(r.value) for r in records if r.valid]
    assert {r.topic for r in records} == {DEMO_TOPIC} and 3900 < len(docs) < 4000  # a few are not JSON
    assert {(d["env"], d["metric"]) for d in docs} >= {("prod", "db_wait_ms"), ("dev", "request_latency_ms")}
    state = SummaryState.of_values([d.get("value") for d in docs], demo[0])
    assert state.count > 3800 and state.rejected.get(NOT_NUMERIC) and state.rejected.get(MISSING)
