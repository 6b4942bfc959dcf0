"""The demo traffic generator's pure part: seeded records, fractions, validity against the shipped rules.

Validity is judged here with ``jsonschema`` and the rule files in ``config/rules/`` (the generator never
sees them), so an "invalid" record that a rule would accept fails the test.
"""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from kdq.traffic import (
    KINDS,
    LATE,
    LATE_EXTRA_MS,
    ON_TIME,
    OUT_OF_ORDER,
    RateLimiter,
    TrafficGenerator,
    TrafficSpec,
    parse_topics,
)
from tests.conftest import PROJECT_ROOT

NOW = 1_795_370_000_000
RULES = {
    name: json.loads((PROJECT_ROOT / "config" / "rules" / f"{name}.schema.json").read_text())
    for name in ("orders", "payments")
}
N = 20_000


def spec(**changes) -> TrafficSpec:
    base = {
        "topics": (("orders", "orders"), ("payments", "payments"), ("clicks", "json")),
        "invalid_ratio": 0.2,
        "out_of_order": 0.1,
        "late": 0.05,
        "allowed_lateness_seconds": 60,
        "partitions": 3,
        "seed": 7,
    }
    return TrafficSpec(**{**base, **changes})


def within(observed: int, n: int, p: float) -> bool:
    """|observed - n p| within 4 standard deviations (a fixed seed makes this deterministic anyway)."""
    return abs(observed - n * p) <= 4 * math.sqrt(n * p * (1 - p)) + 1


def passes_rule(kind: str, value: bytes) -> bool:
    """What the stream decides: UTF-8, one JSON document, and the topic's schema when it has one."""
    try:
        document = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    if kind not in RULES:
        return True
    validator = jsonschema.Draft202012Validator(RULES[kind], format_checker=None)
    return validator.is_valid(document)


@pytest.fixture(scope="module")
def records():
    return TrafficGenerator(spec()).records(N, NOW)


def test_same_seed_same_records() -> None:
    assert TrafficGenerator(spec()).records(500, NOW) == TrafficGenerator(spec()).records(500, NOW)
    assert TrafficGenerator(spec()).records(500, NOW) != TrafficGenerator(spec(seed=8)).records(500, NOW)


def test_fractions_are_respected(records) -> None:
    invalid = sum(not r.valid for r in records)
    late = sum(r.timing == LATE for r in records)
    out_of_order = sum(r.timing == OUT_OF_ORDER for r in records)
    assert within(invalid, N, 0.2), invalid
    assert within(late, N, 0.05), late
    assert within(out_of_order, N, 0.1), out_of_order
    assert sum(r.timing == ON_TIME for r in records) == N - late - out_of_order
    # every topic and partition gets traffic
    assert {(r.topic, r.partition) for r in records} == {(t, p) for t in ("orders", "payments", "clicks") for p in range(3)}


def test_valid_records_pass_and_invalid_records_fail_their_rule(records) -> None:
    for record in records:
        assert passes_rule(record.kind, record.value) is record.valid, (record.kind, record.defect, record.value)


def test_every_defect_occurs_and_breaks_the_rule(records) -> None:
    for kind in ("orders", "payments", "json"):
        seen = {r.defect for r in records if r.kind == kind and not r.valid}
        assert seen == set(KINDS[kind].all_defects()), kind


def test_event_times_follow_the_timing(records) -> None:
    lateness_ms = 60_000
    for record in records:
        age = NOW - record.timestamp_ms
        if record.timing == ON_TIME:
            assert age == 0
        elif record.timing == OUT_OF_ORDER:
            assert 0 < age <= lateness_ms * 0.8  # still counted by the speed layer
        else:
            assert lateness_ms + LATE_EXTRA_MS[0] <= age <= lateness_ms + LATE_EXTRA_MS[1]  # left to the batch layer
    created = {r.timestamp_ms for r in records if r.valid and r.kind == "orders"}
    assert created  # the value's created_at carries the event time too
    sample = next(r for r in records if r.valid and r.kind == "orders" and r.timing == LATE)
    assert json.loads(sample.value)["created_at"].startswith("2026-11-")


def test_no_invalid_or_late_when_asked_for_none() -> None:
    clean = TrafficGenerator(spec(invalid_ratio=0, late=0, out_of_order=0)).records(2000, NOW)
    assert all(r.valid and r.timing == ON_TIME for r in clean)
    assert all(passes_rule(r.kind, r.value) for r in clean)


def test_spec_is_checked() -> None:
    with pytest.raises(ValueError, match="invalid_ratio"):
        spec(invalid_ratio=1.5)
    with pytest.raises(ValueError, match="out_of_order \\+ late"):
        spec(out_of_order=0.7, late=0.5)
    with pytest.raises(ValueError, match="rate"):
        spec(rate=0)


def test_parse_topics() -> None:
    assert parse_topics("orders, payments,clicks,shop.orders:orders") == (
        ("orders", "orders"), ("payments", "payments"), ("clicks", "json"), ("shop.orders", "orders"),
    )
    with pytest.raises(ValueError, match="unknown record kind"):
        parse_topics("x:nope")


def test_existing_topic_with_fewer_partitions_is_respected() -> None:
    generated = TrafficGenerator(spec(), partitions={"orders": 1}).records(600, NOW)
    assert {r.partition for r in generated if r.topic == "orders"} == {0}
    assert {r.partition for r in generated if r.topic == "payments"} == {0, 1, 2}


def test_rate_limiter_paces_and_does_not_burst_after_a_stall() -> None:
    now = [100.0]
    limiter = RateLimiter(50, clock=lambda: now[0])
    assert limiter.due() == 0
    now[0] += 0.1
    assert limiter.due() == 5
    assert limiter.wait_seconds() == pytest.approx(0.02)
    now[0] += 1.0
    assert limiter.due() == 50
    now[0] += 30.0  # a stall: at most one second's worth is sent at once
    assert limiter.due() == 50
    now[0] += 0.2
    assert limiter.due() == 10
