"""The speed layer's micro-batch ledger: one small JSON file per micro-batch, inside the checkpoint.

Written after batch N's archive append (its first output, which also counts
it) and before its other outputs, it fixes what the rest of N and the batches
after it rely on: the batch's ingest time, the per-topic maximum event times
that lateness is judged against before and after it, its counts, and the hash
of the rules (the classifier document, stored once per hash by
:class:`RulesDocuments`) the batch was classified with. A replay of N whose
archive append landed counts the archived rows (their verdicts, their ingest
time), so nothing of N is ever judged twice; an entry written before the
archive (by an earlier kdq version) still fixes the rules and clock of a
replay. It lives in the checkpoint folder (like Spark's own
offset and commit logs) and goes through Hadoop's FileSystem API, so it works on
local disk, HDFS and object stores alike, at the cost of a few milliseconds per
batch instead of a Delta commit.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The entry's field: how many summary groups the batch adds increments to (its summaries' MERGE commits only when
# there is one). A cut of the stream (kdq.spark.stream_cut) waits for that MERGE only when it is non-zero.
SUMMARY_INCREMENTS_KEY = "summary_increments"


class MicroBatchLedger:
    def __init__(self, spark: SparkSession, checkpoint: str, keep: int = 500, directory: str = "kdq_ledger") -> None:
        jvm = spark._jvm
        self._jvm = jvm
        self._dir = jvm.org.apache.hadoop.fs.Path(f"{checkpoint.rstrip('/')}/{directory}")
        self._fs = self._dir.getFileSystem(spark._jsc.hadoopConfiguration())
        self._fs.mkdirs(self._dir)
        self._keep = keep
        self._floor: int | None = None  # entries after it are never trimmed (keep_after)
        self._cache: dict[int, dict] = {}

    def _path(self, batch_id: int):
        return self._jvm.org.apache.hadoop.fs.Path(self._dir, str(batch_id))

    def _batch_ids(self) -> list[int]:
        names = [status.getPath().getName() for status in self._fs.listStatus(self._dir)]
        return sorted(int(n) for n in names if n.isdigit())

    def read(self, batch_id: int) -> dict | None:
        if batch_id in self._cache:
            return self._cache[batch_id]
        path = self._path(batch_id)
        if not self._fs.exists(path):
            return None
        stream = self._fs.open(path)
        try:
            text = self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
        entry = json.loads(text)
        self._cache[batch_id] = entry
        return entry

    def latest_before(self, batch_id: int) -> dict | None:
        earlier = [b for b in self._cache if b < batch_id]
        if earlier and max(earlier) == batch_id - 1:
            return self._cache[batch_id - 1]
        candidates = [b for b in self._batch_ids() if b < batch_id]
        return self.read(candidates[-1]) if candidates else None

    def write(self, entry: dict) -> None:
        """Atomic: write a temporary file, then rename (never a half-written ledger entry)."""
        batch_id = int(entry["batch_id"])
        final = self._path(batch_id)
        tmp = self._jvm.org.apache.hadoop.fs.Path(self._dir, f".{batch_id}.tmp")
        out = self._fs.create(tmp, True)
        try:
            out.write(bytearray(json.dumps(entry, sort_keys=True).encode()))
        finally:
            out.close()
        if not self._fs.rename(tmp, final):
            self._fs.delete(tmp, False)
            if not self._fs.exists(final):
                raise OSError(f"could not write ledger entry {final}")
        self._cache = {b: e for b, e in self._cache.items() if b >= batch_id - 2}
        self._cache[batch_id] = entry
        if batch_id % 100 == 0:
            for old in self._batch_ids()[: -self._keep]:
                if self._floor is None or old <= self._floor:
                    self._fs.delete(self._path(old), False)

    def keep_after(self, batch_id: int) -> None:
        """Never trim the entries after ``batch_id``: their reasons are not in ``invalid_reasons`` yet
        (:mod:`kdq.spark.reasons_flush`)."""
        self._floor = batch_id

    def delete(self, batch_id: int) -> None:
        """Remove an entry (write never replaces an existing one: a Hadoop rename onto it fails)."""
        self._fs.delete(self._path(batch_id), False)
        self._cache.pop(batch_id, None)

    def entries(self) -> list[dict]:
        return [e for e in (self.read(b) for b in self._batch_ids()) if e is not None]


class RulesDocuments:
    """The classifier documents batches were classified with, once per hash: ``<checkpoint>/kdq_rules/<sha256>.json``.

    The speed layer stores the current document before it writes a batch's ledger entry naming its hash, so a
    replay of that batch after a rule change finds the rules its first attempt used. Same atomic Hadoop-FS files
    as the ledger (local disk, HDFS, s3a://). Documents are small and change only with the rules: none is deleted.
    """

    def __init__(self, spark: SparkSession, checkpoint: str, directory: str = "kdq_rules") -> None:
        jvm = spark._jvm
        self._jvm = jvm
        self._dir = jvm.org.apache.hadoop.fs.Path(f"{checkpoint.rstrip('/')}/{directory}")
        self._fs = self._dir.getFileSystem(spark._jsc.hadoopConfiguration())
        self._stored: set[str] = set()

    def _path(self, sha256: str):
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ValueError(f"not a sha256 hex digest: {sha256!r}")
        return self._jvm.org.apache.hadoop.fs.Path(self._dir, f"{sha256}.json")

    def put(self, sha256: str, text: str) -> None:
        """Store ``text`` under its hash unless it is there already (atomic: temporary file, then rename)."""
        if sha256 in self._stored:
            return
        final = self._path(sha256)
        if not self._fs.exists(final):
            self._fs.mkdirs(self._dir)
            tmp = self._jvm.org.apache.hadoop.fs.Path(self._dir, f".{sha256}.{uuid.uuid4().hex}.tmp")
            out = self._fs.create(tmp, True)
            try:
                out.write(bytearray(text.encode("utf-8")))
            finally:
                out.close()
            if not self._fs.rename(tmp, final):
                self._fs.delete(tmp, False)
                if not self._fs.exists(final):  # else another writer stored the same document first
                    raise OSError(f"could not store the rules document {final}")
        self._stored.add(sha256)

    def get(self, sha256: str) -> str | None:
        path = self._path(sha256)
        if not self._fs.exists(path):
            return None
        stream = self._fs.open(path)
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()
