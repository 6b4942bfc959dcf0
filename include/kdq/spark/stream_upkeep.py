"""The speed layer's table upkeep between micro-batches: the work Delta would otherwise do inside a commit.

Three kinds of work used to sit on the micro-batch's path, inside the writer's own commit (benchmarks/PERF_NOTES.md,
"eighteenth pass"):

* the guarded tables' snapshot and txn lookup (Delta 4.4 computes a guarded write's txn version from the table's
  whole state after every commit): ~0.3 s a batch;
* Delta's checkpoint, a post-commit hook of every ``delta.checkpointInterval``-th commit: ~1 s every tenth batch
  of ``window_counts`` and of the archive;
* Delta's auto compaction of the open hour of ``window_counts`` (and ``summaries``), a post-commit hook of the
  commit that brings an hour to ``AUTO_COMPACT_MIN_FILES`` files: ~1 s every tenth batch.

A batch that paid one of them was the slowest of its minute: they made the latency's p99. :class:`StreamUpkeep`
does them on a thread of the stream after each batch instead: the snapshots always (beside the next batch when
there is no pause), the checkpoints and compactions while the stream waits for its next trigger:

* the stream's own session turns auto compaction off (``spark.databricks.delta.autoCompact.enabled``, which wins
  over the table property) and the upkeep compacts the hours the stream's MERGEs wrote once they hold
  ``AUTO_COMPACT_MIN_FILES`` of its files. The next batch's MERGEs wait for a compaction that still runs
  (:meth:`StreamUpkeep.merging`), so the stream never conflicts with itself; a conflict with another writer of
  the hour leaves it for the next upkeep, as auto compaction did. A stream that is never idle (catching up)
  compacts in the batch once an hour holds twice that many;
* the guarded tables have ``delta.checkpointInterval`` = :data:`kdq.tables.STREAM_CHECKPOINT_INTERVAL` (100),
  and the upkeep checkpoints each of them once :data:`CHECKPOINT_EVERY` commits have passed since its last
  checkpoint. Other writers (the batch layer, a rebuild) still checkpoint through the property, when no stream
  runs.

Everything here only reorders work Delta does anyway: no data changes, and a failure is logged and retried at the
next upkeep.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import Counter
from collections.abc import Iterable
from contextlib import contextmanager

from pyspark.sql import SparkSession

from kdq.spark.writers import delta_snapshot, is_conflict, txn_version
from kdq.tables import AUTO_COMPACT_MIN_FILES

log = logging.getLogger("kdq.stream")

# Commits since a guarded table's last checkpoint before the upkeep writes one: Delta's default interval.
CHECKPOINT_EVERY = 10

# The idle time before the next trigger that a compaction or a checkpoint (~1 s each on two cores) needs. With
# less, it waits for a longer pause.
MAINTENANCE_IDLE_MS = 1500

EPOCH = dt.date(1970, 1, 1)
Hour = tuple[str, int]  # (window_date ISO, window_hour): a partition of window_counts and summaries


def window_hours(window_starts_ms: Iterable[int]) -> set[Hour]:
    """The (window_date, window_hour) partitions of windows starting at these epoch milliseconds (UTC)."""
    return {
        ((EPOCH + dt.timedelta(days=ms // 86_400_000)).isoformat(), (ms // 3_600_000) % 24)
        for ms in window_starts_ms
    }


def hours_predicate(hours: Iterable[Hour]) -> str:
    """A partition predicate naming exactly these hours (values from :func:`window_hours`, not user input)."""
    return " OR ".join(
        f"(window_date = DATE'{date}' AND window_hour = {int(hour)})" for date, hour in sorted(set(hours))
    )


class HourFiles:
    """How many files the stream's own MERGEs added to each hour of a window table since it last compacted it
    (one per MERGE that wrote to the hour): a lower bound of the hour's small files, kept in memory (a restart
    starts from zero, so an hour may reach twice the threshold; the maintenance job compacts closed hours)."""

    def __init__(self) -> None:
        self._added: Counter[Hour] = Counter()
        self._lock = threading.Lock()

    def merged(self, hours: Iterable[Hour]) -> None:
        with self._lock:
            self._added.update(set(hours))

    def take(self, at_least: int) -> list[Hour]:
        """The hours with ``at_least`` files added, forgotten until they are given back (:meth:`give_back`)."""
        with self._lock:
            due = sorted(h for h, n in self._added.items() if n >= at_least)
            for hour in due:
                del self._added[hour]
            return due

    def give_back(self, hours: Iterable[Hour], files: int) -> None:
        """A compaction of ``hours`` that did not happen: count their ``files`` again."""
        with self._lock:
            for hour in hours:
                self._added[hour] += files


class StreamUpkeep:
    """The upkeep of the stream's tables: ``spark``, the stream's writer session (its MERGEs' session), looks up
    the txn versions; ``compiled``, a session of the same application that compiles its queries (the stream's
    main one), compacts and checkpoints: an hour of a thousand topics' windows is millions of rows."""

    def __init__(self, spark: SparkSession, compiled: SparkSession, app_id: str, guarded_paths: list[str],
                 window_paths: list[str], min_files: int = AUTO_COMPACT_MIN_FILES) -> None:
        self.spark = spark
        self.compiled = compiled
        self.app_id = app_id
        self.guarded_paths = guarded_paths
        self.window_paths = window_paths
        self.min_files = min_files
        self.hours = {path: HourFiles() for path in window_paths}
        # Held by a compaction and by the stream's MERGEs: they never run at once, so never conflict.
        self._compacting = threading.Lock()

    @contextmanager
    def merging(self):
        """Around the batch's MERGEs into the window tables: waits for a compaction that still runs."""
        with self._compacting:
            yield

    def merged(self, window_starts_ms: Iterable[int]) -> None:
        """After the batch's MERGEs: the hours they wrote a file to."""
        hours = window_hours(window_starts_ms)
        for counter in self.hours.values():
            counter.merged(hours)

    def between_batches(self, idle_ms: int) -> None:
        """The work that fits into ``idle_ms`` before the next trigger (on the upkeep's thread)."""
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", "warm")
        for path in self.guarded_paths:
            try:
                txn_version(self.spark, path, self.app_id)
            except Exception:
                log.debug("preparing the snapshot of %s failed; the next batch computes it", path, exc_info=True)
        if idle_ms < MAINTENANCE_IDLE_MS:
            return
        # One compaction or one checkpoint per pause: the tables commit once a batch each, so their checkpoints
        # come due together, and all of them at once outlast a pause (the next batch then waits for them).
        if self.compact(self.min_files):
            return
        for path in self.guarded_paths:
            if self.checkpoint_if_due(path):
                return

    def in_batch(self) -> None:
        """On the batch's thread, when the stream found no idle time: the hours that hold twice the threshold."""
        self.compact(2 * self.min_files)

    def checkpoint_if_due(self, path: str) -> bool:
        """Checkpoint the table at ``path`` if :data:`CHECKPOINT_EVERY` commits passed since its last checkpoint;
        whether it tried."""
        try:
            snapshot = delta_snapshot(self.compiled, path)
            last = int(snapshot.checkpointProvider().version())
            if int(snapshot.version()) - max(last, 0) < CHECKPOINT_EVERY:
                return False
            jvm = self.compiled._jvm
            jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self.compiled._jsparkSession, path).checkpoint(
                snapshot, jvm.scala.Option.empty())
            return True
        except Exception:
            log.warning("checkpoint of %s failed; the next upkeep tries again", path, exc_info=True)
            return True

    def compact(self, at_least: int) -> bool:
        """Compact the hours of the first window table that has some with ``at_least`` of the stream's files;
        whether it tried."""
        from delta.tables import DeltaTable

        for path in self.window_paths:
            hours = self.hours[path].take(at_least)
            if not hours:
                continue
            try:
                with self._compacting:
                    DeltaTable.forPath(self.compiled, path).optimize().where(hours_predicate(hours)).executeCompaction()
                log.info("compacted %s, hours %s", path, hours)
                return True
            except Exception as exc:  # py4j: Delta's conflicts arrive as generic errors
                self.hours[path].give_back(hours, at_least)
                if is_conflict(exc):
                    log.info("compaction of %s, hours %s, conflicted with another writer; left to the next upkeep",
                             path, hours)
                else:
                    log.warning("compaction of %s, hours %s, failed; left to the next upkeep", path, hours,
                                exc_info=True)
                return True
        return False
