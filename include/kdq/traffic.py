"""Demo traffic: realistic valid, invalid, out-of-order and late JSON records for the local run.

``kdq demo`` (and ``make run``, in the background) produces records at a fixed rate to a few topics.
Each topic has a **record kind** that knows how a good document looks and how it goes bad:

* ``orders`` and ``payments`` follow ``config/rules/orders.schema.json`` / ``payments.schema.json``;
  their invalid records break one rule each (a missing field, a negative amount, an unknown currency,
  an extra field, ...), so the invalid-reason breakdown shows several ``schema:<pointer>`` reasons;
* ``json``, for topics without a rule: any JSON object is valid;
* ``measurements`` (topic ``ops.metrics``): numeric server measurements for the streaming summary
  ``ops_metrics`` configured in ``kdq.toml`` (:class:`MeasurementsKind`);
* every kind also produces undecodable values (``not_json``, ``not_utf8``) among its invalid records;
* ``avro_orders`` (topic ``orders.avro``) and ``protobuf_payments`` (topic ``payments.proto``) are written through
  the Schema Registry in Confluent's wire format (:class:`RegistryKind`: the schema registered under
  ``<topic>-value`` at start); their invalid records are the registry's kinds of bad (no magic byte, an unknown
  schema id, a truncated payload, trailing bytes, a bad enum index, a wrong wire type, a bad message index). They
  join the default topics when a registry is configured or the local stack runs one (:func:`default_topics`).

Timing, per record: *on time* (event time = now), *out of order* (event time up to 80 % of the allowed
lateness in the past: the speed layer still counts it and updates that older window), or *late* (event
time more than the allowed lateness, plus up to 10 minutes, in the past: the speed layer archives it
uncounted and the hourly batch layer corrects its window). The event time is the Kafka record
timestamp (the demo topics' rules configure no event-time field); ``created_at`` in the value carries
the same time for people reading the records.

Generation is pure and deterministic for a seed (:class:`TrafficGenerator`, tested in
``tests/unit/test_traffic.py``); :func:`run_demo` adds the producer and the rate limiter. A new record
kind is a :class:`RecordKind` subclass registered in :data:`KINDS`.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import math
import random
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kdq.config import Config, ConfigError, check_kafka_reachable
from kdq.procs import ManagedProcess

log = logging.getLogger("kdq.demo")

ON_TIME, OUT_OF_ORDER, LATE = "on_time", "out_of_order", "late"
TIMINGS = (ON_TIME, OUT_OF_ORDER, LATE)
LATE_EXTRA_MS = (10_000, 600_000)  # how much later than the allowed lateness a late record is
CURRENCIES = ("EUR", "USD", "GBP")


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _json(document: dict) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


# -- record kinds ---------------------------------------------------------------------------------------

Defect = Callable[[random.Random, dict], bytes]


def _not_json(rng: random.Random, document: dict) -> bytes:
    text = _json(document)
    return text[: rng.randint(1, max(1, len(text) - 2))]  # a truncated document


def _not_utf8(rng: random.Random, document: dict) -> bytes:
    return b"\xff\xfe" + _json(document)[2:]


ENCODING_DEFECTS: dict[str, Defect] = {"not_json": _not_json, "not_utf8": _not_utf8}


class RecordKind:
    """How one kind of record looks when valid, and the ways it can be invalid.

    ``document`` builds a valid JSON object; each entry of ``defects`` turns one into the bytes of an
    invalid value. Both draw only from the ``rng`` they are given, so a seeded run is reproducible.
    """

    name = "json"
    defects: dict[str, Defect] = {}

    def document(self, rng: random.Random, seq: int, event_ms: int) -> dict:
        return {"seq": seq, "value": round(rng.uniform(0, 100), 3), "created_at": _iso(event_ms)}

    def key(self, document: dict) -> bytes | None:
        return None

    def all_defects(self) -> dict[str, Defect]:
        return {**self.defects, **ENCODING_DEFECTS}


def _with(document: dict, **changes: Any) -> bytes:
    return _json({**document, **changes})


def _without(document: dict, name: str) -> bytes:
    return _json({k: v for k, v in document.items() if k != name})


class OrdersKind(RecordKind):
    """``config/rules/orders.schema.json``."""

    name = "orders"
    defects: dict[str, Defect] = {
        "missing_customer": lambda rng, d: _without(d, "customer"),
        "negative_amount": lambda rng, d: _with(d, amount=-round(rng.uniform(0.01, 100), 2)),
        "unknown_currency": lambda rng, d: _with(d, currency=rng.choice(("JPY", "eur", ""))),
        "amount_as_string": lambda rng, d: _with(d, amount=str(d["amount"])),
        "zero_quantity": lambda rng, d: _with(d, lines=[{**d["lines"][0], "qty": 0}, *d["lines"][1:]]),
        "empty_order_id": lambda rng, d: _with(d, order_id=""),
    }

    def document(self, rng: random.Random, seq: int, event_ms: int) -> dict:
        return {
            "order_id": f"o-{seq}",
            "amount": round(rng.uniform(1, 500), 2),
            "currency": rng.choice(CURRENCIES),
            "customer": {"id": f"c-{rng.randrange(1000)}"},
            "lines": [{"sku": f"sku-{rng.randrange(200)}", "qty": rng.randint(1, 5)} for _ in range(rng.randint(1, 3))],
            "created_at": _iso(event_ms),
        }

    def key(self, document: dict) -> bytes | None:
        return document["customer"]["id"].encode()


class PaymentsKind(RecordKind):
    """``config/rules/payments.schema.json`` (``additionalProperties: false``)."""

    name = "payments"
    defects: dict[str, Defect] = {
        "zero_amount": lambda rng, d: _with(d, amount=0),
        "unknown_method": lambda rng, d: _with(d, method=rng.choice(("cash", "CARD"))),
        "missing_status": lambda rng, d: _without(d, "status"),
        "extra_field": lambda rng, d: _with(d, debug=True),
        "bad_card_digits": lambda rng, d: _with(d, method="card", card={"last4": rng.choice(("12a4", "123", "12345"))}),
    }

    def document(self, rng: random.Random, seq: int, event_ms: int) -> dict:
        method = rng.choice(("card", "sepa", "paypal"))
        document = {
            "payment_id": f"p-{seq}",
            "order_id": f"o-{rng.randrange(max(seq, 1))}",
            "amount": round(rng.uniform(1, 500), 2),
            "currency": rng.choice(CURRENCIES),
            "method": method,
            "status": rng.choice(("authorized", "captured", "captured", "refunded", "failed")),
            "created_at": _iso(event_ms),
        }
        if method == "card":
            document["card"] = {"last4": f"{rng.randrange(10_000):04d}"}
        return document

    def key(self, document: dict) -> bytes | None:
        return document["order_id"].encode()


# (metric, log-normal median, sigma): heavy right tails, like real waits and latencies.
MEASUREMENT_SERIES = (("db_wait_ms", 4.0, 1.1), ("cpu_time_ms", 25.0, 0.6), ("request_latency_ms", 80.0, 0.8))
MEASUREMENT_ENVS = (("prod", 12), ("staging", 4), ("dev", 2))  # (environment, servers)


class MeasurementsKind(RecordKind):
    """Server measurements for the streaming summary ``ops_metrics`` of ``kdq.toml`` (topic ``ops.metrics``).

    The topic has no rule, so only undecodable values are invalid. About 1 % of the valid records carry
    a value the summary cannot use (the text ``"n/a"``, or no ``value`` at all): they stay valid in the
    quality counts and show up in the summary row's ``rejected`` counts.
    """

    name = "measurements"
    unusable_share = 0.01

    def document(self, rng: random.Random, seq: int, event_ms: int) -> dict:
        env, servers = MEASUREMENT_ENVS[rng.randrange(len(MEASUREMENT_ENVS))]
        metric, median, sigma = MEASUREMENT_SERIES[rng.randrange(len(MEASUREMENT_SERIES))]
        document: dict[str, Any] = {
            "ts": event_ms,
            "env": env,
            "host": f"{env}-db-{rng.randrange(servers):02d}",
            "metric": metric,
            "value": round(rng.lognormvariate(math.log(median), sigma), 3),
        }
        draw = rng.random()
        if draw < self.unusable_share / 2:
            document["value"] = "n/a"
        elif draw < self.unusable_share:
            del document["value"]
        return document

    def key(self, document: dict) -> bytes | None:
        return document["host"].encode()


# -- kinds written through the Schema Registry ------------------------------------------------------------

# (rng, document, the valid framed value) -> an invalid value
RegistryDefect = Callable[[random.Random, dict, bytes], bytes]
UNKNOWN_SCHEMA_ID_BASE = 0x7FFF0000  # far above any id a registry hands out


def frame(schema_id: int, payload: bytes) -> bytes:
    """Confluent's wire format: magic byte 0, the schema id (4 bytes, big-endian), the payload."""
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


def _unknown_schema_id(rng: random.Random, document: dict, value: bytes) -> bytes:
    return frame(UNKNOWN_SCHEMA_ID_BASE + rng.randrange(1000), value[5:])


def _no_magic_byte(rng: random.Random, document: dict, value: bytes) -> bytes:
    return _json(document)  # what a producer without the registry's serializer writes


class RegistryKind(RecordKind):
    """A kind whose values are written through the Schema Registry: ``schema_text`` of ``schema_type`` is
    registered under ``<topic>-value`` when the demo starts, each value framed with the id it got."""

    schema_type = ""
    schema_text = ""
    registry_defects: dict[str, RegistryDefect] = {}

    def payload(self, document: dict) -> bytes:
        raise NotImplementedError

    def encode(self, document: dict, schema_id: int) -> bytes:
        return frame(schema_id, self.payload(document))

    def all_defects(self) -> dict[str, Any]:
        return {**self.registry_defects, "no_magic_byte": _no_magic_byte, "unknown_schema_id": _unknown_schema_id}


AVRO_ORDER_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "io.kdq.demo",
    "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "currency", "type": {"type": "enum", "name": "Currency", "symbols": list(CURRENCIES)}},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
            {"name": "id", "type": "string"}, {"name": "email", "type": ["null", "string"], "default": None}]}},
        {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
            {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}},
        {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


@functools.lru_cache(maxsize=4)
def _avro_schema(widened: bool) -> Any:
    """The parsed orders schema; ``widened``: a writer whose currency enum has one more symbol (JPY)."""
    import fastavro

    schema = json.loads(json.dumps(AVRO_ORDER_SCHEMA))
    if widened:
        schema["fields"][2]["type"]["symbols"].append("JPY")
    return fastavro.parse_schema(schema)


def _avro(document: dict, widened: bool = False) -> bytes:
    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, _avro_schema(widened), document)
    return out.getvalue()


class AvroOrdersKind(RegistryKind):
    """Orders as Avro (:data:`AVRO_ORDER_SCHEMA`: a nested record, an array of records, an enum, a union, a
    timestamp); the shipped rule ``orders.avro`` reads its event time from ``created_at``."""

    name = "avro_orders"
    schema_type = "AVRO"
    schema_text = json.dumps(AVRO_ORDER_SCHEMA, separators=(",", ":"))
    registry_defects: dict[str, RegistryDefect] = {
        "truncated": lambda rng, d, v: v[: rng.randint(5, len(v) - 1)],  # Avro has no end marker: any cut is short
        "trailing_bytes": lambda rng, d, v: v + bytes([rng.randrange(256)]),
        "bad_currency": lambda rng, d, v: v[:5] + _avro({**d, "currency": "JPY"}, widened=True),
    }

    def document(self, rng: random.Random, seq: int, event_ms: int) -> dict:
        return {
            "order_id": f"o-{seq}",
            "amount": round(rng.uniform(1, 500), 2),
            "currency": rng.choice(CURRENCIES),
            "customer": {"id": f"c-{rng.randrange(1000)}", "email": None if rng.random() < 0.5 else "a@example.com"},
            "lines": [{"sku": f"sku-{rng.randrange(200)}", "qty": rng.randint(1, 5)} for _ in range(rng.randint(1, 3))],
            "created_at": event_ms,
        }

    def key(self, document: dict) -> bytes | None:
        return document["customer"]["id"].encode()

    def payload(self, document: dict) -> bytes:
        return _avro(document)


PROTOBUF_PAYMENT_SCHEMA = """\
syntax = "proto3";
package io.kdq.demo;

message Payment {
  string payment_id = 1;
  string order_id = 2;
  int64 amount_cents = 3;
  string currency = 4;
  Method method = 5;
  Status status = 6;
  Card card = 7;
  int64 created_at_ms = 8;
  enum Method { METHOD_UNSPECIFIED = 0; CARD = 1; SEPA = 2; PAYPAL = 3; }
  enum Status { STATUS_UNSPECIFIED = 0; AUTHORIZED = 1; CAPTURED = 2; REFUNDED = 3; FAILED = 4; }
  message Card { string last4 = 1; }
}
"""
PAYMENT_METHODS = {"card": 1, "sepa": 2, "paypal": 3}
PAYMENT_STATUSES = {"authorized": 1, "captured": 2, "refunded": 3, "failed": 4}


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1  # negative int64: ten bytes, as protobuf writes them
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _pb_varint(field_number: int, n: int) -> bytes:
    return _varint(field_number << 3) + _varint(n)


def _pb_bytes(field_number: int, data: bytes) -> bytes:
    return _varint(field_number << 3 | 2) + _varint(len(data)) + data


class ProtobufPaymentsKind(RegistryKind):
    """Payments as Protobuf (:data:`PROTOBUF_PAYMENT_SCHEMA`, registered as .proto text), written field by field
    in number order with the message indexes ``[0]`` (the first message); the shipped rule ``payments.proto``
    reads its event time from ``created_at_ms``."""

    name = "protobuf_payments"
    schema_type = "PROTOBUF"
    schema_text = PROTOBUF_PAYMENT_SCHEMA
    registry_defects: dict[str, RegistryDefect] = {
        # created_at_ms comes last and takes 6 bytes after its tag: a cut of 1 to 5 ends inside it (a cut at a
        # field boundary would be a valid message with fewer fields).
        "truncated": lambda rng, d, v: v[: len(v) - rng.randint(1, 5)],
        "wrong_wire_type": lambda rng, d, v: v[:6] + _pb_varint(1, 7) + v[6:],  # payment_id (a string) as a number
        "bad_message_index": lambda rng, d, v: v[:5] + b"\x02\x06" + v[6:],  # message [3]: the file has one
    }

    def document(self, rng: random.Random, seq: int, event_ms: int) -> dict:
        method = rng.choice(tuple(PAYMENT_METHODS))
        document = {
            "payment_id": f"p-{seq}",
            "order_id": f"o-{rng.randrange(max(seq, 1))}",
            "amount_cents": rng.randint(100, 50_000),
            "currency": rng.choice(CURRENCIES),
            "method": method,
            "status": rng.choice(tuple(PAYMENT_STATUSES)),
            "created_at_ms": event_ms,
        }
        if method == "card":
            document["card"] = {"last4": f"{rng.randrange(10_000):04d}"}
        return document

    def key(self, document: dict) -> bytes | None:
        return document["order_id"].encode()

    def payload(self, document: dict) -> bytes:
        card = document.get("card")
        return b"\x00" + b"".join((  # message indexes [0], then the fields
            _pb_bytes(1, document["payment_id"].encode()),
            _pb_bytes(2, document["order_id"].encode()),
            _pb_varint(3, document["amount_cents"]),
            _pb_bytes(4, document["currency"].encode()),
            _pb_varint(5, PAYMENT_METHODS[document["method"]]),
            _pb_varint(6, PAYMENT_STATUSES[document["status"]]),
            _pb_bytes(7, _pb_bytes(1, card["last4"].encode())) if card else b"",
            _pb_varint(8, document["created_at_ms"]),
        ))


KINDS: dict[str, RecordKind] = {
    kind.name: kind
    for kind in (OrdersKind(), PaymentsKind(), MeasurementsKind(), RecordKind(), AvroOrdersKind(),
                 ProtobufPaymentsKind())
}
DEFAULT_TOPICS = "orders,payments,ops.metrics:measurements"
# With a Schema Registry (configured, or the local stack's): the shipped rules judge these two through it.
REGISTRY_TOPICS = "orders.avro:avro_orders,payments.proto:protobuf_payments"


def default_topics(config: Config) -> str:
    """The demo's topics: :data:`DEFAULT_TOPICS`, and :data:`REGISTRY_TOPICS` when a registry is configured or
    the local stack recorded one."""
    try:
        config.registry_url()
    except ConfigError:
        return DEFAULT_TOPICS
    return f"{DEFAULT_TOPICS},{REGISTRY_TOPICS}"


def parse_topics(text: str) -> tuple[tuple[str, str], ...]:
    """``orders,payments,shop.orders:orders`` → ((topic, kind), ...); the kind defaults to the topic's name
    when a kind has that name, else ``json``."""
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        topic, _, kind = item.partition(":")
        kind = kind or (topic if topic in KINDS else "json")
        if kind not in KINDS:
            raise ValueError(f"unknown record kind {kind!r} for topic {topic!r}; known: {', '.join(sorted(KINDS))}")
        pairs.append((topic, kind))
    if not pairs:
        raise ValueError("no topics given")
    return tuple(pairs)


# -- pure generation -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrafficSpec:
    """What to produce. Fractions are per record; ``out_of_order`` and ``late`` exclude each other."""

    topics: tuple[tuple[str, str], ...] = (("orders", "orders"), ("payments", "payments"), ("ops.metrics", "measurements"))
    rate: float = 50.0
    partitions: int = 3
    invalid_ratio: float = 0.1
    out_of_order: float = 0.05
    late: float = 0.01
    allowed_lateness_seconds: int = 60
    duration_seconds: float | None = None
    count: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("invalid_ratio", "out_of_order", "late"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be between 0 and 1, got {getattr(self, name)}")
        if self.out_of_order + self.late > 1:
            raise ValueError(f"out_of_order + late must be at most 1, got {self.out_of_order + self.late}")
        if self.rate <= 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        if self.partitions < 1:
            raise ValueError(f"partitions must be at least 1, got {self.partitions}")
        if self.count is not None and self.count < 0:
            raise ValueError(f"count must not be negative, got {self.count}")
        if self.duration_seconds is not None and self.duration_seconds < 0:
            raise ValueError(f"duration must not be negative, got {self.duration_seconds}")
        if not self.topics:
            raise ValueError("at least one topic is needed")


@dataclass(frozen=True)
class DemoRecord:
    topic: str
    partition: int
    key: bytes | None
    value: bytes
    timestamp_ms: int
    kind: str
    valid: bool
    timing: str
    defect: str | None = None


class TrafficGenerator:
    """Deterministic record factory: the same spec (with a seed) and clock readings give the same records."""

    def __init__(
        self, spec: TrafficSpec, partitions: dict[str, int] | None = None, schema_ids: dict[str, int] | None = None
    ) -> None:
        """``schema_ids``: topic -> the id its kind's schema got from the registry (:func:`register_schemas`),
        for the topics of :class:`RegistryKind` kinds."""
        self.spec = spec
        self.schema_ids = dict(schema_ids or {})
        for topic, kind in spec.topics:
            if isinstance(KINDS[kind], RegistryKind) and topic not in self.schema_ids:
                raise ValueError(f"topic {topic!r}: kind {kind!r} is written through the Schema Registry, and no schema"
                                 " id was registered for it")
        self.rng = random.Random(spec.seed)
        self.seq = 0
        # Partitions per topic: the spec's, or fewer when an existing topic has fewer.
        self.partitions = {topic: (partitions or {}).get(topic, spec.partitions) for topic, _ in spec.topics}

    def event_time(self, now_ms: int) -> tuple[int, str]:
        draw = self.rng.random()
        lateness_ms = self.spec.allowed_lateness_seconds * 1000
        if draw < self.spec.late:
            return now_ms - lateness_ms - self.rng.randint(*LATE_EXTRA_MS), LATE
        if draw < self.spec.late + self.spec.out_of_order:
            return now_ms - self.rng.randint(1, max(1, int(lateness_ms * 0.8))), OUT_OF_ORDER
        return now_ms, ON_TIME

    def record(self, now_ms: int) -> DemoRecord:
        topic, kind_name = self.spec.topics[self.rng.randrange(len(self.spec.topics))]
        kind = KINDS[kind_name]
        event_ms, timing = self.event_time(now_ms)
        document = kind.document(self.rng, self.seq, event_ms)
        self.seq += 1
        defect = None
        invalid = self.rng.random() < self.spec.invalid_ratio
        if invalid:
            defects = kind.all_defects()
            defect = sorted(defects)[self.rng.randrange(len(defects))]
        if isinstance(kind, RegistryKind):
            value = kind.encode(document, self.schema_ids[topic])
            if defect is not None:
                value = kind.all_defects()[defect](self.rng, document, value)
        elif defect is not None:
            value = kind.all_defects()[defect](self.rng, document)
        else:
            value = _json(document)
        return DemoRecord(
            topic=topic,
            partition=self.rng.randrange(self.partitions[topic]),
            key=kind.key(document),
            value=value,
            timestamp_ms=event_ms,
            kind=kind_name,
            valid=defect is None,
            timing=timing,
            defect=defect,
        )

    def records(self, n: int, now_ms: int, step_ms: int = 0) -> list[DemoRecord]:
        return [self.record(now_ms + i * step_ms) for i in range(n)]


class RateLimiter:
    """Paces a loop at ``rate`` per second: record *i* is due at ``start + i / rate``.

    After a stall (a slow broker, a suspended laptop) it does not burst to catch up more than
    ``max_burst_seconds`` worth of records.
    """

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic, max_burst_seconds: float = 1.0) -> None:
        self.rate = rate
        self.clock = clock
        self.max_burst = max(1, int(rate * max_burst_seconds))
        self.start = clock()
        self.sent = 0

    def due(self) -> int:
        """Records that may be sent now (and are counted as sent)."""
        owed = int((self.clock() - self.start) * self.rate + 1e-9) - self.sent  # 1e-9: float noise
        if owed > self.max_burst:  # fell behind: forget the backlog instead of flooding
            self.sent += owed - self.max_burst
            owed = self.max_burst
        owed = max(owed, 0)
        self.sent += owed
        return owed

    def wait_seconds(self) -> float:
        """Time until the next record is due."""
        return max(0.0, self.start + (self.sent + 1) / self.rate - self.clock())


# -- producing -----------------------------------------------------------------------------------------


@dataclass
class DemoStats:
    started_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    produced: Counter = field(default_factory=Counter)  # (topic, valid|invalid, timing)
    delivered: int = 0
    failed: int = 0
    last_error: str | None = None

    def add(self, record: DemoRecord) -> None:
        self.produced[(record.topic, "valid" if record.valid else "invalid", record.timing)] += 1

    def summary(self) -> dict:
        by_topic: dict[str, Counter] = {}
        for (topic, status, timing), n in self.produced.items():
            counter = by_topic.setdefault(topic, Counter())
            counter[status] += n
            counter[timing] += n
        return {
            "started_ms": self.started_ms,
            "updated_ms": int(time.time() * 1000),
            "produced": sum(self.produced.values()),
            "delivered": self.delivered,
            "failed": self.failed,
            "last_error": self.last_error,
            "topics": {topic: dict(counter) for topic, counter in sorted(by_topic.items())},
        }


def ensure_topics(config: Config, spec: TrafficSpec, timeout: float = 30.0) -> dict[str, int]:
    """Create missing topics with ``spec.partitions``; returns each topic's partition count."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(config.kafka_client_conf())
    existing = admin.list_topics(timeout=timeout).topics
    wanted = [topic for topic, _ in spec.topics if topic not in existing]
    if wanted:
        # The brokers' default replication factor (and min.insync.replicas): 1 on the single local broker, 3 (and 2)
        # on the cluster shape and in the compose deployment. An explicit 1 there would leave the topic below its
        # brokers' min.insync.replicas 2, and every acks=all write would be refused.
        futures = admin.create_topics(
            [NewTopic(t, spec.partitions, replication_factor=-1) for t in wanted], operation_timeout=timeout
        )
        for future in futures.values():
            try:
                future.result(timeout=timeout)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
    # A topic just created may be missing from the next metadata answer (the broker serving it learns of the topic
    # a moment later): asked again until every topic is there with its partitions, within ``timeout``.
    deadline = time.monotonic() + timeout
    while True:
        metadata = admin.list_topics(timeout=timeout).topics
        missing = [t for t, _ in spec.topics if t not in metadata or not metadata[t].partitions]
        if not missing:
            return {topic: min(spec.partitions, len(metadata[topic].partitions)) for topic, _ in spec.topics}
        if time.monotonic() >= deadline:
            raise KafkaException(f"topics {', '.join(missing)} are not in the brokers' metadata {timeout:.0f} s after "
                                 "their creation")
        time.sleep(0.2)


def register_schemas(config: Config, spec: TrafficSpec, attempts: int = 5) -> dict[str, int]:
    """Registers the schema of each :class:`RegistryKind` topic under ``<topic>-value`` (the same schema again:
    the same id) and returns topic -> id; retried with backoff, then a ConfigError naming the registry."""
    wanted = [(topic, KINDS[kind]) for topic, kind in spec.topics if isinstance(KINDS[kind], RegistryKind)]
    if not wanted:
        return {}
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client_conf = config.registry_client_conf()  # a ConfigError when no registry is configured or running
    for attempt in range(attempts):
        try:
            client = SchemaRegistryClient(client_conf)
            return {
                topic: client.register_schema(f"{topic}-value", Schema(kind.schema_text, kind.schema_type))
                for topic, kind in wanted
            }
        except Exception as exc:  # the registry's client raises its own errors and httpx's
            if attempt == attempts - 1:
                raise ConfigError(
                    f"the Schema Registry at {client_conf['url']} did not register the demo's schemas: {exc}"
                ) from None
            log.warning("demo: registering the schemas failed (%s); again in %d s", exc, 2**attempt)
            time.sleep(2**attempt)
    raise AssertionError("unreachable")


def run_demo(
    config: Config,
    spec: TrafficSpec,
    stop: threading.Event | None = None,
    stats_file: Path | None = None,
    report_every: float = 10.0,
) -> dict:
    """Produce until ``spec.count`` records, ``spec.duration_seconds`` or ``stop``; returns the summary."""
    from confluent_kafka import Producer

    stop = stop or threading.Event()
    check_kafka_reachable(config)  # a clear error for an unreachable broker or refused credentials, not a timeout
    partitions = ensure_topics(config, spec)
    generator = TrafficGenerator(spec, partitions, register_schemas(config, spec))
    stats = DemoStats()
    producer = Producer(
        {**config.kafka_client_conf(), "linger.ms": 20, "enable.idempotence": True, "client.id": "kdq-demo"}
    )

    def delivered(err: Any, _msg: Any) -> None:
        if err is None:
            stats.delivered += 1
        else:
            stats.failed += 1
            stats.last_error = str(err)

    def report() -> None:
        summary = stats.summary()
        if stats_file is not None:
            stats_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = stats_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(summary, indent=2))
            tmp.replace(stats_file)
        log.info("demo: produced %(produced)d, delivered %(delivered)d, failed %(failed)d", summary)

    limiter = RateLimiter(spec.rate)
    deadline = None if spec.duration_seconds is None else time.monotonic() + spec.duration_seconds
    next_report = time.monotonic() + report_every
    total = 0
    try:
        while not stop.is_set():
            if spec.count is not None and total >= spec.count:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            due = limiter.due()
            if spec.count is not None:
                due = min(due, spec.count - total)
            now_ms = int(time.time() * 1000)
            for _ in range(due):
                record = generator.record(now_ms)
                while True:
                    try:
                        producer.produce(
                            record.topic, value=record.value, key=record.key, partition=record.partition,
                            timestamp=record.timestamp_ms, on_delivery=delivered,
                        )
                        break
                    except BufferError:  # local queue full: let the broker catch up
                        producer.poll(0.1)
                stats.add(record)
                total += 1
            producer.poll(0)
            if time.monotonic() >= next_report:
                report()
                next_report = time.monotonic() + report_every
            stop.wait(min(limiter.wait_seconds(), 0.2) if due == 0 else 0)
    finally:
        left = producer.flush(30)
        if left:
            stats.failed += left
            stats.last_error = f"{left} records not delivered at exit"
        report()
    return stats.summary()


# -- the background process of the local run -----------------------------------------------------------


def demo_process(config: Config) -> ManagedProcess:
    folder = config.data_dir / "demo"
    return ManagedProcess(
        name="demo",
        pid_file=folder / "demo.pid",
        log_file=folder / "demo.log",
        marker=f"--stats-file={folder / 'stats.json'}",  # unique per data folder
    )


def start_demo(config: Config, demo_args: Sequence[str] = ()) -> int:
    """``kdq demo <demo_args>`` detached (no-op if it already runs); returns its pid."""
    process = demo_process(config)
    config_args = ["--config", config.source] if config.source != "defaults" else []
    command = [sys.executable, "-m", "kdq.cli", *config_args, "demo", *demo_args, process.marker]
    return process.start(command, cwd=config.base_dir)


def stop_demo(config: Config, timeout: float = 40.0) -> bool:
    """SIGTERM: the generator flushes what it produced and exits."""
    return demo_process(config).stop(timeout=timeout)


def read_stats(config: Config) -> dict | None:
    try:
        return json.loads((config.data_dir / "demo" / "stats.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def main_loop(config: Config, spec: TrafficSpec, stats_file: Path | None) -> dict:
    """``run_demo`` with SIGTERM/SIGINT as a graceful stop (flush, final stats), for the CLI."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return run_demo(config, spec, stop=stop, stats_file=stats_file)
