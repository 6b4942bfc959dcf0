"""Whether the stream has finished every micro-batch ingested before an instant.

The hourly recompute and the archive retention wait for it. A micro-batch that started before the hour's
end and is still classifying has no ledger entry yet: judged by the latest ledger entry alone, the stream
looked caught up, the interval's recompute and reconcile missed that batch's late rows, and the next
interval's filter never selected them. Spark's offset log names the batch (``offsets/<N>``, written
before kdq's code runs) and its trigger time, a lower bound of its ingest time.
"""

from __future__ import annotations

import json
from pathlib import Path

from kdq.stream.checkpoint_offsets import finished_batches_before

END = 1_700_003_600_000  # the interval's end
BEFORE, AFTER = END - 2_000, END + 2_000


def _offsets(checkpoint: Path, batch_id: int, trigger_ms: int) -> None:
    folder = checkpoint / "offsets"
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": trigger_ms, "conf": {}}
    (folder / str(batch_id)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps({'t': {'0': batch_id * 10}})}")


def _commit(checkpoint: Path, batch_id: int) -> None:
    folder = checkpoint / "commits"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def _ledger(checkpoint: Path, batch_id: int, ingest_ms: int) -> None:
    folder = checkpoint / "kdq_ledger"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(batch_id)).write_text(json.dumps({"batch_id": batch_id, "ingest_time_ms": ingest_ms}))


def _committed_batches(checkpoint: Path, count: int, ingest_ms: int) -> None:
    for b in range(count):
        _offsets(checkpoint, b, ingest_ms - 100)
        _ledger(checkpoint, b, ingest_ms)
        _commit(checkpoint, b)


def test_no_stream_ran(tmp_path: Path) -> None:
    assert finished_batches_before(tmp_path / "cp", END) is None


def test_a_batch_still_classifying_before_the_end_is_not_caught_up(tmp_path: Path) -> None:
    cp = tmp_path / "cp"
    _committed_batches(cp, 3, BEFORE - 10_000)
    _offsets(cp, 3, BEFORE)  # planned before the end, no ledger entry yet: still classifying
    assert finished_batches_before(cp, END) is False


def test_a_batch_in_flight_planned_after_the_end_does_not_hold_the_interval(tmp_path: Path) -> None:
    cp = tmp_path / "cp"
    _committed_batches(cp, 3, BEFORE - 10_000)
    _offsets(cp, 3, AFTER)
    assert finished_batches_before(cp, END) is True


def test_the_ledger_decides_once_written(tmp_path: Path) -> None:
    cp = tmp_path / "cp"
    _committed_batches(cp, 2, BEFORE - 10_000)
    _offsets(cp, 2, BEFORE - 500)
    _ledger(cp, 2, BEFORE)  # a replayed batch keeps its original ingest time
    assert finished_batches_before(cp, END) is False
    _commit(cp, 2)
    assert finished_batches_before(cp, END) is True


def test_every_batch_committed_is_caught_up_even_before_the_end(tmp_path: Path) -> None:
    cp = tmp_path / "cp"
    _committed_batches(cp, 2, BEFORE - 10_000)
    # Nothing in flight: a manual run over the current hour counts what is there now (the scheduled run
    # after the hour's end counts the rest), as before.
    assert finished_batches_before(cp, END) is True


def test_the_batch_layer_waits_for_a_batch_still_classifying(spark, tmp_path: Path) -> None:
    """The check the hourly recompute and the retention call (before the fix: True, from the ledger alone)."""
    from kdq.spark import batch_layer
    from kdq.stream.checkpoint_offsets import speed_layer_checkpoint
    from tests.conftest import make_config

    config = make_config(tmp_path)
    cp = Path(speed_layer_checkpoint(config))
    _committed_batches(cp, 3, 1_000)
    _offsets(cp, 3, 2_000)  # planned an hour before the end asked about, still classifying
    assert batch_layer.stream_caught_up(spark, config, 3_600_000) is False
    _ledger(cp, 3, 2_500)
    _commit(cp, 3)
    assert batch_layer.stream_caught_up(spark, config, 3_600_000) is True
