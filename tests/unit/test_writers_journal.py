"""The writers journal: which batch jobs wrote beside the stream in the last day, and their waits."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import time
from pathlib import Path

import pytest

from kdq import writers_journal as wj
from kdq.job_reports import MaintenanceReport
from kdq.quality_health import stream_health, writers_json
from kdq.quality_html import render_page
from kdq.quality_page import PageRange, build_model
from kdq.stream.state import atomic_write_json, state_dir
from tests.conftest import make_config

HOUR = 3600 * 1000


def _entry(run: str, job: str, start: int, end: int | None = None, **extra) -> dict:
    base = {"run": run, "job": job, "pid": 1, "host": "elsewhere", "start_ms": start}
    if end is None:
        return {**base, "phase": "start", **extra}
    return {**base, "phase": "end", "end_ms": end, **extra}


def _append_many(data_dir: str, tag: str, n: int) -> None:
    config = make_config(Path(data_dir))
    for i in range(n):
        wj.append(config, {"run": f"{tag}-{i}", "job": tag, "start_ms": wj.now_ms(), "phase": "start", "pad": "x" * 300})


def test_two_processes_append_concurrently_without_losing_or_tearing_a_line(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=_append_many, args=(str(tmp_path), tag, 150)) for tag in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    config = make_config(tmp_path)
    lines = wj.journal_path(config).read_text().splitlines()
    assert len(lines) == 300
    entries = [json.loads(line) for line in lines]  # every line whole
    assert sorted(e["run"] for e in entries) == sorted(f"{t}-{i}" for t in "ab" for i in range(150))


def test_trimming_keeps_the_last_day_and_the_size_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_config(tmp_path)
    now = 100 * 24 * HOUR
    old_start = now - 30 * HOUR
    wj.append(config, _entry("old", "rebuild", old_start), now=old_start)
    wj.append(config, _entry("old", "rebuild", old_start, old_start + HOUR, outcome="ok"), now=old_start + HOUR)
    # started more than a day ago, ended within it: the run is kept whole
    wj.append(config, _entry("long", "rebuild", now - 25 * HOUR), now=now - 25 * HOUR)
    wj.append(config, _entry("long", "rebuild", now - 25 * HOUR, now - 2 * HOUR, outcome="ok"), now=now - 2 * HOUR)
    wj.append(config, _entry("new", "maintenance", now - HOUR), now=now)
    assert [(e["run"], e["phase"]) for e in wj.read_entries(config)] == [
        ("long", "start"), ("long", "end"), ("new", "start")
    ]
    monkeypatch.setattr(wj, "MAX_BYTES", 2000)
    for i in range(50):
        wj.append(config, _entry(f"r{i}", "backfill", now, pad="y" * 100), now=now)
    assert wj.journal_path(config).stat().st_size <= 2000
    runs = [e["run"] for e in wj.read_entries(config)]
    assert runs[-1] == "r49" and "long" not in runs  # the newest lines stay


def test_a_torn_line_is_skipped(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    wj.append(config, _entry("a", "rebuild", wj.now_ms()))
    with open(wj.journal_path(config), "a") as out:
        out.write('{"run": "torn", "jo')
    assert [e["run"] for e in wj.read_entries(config)] == ["a"]


def test_summary_per_job_beside_the_stream_and_waits() -> None:
    now = 100 * 24 * HOUR
    host = socket.gethostname()
    waits = {"conflict_retries": 2, "stale_read_retries": 1, "retry_wait_seconds": 6.0, "stream_wait_seconds": 3.0,
             "cuts": 2, "behind": 0}
    entries = [
        _entry("r1", "rebuild", now - 3 * HOUR),
        _entry("r1", "rebuild", now - 3 * HOUR, now - 2 * HOUR, outcome="ok", stream_beside=True, waits=waits),
        _entry("r2", "rebuild", now - HOUR),
        _entry("r2", "rebuild", now - HOUR, now - HOUR + 60_000, outcome="failed", error="boom",
               stream_beside=True, waits={"cuts": 1}),
        _entry("m1", "maintenance", now - 5 * HOUR),
        _entry("m1", "maintenance", now - 5 * HOUR, now - 5 * HOUR + 1000, outcome="ok", stream_beside=False,
               waits={"behind": 1}),
        _entry("old", "backfill", now - 30 * HOUR),
        _entry("old", "backfill", now - 30 * HOUR, now - 29 * HOUR, outcome="ok"),
        {**_entry("gone", "batch_recompute", now - HOUR), "host": host, "pid": 2**22 + 12345},  # killed: no end
        {**_entry("live", "batch_recompute", now - 60_000), "host": host, "pid": os.getpid()},
    ]
    by_job = {s.job: s for s in wj.summarize(entries, now)}
    assert set(by_job) == {"rebuild", "maintenance", "batch_recompute"}  # the backfill is older than a day
    rebuild = by_job["rebuild"]
    assert (rebuild.runs, rebuild.beside_stream, rebuild.waited) == (2, 2, 1)
    assert (rebuild.conflict_retries, rebuild.stale_read_retries, rebuild.wait_seconds, rebuild.cuts) == (2, 1, 9.0, 3)
    assert (rebuild.last_outcome, rebuild.last_error, rebuild.last_end_ms) == ("failed", "boom", now - HOUR + 60_000)
    maintenance = by_job["maintenance"]
    assert (maintenance.beside_stream, maintenance.waited, maintenance.behind) == (0, 1, 1)
    recompute = by_job["batch_recompute"]
    assert (recompute.runs, recompute.running, recompute.lost, recompute.last_outcome) == (2, 1, 1, None)


def test_stream_beside_from_the_heartbeat() -> None:
    start, end = 1_000_000, 2_000_000
    running_at_start = {"state": "running", "time_ms": start - 5000}
    assert wj.stream_beside(running_at_start, running_at_start, start, end) is True
    assert wj.stream_beside(None, None, start, end) is None  # no heartbeat here at all
    stopped_before = {"state": "stopped", "time_ms": start - 10_000}
    assert wj.stream_beside(stopped_before, stopped_before, start, end) is False
    # started during the job and killed before its end: its last beat was written while the job ran
    assert wj.stream_beside(stopped_before, {"state": "running", "time_ms": start + 500_000}, start, end) is True


def test_retry_on_conflict_feeds_the_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    from kdq.spark import writers

    monkeypatch.setattr(writers.time, "sleep", lambda s: None)
    wj.WAITS.reset()
    failures = iter(
        [RuntimeError("io.delta.exceptions.ConcurrentAppendException: files were added"),
         RuntimeError("[USER_RAISED_EXCEPTION] KDQ_STALE_READ window changed"),
         RuntimeError("DELTA_CONCURRENT_WRITE")]
    )

    def conflicting() -> str:
        error = next(failures, None)
        if error is not None:
            raise error
        return "done"

    assert writers.retry_on_conflict(conflicting, "test write", attempts=5) == "done"
    waits = wj.WAITS.snapshot()
    assert (waits["conflict_retries"], waits["stale_read_retries"]) == (2, 1)
    assert waits["retry_wait_seconds"] == 2.0 + 4.0 + 6.0  # the pauses it would have slept
    assert wj.waited(waits)
    wj.WAITS.reset()
    with pytest.raises(ValueError):  # not a conflict: raised at once, nothing counted
        writers.retry_on_conflict(lambda: (_ for _ in ()).throw(ValueError("bad")), "test write")
    assert not wj.waited(wj.WAITS.snapshot())


def test_run_main_journals_a_writer_job_with_its_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kdq import jobs
    from kdq.spark import session

    config = make_config(tmp_path)
    monkeypatch.setattr(jobs, "load_config", lambda path=None: config)

    class FakeSpark:
        def stop(self) -> None:
            pass

    monkeypatch.setattr(session, "build_session", lambda config, app_name: FakeSpark())
    atomic_write_json(state_dir(config) / "heartbeat.json", {"state": "running", "pid": 1, "time_ms": wj.now_ms()})
    wj.WAITS.retried(stale_read=False, slept_seconds=50)  # a previous job's count: reset at the start

    def parse(argv):
        return argparse.Namespace(config=None, run_id="scheduled__2026-01-01T00:00:00")

    def run(spark, config, args) -> MaintenanceReport:
        wj.WAITS.stream_behind()
        return MaintenanceReport(today="2026-01-01", steps=1, results={})

    assert jobs.run_main(["--today", "2026-01-01"], parse, run, app_name="kdq-maintenance") == 0

    def boom(spark, config, args):
        wj.WAITS.retried(stale_read=True, slept_seconds=2)
        raise RuntimeError("conflict after 5 attempts")

    with pytest.raises(RuntimeError):
        jobs.run_main([], parse, boom, app_name="kdq-rebuild")
    assert jobs.run_main([], parse, run, app_name="kdq-reconcile") == 0  # read-only: not journaled

    entries = wj.read_entries(config)
    assert [(e["job"], e["phase"]) for e in entries] == [
        ("maintenance", "start"), ("maintenance", "end"), ("rebuild", "start"), ("rebuild", "end")
    ]
    end = entries[1]
    assert end["outcome"] == "ok" and end["stream_beside"] is True and end["run_id"].startswith("scheduled__")
    assert end["args"] == "--today 2026-01-01" and end["pid"] == os.getpid() and end["host"] == socket.gethostname()
    assert end["waits"]["behind"] == 1 and end["waits"]["conflict_retries"] == 0 and end["waited"] is True
    failed = entries[3]
    assert failed["outcome"] == "failed" and "conflict after 5 attempts" in failed["error"]
    assert failed["waits"]["stale_read_retries"] == 1 and failed["waits"]["behind"] == 0


def test_kdq_status_prints_the_writers_section(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(tmp_path)
    assert wj.describe(config) == [f"{'writers':<10} (last 24 h) no batch job wrote kdq's tables"]
    now = wj.now_ms()
    wj.append(config, _entry("r1", "rebuild", now - HOUR))
    wj.append(config, _entry("r1", "rebuild", now - HOUR, now - HOUR + 90_000, outcome="ok", stream_beside=True,
                             waits={"conflict_retries": 1, "retry_wait_seconds": 2.0, "stream_wait_seconds": 4.0,
                                    "cuts": 2}))
    wj.append(config, _entry("m1", "maintenance", now - 2 * HOUR))
    wj.append(config, _entry("m1", "maintenance", now - 2 * HOUR, now - 2 * HOUR + 1000, outcome="ok",
                             stream_beside=True, waits={}))

    from kdq import cli
    from kdq.stack import manager

    class NoStack:
        def __init__(self, config) -> None:
            pass

        def status(self) -> list:
            return []

    monkeypatch.setattr(manager, "LocalStack", NoStack)
    assert cli._status(config, argparse.Namespace()) == 0
    out = capsys.readouterr().out
    assert "writers    (last 24 h) 2 run(s) of 2 job(s); 2 beside the stream; 1 waited for another writer" in out
    rebuild = next(line for line in out.splitlines() if "rebuild" in line)
    assert "runs 1, beside stream 1, waited 1 (6 s: 1 conflict / 0 stale-read retries, 4 s for the stream, 0 behind)" in rebuild
    assert "last ok at" in rebuild
    assert "maintenance" in out and "waited 0" in out


def test_quality_page_json_and_html_have_the_writers_section() -> None:
    now = 100 * 24 * HOUR
    entries = [
        _entry("r1", "rebuild", now - HOUR),
        _entry("r1", "rebuild", now - HOUR, now - HOUR + 1000, outcome="failed", error="<boom>", stream_beside=True,
               waits={"stale_read_retries": 2, "retry_wait_seconds": 6}),
    ]
    health = stream_health({"heartbeat": {"state": "running", "time_ms": now}}, [], now,
                           writers=wj.summarize(entries, now))
    payload = writers_json(health, now)
    assert payload["runs"] == 1 and payload["beside_stream"] == 1 and payload["waited"] == 1
    assert payload["jobs"][0]["job"] == "rebuild" and payload["jobs"][0]["stale_read_retries"] == 2
    json.dumps(payload)  # plain JSON
    html = render_page(build_model(PageRange(now), None, health, sql_error="down"))
    assert 'data-row="writer" data-job="rebuild"' in html
    assert 'data-field="writers-waited">1</b>' in html
    assert '<td class="n" data-field="retries">0 / 2</td>' in html
    assert "&lt;boom&gt;" in html and "<boom>" not in html  # the error is escaped
    empty = render_page(build_model(PageRange(now), None, stream_health({}, [], now), sql_error="down"))
    assert 'data-field="writers-none"' in empty


def test_the_journal_is_in_the_stream_state_folder(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    assert wj.journal_path(config).parent == state_dir(config)
    started = time.time()
    run = wj.JournalRun(config, "backfill", ["--topics", "a"]).start()
    entry = run.end(ok=True)
    assert entry["stream_beside"] is None  # no heartbeat: never started here
    assert entry["end_ms"] >= started * 1000 - 1000
