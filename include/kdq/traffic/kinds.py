"""The demo's record kinds: how a good document of each kind looks, the ways it goes bad, and the demo's
topics (see :mod:`kdq.traffic`). Pure: no Kafka, no registry client."""

from __future__ import annotations

import functools
import io
import json
import math
import random
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kdq.config import Config, ConfigError

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
