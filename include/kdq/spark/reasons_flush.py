"""The speed layer's invalid reasons, appended once a minute instead of once per micro-batch.

A micro-batch's reason increments are written into its ledger entry (``reason_increments``), which the batch
writes anyway, before its MERGE. Once ``stream.reasons_flush_seconds`` have passed since the last flush (at the
next batch, or within 5 s while none runs, so a topic gone quiet still gets its last reasons) and when the
stream stops gracefully, the entries after the table's last flushed batch ``f`` up to the newest
batch ``N`` are appended to ``invalid_reasons`` in one commit guarded by (the stream's app id, ``N``): one row per
(batch, topic, coarse window, reason) with the batch's id and its ingest time as ``updated_at``.

Why: every guarded Delta write costs a reconstruction of the table's snapshot state (the txn check), and the
per-batch append beside the MERGE made a small batch about a quarter longer (benchmarks/PERF_NOTES.md, "Issue 24,
seventh pass").

Exactly once: a replayed flush finds the table's txn version at ``N`` or later and is skipped by Delta; a crash
before a flush leaves entries ``(f, N]`` in the ledger, which keeps every entry after ``f``
(:class:`kdq.spark.ledger.MicroBatchLedger`'s floor), for the next flush. The rows carry their batch's ingest
time, so the stream cut (:mod:`kdq.spark.stream_cut`) tells the batches up to ``T`` from later ones exactly as
before, and it reads the unflushed entries ``(f, T]`` from the ledger instead of waiting for them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping

from pyspark.sql import SparkSession

from kdq.config import Config
from kdq.spark.ledger import MicroBatchLedger
from kdq.spark.tables import table_path
from kdq.spark.writers import append_stream_reason_rows, txn_version
from kdq.tables import INVALID_REASONS

log = logging.getLogger("kdq.stream")

REASONS_KEY = "reason_increments"  # the ledger entry's field: [{topic, window_start_ms, reason, count}]
# After a flush is due it waits for the next micro-batch's MERGE or, while none runs, the stream loop's next look
# (every 5 s): a margin of a few batches.
FLUSH_DELAY_MARGIN_SECONDS = 30


def reasons_lag_seconds(stream) -> int:
    """How long after its counts the stream's reasons may reach ``invalid_reasons`` (``stream``: StreamConfig)."""
    return math.ceil(stream.reasons_flush_seconds) + FLUSH_DELAY_MARGIN_SECONDS if stream.reasons_flush_seconds else 0


def pending_reason_rows(entries: Iterable[Mapping]) -> list[dict]:
    """The rows a flush appends for these ledger entries: each entry's increments with its batch id and ingest
    time (``ingest_time_ms``). Entries without increments (no invalid record) add none."""
    rows: list[dict] = []
    for entry in entries:
        for r in entry.get(REASONS_KEY) or ():
            rows.append({
                "topic": r["topic"], "window_start_ms": int(r["window_start_ms"]), "reason": r["reason"],
                "count": int(r["count"]), "batch_id": int(entry["batch_id"]), "ingest_time_ms": int(entry["ingest_time_ms"]),
            })
    return rows


class ReasonsFlush:
    """When and what the stream appends to ``invalid_reasons`` (see the module doc). One per speed layer; called
    on a batch's writer thread (``due``, then ``flush`` beside its MERGE, before its commit), from the stream's
    loop while no batch runs, and at a graceful stop."""

    def __init__(self, spark: SparkSession, config: Config, app_id: str, ledger: MicroBatchLedger,
                 clock=time.monotonic) -> None:
        self.spark = spark
        self.config = config
        self.app_id = app_id
        self.ledger = ledger
        self._clock = clock
        self._path = table_path(config, INVALID_REASONS)
        self._last = clock()
        # The batch's thread and the idle stream's loop both flush: one at a time, each from the table's own txn
        # version, so two never append the same batches.
        self._lock = threading.Lock()

    def flushed(self) -> int:
        """The last batch whose reasons are in the table (-1: none), read from its Delta log at every flush (once
        a minute), never kept: a driver fenced out of this checkpoint may have flushed after this one started."""
        flushed = txn_version(self.spark, self._path, self.app_id)
        self.ledger.keep_after(flushed)
        return flushed

    def due(self) -> bool:
        return self._clock() - self._last >= self.config.stream.reasons_flush_seconds

    def flush(self, newest: int) -> int:
        """Append the reasons of batches ``(flushed, newest]`` from their ledger entries, guarded by ``newest``
        (a commit even when they have none, so the table's txn version says how far the ledger is flushed);
        returns how many rows were appended."""
        with self._lock:
            return self._flush(newest)

    def _flush(self, newest: int) -> int:
        first = self.flushed() + 1
        self._last = self._clock()
        if newest < first:
            return 0
        entries = []
        for batch_id in range(first, newest + 1):
            entry = self.ledger.read(batch_id)
            # None: trimmed by a kdq version that appended each batch's reasons itself (the ledger keeps every
            # entry after the flushed one since); an entry without increments is that version's too.
            if entry is not None:
                entries.append(entry)
        rows = pending_reason_rows(entries)
        append_stream_reason_rows(self.spark, self.config, rows, self.app_id, newest)
        self.ledger.keep_after(newest)
        log.info("reasons of micro-batches %d..%d appended (%d rows)", first, newest, len(rows))
        return len(rows)
