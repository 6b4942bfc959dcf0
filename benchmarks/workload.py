"""The benchmark workload: order-like JSON messages of a given size, with invalid, out-of-order and late ones,
produced fast into real Kafka topics and checked complete before anything is timed.

Messages are made from a few hundred JSON templates with unique fields filled
in per message (order id, amount, customer id), so every value differs (no
unrealistically good compression) and generation costs about a microsecond.
Each message's Kafka key is its produce time in epoch millis (ASCII), which
the latency phase reads back from the raw archive; its Kafka timestamp is its
event time (kdq's default event-time source).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass

# Kinds of message and what kdq (with the orders schema) says about them.
VALID = "valid"
SCHEMA_KINDS = ("neg_amount", "bad_currency", "no_customer", "zero_qty", "empty_id")
INVALID_KINDS = (*SCHEMA_KINDS, "not_json", "not_utf8")
ORDERS_SCHEMA_FILE = "orders.schema.json"


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

    def describe(self) -> dict:
        return asdict(self)


def expected_valid(kind: str, schema: bool) -> bool:
    """Ground truth: schema violations are valid JSON, so only invalid when the rule applies."""
    if kind == VALID:
        return True
    if kind in SCHEMA_KINDS:
        return not schema
    return False


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
        lines.append(
            {
                "sku": f"SKU-{rng.randrange(10**8):08d}",
                "qty": rng.randrange(1, 9),
                "price": round(rng.uniform(1, 500), 2),
                "note": "gift wrap" if rng.random() < 0.3 else "",
            }
        )
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

    def value(self, kind: str, seq: int) -> bytes:
        if kind == "not_json":
            return self.value(VALID, seq)[:-7]
        if kind == "not_utf8":
            v = self.value(VALID, seq)
            return v[:40] + b"\xff\xfe" + v[42:]
        tpls = self.templates[kind]
        return tpls[seq % len(tpls)] % {b"o": seq, b"a": seq % 1000, b"c": seq % 100, b"u": seq // 7}


def choose_kind(rng: random.Random, invalid_ratio: float) -> str:
    if rng.random() >= invalid_ratio:
        return VALID
    return rng.choice(INVALID_KINDS)


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
    gen = Generator(w.message_bytes, w.seed)
    rng = random.Random(w.seed * 1000 + worker)
    kinds: Counter = Counter()
    late: Counter = Counter()  # shifted back beyond the allowed lateness, by (topic, kind)
    step = 1000.0 / w.event_rate
    key = str(int(time.time() * 1000)).encode()
    for i in range(worker, w.messages, workers):
        kind = choose_kind(rng, w.invalid_ratio)
        kinds[(topics[i % len(topics)], kind)] += 1
        shift = event_offset_ms(rng, w.out_of_order, w.late, w.allowed_lateness_s)
        if shift > w.allowed_lateness_s * 1000:
            late[(topics[i % len(topics)], kind)] += 1
        ts = base_ms + int(i * step) - shift
        if i % 4096 < workers:
            key = str(int(time.time() * 1000)).encode()
        while True:
            try:
                producer.produce(
                    topics[i % len(topics)],
                    value=gen.value(kind, i),
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
    gen = Generator(w.message_bytes, w.seed)
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
            kind = choose_kind(rng, w.invalid_ratio)
            i = sent
            topic = topics[i % len(topics)]
            kinds[(topic, kind)] += 1
            ts = now_ms - event_offset_ms(rng, w.out_of_order, w.late, w.allowed_lateness_s)
            while True:
                try:
                    producer.produce(topic, value=gen.value(kind, seq + i), key=key, partition=(i // len(topics)) % w.partitions, timestamp=ts)
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
