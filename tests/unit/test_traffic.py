"""The demo traffic generator's pure part: seeded records, fractions, validity against the shipped rules.

Validity is judged here with ``jsonschema`` and the rule files in ``config/rules/`` (the generator never
sees them), so an "invalid" record that a rule would accept fails the test.
"""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from kdq.traffic.generator import (
    LATE,
    LATE_EXTRA_MS,
    ON_TIME,
    OUT_OF_ORDER,
    RateLimiter,
    TrafficGenerator,
    TrafficSpec,
)
from kdq.traffic.kinds import KINDS, parse_topics
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


def _protobuf_fields(payload: bytes) -> dict[int, list]:
    """A strict reader of the demo's Payment messages (protobuf's wire format by hand): field number -> values;
    raises ValueError on a truncated field or a wire type the schema does not give that field."""
    wire_types = {1: 2, 2: 2, 3: 0, 4: 2, 5: 0, 6: 0, 7: 2, 8: 0}

    def varint(at: int) -> tuple[int, int]:
        n = shift = 0
        while True:
            if at >= len(payload):
                raise ValueError("truncated varint")
            byte = payload[at]
            n |= (byte & 0x7F) << shift
            at, shift = at + 1, shift + 7
            if not byte & 0x80:
                return n, at

    fields: dict[int, list] = {}
    at = 0
    while at < len(payload):
        tag, at = varint(at)
        number, wire = tag >> 3, tag & 7
        if wire_types.get(number) != wire:
            raise ValueError(f"field {number}: wire type {wire}")
        if wire == 0:
            value, at = varint(at)
        else:
            size, at = varint(at)
            if at + size > len(payload):
                raise ValueError("truncated bytes")
            value, at = payload[at:at + size], at + size
        fields.setdefault(number, []).append(value)
    return fields


def _decodes(record, ids: dict[str, int], avro) -> bool:
    """Whether a registry kind's value is its topic's schema id and a payload that decodes entirely."""
    import io

    import fastavro

    value = record.value
    if value[:1] != b"\x00" or len(value) < 5 or int.from_bytes(value[1:5], "big") != ids[record.topic]:
        return False
    try:
        if record.kind == "avro_orders":
            body = io.BytesIO(value[5:])
            decoded = fastavro.schemaless_reader(body, avro, None)
            return body.read() == b"" and decoded["created_at"] is not None
        if value[5:6] != b"\x00":  # message indexes: [0]
            return False
        return bool(_protobuf_fields(value[6:])[8])
    except (ValueError, EOFError, IndexError, StopIteration):
        return False


def test_registry_kinds_frame_their_values_and_every_defect_breaks_them() -> None:
    """orders.avro and payments.proto: valid values are the registered schema's encoding framed with its id (Avro
    read back with fastavro, Protobuf with a strict wire reader); each defect breaks the value the way its name
    says; a registry kind without a registered id is refused at the start."""
    import fastavro

    from kdq.traffic.kinds import AVRO_ORDER_SCHEMA, UNKNOWN_SCHEMA_ID_BASE, RegistryKind

    topics = (("orders.avro", "avro_orders"), ("payments.proto", "protobuf_payments"))
    ids = {"orders.avro": 7, "payments.proto": 8}
    with pytest.raises(ValueError, match="'orders.avro': kind 'avro_orders' is written through the Schema Registry"):
        TrafficGenerator(spec(topics=topics))
    generator = TrafficGenerator(spec(topics=topics, invalid_ratio=0.5, late=0, out_of_order=0), schema_ids=ids)
    avro = fastavro.parse_schema(json.loads(json.dumps(AVRO_ORDER_SCHEMA)))
    seen: set[tuple[str, str | None]] = set()
    for record in generator.records(3000, NOW):
        value = record.value
        seen.add((record.kind, record.defect))
        framed = value[:1] == b"\x00" and len(value) >= 5
        schema_id = int.from_bytes(value[1:5], "big") if framed else None

        assert _decodes(record, ids, avro) == record.valid, (record.kind, record.defect, value)
        if record.defect == "unknown_schema_id":
            assert schema_id >= UNKNOWN_SCHEMA_ID_BASE
        if record.defect == "no_magic_byte":
            assert not framed
    for kind in ("avro_orders", "protobuf_payments"):
        assert isinstance(KINDS[kind], RegistryKind)
        assert {d for k, d in seen if k == kind} == {None, *KINDS[kind].all_defects()}, kind
