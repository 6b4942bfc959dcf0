"""Per-topic lateness: a record from a fast clock must not make its topic's on-time records late.

The bug guarded against: one record with a Kafka timestamp 240 s ahead (inside the 300 s future margin, so valid)
advanced the topic's watermark to 240 s ahead of the stream's clock; with 60 s of allowed lateness every
on-time record of the next minutes was then "late" and left to the hourly batch layer. The watermark's input
is each record's event time capped at its ingest time, so the margin still decides validity while only a
clock the stream has itself reached moves the watermark.
"""

from __future__ import annotations

import datetime as dt

from kdq.config import StreamConfig
from kdq.rules import load_rules
from kdq.spark import transforms
from kdq.stream.micro_batch import increments_of, merge_maxima
from tests.conftest import PROJECT_ROOT

T0 = 1_700_000_000_000
SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"


def _stamp(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).replace(tzinfo=None)


def _batch(spark, topic: str, event_ms: list[int], first_offset: int = 0):
    rows = [(b"k", b'{"ok": true}', topic, 0, first_offset + i, _stamp(ms), 0) for i, ms in enumerate(event_ms)]
    return spark.createDataFrame(rows, SCHEMA)


def _run(spark, batch, before: dict[str, int], ingest_ms: int, stream: StreamConfig):
    rules = load_rules(PROJECT_ROOT / "config" / "rules")
    classified = transforms.mark_late(transforms.classify(batch, rules, stream, ingest_ms), before, stream)
    return increments_of([r.asDict() for r in transforms.batch_aggregates(classified).collect()], 60)


def test_a_fast_clock_inside_the_margin_does_not_make_on_time_records_late(spark) -> None:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    stream = StreamConfig()  # 60 s lateness, 300 s future margin
    topic = "fast_clock"
    ingest_1 = T0
    first = _run(spark, _batch(spark, topic, [T0 + 240_000]), {}, ingest_1, stream)
    assert first.input_rows == 1 and not first.late_rows
    assert [w["status"] for w in first.window_increments] == ["valid"]  # inside the margin: valid, counted
    # The watermark's input never passes the stream's own clock.
    assert first.max_event_ms[topic] <= ingest_1
    after = merge_maxima({}, first.max_event_ms)

    # 2,990 on-time records over the next 60 s, in one batch ingested at their end.
    on_time = [T0 + 1_000 + i * 20 for i in range(2_990)]
    second = _run(spark, _batch(spark, topic, on_time, first_offset=1), after, T0 + 61_000, stream)
    assert second.input_rows == 2_990
    assert second.late_rows == {}, "on-time records were left to the batch layer"
    assert sum(w["count"] for w in second.window_increments) == 2_990


def test_records_really_late_against_the_stream_clock_are_still_late(spark) -> None:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    stream = StreamConfig()
    topic = "slow_record"
    first = _run(spark, _batch(spark, topic, [T0]), {}, T0 + 500, stream)
    assert first.max_event_ms[topic] == T0  # an event time behind the ingest time moves the watermark as before
    after = merge_maxima({}, first.max_event_ms)
    # 61 s before the watermark: later than the allowed 60 s, so left to the batch layer.
    late = _run(spark, _batch(spark, topic, [T0 - 62_000], first_offset=1), after, T0 + 1_000, stream)
    assert late.late_rows == {topic: 1} and late.window_increments == []


def test_each_topic_is_judged_against_its_own_watermark_among_many(spark) -> None:
    """The watermarks go into the plan as one SQL map literal: every topic finds its own, whatever its name
    (quotes and backslashes come out as themselves), and a topic without one is never late."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    stream = StreamConfig()
    odd = ["it's", "back\\slash", "a.b-c_d"]
    before = {f"t{i}": T0 + i for i in range(1_000)} | {name: T0 for name in odd}
    before["behind"] = T0 - 600_000  # its records at T0 - 120 s are on time against this one
    frames = [_batch(spark, t, [T0 - 120_000]) for t in [*odd, "t5", "behind", "new_topic"]]
    batch = frames[0]
    for frame in frames[1:]:
        batch = batch.unionByName(frame)
    result = _run(spark, batch, before, T0 + 1_000, stream)
    assert result.late_rows == {"it's": 1, "back\\slash": 1, "a.b-c_d": 1, "t5": 1}
    assert sorted(w["topic"] for w in result.window_increments) == ["behind", "new_topic"]
