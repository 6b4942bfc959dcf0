"""Bad input never crashes the stream and is counted invalid with the right reason; clocks in the future
on one topic never make another topic's records late."""

from __future__ import annotations

import json

from pyspark.sql import functions as F

from kdq.rules import load_rules
from kdq.spark.speed_layer import SpeedLayer
from kdq.spark.tables import register_tables
from tests.integration.helpers import W0, isolated_config, produce, window_counts
from tests.integration.test_speed_layer_example import run_available_now

SCHEMA = {
    "type": "object",
    "required": ["id", "ts"],
    "properties": {
        "id": {"type": "string", "minLength": 2, "maxLength": 5, "pattern": "^[a-z]+$"},
        "ts": {"type": "integer"},
        "amount": {"type": "number", "minimum": 0, "maximum": 100},
        "kind": {"enum": ["a", "b"]},
        "version": {"const": 1},
        "tags": {"type": "array", "items": {"type": "string"}},
        "customer": {"type": "object", "required": ["cid"], "properties": {"cid": {"type": "integer"}}},
    },
    "additionalProperties": False,
}


def _rules(folder, prefix: str) -> None:
    folder.mkdir(parents=True)
    (folder / "strict.schema.json").write_text(json.dumps(SCHEMA))
    (folder / "topics.toml").write_text(
        f'[[topic]]\nmatch = "re:{prefix}-strict.*"\nschema = "strict.schema.json"\n'
        'event_time_field = "ts"\nevent_time_format = "epoch_millis"\n'
    )


def test_every_kind_of_bad_input_gets_its_reason(spark, local_stack, tmp_path) -> None:
    prefix = f"bad{tmp_path.name[-6:].replace('_', '')}"
    topic = f"{prefix}-strict"
    _rules(tmp_path / "rules", prefix)
    config = isolated_config(
        local_stack, tmp_path / "data", prefix, paths={"rules_dir": str(tmp_path / "rules")}, stream={"window_seconds": 1}
    )
    local_stack.kafka.create_topic(topic, partitions=2)

    def doc(**fields) -> bytes:
        base = {"id": "abc", "ts": W0 + 100}
        base.update(fields)
        return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()

    cases: list[tuple[bytes | None, str | None]] = [
        (doc(), None),
        (doc(amount=50, kind="a", version=1, tags=["x"], customer={"cid": 7}), None),
        (b"\xff\xfe\xfd", "not_utf8"),
        (b"{not json", "not_json"),
        (b"", "not_json"),
        (None, "null_value"),
        (b'{"id":"abc","ts":' + str(W0).encode() + b',"pad":"' + b"x" * (5 * 1024 * 1024) + b'"}', "too_large"),
        (doc(ts=...), "bad_timestamp"),  # event-time field missing
        (doc(ts="yesterday"), "bad_timestamp"),  # garbled event-time field
        (doc(id="abcdefgh"), "schema:/properties/id/maxLength"),
        (doc(id="a"), "schema:/properties/id/minLength"),
        (doc(id="ABC"), "schema:/properties/id/pattern"),
        (doc(id=12), "schema:/properties/id/type"),
        (doc(amount=-1), "schema:/properties/amount/minimum"),
        (doc(amount=101), "schema:/properties/amount/maximum"),
        (doc(kind="z"), "schema:/properties/kind/enum"),
        (doc(version=2), "schema:/properties/version/const"),
        (doc(tags=["x", 3]), "schema:/properties/tags/items/type"),
        (doc(customer={}), "schema:/properties/customer/required/0"),
        (doc(customer={"cid": "7"}), "schema:/properties/customer/properties/cid/type"),
        (doc(extra=1), "schema:/additionalProperties"),
        (doc(id=...), "schema:/required/0"),
        (b"[1, 2]", "bad_timestamp"),  # no event-time field to read: the clock outranks the schema
    ]
    produce(
        config.kafka_bootstrap(),
        topic,
        [(i % 2, value, W0 + 100) for i, (value, _) in enumerate(cases)],
    )
    # A normal topic beside one whose producer stamps records an hour in the future.
    normal, future = f"{prefix}-normal", f"{prefix}-future"
    local_stack.kafka.create_topic(normal, partitions=1)
    local_stack.kafka.create_topic(future, partitions=1)
    import time

    now = int(time.time() * 1000)
    produce(config.kafka_bootstrap(), future, [(0, b'{"ok":1}', now + 3_600_000) for _ in range(3)])
    produce(config.kafka_bootstrap(), normal, [(0, b'{"ok":1}', now - 5_000 + i) for i in range(4)])

    layer = SpeedLayer(spark, config, load_rules(config.rules_dir))
    run_available_now(layer)
    # Second wave on the normal topic, a little older than the first: still counted,
    # because the future topic's clock never moves the normal topic's lateness.
    produce(config.kafka_bootstrap(), normal, [(0, b'{"ok":1}', now - 8_000 + i) for i in range(2)])
    run_available_now(layer)

    archive = spark.read.format("delta").load(str(config.tables_dir / "raw_archive"))
    got = {
        r["offset"] + 1000 * r["partition"]: r["reason"]
        for r in archive.where(F.col("topic") == topic).select("partition", "offset", "reason").collect()
    }
    produced_order = {}
    counters = [0, 0]
    for i, (_, reason) in enumerate(cases):
        produced_order[counters[i % 2] + 1000 * (i % 2)] = reason
        counters[i % 2] += 1
    assert got == produced_order

    counts = window_counts(spark, config, topic)
    w = W0
    expected_invalid = sum(1 for _, reason in cases if reason is not None)
    # bad_timestamp records count in the window of their Kafka timestamp (W0+100 → w).
    assert counts == {(topic, w, "valid"): 2, (topic, w, "invalid"): expected_invalid}

    reasons = {
        r["reason"]: r["count"]
        for r in spark.read.format("delta").load(str(config.tables_dir / "invalid_reasons"))
        .where(F.col("topic") == topic).groupBy("reason").agg(F.sum("count").alias("count")).collect()
    }
    assert reasons["bad_timestamp"] == 3 and reasons["not_json"] == 2 and sum(reasons.values()) == expected_invalid
    # The invalid_samples view over the archive: every invalid record here (fewer than 20 per reason).
    # (registered under a database of this test's own: the session's catalog outlives each test)
    own = config.model_copy(update={"spark": config.spark.model_copy(update={"database": "kdq_bad_input"})})
    register_tables(spark, own)
    samples = spark.table("kdq_bad_input.invalid_samples").where(F.col("topic") == topic)
    assert samples.count() == expected_invalid
    assert samples.where(F.col("reason") == "too_large").first()["value_bytes"] > 5 * 1024 * 1024
    assert {r["reason"] for r in samples.collect()} == {reason for _, reason in cases if reason is not None}

    normal_counts = window_counts(spark, config, normal)
    assert sum(normal_counts.values()) == 6 and all(k[2] == "valid" for k in normal_counts)
    assert archive.where((F.col("topic") == normal) & ~F.col("counted")).count() == 0
    future_rows = archive.where(F.col("topic") == future).collect()
    assert [r["reason"] for r in future_rows] == ["future_timestamp"] * 3
    future_counts = window_counts(spark, config, future)
    assert sum(future_counts.values()) == 3 and all(k[2] == "invalid" for k in future_counts)
    # Counted in the window of their ingest time, not an hour ahead.
    assert all(window < now + 600_000 for _, window, _ in future_counts)
