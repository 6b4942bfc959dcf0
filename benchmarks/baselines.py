"""The two baselines, run on the same topics as the speed layer, in the same run.

* ``raw``: the consumption ceiling: a confluent-kafka consumer that reads
  every record (value bytes touched, nothing else) from offset 0 to the end.
* ``plain``: the job a team would write by hand: confluent-kafka + json +
  fastjsonschema + per-(topic, 1 s window, status) counts in a dict. It keeps
  nothing durable, has no exactly-once, no late-data handling, no reasons
  table, no outputs: the cost of the bare validation and counting. On Avro topics (the ``avro`` rule variant)
  its validation is what a registry-aware consumer does: the wire header's magic byte and schema id (the
  topic's subject's id, known in advance: no registry request), then fastavro's decoding of the payload,
  which must use every byte (:func:`avro_validator`).

Each runs in ``processes`` processes (partitions split among them, as a
consumer group would), so it can be compared core for core with Spark's
``local[2]``. Time runs from the moment every process is connected and
assigned until the last record is read.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from collections import Counter
from pathlib import Path

CONSUMER_CONF = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "fetch.max.bytes": 52_428_800,
    "max.partition.fetch.bytes": 8_388_608,
    "queued.max.messages.kbytes": 262_144,
    "fetch.wait.max.ms": 100,
}


def avro_validator(spec: dict):
    """``spec``: {"avro_schema": the writer's schema, "ids": {topic: its subject's schema id}}; returns
    ``valid(topic, value) -> bool``, the verdict kdq's registry-backed rule gives (framing, id, decoding)."""
    import io

    import fastavro

    parsed = fastavro.parse_schema(spec["avro_schema"])
    headers = {topic: b"\x00" + int(i).to_bytes(4, "big") for topic, i in spec["ids"].items()}
    read = fastavro.schemaless_reader

    def valid(topic: str, value: bytes) -> bool:
        if value[:5] != headers.get(topic):
            return False  # not framed, or another schema id: no_magic_byte / unknown / other subject
        body = io.BytesIO(value)
        body.seek(5)
        try:
            read(body, parsed)
        except Exception:  # noqa: BLE001 (EOFError, IndexError of a bad enum or union index, ValueError, ...)
            return False
        return body.tell() == len(value)  # bytes left over: invalid

    return valid


def _consume(
    kind: str, bootstrap: str, assignment: list[tuple[str, int, int]], schema_path: str | None, ready, go, out
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kdq-bench-{kind}-{time.time_ns()}", **CONSUMER_CONF})
    consumer.assign([TopicPartition(t, p, 0) for t, p, _ in assignment])
    remaining = {(t, p): end for t, p, end in assignment if end > 0}
    validate = avro = None
    if kind == "plain" and schema_path:
        spec = json.loads(Path(schema_path).read_text())
        if "avro_schema" in spec:
            avro = avro_validator(spec)
        else:
            import fastjsonschema

            validate = fastjsonschema.compile(spec)
    counts: Counter = Counter()
    messages = 0
    nbytes = 0
    ready.put(True)
    go.wait()
    started = time.monotonic()
    loads = json.loads
    while remaining:
        batch = consumer.consume(num_messages=10_000, timeout=1.0)
        for msg in batch:
            if msg.error():
                continue
            value = msg.value()
            messages += 1
            nbytes += len(value)
            if avro is not None:
                status = "valid" if avro(msg.topic(), value) else "invalid"
                counts[(msg.topic(), msg.timestamp()[1] // 1000 * 1000, status)] += 1
            elif kind == "plain":
                # What a hand-written job does per record: parse, validate, count in its window.
                try:
                    doc = loads(value)  # bytes: UTF-8 decoding errors raise ValueError too
                    if validate is not None:
                        validate(doc)
                    status = "valid"
                except ValueError:  # JSONDecodeError, UnicodeDecodeError, JsonSchemaException
                    status = "invalid"
                counts[(msg.topic(), msg.timestamp()[1] // 1000 * 1000, status)] += 1
            key = (msg.topic(), msg.partition())
            if key in remaining and msg.offset() + 1 >= remaining[key]:
                del remaining[key]
    seconds = time.monotonic() - started
    consumer.close()
    totals = Counter()
    for (_, _, status), n in counts.items():
        totals[status] += n
    out.put({"messages": messages, "bytes": nbytes, "seconds": seconds, "totals": dict(totals), "windows": len(counts)})


def run_consumers(
    kind: str, bootstrap: str, ends: dict[tuple[str, int], int], processes: int, schema_path: str | None = None
) -> dict:
    """Run ``processes`` consumers of ``kind`` ('raw' or 'plain') over the partitions in ``ends`` (topic, p) → end offset."""
    ctx = mp.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    parts = sorted(ends.items())
    shares = [[(t, p, end) for (t, p), end in parts[k::processes]] for k in range(processes)]
    procs = [
        ctx.Process(target=_consume, args=(kind, bootstrap, share, schema_path, ready, go, out), daemon=True)
        for share in shares
    ]
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            ready.get(timeout=120)
        started = time.monotonic()
        go.set()
        results = [out.get(timeout=1800) for _ in procs]
        wall = time.monotonic() - started
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    messages = sum(r["messages"] for r in results)
    nbytes = sum(r["bytes"] for r in results)
    totals: Counter = Counter()
    for r in results:
        totals.update(r["totals"])
    return {
        "kind": kind,
        "processes": processes,
        "messages": messages,
        "bytes": nbytes,
        "seconds": round(wall, 3),
        "msgs_per_s": round(messages / wall, 1),
        "mb_per_s": round(nbytes / wall / 1e6, 2),
        "totals": dict(totals),
    }
