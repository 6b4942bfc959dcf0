"""The writers journal: which batch jobs wrote kdq's tables beside the stream, and whether they waited.

Pure Python (no Spark import). Every Spark batch job that writes a kdq table (:data:`WRITER_APPS`: the hourly
recompute, a rebuild, the maintenance, a backfill, the InfluxDB catch-up, the correction push) runs through
:func:`kdq.jobs.run_main`, which records two lines here per run: one when it starts and one when it ends
(job, its run id and arguments, pid, host, start, end, outcome, whether the stream ran beside it, and what
it waited for). The jobs' waiting code feeds :data:`WAITS`, a process-wide counter object that
``run_main`` resets when the job starts:

* :func:`kdq.spark.writers.retry_on_conflict`: each retry after a Delta conflict or a compare-and-set that
  found its read outdated (``KDQ_STALE_READ``), and the seconds it slept before retrying;
* :func:`kdq.spark.stream_cut.stream_cut`: each cut taken and the seconds it waited for the stream's appends;
* :func:`kdq.spark.rebuild.rebuild`: a start-over from a new cut (a stale read);
* the hourly recompute refusing an interval the stream has not committed (``StreamBehind``) and the
  maintenance skipping the archive retention while the stream is behind (``behind``).

The file is ``<data_dir>/stream/writers.jsonl`` (the stream's state folder, :mod:`kdq.stream.state`), one JSON
object a line, appended under an exclusive ``fcntl`` lock on ``.writers.lock`` beside it and trimmed (under
the same lock, rewritten atomically) to the last :data:`KEEP_MS` and at most :data:`MAX_BYTES`. Readers take
no lock and skip a torn line. ``kdq status`` (:func:`describe`) and the data-quality page
(:func:`summarize`) read it.

Whether the stream ran beside a job comes from the stream's heartbeat: fresh ("running"/"starting", younger
than :data:`FRESH_MS`) when the job started or ended, or written while the job ran. A job whose driver runs on
a remote cluster node (``spark.submit_deploy_mode = cluster``) writes the journal under its config's
``data_dir`` on that node, where ``kdq status`` on the Airflow host does not see it, and it sees that node's
heartbeat file (none, unless the stream runs there): such runs are missing here, or say ``beside: unknown``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kdq.stream.state import HEARTBEAT, WRITERS_JOURNAL, private_tmp, read_json, state_dir

log = logging.getLogger("kdq.writers_journal")

KEEP_MS = 24 * 3600 * 1000  # entries older than a day are trimmed (a run is kept while either line is younger)
MAX_BYTES = 512 * 1024  # at most this much is kept (the newest lines)
FRESH_MS = 120_000  # a heartbeat younger than this says the stream is running (the page's stale_after_s)

# The app names (kdq.jobs.run_main) of the jobs that write kdq's tables or outputs → their journal name.
# reconcile (read-only), the SQL endpoint and the stream itself are not writers of this journal.
WRITER_APPS = {
    "kdq-batch-recompute": "batch_recompute",
    "kdq-rebuild": "rebuild",
    "kdq-maintenance": "maintenance",
    "kdq-archive-from-kafka": "backfill",
    "kdq-influx-catch-up": "influx_catch_up",
    "kdq-push-corrections": "push_corrections",
}


def journal_path(config: Any) -> Path:
    return state_dir(config) / WRITERS_JOURNAL


def _lock_path(config: Any) -> Path:
    return state_dir(config) / f".{WRITERS_JOURNAL.removesuffix('.jsonl')}.lock"


def now_ms() -> int:
    return int(time.time() * 1000)


# -- what the running job waited for ------------------------------------------------------------------------


class WaitCounters:
    """What this process's job waited for (thread-safe: a job may write from several threads)."""

    FIELDS = ("conflict_retries", "stale_read_retries", "retry_wait_seconds", "stream_wait_seconds", "cuts", "behind")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.conflict_retries = 0  # Delta optimistic-concurrency conflicts retried
            self.stale_read_retries = 0  # compare-and-set retries (another writer changed what was read)
            self.retry_wait_seconds = 0.0  # slept before those retries
            self.stream_wait_seconds = 0.0  # waited for the stream's appends (stream_cut)
            self.cuts = 0  # consistent cuts taken (stream_cut)
            self.behind = 0  # refused or skipped because the stream had not committed far enough

    def retried(self, stale_read: bool, slept_seconds: float = 0.0) -> None:
        with self._lock:
            if stale_read:
                self.stale_read_retries += 1
            else:
                self.conflict_retries += 1
            self.retry_wait_seconds += max(0.0, float(slept_seconds))

    def waited_for_stream(self, seconds: float) -> None:
        with self._lock:
            self.stream_wait_seconds += max(0.0, float(seconds))

    def cut(self) -> None:
        with self._lock:
            self.cuts += 1

    def stream_behind(self) -> None:
        with self._lock:
            self.behind += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            out = {name: getattr(self, name) for name in self.FIELDS}
        out["retry_wait_seconds"] = round(out["retry_wait_seconds"], 1)
        out["stream_wait_seconds"] = round(out["stream_wait_seconds"], 1)
        return out


WAITS = WaitCounters()


def waited(waits: Mapping[str, Any]) -> bool:
    """Whether a run waited for another writer: a retry, a refusal or skip because the stream was behind, or
    a wait for the stream's appends (cuts alone are not waits)."""
    return bool(
        int(waits.get("conflict_retries") or 0)
        or int(waits.get("stale_read_retries") or 0)
        or int(waits.get("behind") or 0)
        or float(waits.get("stream_wait_seconds") or 0) >= 0.5
    )


def wait_seconds(waits: Mapping[str, Any]) -> float:
    return float(waits.get("retry_wait_seconds") or 0) + float(waits.get("stream_wait_seconds") or 0)


# -- the stream beside --------------------------------------------------------------------------------------


def stream_beat(config: Any) -> dict | None:
    beat = read_json(state_dir(config) / HEARTBEAT)
    return beat if isinstance(beat, dict) else None


def _fresh(beat: Mapping[str, Any] | None, at_ms: int) -> bool:
    return (
        beat is not None
        and beat.get("state") in ("running", "starting")
        and at_ms - int(beat.get("time_ms") or 0) <= FRESH_MS
    )


def stream_beside(start_beat: Mapping | None, end_beat: Mapping | None, start_ms: int, end_ms: int) -> bool | None:
    """Whether the stream ran while the job did: its heartbeat fresh at the start or the end, or written during
    the run (a "stopped" beat then says it stopped during it). None: no heartbeat at all (never started
    here, or it runs on another machine)."""
    if start_beat is None and end_beat is None:
        return None
    if _fresh(start_beat, start_ms) or _fresh(end_beat, end_ms):
        return True
    return end_beat is not None and int(end_beat.get("time_ms") or 0) >= start_ms


# -- the file -----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(config: Any) -> Iterator[None]:
    folder = state_dir(config)
    folder.mkdir(parents=True, exist_ok=True)
    with open(_lock_path(config), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _entry_ms(entry: Mapping[str, Any]) -> int:
    return int(entry.get("end_ms") or entry.get("start_ms") or 0)


def _parse(lines: Iterable[str]) -> list[dict]:
    entries = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a torn line (a writer killed mid-write)
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def append(config: Any, entry: Mapping[str, Any], now: int | None = None) -> None:
    """Append one entry and trim the file, under the journal's lock."""
    now = now_ms() if now is None else int(now)
    path = journal_path(config)
    line = json.dumps(dict(entry), default=str, separators=(",", ":")) + "\n"
    with _locked(config):
        with open(path, "a", encoding="utf-8") as out:
            out.write(line)
        _trim(path, now)


def _trim(path: Path, now: int) -> None:
    """Keep the runs with a line younger than :data:`KEEP_MS`, then the newest lines within :data:`MAX_BYTES`;
    rewritten atomically (the caller holds the lock) only when something goes."""
    data = path.read_text(encoding="utf-8", errors="replace")
    lines = data.splitlines()
    entries = _parse(lines)
    recent_runs = {e.get("run") for e in entries if _entry_ms(e) >= now - KEEP_MS}
    kept = [json.dumps(e, default=str, separators=(",", ":")) for e in entries if e.get("run") in recent_runs]
    size = 0
    cut = len(kept)
    for i in range(len(kept) - 1, -1, -1):
        size += len(kept[i].encode()) + 1
        if size > MAX_BYTES:
            break
        cut = i
    kept = kept[cut:]
    if len(kept) == len(lines):
        return
    tmp = private_tmp(path)
    tmp.write_text("".join(f"{k}\n" for k in kept), encoding="utf-8")
    os.replace(tmp, path)


def read_entries(config: Any) -> list[dict]:
    """Every entry in the journal, oldest first (no lock: appends are whole lines, trims atomic renames)."""
    try:
        return _parse(journal_path(config).read_text(encoding="utf-8", errors="replace").splitlines())
    except FileNotFoundError:
        return []


# -- one job's run ------------------------------------------------------------------------------------------


def _args_summary(argv: Sequence[str] | None, limit: int = 300) -> str:
    text = " ".join(str(a) for a in argv or ())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class JournalRun:
    """One job's run: :meth:`start` writes its start line (and resets :data:`WAITS`), :meth:`end` its end line.
    Never raises: a journal that cannot be written (a full disk) must not fail the job."""

    def __init__(self, config: Any, job: str, argv: Sequence[str] | None, run_id: str | None = None) -> None:
        self.config = config
        self.start_ms = now_ms()
        self.base = {
            "run": f"{socket.gethostname()}:{os.getpid()}:{self.start_ms}",
            "job": job,
            "run_id": run_id,
            "args": _args_summary(argv),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "start_ms": self.start_ms,
        }
        self.start_beat: dict | None = None

    def _write(self, entry: dict) -> None:
        try:
            append(self.config, entry)
        except OSError as exc:
            log.warning("could not write the writers journal %s: %s", journal_path(self.config), exc)

    def start(self) -> JournalRun:
        WAITS.reset()
        self.start_beat = stream_beat(self.config)
        self._write({**self.base, "phase": "start", "stream_at_start": _fresh(self.start_beat, self.start_ms)})
        return self

    def end(self, ok: bool, error: str | None = None) -> dict:
        end = now_ms()
        end_beat = stream_beat(self.config)
        waits = WAITS.snapshot()
        entry = {
            **self.base,
            "phase": "end",
            "end_ms": end,
            "outcome": "ok" if ok else "failed",
            "error": (error or "").strip().splitlines()[0][:300] if error else None,
            "stream_beside": stream_beside(self.start_beat, end_beat, self.start_ms, end),
            "waits": waits,
            "waited": waited(waits),
        }
        self._write(entry)
        return entry


def start_run(config: Any, app_name: str, argv: Sequence[str] | None, run_id: str | None = None) -> JournalRun | None:
    """The journal run of a writer job (None for a job that is not one: :data:`WRITER_APPS`)."""
    job = WRITER_APPS.get(app_name)
    if job is None:
        return None
    try:
        return JournalRun(config, job, argv, run_id).start()
    except Exception:  # an unreadable state folder must not fail the job
        log.warning("could not start the writers journal's entry of %s", job, exc_info=True)
        return None


def end_run(run: JournalRun | None, ok: bool, error: str | None = None) -> None:
    """:meth:`JournalRun.end`, never raising (the job's own outcome is what its caller reports)."""
    if run is None:
        return
    try:
        run.end(ok, error)
    except Exception:
        log.warning("could not write the writers journal's end of %s", run.base.get("job"), exc_info=True)


# -- reading it back ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriterSummary:
    """One job's runs in the journal's window (``kdq status``'s writers section, the page's table).

    ``runs``: started in the window (``running``: of them, not ended yet and their process alive on this host;
    ``lost``: not ended and not running, e.g. killed); ``beside_stream``: ended runs the stream ran beside;
    ``waited``: ended runs that waited for another writer, ``wait_seconds`` how long in all, and the totals of
    their retries, waits for the stream and refusals/skips because it was behind; ``last_*``: the newest
    ended run."""

    job: str
    runs: int = 0
    running: int = 0
    lost: int = 0
    beside_stream: int = 0
    waited: int = 0
    wait_seconds: float = 0.0
    conflict_retries: int = 0
    stale_read_retries: int = 0
    stream_wait_seconds: float = 0.0
    behind: int = 0
    cuts: int = 0
    last_outcome: str | None = None
    last_end_ms: int | None = None
    last_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _alive(entry: Mapping[str, Any]) -> bool:
    if entry.get("host") != socket.gethostname():
        return True  # cannot tell: another machine's run without an end is taken as running
    pid = int(entry.get("pid") or 0)
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def summarize(entries: Iterable[Mapping[str, Any]], now: int | None = None, window_ms: int = KEEP_MS) -> list[WriterSummary]:
    """Per job (sorted by name), its runs that started or ended in the last ``window_ms``."""
    now = now_ms() if now is None else int(now)
    runs: dict[str, dict] = {}
    for entry in entries:
        key = entry.get("run")
        if key is None:
            continue
        runs.setdefault(key, {}).update(entry)  # the end line holds everything the start line does
    per_job: dict[str, dict[str, Any]] = {}
    for run in sorted(runs.values(), key=lambda r: int(r.get("start_ms") or 0)):
        if max(_entry_ms(run), int(run.get("start_ms") or 0)) < now - window_ms:
            continue
        s = per_job.setdefault(str(run.get("job")), {"runs": 0, "running": 0, "lost": 0, "beside_stream": 0,
                                                      "waited": 0, "wait_seconds": 0.0, "conflict_retries": 0,
                                                      "stale_read_retries": 0, "stream_wait_seconds": 0.0,
                                                      "behind": 0, "cuts": 0})
        s["runs"] += 1
        if run.get("phase") != "end":
            s["running" if _alive(run) else "lost"] += 1
            continue
        waits = run.get("waits") or {}
        s["beside_stream"] += 1 if run.get("stream_beside") else 0
        s["waited"] += 1 if waited(waits) else 0
        s["wait_seconds"] += wait_seconds(waits)
        for name in ("conflict_retries", "stale_read_retries", "behind", "cuts"):
            s[name] += int(waits.get(name) or 0)
        s["stream_wait_seconds"] += float(waits.get("stream_wait_seconds") or 0)
        if s.get("last_end_ms") is None or int(run["end_ms"]) >= s["last_end_ms"]:
            s["last_outcome"], s["last_end_ms"], s["last_error"] = run.get("outcome"), int(run["end_ms"]), run.get("error")
    return [
        WriterSummary(job=job, **{**s, "wait_seconds": round(s["wait_seconds"], 1),
                                  "stream_wait_seconds": round(s["stream_wait_seconds"], 1)})
        for job, s in sorted(per_job.items())
    ]


def _iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def describe(config: Any, now: int | None = None) -> list[str]:
    """The writers lines of ``kdq status``."""
    summaries = summarize(read_entries(config), now)
    if not summaries:
        return [f"{'writers':<10} (last 24 h) no batch job wrote kdq's tables"]
    runs = sum(s.runs for s in summaries)
    beside = sum(s.beside_stream for s in summaries)
    waited_runs = sum(s.waited for s in summaries)
    lines = [
        f"{'writers':<10} (last 24 h) {runs} run(s) of {len(summaries)} job(s); {beside} beside the stream; "
        + (f"{waited_runs} waited for another writer" if waited_runs else "none waited for another writer")
    ]
    for s in summaries:
        open_runs = ", ".join(p for p in (f"{s.running} running" if s.running else "",
                                          f"{s.lost} without an end" if s.lost else "") if p)
        detail = (
            f"waited {s.waited} ({s.wait_seconds:.0f} s: {s.conflict_retries} conflict / "
            f"{s.stale_read_retries} stale-read retries, {s.stream_wait_seconds:.0f} s for the stream, "
            f"{s.behind} behind)"
            if s.waited
            else "waited 0"
        )
        last = f"last {s.last_outcome} at {_iso(s.last_end_ms)}" if s.last_outcome else "no run ended"
        if s.last_outcome == "failed" and s.last_error:
            last += f": {s.last_error[:120]}"
        lines.append(
            f"{'':<10} {s.job:<17} runs {s.runs}{f' ({open_runs})' if open_runs else ''}, "
            f"beside stream {s.beside_stream}, {detail}; {last}"
        )
    return lines
