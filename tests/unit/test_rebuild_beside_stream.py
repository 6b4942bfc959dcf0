"""A rebuild beside the running stream neither doubles nor loses counts.

Under `make run`, two rebuilds of a range the stream was still writing lost 820 of 22,070 records. The
stream's micro-batches are played here with the stream's own writers (archive append and window-count
MERGE under its checkpoint's app id, ledger entries in its checkpoint), in the orders that race:

* the archive append of a batch landed, its MERGE not yet, when the rebuild reads: the rebuild must not
  count those rows (the MERGE adds them);
* a batch's MERGE lands between the rebuild's read and its write: the rebuild must not overwrite it.

Expected values are written out by hand.
"""

from __future__ import annotations

import datetime as dt
import json

from pyspark.sql import functions as F

from kdq.rules import load_rules
from kdq.spark import batch_layer as bl
from kdq.spark import transforms
from kdq.spark.ledger import MicroBatchLedger
from kdq.spark.reasons_flush import REASONS_KEY, ReasonsFlush
from kdq.spark.rebuild import rebuild
from kdq.spark.speed_layer import app_id_for, checkpoint_dir
from kdq.spark.stream_cut import reasons_at, stream_cut
from kdq.spark.tables import ensure_tables, table_path
from kdq.spark.writers import append_archive, merge_window_increments
from kdq.tables import WINDOW_COUNTS
from tests.conftest import make_config

W = 1_700_000_000_000
TOPIC = "pay"
SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"
STRICT = {"type": "object", "properties": {"amount": {"type": "number", "minimum": 0}}}


class Stream:
    """The stream's writes of one micro-batch, split where the races happen."""

    def __init__(self, spark, config, rules_dir) -> None:
        self.spark, self.config = spark, config
        self.checkpoint = checkpoint_dir(config)
        self.app_id = app_id_for(self.checkpoint)
        self.ledger = MicroBatchLedger(spark, str(self.checkpoint))
        self.rules = load_rules(rules_dir)  # the rules the stream runs with (the old ones)
        self.increments: dict[int, list[dict]] = {}

    def archive(self, batch_id: int, amounts: list[int], first_offset: int, topic: str = TOPIC) -> None:
        ingest_ms = W + 10_000 + batch_id * 1_000
        stamp = dt.datetime.fromtimestamp((W + 100) / 1000, dt.UTC).replace(tzinfo=None)
        rows = [(None, json.dumps({"amount": a}).encode(), topic, 0, first_offset + i, stamp, 0) for i, a in enumerate(amounts)]
        classified = transforms.mark_late(
            transforms.classify(self.spark.createDataFrame(rows, SCHEMA), self.rules, self.config.stream, ingest_ms),
            {}, self.config.stream,
        )
        self.ledger.write({"batch_id": batch_id, "ingest_time_ms": ingest_ms, "max_event_ms_before": {},
                           "max_event_ms_after": {topic: W + 100}, "invalid_rows": 0,
                           "input_rows_by_topic": {topic: len(amounts)}, **self.entry_fields(batch_id, classified)})
        append_archive(classified, self.config, self.app_id, batch_id, batch_id, "stream")
        self.increments[batch_id] = [{"topic": topic, "window_start_ms": W, "status": "valid", "count": len(amounts),
                                      "rules_version": self.rules.version_for(topic)}]

    def entry_fields(self, batch_id: int, classified) -> dict:
        """More fields of the batch's ledger entry (a subclass's)."""
        return {}

    def merge(self, batch_id: int) -> None:
        merge_window_increments(self.spark, self.increments[batch_id], self.config, self.app_id, batch_id)


def _counts(spark, config) -> dict:
    df = spark.read.format("delta").load(table_path(config, WINDOW_COUNTS)).where(F.col("topic") == TOPIC)
    return {(r["w"], r["status"]): r["count"] for r in df.select(F.unix_millis("window_start").alias("w"), "status", "count").collect()}


def _setup(spark, tmp_path):
    config = make_config(tmp_path / "data", paths={"rules_dir": str(tmp_path / "rules")})
    (tmp_path / "rules").mkdir()
    ensure_tables(spark, config)
    return config, Stream(spark, config, tmp_path / "rules")


def test_a_batch_archived_but_not_merged_is_left_to_its_merge(spark, tmp_path) -> None:
    config, stream = _setup(spark, tmp_path)
    stream.archive(0, [5, 6, 7], 0)
    stream.merge(0)
    stream.archive(1, [8, 9], 3)  # the batch in flight: archived, its MERGE not landed yet

    report = rebuild(spark, config, load_rules(tmp_path / "rules"), W, W + 1_000, [TOPIC], "rb", push=False)
    assert report.corrections == 0  # the stored 3 are the cut's 3
    stream.merge(1)
    assert _counts(spark, config) == {(W, "valid"): 5}  # was 7 before the cut: batch 1 counted twice


def test_a_merge_between_the_rebuilds_read_and_write_is_not_lost(spark, tmp_path, monkeypatch) -> None:
    config, stream = _setup(spark, tmp_path)
    stream.archive(0, [5, -1, 7], 0)
    stream.merge(0)
    (tmp_path / "rules" / f"{TOPIC}.schema.json").write_text(json.dumps(STRICT))  # negative amounts now invalid

    real_merge = bl._merge_absolute
    raced = []

    def stream_merges_first(*args, **kwargs):
        if not raced:  # the stream's next batch lands after the rebuild read the window, before it writes
            stream.archive(1, [8, 9], 3)
            stream.merge(1)
            raced.append(True)
        return real_merge(*args, **kwargs)

    monkeypatch.setattr(bl, "_merge_absolute", stream_merges_first)
    report = rebuild(spark, config, load_rules(tmp_path / "rules"), W, W + 1_000, [TOPIC], "rb", push=False)
    assert raced and report.ok
    # Every record once: 5, 7, 8, 9 valid (batch 1 is re-judged too: the second cut holds it), -1 invalid.
    assert _counts(spark, config) == {(W, "valid"): 4, (W, "invalid"): 1}  # before: valid 2, batch 1's +2 lost
    assert report.corrections == 2


def _with_reasons(stream: Stream, batch_id: int, not_json: int) -> None:
    """Batch ``batch_id``'s ledger entry as the speed layer writes it: with its reason increments."""
    entry = dict(stream.ledger.read(batch_id))
    entry.update({"invalid_rows": not_json, REASONS_KEY: [
        {"topic": TOPIC, "window_start_ms": W // 60_000 * 60_000, "reason": "not_json", "count": not_json}]})
    stream.ledger.delete(batch_id)
    stream.ledger.write(entry)


def _reason_total(spark, config, cut) -> int:
    return int(reasons_at(spark, config, cut).where(F.col("topic") == TOPIC).agg(F.sum("count")).first()[0] or 0)


def test_the_cut_holds_the_reasons_the_stream_has_not_appended_yet_and_no_later_ones(spark, tmp_path) -> None:
    """The stream appends its batches' reasons once a minute from their ledger entries: a cut counts the merged
    batches' pending reasons as present (they will be), and leaves out a flushed batch it does not hold."""
    config, stream = _setup(spark, tmp_path)
    flush = ReasonsFlush(spark, config, stream.app_id, stream.ledger)
    for batch_id, invalid in ((0, 1), (1, 2), (2, 3)):
        stream.archive(batch_id, [1, 2], first_offset=batch_id * 10)
        _with_reasons(stream, batch_id, invalid)
        stream.merge(batch_id)
    flush.flush(0)

    cut = stream_cut(spark, config, wait_seconds=5)
    assert (cut.last_merged, len(cut.pending_reasons)) == (2, 2)  # batches 1 and 2 from the ledger
    assert _reason_total(spark, config, cut) == 6

    stream.archive(3, [1], first_offset=30)  # archived, its MERGE not landed yet
    _with_reasons(stream, 3, 4)
    flush.flush(3)  # 1..3 appended: batch 3's rows are in the table, not in the cut
    later = stream_cut(spark, config, wait_seconds=5)
    assert (later.last_merged, later.pending_reasons) == (2, ())
    assert _reason_total(spark, config, later) == 6
