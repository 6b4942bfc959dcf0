"""Ordered pushes: an older absolute count never replaces a newer one on the metrics topic or in InfluxDB.

Every pushed count carries its **order**: the ``window_counts`` Delta table version it was read at (Delta
versions only grow, and a value read at version ``V`` holds every commit up to ``V``). InfluxDB points of
counts get the integer field :data:`VERSION_FIELD`, metrics-topic messages the header
:data:`VERSION_HEADER` (decimal text). Pure Python, no Spark: the readers are passed in.

Writers (the stream after each micro-batch, the hourly ``push_corrections``, a rebuild's push, the
InfluxDB catch-up) run in different processes at the same time. InfluxDB 1.x keeps the last write of a
point and has no conditional write; a compacted topic keeps the last message of a key. So the order of
the writes must follow the order of the versions. Two rules make it so:

1. **One push at a time** (:func:`push_lock`): every push writes while holding an exclusive ``fcntl`` lock
   on ``<data_dir>/stream/.push.lock`` (the folder of the stream's state, which every kdq process of a
   deployment shares). A **batch push** reads the counts it sends at the table's *latest* version while
   holding the lock, so its values are at least as new as anything written before it, and it records that
   version in ``push_order.json`` (:class:`PushClock`). The **stream** reads back its changed windows
   before taking the lock (its hot path) and, holding it, compares its version with the clock: when a
   batch push of a newer version ran in between, it reads again at the latest version before writing.
   Hence, among kdq writers, every write holds a version at least as new as every earlier write.
2. **A batch push checks InfluxDB** (:func:`stored_versions`, 1.x): points whose stored
   :data:`VERSION_FIELD` is newer than the version read are not written (``influx_skipped``). This covers
   a writer that does not share the lock (another host with its own state folder, an older kdq).
   Residual race, for such a writer only: a newer write landing between this check and the write
   (milliseconds: one HTTP request) is replaced; the next push of that window (the stream's next update
   of it, or the next catch-up) repairs it. Writers that share the lock have no such race.

Consumers of the metrics topic keep, per key, the value with the highest :data:`VERSION_HEADER` (a message
without the header is older than any with one); the rules above make the log's last message per key the
newest too, so compaction converges to it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kdq.config import Config
from kdq.stream.state import atomic_write_json, read_json, state_dir

log = logging.getLogger(__name__)

VERSION_FIELD = "kdq_version"  # InfluxDB: the window_counts version a count point's values were read at
VERSION_HEADER = "kdq-version"  # metrics topic: the same, as a message header (decimal text)
PUSH_LOCK = ".push.lock"
PUSH_ORDER = "push_order.json"  # {"batch_version": the newest version a batch push has sent}

Window = tuple[str, int]  # (topic, window_start_ms)


@dataclass
class PushClock:
    """The newest ``window_counts`` version a batch push has sent (-1: none); read and advanced under the lock."""

    path: Any
    batch_version: int

    def advance(self, version: int) -> None:
        if version > self.batch_version:
            self.batch_version = int(version)
            atomic_write_json(self.path, {"batch_version": self.batch_version})


@contextlib.contextmanager
def push_lock(config: Config) -> Iterator[PushClock]:
    """Hold the deployment's push lock (blocking) and yield the push clock."""
    folder = state_dir(config)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / PUSH_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            state = read_json(folder / PUSH_ORDER) or {}
            yield PushClock(folder / PUSH_ORDER, int(state.get("batch_version", -1)))
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def version_headers(version: int) -> list[tuple[str, bytes]]:
    return [(VERSION_HEADER, str(int(version)).encode())]


def header_version(headers: Sequence[tuple[str, bytes | None]] | None) -> int:
    """A metrics message's order (-1 without the header): what a consumer compares to keep the newest value."""
    for name, value in headers or ():
        if name == VERSION_HEADER and value is not None:
            return int(value.decode() if isinstance(value, bytes) else value)
    return -1


def _quote_identifier(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def stored_versions(config: Config, windows: Iterable[Window]) -> dict[Window, int]:
    """The :data:`VERSION_FIELD` InfluxDB holds per wanted window (absent: no point, or one written without it).

    InfluxDB 1.x only (one query per 50 topics, each over the span of its wanted windows); 2.x/3.x: ``{}``
    (no check; the lock still orders kdq's own writers). A query that fails raises: a push that cannot check
    must not write blind (the caller records it for the catch-up).
    """
    import requests

    settings = config.influxdb
    wanted: dict[str, set[int]] = {}
    for topic, ms in windows:
        wanted.setdefault(topic, set()).add(int(ms))
    if settings.version != 1 or not wanted:
        return {}
    found: dict[Window, int] = {}
    topics = sorted(wanted)
    auth = (settings.username, settings.password) if settings.username else None
    for start in range(0, len(topics), 50):
        part = topics[start : start + 50]
        query = ";".join(
            f"SELECT {_quote_identifier(VERSION_FIELD)} FROM {_quote_identifier(t)} "
            f"WHERE time >= {min(wanted[t])}ms AND time <= {max(wanted[t])}ms"
            for t in part
        )
        params = {"db": settings.database, "q": query, "epoch": "ms"}
        if settings.retention_policy:
            params["rp"] = settings.retention_policy
        response = requests.get(
            f"{config.influx_url().rstrip('/')}/query", params=params, auth=auth, timeout=settings.timeout_seconds
        )
        response.raise_for_status()
        for topic, result in zip(part, response.json().get("results", []), strict=False):
            if "error" in result:
                raise RuntimeError(f"InfluxDB query of {VERSION_FIELD} for {topic!r} failed: {result['error']}")
            for series in result.get("series", []):
                for time_ms, version in series.get("values", []):
                    if version is not None and int(time_ms) in wanted[topic]:
                        found[(topic, int(time_ms))] = int(version)
    return found


def not_older(rows: Sequence[Mapping], version: int, stored: Mapping[Window, int]) -> tuple[list[Mapping], int]:
    """The rows (topic, window_start_ms, ...) whose stored version is not newer than ``version``; and how
    many were left out."""
    keep = [r for r in rows if stored.get((r["topic"], int(r["window_start_ms"])), -1) <= version]
    return keep, len(rows) - len(keep)


def versioned_count_points(rows: Iterable[Mapping], version: int) -> list:
    """:func:`kdq.influx.count_points` with the order field."""
    from kdq.influx import Point, count_points

    return [Point(p.measurement, p.time_ms, {**p.fields, VERSION_FIELD: int(version)}, p.tags) for p in count_points(rows)]


# A reader of current counts: windows -> (the window_counts version read at, one row per window with
# topic, window_start_ms, valid, invalid; a status without a row reads 0).
CountsReader = Callable[[Sequence[Window]], tuple[int, list[dict]]]


def push_ordered(
    config: Config,
    read: CountsReader,
    windows: Iterable[Window],
    metric_keys: Iterable[tuple[str, int, str]] = (),
    producer: Any = None,
    influx: bool = True,
) -> dict[str, Any]:
    """A batch push: holding the push lock, read the windows' counts at the latest version, send the metrics
    keys (topic, window_start_ms, status) with the version header, and write to InfluxDB every window whose
    stored version is not newer (:func:`stored_versions`). An InfluxDB failure is returned (``influx_ok``
    False, ``influx_error``), a metrics-topic failure raises.
    """
    from kdq.influx import InfluxSink
    from kdq.metrics_topic import produce_counts

    wanted = sorted({(t, int(ms)) for t, ms in windows})
    keys = sorted(set(metric_keys))
    result: dict[str, Any] = {"metrics_sent": 0, "influx_points": 0, "influx_skipped": 0, "influx_ok": True}
    if not wanted:
        return result
    with push_lock(config) as clock:
        version, values = read(wanted)
        result["version"] = version
        clock.advance(version)  # before writing: a stream that read older and writes after us reads again
        if keys:
            by_window = {(r["topic"], int(r["window_start_ms"])): r for r in values}
            rows = [{"topic": t, "window_start_ms": ms, "status": s, "count": by_window[(t, ms)][s]} for t, ms, s in keys]
            result["metrics_sent"] = produce_counts(config, rows, producer=producer, version=version)
        if influx and config.influxdb.enabled:
            try:
                keep, skipped = not_older(values, version, stored_versions(config, wanted))
                result["influx_skipped"] = skipped
                if skipped:
                    log.warning("%d InfluxDB points hold a newer version than %d: left as they are", skipped, version)
                result["influx_points"] = InfluxSink(config).write(versioned_count_points(keep, version))
            except Exception as exc:  # InfluxWriteError, a failed check, or a config error naming the missing URL
                log.error("InfluxDB push of %d windows (version %d) failed: %s", len(values), version, exc)
                result["influx_ok"] = False
                result["influx_error"] = str(exc)[:500]
    return result


def stream_push_version(clock: PushClock, read_version: int) -> bool:
    """Whether the stream, holding the lock, must read its windows again before writing: a batch push of a
    newer version than the one it read ran since its read."""
    return clock.batch_version > read_version
