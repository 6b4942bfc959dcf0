"""The speed layer's Kafka offsets, read from its Spark checkpoint (pure Python: no Spark, no Kafka).

The checkpoint is a location string (a local path or a URI: :mod:`kdq.storage`), read through
:func:`kdq.storage.files_for`.

Spark writes ``offsets/<N>`` (the end offsets of micro-batch N) before the
batch runs and ``commits/<N>`` after it succeeded; ``sources/0/0`` holds the
query's initial offsets. Batch N reads [offsets of N-1 (or the initial ones),
offsets of N). What the stream has *passed* is the end offsets of its last
committed batch: every record below them is archived and counted, and a
record at or above them will be, by the stream itself.

Whether the stream has finished every micro-batch ingested before an instant
(:func:`finished_batches_before`) is read from the same logs, plus kdq's batch
ledger (``kdq_ledger/<N>``, the batch's fixed ingest time).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kdq import storage
from kdq.config import Config
from kdq.storage import Location

EARLIEST = -2  # a partition the previous batch did not know: the stream starts it at its earliest offset


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int  # inclusive; EARLIEST = the partition's earliest offset
    end: int  # exclusive


def speed_layer_checkpoint(config: Config) -> str:
    return storage.checkpoint_location(config, "speed_layer")


def source_offsets(path: Location) -> dict[str, dict[str, int]]:
    """The Kafka source's offsets in one file of the offset log (or sources/0/0): {topic: {partition: offset}}."""
    lines = storage.files_for(path).read_bytes(path).decode("utf-8").lstrip("\x00").splitlines()
    for line in reversed(lines):
        if line.startswith("{") and "batchWatermarkMs" not in line:
            return {topic: {p: int(o) for p, o in parts.items()} for topic, parts in json.loads(line).items()}
    raise ValueError(f"{path}: no Kafka offsets in it")


def batch_ids(folder: Location) -> list[int]:
    """The numbered entries of a checkpoint log folder (offsets, commits), sorted; [] when it does not exist."""
    return sorted(int(name) for name in storage.files_for(folder).names(folder) if name.isdigit())


def batch_offset_ranges(checkpoint: Location, batch_id: int) -> list[OffsetRange]:
    """The offset ranges micro-batch ``batch_id`` reads (partitions with nothing to read left out)."""
    end = source_offsets(storage.join(checkpoint, "offsets", batch_id))
    if batch_id > 0:
        start = source_offsets(storage.join(checkpoint, "offsets", batch_id - 1))
    else:
        start = source_offsets(storage.join(checkpoint, "sources", 0, 0))
    ranges = []
    for topic, parts in sorted(end.items()):
        for partition, stop in sorted(parts.items(), key=lambda kv: int(kv[0])):
            begin = start.get(topic, {}).get(partition, EARLIEST)
            if begin == EARLIEST or begin < stop:
                ranges.append(OffsetRange(topic, int(partition), begin, stop))
    return ranges


def passed_offsets(checkpoint: Location) -> dict[tuple[str, int], int]:
    """(topic, partition) → the end offset of the stream's last committed micro-batch ({} before the first)."""
    committed = batch_ids(storage.join(checkpoint, "commits"))
    if not committed:
        return {}
    ends = source_offsets(storage.join(checkpoint, "offsets", committed[-1]))
    return {(topic, int(p)): offset for topic, parts in ends.items() for p, offset in parts.items()}


def batch_timestamp_ms(path: Location) -> int | None:
    """The trigger time Spark recorded in one file of the offset log (``batchTimestampMs``), None if absent."""
    lines = storage.files_for(path).read_bytes(path).decode("utf-8").lstrip("\x00").splitlines()
    for line in lines:
        if line.startswith("{") and "batchTimestampMs" in line:
            return int(json.loads(line)["batchTimestampMs"])
    return None


def _ledger_ingest_ms(checkpoint: Location, batch_id: int) -> int | None:
    path = storage.join(checkpoint, "kdq_ledger", batch_id)
    try:
        return int(json.loads(storage.files_for(path).read_bytes(path))["ingest_time_ms"])
    except FileNotFoundError:
        return None


def finished_batches_before(checkpoint: Location, end_ms: int) -> bool | None:
    """Whether every micro-batch whose ingest time is before ``end_ms`` has committed (None: no stream ran).

    A batch's rows become visible in the archive when it commits, which can be long after its ingest time
    (a slow batch, or one that crashed and is replayed with its original ingest time). Spark writes
    ``offsets/<N>`` when it plans batch N, before kdq's code runs, and batches run one after the other, so
    only the last planned batch can be open. Its ingest time is the ledger's once written; before that (the
    batch is still classifying) it is at least the trigger time in ``offsets/<N>``: kdq fixes the ingest
    time after Spark planned the batch, and a replay keeps the ledger's or takes a later clock. With every
    planned batch committed the stream has nothing in flight: true, also for an ``end_ms`` still ahead (a
    manual run over the current hour counts what is there now; the scheduled run after the hour's end
    counts the rest).
    """
    planned = batch_ids(storage.join(checkpoint, "offsets"))
    if not planned:
        return None
    last = planned[-1]
    if last in batch_ids(storage.join(checkpoint, "commits")):
        return True
    ingest = _ledger_ingest_ms(checkpoint, last)
    if ingest is None:
        ingest = batch_timestamp_ms(storage.join(checkpoint, "offsets", last))
    return ingest is not None and ingest >= end_ms
