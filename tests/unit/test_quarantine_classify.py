"""Quarantine in classify: records marked quarantined skip the classifier and are invalid with reason
internal_error:quarantined at their Kafka timestamp; the test-only poison switch fails any job over an
unquarantined poisoned record and leaves quarantined ones alone."""

from __future__ import annotations

import datetime as dt

import pytest

from kdq.config import StreamConfig
from kdq.rules import load_rules
from kdq.spark import transforms
from kdq.spark.faults import FaultInjector
from tests.conftest import PROJECT_ROOT

T0 = 1_700_000_000_000
INGEST = T0 + 5_000


def records(spark, quarantined: list[bool] | None = None):
    stamp = dt.datetime.fromtimestamp(T0 / 1000, dt.UTC).replace(tzinfo=None)
    rows = [
        (b"k", b'{"ok": true}', "t", 0, 0, stamp, 0),
        (b"k", b'{"ok": true} POISON', "t", 0, 1, stamp + dt.timedelta(milliseconds=1500), 0),
        (b"k", b"not json", "t", 1, 0, stamp + dt.timedelta(days=3), 0),  # far ahead of ingest time
    ]
    schema = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"
    df = spark.createDataFrame(rows, schema)
    if quarantined is not None:
        from pyspark.sql import functions as F

        flags = {(p, o): q for (_, _, _, p, o, _, _), q in zip(rows, quarantined, strict=True)}
        hit = F.lit(False)
        for (p, o), q in flags.items():
            if q:
                hit = hit | ((F.col("partition") == p) & (F.col("offset") == o))
        df = df.withColumn(transforms.QUARANTINED_COLUMN, hit)
    return df


def classify(spark, df):
    stream = StreamConfig()
    rules = load_rules(PROJECT_ROOT / "config" / "rules")
    out = transforms.classify(df, rules, stream, INGEST).orderBy("partition", "offset").collect()
    assert transforms.QUARANTINED_COLUMN not in out[0].asDict()
    return [(r.partition, r.offset, r.valid, r.reason, int(r.window_start.replace(tzinfo=dt.UTC).timestamp() * 1000))
            for r in out]


def test_quarantined_records_skip_classification_and_are_internal_error(spark) -> None:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    plain = classify(spark, records(spark))
    assert plain[0] == (0, 0, True, None, T0) and plain[2][3] == "not_json"
    marked = classify(spark, records(spark, [False, True, True]))
    assert marked == [
        (0, 0, True, None, T0),
        (0, 1, False, transforms.QUARANTINED, T0 + 1000),
        (1, 0, False, transforms.QUARANTINED, INGEST),  # its Kafka clock is far ahead: ingest time
    ]


def test_poison_switch_fails_unless_the_record_is_quarantined(spark) -> None:
    faults = FaultInjector.from_env({"KDQ_FAULT_FAIL_VALUE": "POISON"})
    with pytest.raises(Exception, match="KDQ_FAULT_FAIL_VALUE: cannot process record t partition 0 offset 1"):
        classify(spark, faults.poison(records(spark)))
    assert [r[3] for r in classify(spark, faults.poison(records(spark, [False, True, False])))] == [
        None, transforms.QUARANTINED, "not_json",
    ]


def test_quarantine_decision_is_taken_before_the_ledger_and_replayed_after_it(spark, tmp_path) -> None:
    import json

    from kdq.spark.speed_layer import SpeedLayer
    from kdq.stream import failures
    from tests.conftest import make_config

    config = make_config(tmp_path / "data")
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "4").write_text('v1\n{"batchWatermarkMs":0}\n' + json.dumps({"t": {"0": 10}}) + "\n")
    (checkpoint / "offsets" / "5").write_text('v1\n{"batchWatermarkMs":0}\n' + json.dumps({"t": {"0": 20}}) + "\n")
    layer = SpeedLayer(spark, config, load_rules(PROJECT_ROOT / "config" / "rules"), checkpoint=checkpoint)
    try:
        assert layer._decide_quarantine(5) == []  # no list: nothing read, nothing recorded
        assert not (checkpoint / "kdq_quarantine").exists()

        failures.add_quarantine(config, [{"topic": "t", "partition": 0, "from": 2, "to": 3}], "other batch")
        failures.add_quarantine(config, [{"topic": "t", "partition": 0, "from": 12, "to": 12}], "bug")
        assert [e["id"] for e in layer._decide_quarantine(5)] == [2]  # only the entry inside batch 5 (10..19)

        # The operator adds a range before the batch reached its ledger entry: the next attempt applies it.
        failures.add_quarantine(config, [{"topic": "t", "partition": 0, "from": 15, "to": 16}], "more")
        assert [e["id"] for e in layer._decide_quarantine(5)] == [2, 3]

        # Once the ledger entry exists, a replay keeps the recorded decision, whatever the list says now.
        layer.ledger.write({"batch_id": 5, "ingest_time_ms": 1, "max_event_ms_before": {}, "max_event_ms_after": {}})
        failures.add_quarantine(config, [{"topic": "t", "partition": 0, "from": 18, "to": 18}], "late")
        fresh = SpeedLayer(spark, config, load_rules(PROJECT_ROOT / "config" / "rules"), checkpoint=checkpoint)
        try:
            assert [e["id"] for e in fresh._decide_quarantine(5)] == [2, 3]
        finally:
            fresh.close()
    finally:
        layer.close()
