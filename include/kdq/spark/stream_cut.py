"""What of the stream's work an absolute write of ``window_counts`` may count: a consistent cut.

The stream adds per-window *increments* (a MERGE per micro-batch, guarded by its checkpoint's app id and
the batch id) and appends the batch's records to the raw archive and its reasons to ``invalid_reasons``
beside it, as separate commits. A job that sets *absolute* counts from the archive (a rebuild, the hourly
recompute) while the stream runs must count exactly the records the stored counts already hold. Two races
break that (they once lost 820 records under ``make run``):

* a micro-batch whose archive rows the job counts but whose MERGE lands after the job's write adds its
  increments on top of an absolute count that already had them: counted twice;
* a micro-batch whose MERGE lands between the job's read of the stored counts and its write is
  overwritten: lost.

The cut takes the stored counts at one ``window_counts`` version ``V`` and, from the Delta log of that
version, the last micro-batch ``T`` whose MERGE it holds (the stream's txn version). The archive is read at a
version that holds every batch up to ``T`` (waiting briefly for the stream's append, which runs beside its
MERGE); the reasons at the version read, plus the reasons of the batches up to ``T`` the stream has not
appended yet, from their ledger entries (it appends them once a minute: :mod:`kdq.spark.reasons_flush`). The
rows of the stream's later batches are left out: stream-counted rows
ingested at or after the ingest time of batch ``T + 1`` (from the micro-batch ledger, or the time Spark planned it
while only its archive append has landed; ingest times grow with batch ids, and an older checkpoint's batches
all predate this one's). The first race is gone by
construction. The second is caught at the write: :func:`kdq.spark.batch_layer._merge_absolute` checks that
each stored count is still the one read (a compare-and-set inside the MERGE) and the job starts over.

With summaries configured the cut also fixes a ``summaries`` version holding the stream's summary increments of
exactly the batches up to ``T``. The stream MERGEs them beside its window counts' MERGE, so either may land
first: the cut waits for batch ``T``'s (when its ledger entry says it has any), and takes the counts again when
batch ``T + 1``'s landed first. A summaries rebuild reads the stored states at that version, leaves out every
stream row of the later batches (counted for the window counts or not: a record too late for its 1-second
window may still be in time for its summary's), and writes with the same compare-and-set
(:func:`kdq.spark.summaries.store.merge_absolute`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq import storage
from kdq.config import Config
from kdq.spark.ledger import SUMMARY_INCREMENTS_KEY
from kdq.spark.reasons_flush import REASONS_KEY, pending_reason_rows
from kdq.spark.tables import table_path
from kdq.spark.writers import delta_snapshot, stream_reason_frame
from kdq.stream.checkpoint_offsets import batch_timestamp_ms, speed_layer_checkpoint
from kdq.tables import INVALID_REASONS, RAW_ARCHIVE, SUMMARIES, WINDOW_COUNTS
from kdq.writers_journal import WAITS

log = logging.getLogger("kdq.batch")


class StreamAppendsBehind(RuntimeError):
    """The stream's archive (or reasons) append of a batch whose MERGE landed did not land in time."""


@dataclass(frozen=True)
class StreamCut:
    """Versions to read and the stream rows to leave out (see the module doc).

    ``app_id``: the stream checkpoint's app id (None: no stream has run here, nothing to leave out);
    ``counts_version``: the ``window_counts`` version the stored counts are read at; ``last_merged``: the
    stream's last batch held by it (-1: none); ``archive_version`` / ``reasons_version``: the versions the
    archive and ``invalid_reasons`` are read at; ``excluded_from_ms``: the ingest time of batch
    ``last_merged + 1`` when those versions hold rows of it or later batches (None: they hold none).
    """

    app_id: str | None
    counts_version: int
    last_merged: int
    archive_version: int
    reasons_version: int
    excluded_from_ms: int | None
    # The reasons of batches up to last_merged not in invalid_reasons yet (ledger rows; not logged: one per window).
    pending_reasons: tuple[dict, ...] = field(default=(), repr=False)
    # The summaries version holding the stream's summary increments of exactly the batches up to last_merged
    # (None: no summaries configured).
    summaries_version: int | None = None

    def archive_rows(self) -> Column:
        """Archive rows the stored counts may hold: all but the stream-counted rows of later batches."""
        if self.excluded_from_ms is None:
            return F.lit(True)
        later = (
            (F.coalesce(F.col("source"), F.lit("")) == "stream")
            & F.col("counted")
            & (F.col("ingest_time") >= F.timestamp_millis(F.lit(self.excluded_from_ms)))
        )
        return ~later

    def summary_rows(self) -> Column:
        """Archive rows the stored summaries at ``summaries_version`` may hold: all but the stream's rows of later
        batches, whether the window counts counted them or not (a later batch's summaries MERGE adds those it is
        in time for; the hourly recompute the others)."""
        if self.excluded_from_ms is None:
            return F.lit(True)
        later = (F.coalesce(F.col("source"), F.lit("")) == "stream") & (
            F.col("ingest_time") >= F.timestamp_millis(F.lit(self.excluded_from_ms))
        )
        return ~later

    def reason_rows(self) -> Column:
        """``invalid_reasons`` rows the cut holds: adjustments (no batch id) and the stream's batches up to
        ``last_merged`` (a stream row's ``updated_at`` is taken after its batch's ingest time)."""
        if self.excluded_from_ms is None:
            return F.lit(True)
        return F.col("batch_id").isNull() | (F.col("batch_id") < 0) | (
            F.col("updated_at") < F.timestamp_millis(F.lit(self.excluded_from_ms))
        )


def _stream_app_id(config: Config) -> str | None:
    path = storage.join(speed_layer_checkpoint(config), "kdq_app_id")
    try:
        return storage.files_for(path).read_bytes(path).decode().strip() or None
    except FileNotFoundError:
        return None


def _txn(snapshot, app_id: str | None) -> int:
    if app_id is None:
        return -1
    version = snapshot.transactions().get(app_id)
    return int(version.get()) if version.isDefined() else -1


def _ledger_entry(config: Config, batch_id: int) -> dict | None:
    path = storage.join(speed_layer_checkpoint(config), "kdq_ledger", batch_id)
    try:
        return json.loads(storage.files_for(path).read_bytes(path))
    except FileNotFoundError:
        return None


def _ingest_bound_ms(config: Config, batch_id: int) -> int:
    """A time at or before batch ``batch_id``'s ingest time and after every earlier batch's: its ingest time from
    the ledger, or, while its archive append has landed but its ledger entry is not written yet (the speed
    layer's order), the trigger time Spark recorded when it planned the batch (after the previous batch
    committed, before kdq fixed this one's ingest time)."""
    entry = _ledger_entry(config, batch_id)
    if entry is not None:
        return int(entry["ingest_time_ms"])
    path = storage.join(speed_layer_checkpoint(config), "offsets", batch_id)
    try:
        planned = batch_timestamp_ms(path)
    except FileNotFoundError:
        planned = None
    if planned is None:  # its rows landed, so it was planned: the checkpoint was trimmed or lost
        raise StreamAppendsBehind(f"the stream's checkpoint has no entry for micro-batch {batch_id}, whose rows landed")
    return planned


def _pending_reasons(config: Config, flushed: int, last_merged: int) -> list[dict] | None:
    """The reasons of batches ``(flushed, last_merged]`` from their ledger entries, or None while one of them has
    none there (an entry of a kdq version that appended each batch's reasons itself, still appending)."""
    entries = []
    for batch_id in range(flushed + 1, last_merged + 1):
        entry = _ledger_entry(config, batch_id)
        if entry is None or REASONS_KEY not in entry:
            # A batch with no counted invalid record appended no reasons in that version: nothing pending.
            if entry is not None and int(entry.get("invalid_rows", 1)) == 0:
                continue
            return None
        entries.append(entry)
    return pending_reason_rows(entries)


def _summaries_hold(config: Config, summaries, app_id: str | None, last_merged: int) -> bool | None:
    """Whether the ``summaries`` snapshot holds the stream's summary increments of exactly the batches up to
    ``last_merged``: True; False while batch ``last_merged``'s MERGE (beside its counts') has not landed; None when
    a later batch's has. Earlier batches' landed: a batch starts after the previous one's summaries finished."""
    held = _txn(summaries, app_id)
    if held > last_merged:
        return None
    if app_id is None or held == last_merged:
        return True
    entry = _ledger_entry(config, last_merged)
    if entry is None:
        return False
    if SUMMARY_INCREMENTS_KEY in entry:
        return int(entry[SUMMARY_INCREMENTS_KEY]) == 0
    # An entry written without the observed states (a replay that counted its archived rows), or by an older kdq:
    # nothing to wait for when none of its topics has a summary; else its MERGE may still land.
    topics = entry.get("input_rows_by_topic")
    return topics is not None and not any(s.matches(t) for s in config.summaries for t in topics)


def stream_cut(spark: SparkSession, config: Config, wait_seconds: float = 120.0) -> StreamCut:
    """The cut as of now (reads three or four Delta logs and a few ledger entries); waits up to
    ``wait_seconds`` for the stream's appends (and summaries) of its last merged batch, else
    :class:`StreamAppendsBehind`."""
    app_id = _stream_app_id(config)
    counts = delta_snapshot(spark, table_path(config, WINDOW_COUNTS))
    last_merged = _txn(counts, app_id)
    waiting_since = time.monotonic()
    deadline = waiting_since + wait_seconds
    WAITS.cut()
    summaries = None
    while True:
        archive = delta_snapshot(spark, table_path(config, RAW_ARCHIVE))
        reasons = delta_snapshot(spark, table_path(config, INVALID_REASONS))
        archived, reasoned = _txn(archive, app_id), _txn(reasons, app_id)
        pending = [] if app_id is None or reasoned >= last_merged else _pending_reasons(config, reasoned, last_merged)
        held: bool | None = True
        if config.summaries:
            summaries = delta_snapshot(spark, table_path(config, SUMMARIES))
            held = _summaries_hold(config, summaries, app_id, last_merged)
        if archived >= last_merged and pending is not None and held:
            break
        if time.monotonic() > deadline:
            WAITS.waited_for_stream(time.monotonic() - waiting_since)
            raise StreamAppendsBehind(
                f"the stream's micro-batch {last_merged} is in window_counts but its appends have not landed "
                f"after {wait_seconds:.0f}s (archive holds batch {archived}, invalid_reasons {reasoned}"
                + ("" if summaries is None else f", summaries {_txn(summaries, app_id)}") + "); retry later"
            )
        if held is None:  # the next batch's summaries landed before its counts' MERGE: take the counts again
            counts = delta_snapshot(spark, table_path(config, WINDOW_COUNTS))
            last_merged = _txn(counts, app_id)
            time.sleep(0.2)
            continue
        time.sleep(1.0)
    if time.monotonic() - waiting_since >= 1.0:  # it waited for the stream's appends (the writers journal)
        WAITS.waited_for_stream(time.monotonic() - waiting_since)
    newest = max(archived, reasoned)
    excluded = _ingest_bound_ms(config, last_merged + 1) if app_id is not None and newest > last_merged else None
    cut = StreamCut(
        app_id=app_id,
        counts_version=int(counts.version()),
        last_merged=last_merged,
        archive_version=int(archive.version()),
        reasons_version=int(reasons.version()),
        excluded_from_ms=excluded,
        pending_reasons=tuple(pending),
        summaries_version=None if summaries is None else int(summaries.version()),
    )
    log.info("stream cut: %s (%d pending reason rows)", cut, len(cut.pending_reasons))
    return cut


def read_at(spark: SparkSession, config: Config, spec, version: int) -> DataFrame:
    return spark.read.format("delta").option("versionAsOf", int(version)).load(table_path(config, spec))


def archive_at(spark: SparkSession, config: Config, cut: StreamCut) -> DataFrame:
    """The archive rows the cut's stored counts may hold."""
    return read_at(spark, config, RAW_ARCHIVE, cut.archive_version).where(cut.archive_rows())


def counts_at(spark: SparkSession, config: Config, cut: StreamCut) -> DataFrame:
    """``window_counts`` as the cut read it."""
    return read_at(spark, config, WINDOW_COUNTS, cut.counts_version)


def reasons_at(spark: SparkSession, config: Config, cut: StreamCut) -> DataFrame:
    """``invalid_reasons`` rows the cut holds: the table's at the cut's version and the stream's pending ones."""
    stored = read_at(spark, config, INVALID_REASONS, cut.reasons_version).where(cut.reason_rows())
    if not cut.pending_reasons:
        return stored
    pending = stream_reason_frame(spark, cut.pending_reasons)
    return stored.unionByName(pending, allowMissingColumns=True)
