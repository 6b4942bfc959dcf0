"""Pure measurement logic (no Kafka, no Spark): percentiles, throughput from progress records,
commit times from a Delta log, and a sampler of a process tree's CPU and memory."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between ranks (numpy's default); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = math.ceil(rank)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo))


def weighted_percentiles(pairs: Sequence[tuple[float, int]], qs: Sequence[float]) -> dict[float, float]:
    """Nearest-rank percentiles of values given with their counts: (value, count) pairs."""
    ordered = sorted(p for p in pairs if p[1] > 0)
    total = sum(n for _, n in ordered)
    result: dict[float, float] = {}
    if not total:
        return result
    for q in qs:
        rank = max(1, math.ceil(q / 100.0 * total))
        seen = 0
        for value, n in ordered:
            seen += n
            if seen >= rank:
                result[q] = float(value)
                break
    return result


def rate(count: float, seconds: float) -> float | None:
    return count / seconds if seconds > 0 else None


def record_ms(record: Mapping[str, Any]) -> int | None:
    """A progress record's trigger time (Spark's ISO-8601 ``timestamp``), epoch millis."""
    text = record.get("timestamp")
    if not text:
        return None
    try:
        return int(datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


def write_results(folder: Path, name: str, result: Mapping[str, Any], md: str) -> None:
    """``<name>.json`` (the figures, first: a report that fails to render must not lose a run) and ``<name>.md``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (folder / f"{name}.md").write_text(md)
    print(f"written: {folder}/{name}.json, {name}.md")


def iso_ms(text: str) -> int:
    """Spark's progress timestamp (``2024-05-01T10:00:00.123Z``) → epoch millis."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


@dataclass(frozen=True)
class CatchUp:
    """Throughput of a backlog from the first to the last micro-batch that read it."""

    rows: int
    batches: int
    seconds: float
    steady_rows: int
    steady_seconds: float
    first_batch_seconds: float

    @property
    def msgs_per_s(self) -> float | None:
        return rate(self.rows, self.seconds)

    @property
    def steady_msgs_per_s(self) -> float | None:
        return rate(self.steady_rows, self.steady_seconds)


def catch_up(progress: Iterable[dict], backlog: int) -> CatchUp | None:
    """From StreamingQueryProgress records (kdq's progress.jsonl): the batches until ``backlog`` rows were read.

    Time runs from the first non-empty batch's trigger start to the end of the
    batch that read the last backlog row: JVM start-up and the idle triggers
    before the data are excluded, every batch's fixed cost is included.
    ``steady`` leaves out the first batch (code generation, JIT warm-up).
    """
    batches = [p for p in progress if p.get("input_rows")]
    batches.sort(key=lambda p: p["batch_id"])
    taken, rows = [], 0
    for p in batches:
        taken.append(p)
        rows += int(p["input_rows"])
        if rows >= backlog:
            break
    if not taken or rows < backlog:
        return None

    def start(p: dict) -> float:
        return iso_ms(p["timestamp"]) / 1000.0

    def end(p: dict) -> float:
        return start(p) + int(p["duration_ms"].get("triggerExecution", 0)) / 1000.0

    first, last = taken[0], taken[-1]
    steady = taken[1:]
    return CatchUp(
        rows=rows,
        batches=len(taken),
        seconds=end(last) - start(first),
        steady_rows=sum(int(p["input_rows"]) for p in steady),
        steady_seconds=(end(last) - start(steady[0])) if steady else 0.0,
        first_batch_seconds=end(first) - start(first),
    )


def mean_breakdown(progress: Iterable[dict], skip_first: bool = True) -> dict[str, float]:
    """Average writer_ms per step over non-empty batches (the first one, JIT warm-up, left out when asked)."""
    batches = sorted((p for p in progress if p.get("input_rows") and p.get("writer_ms")), key=lambda p: p["batch_id"])
    if skip_first and len(batches) > 1:
        batches = batches[1:]
    totals: dict[str, float] = {}
    for p in batches:
        for step, ms in p["writer_ms"].items():
            totals[step] = totals.get(step, 0.0) + ms
    return {step: round(ms / len(batches), 1) for step, ms in totals.items()} if batches else {}


def commit_times(delta_log: Path, app_id: str) -> dict[int, float]:
    """txnVersion → time (epoch seconds, the commit file's mtime) of each commit ``app_id`` made to a Delta table.

    A commit file appears atomically when the commit succeeds, so its mtime is
    the moment readers can see the new version: the window count is visible.
    """
    found: dict[int, float] = {}
    for path in sorted(delta_log.glob("*.json")):
        for line in path.read_text().splitlines():
            action = json.loads(line)
            txn = action.get("txn")
            if txn and txn.get("appId") == app_id:
                found[int(txn["version"])] = path.stat().st_mtime
    return found


@dataclass
class TreeStats:
    peak_rss: int = 0
    samples: int = 0
    peak_parts: dict[str, int] = field(default_factory=dict)  # RSS by process name at the peak


@dataclass
class ProcessSampler:
    """Samples RSS (sum over a process and its descendants) in a thread; CPU seconds on demand."""

    pid: int
    interval: float = 0.25
    stats: TreeStats = field(default_factory=TreeStats)
    _last_cpu: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _tree(self) -> list[psutil.Process]:
        """The root and its descendants, without forks that have not exec'd (yet).

        A JVM runs helpers (``df``, ``chmod``, ...) by fork + exec; until the
        exec, the child is a copy of the JVM (same executable, named after the
        forking thread) whose RSS is the JVM's own shared pages: counting it
        would double the JVM. A child with its parent's executable and command
        line is such a copy and is skipped.
        """
        try:
            root = psutil.Process(self.pid)
            tree = [root]
            ids = {root.pid: _identity(root)}
            for child in root.children(recursive=True):
                ident = ids[child.pid] = _identity(child)
                if ident is not None and ident == ids.get(child.ppid()):
                    continue
                tree.append(child)
            return tree
        except psutil.Error:
            return []

    def sample(self) -> int:
        rss = 0
        cpu = 0.0
        parts: dict[str, int] = {}
        for i, proc in enumerate(self._tree()):
            try:
                with proc.oneshot():
                    mem = proc.memory_info().rss
                    rss += mem
                    name = proc.name()
                    parts[name] = parts.get(name, 0) + mem
                    times = proc.cpu_times()
                    cpu += times.user + times.system
                    if i == 0:
                        # Children that exited and were reaped are in the root's children_* times.
                        cpu += times.children_user + times.children_system
            except psutil.Error:
                continue
        self._last_cpu = max(cpu, self._last_cpu)
        self.stats.samples += 1
        if rss > self.stats.peak_rss:
            self.stats.peak_rss = rss
            self.stats.peak_parts = parts
        return rss

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) of the root, its reaped children and its live descendants."""
        self.sample()
        return self._last_cpu

    def reset_peak(self) -> None:
        self.stats.peak_rss = 0

    def start(self) -> ProcessSampler:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                self.sample()

        self._thread = threading.Thread(target=loop, name=f"sampler-{self.pid}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def _identity(proc: psutil.Process) -> tuple | None:
    try:
        return (proc.exe(), tuple(proc.cmdline()))
    except psutil.Error:
        return None


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (all cores), for the share left to other processes."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0)


def now() -> float:
    return time.monotonic()
