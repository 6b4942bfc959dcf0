"""The micro-batch's counts as an observed metric of the archive write (io.kdq.spark.counts.BatchCounts) equal the
GROUP BY the batch layer uses (transforms.batch_aggregates), row for row, on a batch with every kind of
record: valid, invalid with several reasons, late, bad and future clocks, quarantined, several topics and
windows. And the observation is filled by the Delta write that carries it, once."""

from __future__ import annotations

import datetime as dt
import random

from pyspark.sql import Observation
from pyspark.sql import functions as F

from kdq.config import StreamConfig
from kdq.rules import load_rules
from kdq.spark import transforms
from kdq.spark.writers import append_once
from tests.conftest import PROJECT_ROOT

T0 = 1_700_000_000_000
SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"
VALUES = [b'{"ok": true}', b"not json", b"\xff\xfe", b'{"id": "x"}', b"[1,2", b"null", b'{"a": 1}']


def _stamp(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).replace(tzinfo=None)


def _classified(spark, rows: int = 3_000):
    rng = random.Random(7)
    ingest = T0 + 100_000
    records = []
    for i in range(rows):
        topic = rng.choice(["orders", "payments", "ops.metrics", "free"])
        ms = T0 + rng.randint(-200_000, 100_000)
        if rng.random() < 0.01:
            ms = ingest + 3_600_000  # future clock
        records.append((b"k", rng.choice(VALUES), topic, i % 3, i, _stamp(ms), 0))
    frame = spark.createDataFrame(records, SCHEMA).withColumn(
        transforms.QUARANTINED_COLUMN, (F.col("offset") % 97) == 0
    )
    stream = StreamConfig()
    rules = load_rules(PROJECT_ROOT / "config" / "rules")
    before = {"orders": T0, "payments": T0 - 50_000, "ops.metrics": T0 + 60_000}
    return transforms.mark_late(transforms.classify(frame, rules, stream, ingest), before, stream).repartition(3)


def _key(row: dict) -> tuple:
    return (row["topic"], row["window_start_ms"], row["valid"], row["reason"] or "", row["counted"])


def test_the_observed_counts_equal_the_group_by(spark) -> None:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    classified = _classified(spark).cache()
    expected = sorted((r.asDict() for r in transforms.batch_aggregates(classified).collect()), key=_key)
    observed = classified.select(transforms.batch_counts_metric(classified).alias("m")).first()["m"]
    actual = sorted(transforms.batch_counts_rows(observed), key=_key)
    assert {r["counted"] for r in expected} == {True, False}  # the batch has late rows
    assert any(r["reason"] == transforms.QUARANTINED for r in expected)
    assert any(r["max_event_ms"] is None for r in expected)  # untrusted clocks only
    assert len(actual) == len(expected) > 20
    assert actual == expected
    classified.unpersist()


def test_an_observed_delta_append_reports_every_written_row_once(spark, tmp_path) -> None:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    classified = _classified(spark, rows=2_000)
    observation = Observation("kdq_test_batch_counts")
    observed = classified.observe(observation, transforms.batch_counts_metric(classified).alias("counts"))
    path = str(tmp_path / "archive")
    append_once(observed, path, "test-app", 1)
    rows = transforms.batch_counts_rows(observation.get["counts"])
    assert sum(r["count"] for r in rows) == 2_000
    assert spark.read.format("delta").load(path).count() == 2_000
