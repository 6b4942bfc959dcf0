"""A rebuild beside the running stream neither doubles nor loses summary states.

The stream MERGEs a micro-batch's summary increments beside its window counts' MERGE (kdq.spark.speed_layer,
``_start_summaries``), so either may land first, and a rebuild sets absolute states. The stream's micro-batches
are played here with the stream's own writers (archive append, window-count MERGE, summaries MERGE under its
checkpoint's app id, ledger entries in its checkpoint), in the orders that race:

* a batch's counts MERGE landed, its summaries MERGE not yet, when the rebuild takes its cut;
* a batch's summaries MERGE landed, its counts MERGE not yet;
* a batch's summaries MERGE lands between the rebuild's read of the stored states and its write.

Expected states are written out by hand: the values 5, 7, 8, 9 (the rebuilt rule makes -1 invalid).
"""

from __future__ import annotations

import json
import time
import types

import pytest

from kdq.rules import load_rules
from kdq.spark import stream_cut as stream_cut_module
from kdq.spark.ledger import SUMMARY_INCREMENTS_KEY
from kdq.spark.rebuild import rebuild
from kdq.spark.stream_cut import StreamAppendsBehind, stream_cut
from kdq.spark.summaries import batch as summaries_batch
from kdq.spark.summaries import merge_increments, read_states, summary_states, summary_values
from kdq.spark.summaries.transforms import state_entry
from kdq.spark.tables import ensure_tables
from tests.conftest import make_config
from tests.unit.test_rebuild_beside_stream import STRICT, TOPIC, W
from tests.unit.test_rebuild_beside_stream import Stream as CountsStream


class Stream(CountsStream):
    """The stream's writes of one micro-batch, split where the races happen, with its summaries MERGE."""

    def __init__(self, spark, config, rules_dir) -> None:
        super().__init__(spark, config, rules_dir)
        self.summaries: dict[int, list[dict]] = {}

    def entry_fields(self, batch_id: int, classified) -> dict:
        """The batch's summary increments, and their number in its ledger entry as the speed layer writes it."""
        values = summary_values(classified.select("topic", "window_start", "valid", "value"), self.config.summaries)
        states = [r.asDict() for r in summary_states(values).collect()]
        self.summaries[batch_id] = [state_entry(r) for r in states if not r["late"]]
        return {SUMMARY_INCREMENTS_KEY: len(self.summaries[batch_id])}

    def merge_counts(self, batch_id: int) -> None:
        self.merge(batch_id)

    def merge_summaries(self, batch_id: int) -> None:
        merge_increments(self.spark, self.config, self.summaries[batch_id], self.app_id, batch_id)

    def whole(self, batch_id: int, amounts: list[int], first_offset: int) -> None:
        self.archive(batch_id, amounts, first_offset)
        self.merge_counts(batch_id)
        self.merge_summaries(batch_id)


def _state(spark, config):
    states = read_states(spark, config, [("amt", TOPIC, W)])
    assert len(states) == 1, states
    return next(iter(states.values()))["state"]


def _assert_values(state, values: list[int]) -> None:
    assert (state.count, state.sum, state.min, state.max) == (len(values), float(sum(values)), min(values), max(values))


def _setup(spark, tmp_path):
    (tmp_path / "rules").mkdir()
    config = make_config(tmp_path / "data", paths={"rules_dir": str(tmp_path / "rules")}).with_summaries(
        [{"name": "amt", "topic": TOPIC, "value": "amount", "window_seconds": 1, "allowed_lateness_seconds": 600}]
    )
    ensure_tables(spark, config)
    return config, Stream(spark, config, tmp_path / "rules")


def _strict_rules(tmp_path):
    (tmp_path / "rules" / f"{TOPIC}.schema.json").write_text(json.dumps(STRICT))  # negative amounts now invalid
    return load_rules(tmp_path / "rules")


def _sleep_once_then(monkeypatch, action) -> list[bool]:
    """The cut's waits run ``action`` the first time (the stream's write landing while the cut waits for it)."""
    done: list[bool] = []

    def sleep(seconds: float) -> None:
        if not done:
            action()
            done.append(True)
        time.sleep(min(seconds, 0.05))

    monkeypatch.setattr(stream_cut_module, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    return done


def test_a_batch_whose_summaries_have_not_landed_is_waited_for(spark, tmp_path, monkeypatch) -> None:
    config, stream = _setup(spark, tmp_path)
    stream.whole(0, [5, -1, 7], 0)
    stream.archive(1, [8, 9], 3)
    stream.merge_counts(1)  # batch 1's summaries MERGE, beside its counts', has not landed yet
    with pytest.raises(StreamAppendsBehind, match="summaries 0"):
        stream_cut(spark, config, wait_seconds=0.5)

    landed = _sleep_once_then(monkeypatch, lambda: stream.merge_summaries(1))
    report = rebuild(spark, config, _strict_rules(tmp_path), W, W + 1_000, [TOPIC], "rb", push=False)
    assert landed and report.ok and report.summaries_corrections == 1
    _assert_values(_state(spark, config), [5, 7, 8, 9])  # without the wait: 8 and 9 twice, or -1 kept


def test_a_batch_whose_summaries_landed_before_its_counts_is_in_the_cut_once_its_counts_are(
    spark, tmp_path, monkeypatch
) -> None:
    config, stream = _setup(spark, tmp_path)
    stream.whole(0, [5, -1, 7], 0)
    stream.archive(1, [8, 9], 3)
    stream.merge_summaries(1)  # batch 1's summaries landed first, its counts' MERGE still runs
    with pytest.raises(StreamAppendsBehind, match="summaries 1"):
        stream_cut(spark, config, wait_seconds=0.5)

    landed = _sleep_once_then(monkeypatch, lambda: stream.merge_counts(1))
    report = rebuild(spark, config, _strict_rules(tmp_path), W, W + 1_000, [TOPIC], "rb", push=False)
    assert landed and report.ok and report.summaries_corrections == 1
    _assert_values(_state(spark, config), [5, 7, 8, 9])


def test_a_summaries_merge_between_the_rebuilds_read_and_write_is_not_lost(spark, tmp_path, monkeypatch) -> None:
    config, stream = _setup(spark, tmp_path)
    stream.whole(0, [5, -1, 7], 0)
    real_merge = summaries_batch.merge_absolute
    raced: list[bool] = []

    def stream_merges_first(*args, **kwargs):
        if not raced:  # the stream's next batch lands after the rebuild read the states, before it writes
            stream.whole(1, [8, 9], 3)
            raced.append(True)
        return real_merge(*args, **kwargs)

    monkeypatch.setattr(summaries_batch, "merge_absolute", stream_merges_first)
    report = rebuild(spark, config, _strict_rules(tmp_path), W, W + 1_000, [TOPIC], "rb", push=False)
    assert raced and report.ok
    _assert_values(_state(spark, config), [5, 7, 8, 9])  # before the compare-and-set: 5, 7 (batch 1's lost)


def test_a_batch_without_summary_increments_is_not_waited_for(spark, tmp_path) -> None:
    config, stream = _setup(spark, tmp_path)
    stream.whole(0, [5, 7], 0)
    stream.archive(1, [3], 2, topic="other")  # no record for the summary: its summaries MERGE never commits
    stream.merge_counts(1)
    cut = stream_cut(spark, config, wait_seconds=0.5)
    assert cut.last_merged == 1 and cut.summaries_version is not None

    # An entry without the field (written without the observed states, or by an older kdq): its topics decide.
    entry = {k: v for k, v in stream.ledger.read(1).items() if k != SUMMARY_INCREMENTS_KEY}
    stream.ledger.delete(1)
    stream.ledger.write(entry)
    assert stream_cut(spark, config, wait_seconds=0.5).last_merged == 1  # "other" has no summary
    stream.ledger.delete(1)
    stream.ledger.write({**entry, "input_rows_by_topic": {"other": 1, TOPIC: 1}})
    with pytest.raises(StreamAppendsBehind):  # a summary topic: its MERGE may still land
        stream_cut(spark, config, wait_seconds=0.5)
