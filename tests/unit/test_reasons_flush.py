"""The stream's once-a-minute append of the invalid reasons its micro-batches keep in their ledger entries
(kdq.spark.reasons_flush): which rows, when, and which batches a flush covers."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdq.spark import reasons_flush
from kdq.spark.reasons_flush import REASONS_KEY, ReasonsFlush, pending_reason_rows
from tests.conftest import make_config


def entry(batch_id: int, reasons: list[tuple[str, int, str, int]] | None) -> dict:
    e = {"batch_id": batch_id, "ingest_time_ms": 1_000_000 + batch_id * 1000}
    if reasons is not None:
        e[REASONS_KEY] = [{"topic": t, "window_start_ms": w, "reason": r, "count": n} for t, w, r, n in reasons]
    return e


def test_each_entrys_increments_carry_its_batch_and_ingest_time() -> None:
    rows = pending_reason_rows([
        entry(3, [("orders", 60_000, "schema:/a", 2), ("pay", 0, "not_json", 1)]),
        entry(4, []),
        entry(5, None),  # written by a version that appended each batch's reasons itself
        entry(6, [("orders", 60_000, "schema:/a", 1)]),
    ])
    assert rows == [
        {"topic": "orders", "window_start_ms": 60_000, "reason": "schema:/a", "count": 2, "batch_id": 3, "ingest_time_ms": 1_003_000},
        {"topic": "pay", "window_start_ms": 0, "reason": "not_json", "count": 1, "batch_id": 3, "ingest_time_ms": 1_003_000},
        {"topic": "orders", "window_start_ms": 60_000, "reason": "schema:/a", "count": 1, "batch_id": 6, "ingest_time_ms": 1_006_000},
    ]


class FakeLedger:
    def __init__(self, entries: dict[int, dict]) -> None:
        self.entries = entries
        self.floor: int | None = None

    def read(self, batch_id: int) -> dict | None:
        return self.entries.get(batch_id)

    def keep_after(self, batch_id: int) -> None:
        self.floor = batch_id


class FakeTable:
    """invalid_reasons as the flush sees it: its txn version for the app id and the appended rows."""

    def __init__(self, version: int = -1) -> None:
        self.version = version
        self.appends: list[tuple[int, list[dict]]] = []

    def txn_version(self, _spark, _path: str, _app_id: str) -> int:
        return self.version

    def append(self, _spark, _config, rows, _app_id: str, version: int) -> None:
        if version <= self.version:  # Delta's idempotent write skips it
            return
        self.appends.append((version, list(rows)))
        self.version = version


@pytest.fixture
def table(monkeypatch) -> FakeTable:
    fake = FakeTable()
    monkeypatch.setattr(reasons_flush, "txn_version", fake.txn_version)
    monkeypatch.setattr(reasons_flush, "append_stream_reason_rows", fake.append)
    return fake


def test_a_flush_appends_the_batches_since_the_last_one_once(tmp_path: Path, table: FakeTable) -> None:
    now = [0.0]
    config = make_config(tmp_path, stream={"reasons_flush_seconds": 60})
    ledger = FakeLedger({b: entry(b, [("orders", 0, "not_json", b + 1)]) for b in range(8)})
    flush = ReasonsFlush(None, config, "kdq-stream-x", ledger, clock=lambda: now[0])
    assert not flush.due()
    now[0] = 60.0
    assert flush.due()
    assert flush.flush(4) == 5  # batches 0..4
    assert not flush.due()  # the minute starts again
    assert [v for v, _ in table.appends] == [4]
    assert sorted(r["batch_id"] for r in table.appends[0][1]) == [0, 1, 2, 3, 4]
    assert ledger.floor == 4  # the ledger may trim up to the flushed batch, never after it
    assert flush.flush(4) == 0  # a replay of batch 4: nothing new
    assert flush.flush(7) == 3  # 5..7
    assert [sorted(r["batch_id"] for r in rows) for _, rows in table.appends] == [[0, 1, 2, 3, 4], [5, 6, 7]]


def test_a_flush_reads_how_far_the_table_is_at_every_flush(tmp_path: Path, table: FakeTable) -> None:
    """A driver fenced out of the checkpoint may have flushed after this one started: never append its batches
    again."""
    config = make_config(tmp_path)
    ledger = FakeLedger({b: entry(b, [("orders", 0, "not_json", 1)]) for b in range(10)})
    flush = ReasonsFlush(None, config, "kdq-stream-x", ledger)
    assert flush.flushed() == -1
    table.version = 6  # the other driver's flush landed
    assert flush.flush(9) == 3
    assert sorted(r["batch_id"] for r in table.appends[0][1]) == [7, 8, 9]


def test_missing_or_old_entries_add_nothing_and_an_empty_flush_still_records_how_far(tmp_path: Path, table: FakeTable) -> None:
    config = make_config(tmp_path)
    ledger = FakeLedger({2: entry(2, None), 3: entry(3, [])})  # 0 and 1 trimmed by an older kdq version
    flush = ReasonsFlush(None, config, "kdq-stream-x", ledger)
    assert flush.flush(3) == 0
    assert table.appends == [(3, [])]  # the commit records the flushed batch: the cut and the trim floor read it


def test_every_batch_when_the_interval_is_zero(tmp_path: Path, table: FakeTable) -> None:
    config = make_config(tmp_path, stream={"reasons_flush_seconds": 0})
    flush = ReasonsFlush(None, config, "kdq-stream-x", FakeLedger({}), clock=lambda: 5.0)
    assert flush.due()


def test_the_ledger_never_trims_an_entry_whose_reasons_are_not_appended(spark, tmp_path: Path) -> None:
    from kdq.spark.ledger import MicroBatchLedger

    ledger = MicroBatchLedger(spark, str(tmp_path / "checkpoint"), keep=3)
    ledger.keep_after(40)  # batches 41.. wait for the next flush
    for batch_id in range(101):  # the ledger trims at every hundredth batch
        ledger.write(entry(batch_id, []))
    assert [e["batch_id"] for e in ledger.entries()] == list(range(41, 101))
    ledger.keep_after(150)
    for batch_id in range(101, 201):
        ledger.write(entry(batch_id, []))
    assert [e["batch_id"] for e in ledger.entries()] == list(range(151, 201))
