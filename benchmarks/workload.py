"""The benchmark workload: order-like JSON messages of a given size, with invalid, out-of-order and late ones,
produced fast into real Kafka topics and checked complete before anything is timed. The same orders as Avro in
Confluent's wire format (``Workload.encoding == "avro"``, :class:`AvroGenerator`) for registry-backed rules.

Messages are made from a few hundred JSON templates with unique fields filled
in per message (order id, amount, customer id), so every value differs (no
unrealistically good compression) and generation costs about a microsecond.
Each message's Kafka key is its produce time in epoch millis (ASCII), which
the latency phase reads back from the raw archive; its Kafka timestamp is its
event time (kdq's default event-time source).
"""

from __future__ import annotations

import io
import json
import multiprocessing as mp
import random
import struct
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

# Kinds of message and what kdq (with the orders schema) says about them.
VALID = "valid"
SCHEMA_KINDS = ("neg_amount", "bad_currency", "no_customer", "zero_qty", "empty_id")
INVALID_KINDS = (*SCHEMA_KINDS, "not_json", "not_utf8")
ORDERS_SCHEMA_FILE = "orders.schema.json"
# The Avro variant (registry = true): every kind is a payload the registry's schema cannot decode or a framing
# error, so all are invalid. Avro states types, not values: the JSON kinds that break a value's constraint
# (neg_amount, zero_qty, empty_id) have no Avro counterpart.
AVRO_INVALID_KINDS = (
    "truncated",  # the valid payload less its last 7 bytes: avro:/lines/...
    "bad_enum",  # currency written as symbol index 3 of 3: avro:/currency
    "trailing_bytes",  # the valid payload and one byte more: avro:$trailing_bytes
    "no_magic_byte",  # the order as JSON (a JSON producer on the Avro topic): no_magic_byte
    "unknown_schema_id",  # framed with an id the registry does not have: unknown_schema_id
    "other_subject",  # framed with the id of another subject's schema: schema_not_for_subject
)
# What kdq's registry-backed rule says about each kind (config/rules/README.md's reasons); a value ending in "/" is a
# prefix (the pointer names the line the truncated payload ends in).
AVRO_REASONS = {
    "truncated": "avro:/lines/",
    "bad_enum": "avro:/currency",
    "trailing_bytes": "avro:$trailing_bytes",
    "no_magic_byte": "no_magic_byte",
    "unknown_schema_id": "unknown_schema_id",
    "other_subject": "schema_not_for_subject",
}
AVRO_SCHEMA = Path(__file__).resolve().parent / "rules" / "orders.avsc"
# The schema of the other subject (other_subject kind): registered, but not a version of any bench topic's subject.
OTHER_AVRO = {"type": "record", "name": "Refund", "namespace": "io.kdq.bench",
              "fields": [{"name": "refund_id", "type": "string"}, {"name": "cents", "type": "long"}]}
ENCODINGS = ("json", "avro")


@dataclass(frozen=True)
class Workload:
    messages: int
    topics: int = 4
    partitions: int = 3
    message_bytes: int = 1024
    invalid_ratio: float = 0.05
    out_of_order: float = 0.10
    late: float = 0.01
    schema: bool = True
    event_rate: int = 50_000  # msgs/s of event time the backlog represents
    allowed_lateness_s: int = 60
    seed: int = 7
    encoding: str = "json"  # "avro": Confluent's wire format, framed with the ids in ``registry``
    # avro: {"ids": {topic: schema id}, "other_id": id of another subject's schema, "unknown_id": an id not registered}
    registry: dict | None = None

    def invalid_kinds(self) -> tuple[str, ...]:
        return AVRO_INVALID_KINDS if self.encoding == "avro" else INVALID_KINDS

    def describe(self) -> dict:
        return asdict(self)


def expected_valid(kind: str, schema: bool) -> bool:
    """Ground truth: schema violations are valid JSON, so only invalid when the rule applies."""
    if kind == VALID:
        return True
    if kind in SCHEMA_KINDS:
        return not schema
    return False


def _line(rng: random.Random) -> dict:
    return {
        "sku": f"SKU-{rng.randrange(10**8):08d}",
        "qty": rng.randrange(1, 9),
        "price": round(rng.uniform(1, 500), 2),
        "note": "gift wrap" if rng.random() < 0.3 else "",
    }


def _order(rng: random.Random, size: int) -> dict:
    lines = []
    doc = {
        "order_id": "%OID%",
        "amount": "%AMT%",
        "currency": rng.choice(["EUR", "USD", "GBP"]),
        "customer": {
            "id": "%CID%",
            "name": rng.choice(["Ada Lovelace", "Grace Hopper", "Alan Turing", "Edsger Dijkstra"]),
            "email": f"user{rng.randrange(10**6)}@example.com",
            "tier": rng.choice(["gold", "silver", "bronze"]),
        },
        "channel": rng.choice(["web", "app", "store"]),
        "lines": lines,
    }
    while len(json.dumps(doc, separators=(",", ":"))) < size - 35:
        lines.append(_line(rng))
    return doc


def _template(doc: dict) -> bytes:
    """A bytes %-format with named slots; slots a broken kind no longer has are simply not used."""
    text = json.dumps(doc, separators=(",", ":")).replace("%", "%%")
    text = text.replace('"%%OID%%"', '"o-%(o)d"').replace('"%%AMT%%"', "%(a)d.%(c)02d").replace('"%%CID%%"', '"c-%(u)d"')
    return text.encode()


def _broken(kind: str, doc: dict) -> bytes:
    doc = json.loads(json.dumps(doc))
    if kind == "bad_currency":
        doc["currency"] = "JPY"
    elif kind == "no_customer":
        del doc["customer"]
    elif kind == "zero_qty":
        if not doc["lines"]:
            doc["lines"].append({"sku": "SKU-0", "qty": 1})
        doc["lines"][-1]["qty"] = 0
    elif kind == "empty_id":
        doc["order_id"] = ""
    template = _template(doc)
    if kind == "neg_amount":
        # "-1" prefix: never -0.00, which would satisfy minimum 0.
        template = template.replace(b'"amount":%(a)d', b'"amount":-1%(a)d', 1)
    return template


class Generator:
    """Values by kind; ``value(kind, seq)`` fills a prepared template (about a microsecond)."""

    def __init__(self, message_bytes: int, seed: int, templates: int = 64) -> None:
        rng = random.Random(seed)
        docs = [_order(rng, message_bytes) for _ in range(templates)]
        self.templates: dict[str, list[bytes]] = {VALID: [_template(d) for d in docs]}
        for kind in SCHEMA_KINDS:
            self.templates[kind] = [_broken(kind, d) for d in docs[:8]]

    def value(self, kind: str, seq: int, topic: str | None = None) -> bytes:
        """``topic``: unused (the Avro generator's framing depends on it)."""
        if kind == "not_json":
            return self.value(VALID, seq)[:-7]
        if kind == "not_utf8":
            v = self.value(VALID, seq)
            return v[:40] + b"\xff\xfe" + v[42:]
        tpls = self.templates[kind]
        return tpls[seq % len(tpls)] % {b"o": seq, b"a": seq % 1000, b"c": seq % 100, b"u": seq // 7}


def zigzag_varint(n: int) -> bytes:
    """Avro's encoding of an int or long (zig-zag, then a little-endian base-128 varint)."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _avro_str(text: str) -> bytes:
    data = text.encode()
    return zigzag_varint(len(data)) + data


def wire_header(schema_id: int) -> bytes:
    """Confluent's wire format: magic byte 0, then the schema id as a 4-byte big-endian integer."""
    return b"\x00" + struct.pack(">I", schema_id)


def avro_schema() -> dict:
    return json.loads(AVRO_SCHEMA.read_text())


class AvroGenerator:
    """The orders of :class:`Generator` as Avro (``benchmarks/rules/orders.avsc``), ≈ ``message_bytes`` each with its
    wire header (an Avro order carries no field names, so it holds more lines than a JSON one of the same size).

    Each template is encoded once (fastavro) with empty order and customer ids; a message is the topic's header, the
    order id, the amount, the template's bytes up to the customer id, the customer id and the template's rest, so
    every value differs as in the JSON workload, at about a microsecond each. ``registry``: :attr:`Workload.registry`.
    """

    def __init__(self, message_bytes: int, seed: int, registry: dict, templates: int = 64) -> None:
        import fastavro

        parsed = fastavro.parse_schema(avro_schema())
        rng = random.Random(seed)
        self.headers = {topic: wire_header(i) for topic, i in registry["ids"].items()}
        self.unknown_header = wire_header(registry["unknown_id"])
        self.other_header = wire_header(registry["other_id"])
        self.parts: list[tuple[bytes, bytes]] = []  # (currency enum, everything after the customer id)
        for _ in range(templates):
            doc = _order(rng, message_bytes)
            doc.update(order_id="", amount=0.0)
            doc["customer"]["id"] = ""
            while True:
                out = io.BytesIO()
                fastavro.schemaless_writer(out, parsed, doc)
                encoded = out.getvalue()
                # header 5 + order id ~12 + customer id ~10: at least message_bytes - 10 in all
                if len(encoded) >= message_bytes - 35:
                    break
                doc["lines"].append(_line(rng))
            # "" (1 byte), the double (8), the currency's index (1 byte: 3 symbols), "" (1 byte), then the rest.
            assert encoded[0] == 0 and encoded[10] == 0 and encoded[9] in (0, 2, 4), encoded[:11]
            self.parts.append((encoded[9:10], encoded[11:]))
        self.json = Generator(message_bytes, seed)  # the no_magic_byte kind: the same order, as JSON

    def payload(self, seq: int, currency: bytes | None = None) -> bytes:
        """The Avro body (no header) of order ``seq``; ``currency``: its encoded enum index instead of the template's."""
        enum, rest = self.parts[seq % len(self.parts)]
        amount = seq % 1000 + (seq % 100) / 100
        return (_avro_str(f"o-{seq}") + struct.pack("<d", amount) + (currency or enum)
                + _avro_str(f"c-{seq // 7}") + rest)

    def value(self, kind: str, seq: int, topic: str) -> bytes:
        if kind == VALID:
            return self.headers[topic] + self.payload(seq)
        if kind == "truncated":
            return (self.headers[topic] + self.payload(seq))[:-7]
        if kind == "bad_enum":
            return self.headers[topic] + self.payload(seq, currency=zigzag_varint(3))
        if kind == "trailing_bytes":
            return self.headers[topic] + self.payload(seq) + b"\x00"
        if kind == "no_magic_byte":
            return self.json.value(VALID, seq)
        if kind == "unknown_schema_id":
            return self.unknown_header + self.payload(seq)
        if kind == "other_subject":
            return self.other_header + self.payload(seq)
        raise ValueError(f"unknown kind {kind!r}")


def avro_kind_of(reason: str | None) -> str:
    """The Avro kind a reason of kdq's stands for (:data:`AVRO_REASONS`; VALID for none); an unexpected reason as is."""
    if reason is None:
        return VALID
    for kind, expected in AVRO_REASONS.items():
        if reason == expected or (expected.endswith("/") and reason.startswith(expected)):
            return kind
    return reason


def generator(w: Workload) -> Generator | AvroGenerator:
    """The workload's message generator: ``gen.value(kind, seq, topic)``."""
    if w.encoding == "avro":
        return AvroGenerator(w.message_bytes, w.seed, w.registry or {})
    return Generator(w.message_bytes, w.seed)


def register_avro(registry_url: str, topics: list[str], other_subject: str) -> dict:
    """Register the orders' Avro schema under each topic's subject (``<topic>-value``, the topic-name strategy) and
    :data:`OTHER_AVRO` under ``other_subject``; returns :attr:`Workload.registry` (with an id the registry lacks)."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry_url})
    orders = Schema(AVRO_SCHEMA.read_text(), "AVRO")
    ids = {topic: client.register_schema(f"{topic}-value", orders) for topic in topics}
    other = client.register_schema(other_subject, Schema(json.dumps(OTHER_AVRO), "AVRO"))
    if other in ids.values():
        raise RuntimeError(f"the registry gave the other subject's schema the orders' id {other}")
    return {"ids": ids, "other_id": other, "unknown_id": max([other, *ids.values()]) + 1_000_000}


def choose_kind(rng: random.Random, invalid_ratio: float, kinds: tuple[str, ...] = INVALID_KINDS) -> str:
    if rng.random() >= invalid_ratio:
        return VALID
    return rng.choice(kinds)


def event_offset_ms(rng: random.Random, out_of_order: float, late: float, allowed_lateness_s: int) -> int:
    """How far back a message's event time is shifted: 0, a few seconds (out of order), or beyond the lateness."""
    r = rng.random()
    if r < late:
        return int((allowed_lateness_s + 15 + rng.random() * 300) * 1000)
    if r < late + out_of_order:
        return int(rng.random() * 5000)
    return 0


# -- producing a backlog -------------------------------------------------------------------------


def producer_conf(bootstrap: str) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "acks": "1",
        "enable.idempotence": False,
        "linger.ms": 20,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "message.max.bytes": 8_000_000,
        "compression.type": "none",
    }


def _produce_slice(bootstrap: str, topics: list[str], w: Workload, worker: int, workers: int, base_ms: int, out) -> None:
    from confluent_kafka import Producer

    producer = Producer(producer_conf(bootstrap))
    gen = generator(w)
    invalid_kinds = w.invalid_kinds()
    rng = random.Random(w.seed * 1000 + worker)
    kinds: Counter = Counter()
    late: Counter = Counter()  # shifted back beyond the allowed lateness, by (topic, kind)
    step = 1000.0 / w.event_rate
    key = str(int(time.time() * 1000)).encode()
    for i in range(worker, w.messages, workers):
        kind = choose_kind(rng, w.invalid_ratio, invalid_kinds)
        topic = topics[i % len(topics)]
        kinds[(topic, kind)] += 1
        shift = event_offset_ms(rng, w.out_of_order, w.late, w.allowed_lateness_s)
        if shift > w.allowed_lateness_s * 1000:
            late[(topics[i % len(topics)], kind)] += 1
        ts = base_ms + int(i * step) - shift
        if i % 4096 < workers:
            key = str(int(time.time() * 1000)).encode()
        while True:
            try:
                producer.produce(
                    topic,
                    value=gen.value(kind, i, topic),
                    key=key,
                    partition=(i // len(topics)) % w.partitions,
                    timestamp=ts,
                )
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 < workers:
            producer.poll(0)
    remaining = producer.flush(120)
    out.put({"worker": worker, "kinds": [[t, k, n] for (t, k), n in kinds.items()],
             "late_kinds": [[t, k, n] for (t, k), n in late.items()], "undelivered": remaining})


def produce_backlog(bootstrap: str, topics: list[str], w: Workload, workers: int = 2) -> dict:
    """Produce ``w.messages`` into ``topics`` with ``workers`` processes; returns counts by (topic, kind) (``kinds``;
    ``late_kinds``: those shifted back beyond the allowed lateness) and timing."""
    base_ms = int(time.time() * 1000) - int(w.messages * 1000 / w.event_rate) - 3_600_000
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    started = time.monotonic()
    procs = [
        ctx.Process(target=_produce_slice, args=(bootstrap, topics, w, k, workers, base_ms, out), daemon=True)
        for k in range(workers)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join(60)
    seconds = time.monotonic() - started
    undelivered = sum(r["undelivered"] for r in results)
    if undelivered:
        raise RuntimeError(f"{undelivered} messages were not delivered")
    kinds: Counter = Counter()
    late: Counter = Counter()
    for r in results:
        for t, k, n in r["kinds"]:
            kinds[(t, k)] += n
        for t, k, n in r["late_kinds"]:
            late[(t, k)] += n
    return {"seconds": seconds, "kinds": kinds, "late_kinds": late, "base_ms": base_ms}


def end_offsets(bootstrap: str, topics: list[str]) -> dict[tuple[str, int], int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kdq-bench-offsets", "enable.auto.commit": False})
    try:
        result = {}
        for topic in topics:
            meta = consumer.list_topics(topic, timeout=30).topics[topic]
            for p in meta.partitions:
                lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
                result[(topic, p)] = hi - lo
        return result
    finally:
        consumer.close()


def verify_complete(bootstrap: str, topics: list[str], expected: int, timeout: float = 60) -> int:
    """Wait until the topics hold exactly ``expected`` records (the backlog is complete); raise otherwise."""
    deadline = time.monotonic() + timeout
    total = 0
    while time.monotonic() < deadline:
        total = sum(end_offsets(bootstrap, topics).values())
        if total == expected:
            return total
        if total > expected:
            break
        time.sleep(1)
    raise RuntimeError(f"topics {topics} hold {total} records, expected {expected}")


def totals(kinds: Counter, schema: bool) -> dict[str, int]:
    valid = sum(n for (_, k), n in kinds.items() if expected_valid(k, schema))
    invalid = sum(n for (_, k), n in kinds.items() if not expected_valid(k, schema))
    return {"valid": valid, "invalid": invalid}


def totals_by_topic(kinds: Counter, schema: bool) -> dict[str, dict[str, int]]:
    """Ground truth per topic: {topic: {"valid": n, "invalid": n}} from counts by (topic, kind)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, kind), n in kinds.items():
        row = out.setdefault(topic, {"valid": 0, "invalid": 0})
        row["valid" if expected_valid(kind, schema) else "invalid"] += n
    return out


# -- producing at a fixed rate -------------------------------------------------------------------


def _produce_at_rate(bootstrap: str, topics: list[str], w: Workload, msgs_per_s: int, seconds: float, seed: int, out) -> None:
    from confluent_kafka import Producer

    conf = producer_conf(bootstrap)
    conf["linger.ms"] = 5  # latency phase: do not hold records back
    producer = Producer(conf)
    gen = generator(w)
    invalid_kinds = w.invalid_kinds()
    rng = random.Random(seed)
    kinds: Counter = Counter()
    started = time.time()
    sent = 0
    seq = 10**9 + seed * 10**8
    while True:
        now = time.time()
        elapsed = now - started
        if elapsed >= seconds:
            break
        due = int(elapsed * msgs_per_s) - sent
        now_ms = int(now * 1000)
        key = str(now_ms).encode()
        for _ in range(due):
            kind = choose_kind(rng, w.invalid_ratio, invalid_kinds)
            i = sent
            topic = topics[i % len(topics)]
            kinds[(topic, kind)] += 1
            ts = now_ms - event_offset_ms(rng, w.out_of_order, w.late, w.allowed_lateness_s)
            while True:
                try:
                    producer.produce(topic, value=gen.value(kind, seq + i, topic), key=key, partition=(i // len(topics)) % w.partitions, timestamp=ts)
                    break
                except BufferError:
                    producer.poll(0.01)
            sent += 1
        producer.poll(0)
        time.sleep(0.002)
    remaining = producer.flush(60)
    out.put(
        {
            "sent": sent,
            "seconds": time.time() - started,
            "ended_at": time.time(),
            "undelivered": remaining,
            "kinds": [[t, k, n] for (t, k), n in kinds.items()],
        }
    )


def start_rate_producer(bootstrap: str, topics: list[str], w: Workload, msgs_per_s: int, seconds: float):
    """Start one process producing ``msgs_per_s`` for ``seconds`` (key = produce time); returns (process, queue)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_produce_at_rate, args=(bootstrap, topics, w, msgs_per_s, seconds, 11, out), daemon=True)
    proc.start()
    return proc, out
