"""Lost and restored checkpoints against the tables' txn versions.

The stream's archive append runs on a writer thread beside its window-count MERGE, so when the stream dies
either may have landed alone. The stream's writes are played here with its own writers (archive append and
MERGE under the checkpoint's app id, ledger entries in the checkpoint), then the checkpoint is lost (or
replaced by an older backup) and the start-up recovery runs. Expected values are written out by hand.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from kdq.rules import load_rules
from kdq.spark import lost_checkpoint as lc
from kdq.spark import transforms
from kdq.spark.ledger import MicroBatchLedger
from kdq.spark.reasons_flush import REASONS_KEY, ReasonsFlush
from kdq.spark.speed_layer import app_id_for, checkpoint_dir
from kdq.spark.tables import ensure_tables, table_path
from kdq.spark.writers import append_archive, merge_window_increments
from kdq.tables import INVALID_REASONS, WINDOW_COUNTS
from tests.conftest import make_config

W = 1_700_000_000_000
TOPIC = "pay"
SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"


class Stream:
    """One stream checkpoint's writes of a micro-batch, split where they race."""

    def __init__(self, spark, config, rules_dir) -> None:
        self.spark, self.config = spark, config
        self.checkpoint = checkpoint_dir(config)
        self.app_id = app_id_for(self.checkpoint)
        self.ledger = MicroBatchLedger(spark, str(self.checkpoint))
        self.rules = load_rules(rules_dir)
        self.increments: dict[int, list[dict]] = {}
        self.classified: dict[int, object] = {}

    def plan(self, batch_id: int, window_ms: int, offsets: list[int], ingest_ms: int, not_json: int = 0) -> None:
        """Batch ``batch_id``: ``offsets`` in one window, the last ``not_json`` of them invalid (not_json)."""
        stamp = dt.datetime.fromtimestamp((window_ms + 100) / 1000, dt.UTC).replace(tzinfo=None)
        values = [json.dumps({"amount": 1}).encode()] * (len(offsets) - not_json) + [b"{oops"] * not_json
        rows = [(None, v, TOPIC, 0, o, stamp, 0) for o, v in zip(offsets, values, strict=True)]
        self.classified[batch_id] = transforms.mark_late(
            transforms.classify(self.spark.createDataFrame(rows, SCHEMA), self.rules, self.config.stream, ingest_ms),
            {}, self.config.stream,
        )
        coarse = window_ms // 60_000 * 60_000
        self.ledger.write({"batch_id": batch_id, "ingest_time_ms": ingest_ms, "max_event_ms_before": {},
                           "max_event_ms_after": {TOPIC: window_ms + 100}, "invalid_rows": not_json,
                           "input_rows_by_topic": {TOPIC: len(offsets)},
                           REASONS_KEY: [{"topic": TOPIC, "window_start_ms": coarse, "reason": "not_json", "count": not_json}]
                           if not_json else []})
        self.increments[batch_id] = [
            {"topic": TOPIC, "window_start_ms": window_ms, "status": status, "count": n, "rules_version": self.rules.version_for(TOPIC)}
            for status, n in (("valid", len(offsets) - not_json), ("invalid", not_json)) if n
        ]

    def archive(self, batch_id: int) -> None:
        append_archive(self.classified[batch_id], self.config, self.app_id, batch_id, batch_id, "stream")

    def merge(self, batch_id: int) -> None:
        merge_window_increments(self.spark, self.increments[batch_id], self.config, self.app_id, batch_id)

    def flush_reasons(self, newest: int) -> None:
        ReasonsFlush(self.spark, self.config, self.app_id, self.ledger).flush(newest)

    def run(self, batch_id: int, window_ms: int, offsets: list[int], ingest_ms: int, not_json: int = 0) -> None:
        self.plan(batch_id, window_ms, offsets, ingest_ms, not_json)
        self.archive(batch_id)
        self.merge(batch_id)


def _counts(spark, config) -> dict:
    df = spark.read.format("delta").load(table_path(config, WINDOW_COUNTS)).where(F.col("topic") == TOPIC)
    return {(r["w"], r["status"]): r["count"] for r in df.select(F.unix_millis("window_start").alias("w"), "status", "count").collect()}


def _setup(spark, tmp_path, **stream):
    config = make_config(tmp_path / "data", paths={"rules_dir": str(tmp_path / "rules")},
                         stream={"on_fresh_checkpoint": "resume_from_archive", **stream})
    (tmp_path / "rules").mkdir()
    ensure_tables(spark, config)
    return config, Stream(spark, config, tmp_path / "rules")


def _lose(config) -> None:
    shutil.rmtree(checkpoint_dir(config))


def _resume_offset(spark, config) -> int:
    """Where the new stream starts partition 0 (archive_resume_offsets without the broker)."""
    last = spark.read.format("delta").load(_archive_path(config))
    top = last.where(F.col("topic") == TOPIC).agg(F.max("offset")).first()[0]
    return -1 if top is None else int(top) + 1


def _archive_path(config) -> str:
    from kdq.tables import RAW_ARCHIVE

    return table_path(config, RAW_ARCHIVE)


def _new_stream_reads_from_the_resume_offset(spark, config, tmp_path, kafka: dict[int, int], ingest_ms: int) -> None:
    """The new checkpoint's first batch: every record of partition 0 from the resume offset (offset → window)."""
    start = _resume_offset(spark, config)
    fresh = Stream(spark, config, tmp_path / "rules")
    by_window: dict[int, list[int]] = {}
    for offset, window in sorted(kafka.items()):
        if offset >= start:
            by_window.setdefault(window, []).append(offset)
    for i, (window, offsets) in enumerate(sorted(by_window.items())):
        fresh.run(i, window, offsets, ingest_ms + i)


def test_a_merge_that_landed_without_its_archive_is_not_counted_twice(spark, tmp_path) -> None:
    config, stream = _setup(spark, tmp_path)
    kafka = {0: W, 1: W, 2: W, 3: W + 1_000, 4: W + 1_000}
    stream.run(0, W, [0, 1, 2], W + 10_000)
    stream.plan(1, W + 1_000, [3, 4], W + 11_000)
    stream.merge(1)  # the MERGE won the race; the archive append of batch 1 never landed (the process died)
    _lose(config)

    lc.recover_lost_batch(spark, config, "lost")
    _new_stream_reads_from_the_resume_offset(spark, config, tmp_path, kafka, W + 20_000)
    # Before: window W + 1000 held batch 1's +2 and the new stream, resuming after offset 2, added them again: 4.
    assert _counts(spark, config) == {(W, "valid"): 3, (W + 1_000, "valid"): 2}


def test_an_archive_that_landed_without_its_merge_is_counted_once(spark, tmp_path) -> None:
    config, stream = _setup(spark, tmp_path)
    kafka = {0: W, 1: W, 2: W, 3: W + 1_000, 4: W + 1_000, 5: W + 2_000}
    stream.run(0, W, [0, 1, 2], W + 10_000)
    stream.plan(1, W + 1_000, [3, 4], W + 11_000)
    stream.archive(1)  # the archive won; the MERGE never landed
    _lose(config)

    lc.recover_lost_batch(spark, config, "lost")
    _new_stream_reads_from_the_resume_offset(spark, config, tmp_path, kafka, W + 20_000)
    assert _counts(spark, config) == {(W, "valid"): 3, (W + 1_000, "valid"): 2, (W + 2_000, "valid"): 1}


def test_both_landed_and_a_rerun_of_the_recovery_changes_nothing(spark, tmp_path) -> None:
    config, stream = _setup(spark, tmp_path)
    stream.run(0, W, [0, 1, 2], W + 10_000)
    stream.plan(1, W + 1_000, [3, 4], W + 11_000)
    stream.merge(1)
    _lose(config)
    assert lc.recover_lost_batch(spark, config, "lost") == 1  # window W + 1000: 2 → 0 (not archived)
    assert lc.recover_lost_batch(spark, config, "lost") == 0
    assert _counts(spark, config) == {(W, "valid"): 3}


def test_merges_without_their_archive_beyond_one_batch_are_refused(spark, tmp_path) -> None:
    config, stream = _setup(spark, tmp_path)
    stream.run(0, W, [0, 1, 2], W + 10_000)
    stream.plan(1, W + 1_000, [3], W + 11_000)
    stream.plan(2, W + 2_000, [4], W + 12_000)
    stream.merge(1)
    stream.merge(2)
    _lose(config)
    with pytest.raises(lc.LostCheckpoint, match="more than one MERGE without its archive rows"):
        lc.recover_lost_batch(spark, config, "lost")
    assert _counts(spark, config)[(W + 2_000, "valid")] == 1  # nothing was changed


def _reasons(spark, config) -> dict:
    df = spark.read.format("delta").load(table_path(config, INVALID_REASONS)).where(F.col("topic") == TOPIC)
    return {(r["w"], r["reason"]): r["n"] for r in df.groupBy(F.unix_millis("window_start").alias("w"), "reason")
            .agg(F.sum("count").alias("n")).collect() if r["n"]}


def test_the_reasons_the_lost_stream_had_not_appended_yet_are_recomputed_once(spark, tmp_path) -> None:
    """The stream appends its batches' reasons once a minute from their ledger entries: batches 1 and 2's were
    still there when the checkpoint was lost. The recovery appends them from the archive, once."""
    config, stream = _setup(spark, tmp_path)
    stream.run(0, W, [0, 1, 2], W + 10_000, not_json=1)
    stream.flush_reasons(0)
    stream.run(1, W + 1_000, [3, 4], W + 11_000, not_json=2)
    stream.run(2, W + 61_000, [5, 6], W + 12_000, not_json=1)
    _lose(config)
    coarse = W // 60_000 * 60_000
    assert _reasons(spark, config) == {(coarse, "not_json"): 1}

    assert lc.recover_lost_batch(spark, config, "lost") == 0  # every batch reached the counts: nothing to correct
    expected = {(coarse, "not_json"): 3, ((W + 61_000) // 60_000 * 60_000, "not_json"): 1}
    assert _reasons(spark, config) == expected
    lc.recover_lost_batch(spark, config, "lost")
    assert _reasons(spark, config) == expected  # a second recovery appends nothing
    assert _counts(spark, config)[(W + 1_000, "invalid")] == 2


# -- a checkpoint restored from an older backup ---------------------------------------------------------------


def _offsets(checkpoint: Path, batch_id: int) -> None:
    folder = checkpoint / "offsets"
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": W, "conf": {}}
    (folder / str(batch_id)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps({TOPIC: {'0': batch_id * 10}})}")


def _commit(checkpoint: Path, batch_id: int) -> None:
    folder = checkpoint / "commits"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def _backup(stream: Stream, planned: int, committed: int, ledger: int) -> Path:
    """Make the checkpoint look like a backup: offsets/0..planned, commits/0..committed, ledger 0..ledger."""
    checkpoint = Path(str(stream.checkpoint))
    for folder in ("offsets", "commits"):
        shutil.rmtree(checkpoint / folder, ignore_errors=True)
    for b in range(planned + 1):
        _offsets(checkpoint, b)
    for b in range(committed + 1):
        _commit(checkpoint, b)
    for entry in (checkpoint / "kdq_ledger").iterdir():
        if entry.name.isdigit() and int(entry.name) > ledger:
            entry.unlink()
    return checkpoint


def test_a_checkpoint_behind_the_tables_is_refused(spark, tmp_path) -> None:
    config, stream = _setup(spark, tmp_path)
    for b in range(4):
        stream.run(b, W + b * 1_000, [b], W + 10_000 + b)
    checkpoint = _backup(stream, planned=1, committed=1, ledger=1)  # the backup: batches 0..1; tables at 3
    with pytest.raises(lc.CheckpointBehindTables) as refused:
        lc.starting_offsets(spark, config, checkpoint)
    message = str(refused.value)
    assert str(checkpoint) in message and stream.app_id in message
    assert "last committed micro-batch is 1" in message and "window_counts at batch 3" in message
    assert "Restore the newest checkpoint" in message and "resume_from_archive" in message


def test_one_batch_ahead_without_its_plan_is_refused(spark, tmp_path) -> None:
    config, stream = _setup(spark, tmp_path)
    for b in range(3):
        stream.run(b, W + b * 1_000, [b], W + 10_000 + b)
    checkpoint = _backup(stream, planned=1, committed=1, ledger=1)  # tables at 2; offsets/2 not in the backup
    with pytest.raises(lc.CheckpointBehindTables, match="raw_archive at batch 2"):
        lc.starting_offsets(spark, config, checkpoint)


def test_a_batch_in_flight_is_the_normal_crash_and_starts(spark, tmp_path) -> None:
    config, stream = _setup(spark, tmp_path)
    for b in range(3):
        stream.run(b, W + b * 1_000, [b], W + 10_000 + b)
    # Crashed between the writes of batch 2 and its commit: offsets/2 and its ledger entry exist.
    checkpoint = _backup(stream, planned=2, committed=1, ledger=2)
    assert lc.starting_offsets(spark, config, checkpoint) is None
    # Archive landed alone (the MERGE not yet): the same.
    stream.plan(3, W + 3_000, [3], W + 10_003)
    stream.archive(3)
    checkpoint = _backup(stream, planned=3, committed=2, ledger=3)
    assert lc.starting_offsets(spark, config, checkpoint) is None


def test_an_up_to_date_checkpoint_starts(spark, tmp_path) -> None:
    config, stream = _setup(spark, tmp_path)
    for b in range(2):
        stream.run(b, W + b * 1_000, [b], W + 10_000 + b)
    checkpoint = _backup(stream, planned=1, committed=1, ledger=1)
    assert lc.starting_offsets(spark, config, checkpoint) is None


def test_an_archive_append_before_its_ledger_entry_is_a_batch_in_flight(spark, tmp_path) -> None:
    """The speed layer's first write is the archive append; its ledger entry follows. A crash in between leaves
    the archive one batch ahead with no ledger entry: the replay completes it, so the start is not refused."""
    config, stream = _setup(spark, tmp_path)
    for b in range(2):
        stream.run(b, W + b * 1_000, [b], W + 10_000 + b)
    stream.plan(2, W + 2_000, [2], W + 10_002)
    stream.archive(2)
    checkpoint = _backup(stream, planned=2, committed=1, ledger=1)  # no ledger entry for batch 2
    assert lc.starting_offsets(spark, config, checkpoint) is None
    # Its MERGE without its ledger entry cannot come from the speed layer: refused as before.
    stream.merge(2)
    with pytest.raises(lc.CheckpointBehindTables, match="window_counts at batch 2"):
        lc.starting_offsets(spark, config, checkpoint)


def test_a_cut_beside_an_archive_append_without_its_ledger_entry_leaves_that_batch_out(spark, tmp_path) -> None:
    """A rebuild's cut while batch T+1 is archived but its ledger entry not yet written: batch T+1's rows are
    left out from the time Spark planned it (offsets/T+1), which is at or before their ingest time."""
    from kdq.spark.stream_cut import archive_at, stream_cut

    config, stream = _setup(spark, tmp_path)
    stream.run(0, W, [0, 1], W + 10_000)
    stream.plan(1, W, [2, 3, 4], W + 20_000)
    stream.archive(1)
    checkpoint = _backup(stream, planned=1, committed=0, ledger=0)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": W + 19_000, "conf": {}}
    (checkpoint / "offsets" / "1").write_text(f"v1\n{json.dumps(meta)}\n{json.dumps({TOPIC: {'0': 5}})}")
    cut = stream_cut(spark, config, wait_seconds=5)
    assert cut.last_merged == 0 and cut.excluded_from_ms == W + 19_000
    offsets = sorted(r["offset"] for r in archive_at(spark, config, cut).where(cut.archive_rows()).collect())
    assert offsets == [0, 1]


def test_reconcile_reads_one_cut_of_the_stream(spark, tmp_path) -> None:
    """The chaos run's hourly reconcile failed on correct data: it read the archive after a micro-batch's
    archive append and window_counts before that batch's MERGE (the MERGE follows the append), so every
    window of the batch was a mismatch. It now checks the stored counts against the archive rows they may
    hold (kdq.spark.stream_cut): the in-flight batch is left out until its MERGE lands."""
    from kdq.spark.reconcile import count_mismatches

    config, stream = _setup(spark, tmp_path)
    stream.run(0, W, [0, 1], W + 10_000)
    stream.plan(1, W, [2, 3, 4], W + 20_000)
    stream.archive(1)  # batch 1 in flight: archived, not merged yet
    assert count_mismatches(spark, config, [TOPIC], None, None)[:2] == (0, [])
    stream.merge(1)
    assert _counts(spark, config) == {(W, "valid"): 5}
    assert count_mismatches(spark, config, [TOPIC], None, None)[:2] == (0, [])
