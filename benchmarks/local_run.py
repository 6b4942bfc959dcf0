"""`make run` measured (issue 25): the whole product on a private data folder, a quiet phase, then the daily jobs.

    python -m benchmarks.local_run [--minutes 4] [--interval 5] [--demo-args "--rate 200"] [--keep] [--no-save]

Starts the product as ``make run`` does (:func:`kdq.stack.airflow.start_product`: Kafka, InfluxDB, the SQL
endpoint, Airflow standalone with its DAGs unpaused, the speed layer started by the supervisor DAG, ``kdq demo``
traffic), with the project's ``kdq.toml`` but its data in a temporary folder and every component on free
loopback ports, so a user's own ``make run`` is never touched. Once the stream's first counts are in:

* phase **quiet**: the stream and the demo traffic only, ``--minutes``;
* phase **daily jobs**: at its start a run of ``kdq_maintenance`` and one of ``kdq_hourly_recompute`` (over the
  stream's data so far) are triggered through Airflow's REST API; ``--minutes`` again, longer while those runs
  have not ended (at most ``--job-wait-minutes`` more). Their states and durations are recorded.

In each phase, one probe per ``--interval`` seconds on average (the page every other probe, the three SQL probes
in a random order each cycle), each at a random moment of its slot (seeded): the product's own periodic work (the expectations run every 15 s, the stream's
micro-batches) would otherwise meet each probe kind at the same phase throughout a run. On a fixed 5-second grid
every JDBC query met the expectations run's read (0.47 cores in the 5 s before it) and no Connect query did (0.19).

* the data-quality page, ``GET /kdq/quality`` with the admin's bearer token: *first paint* is the time to the
  whole HTML (``data-field="as-of"`` in it); *numbers* the time from the same start until a response carries
  current counts (``<body data-numbers="fresh">``; a page without that attribute: its ``data-field="sql-source"``),
  polling the URL every 0.25 s as the page's own script would, for at most 30 s;
* SQL, the day's ``GROUP BY`` of :mod:`benchmarks.sql_endpoint`, wall clock per query on a session kept for the
  run as a BI tool keeps its connection (its first query reported apart): Spark Connect through kdq's light
  client, JDBC through one beeline fed on its stdin; and ``kdq sql "<query>"`` from process start to exit;
* with every probe, the 1-minute load average and the machine's CPU busy share since the previous probe.

The stream's figures come from its progress log: per micro-batch committed during the phase, its duration
(``triggerExecution``) and its produce → visible latency (the newest record's, and the oldest's, which with the
demo's out-of-order records is mostly their deliberate age). Everything started is stopped in ``finally``
(``kdq down``, then any process left that names the work folder).

Then, unless ``--burst 0``: **an incident** (issue 27). ``kdq demo --burst N`` (N invalid records to the demo's
``orders`` topic, as a user asks for one), then ``kdq.incidents`` polled over Spark Connect every 2 s until the
burst's ``invalid_ratio`` incident is there: seconds from the burst's last record produced to the row visible
(the stream counts it, the ``kdq_expectations`` DAG's next run, every minute, judges it), at most 5 minutes.

Results in ``benchmarks/results/local_run.{json,md}``, with the issues' targets as checks.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import shlex
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.measure import percentile, record_ms
from benchmarks.speed import write_config
from benchmarks.sql_endpoint import QUERY, BeelineSession, kdq_sql_timings
from kdq.config import Config, load_config

PROJECT = Path(__file__).resolve().parents[1]
RESULTS = PROJECT / "benchmarks" / "results"
PAGE_PATH = "/kdq/quality"
NUMBERS_DEADLINE_S = 30.0
NUMBERS_POLL_S = 0.25
# Issue 25's targets.
PAGE_NUMBERS_P95_S = 2.0
PAGE_FIRST_PAINT_P95_S = 1.0
SQL_MEDIAN_S = 1.0
KDQ_SQL_S = 3.0
STREAM_P99_RATIO = 1.2
INCIDENT_OPEN_S = 60.0  # issue 27: an incident opens within one minute of its records being produced
INCIDENT_DEADLINE_S = 300.0
QUIET, JOBS = "quiet", "daily_jobs"
INCIDENT = "incident"
PHASE_TITLES = {QUIET: "quiet (stream + demo)", JOBS: "daily jobs running", INCIDENT: "after `kdq demo --burst`"}
# Probes in turn: the page every other one.
ROTATION = ("page", "connect", "page", "jdbc", "page", "kdq_sql")
JOB_DAGS = ("kdq_maintenance", "kdq_hourly_recompute")

# -- pure logic ----------------------------------------------------------------------------------------------

_BODY_TAG = re.compile(r"<body\b[^>]*>", re.IGNORECASE)
_NUMBERS_ATTR = re.compile(r"\sdata-numbers=[\"']?([a-zA-Z]+)")


def numbers_state(html: str) -> str | None:
    """The page's own word on its counts, ``data-numbers`` of its ``<body>`` tag (``fresh``, ``stale``,
    ``none``); None when the page does not say (a page from before that attribute)."""
    head_end = html.lower().find("</head>")  # a script in the head may spell a body tag in its text
    body = _BODY_TAG.search(html, max(0, head_end))
    if body is None:
        return None
    match = _NUMBERS_ATTR.search(body.group(0))
    return match.group(1).lower() if match else None


def has_numbers(html: str) -> bool:
    """Whether a response shows current counts: ``data-numbers="fresh"`` when the page carries the attribute,
    else the line naming where its counts came from (``data-field="sql-source"``, absent on an SQL error)."""
    state = numbers_state(html)
    if state is not None:
        return state == "fresh"
    return 'data-field="sql-source"' in html


def painted(html: str) -> bool:
    """A whole page (layout, topic list, stream health): its "As of" line is rendered."""
    return 'data-field="as-of"' in html


def cpu_times(stat_text: str) -> tuple[int, int]:
    """(busy, total) jiffies of the machine from ``/proc/stat``'s first line (idle and iowait are not busy)."""
    for line in stat_text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            values = [int(v) for v in parts[1:]]
            # user nice system idle iowait irq softirq steal (guest time is already in user/nice)
            total = sum(values[:8])
            idle = values[3] + (values[4] if len(values) > 4 else 0)
            return total - idle, total
    raise ValueError("no aggregate cpu line in /proc/stat")


def busy_percent(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """CPU busy share of the whole machine between two :func:`cpu_times` readings, in percent."""
    busy, total = after[0] - before[0], after[1] - before[1]
    if total <= 0:
        return None
    return round(100.0 * busy / total, 1)


# Which part of the product a process is, by its command line (first match); Spark's JVMs name their Python
# script in their arguments, so a job's JVM and its Python driver count together.
PROCESS_ROLES = (
    ("stream", ("stream_counts.py",)),
    ("sql endpoint", ("sql_endpoint.py",)),
    ("expectations", ("evaluate_expectations.py",)),
    ("batch jobs", ("spark_jobs/",)),
    ("kafka", ("kafka.Kafka",)),
    ("schema registry", ("apicurio",)),
    ("influxdb", ("influxd",)),
    ("airflow", ("airflow",)),
    ("demo traffic", (" demo",)),
    ("python workers", ("pyspark.daemon",)),
)


def process_role(cmdline: str) -> str:
    for role, needles in PROCESS_ROLES:
        if any(needle in cmdline for needle in needles):
            return role
    return "other"


def process_cpu(proc: Path = Path("/proc")) -> dict[int, tuple[str, int]]:
    """Per live process: (its role, user + system clock ticks so far)."""
    out = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3 of stat(5)
        out[int(entry.name)] = (process_role(cmdline), int(fields[11]) + int(fields[12]))
    return out


def cores_by_role(before: Mapping[int, tuple[str, int]], after: Mapping[int, tuple[str, int]], seconds: float,
                  ticks_per_second: int = 100) -> dict[str, float]:
    """Mean cores each role used between two :func:`process_cpu` readings, largest first. A process started in
    between counts from zero; one that ended in between is not seen (short Airflow task processes)."""
    used: dict[str, int] = {}
    for pid, (role, ticks) in after.items():
        was = before.get(pid)
        used[role] = used.get(role, 0) + ticks - (was[1] if was and was[0] == role else 0)
    if seconds <= 0:
        return {}
    cores = {role: round(t / ticks_per_second / seconds, 2) for role, t in used.items()}
    return dict(sorted(((r, c) for r, c in cores.items() if c > 0), key=lambda rc: -rc[1]))


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def spread(values: Sequence[float], qs: Sequence[int] = (50, 95)) -> dict[str, float | int | None]:
    """``n`` and the percentiles ``p<q>`` (linear interpolation, as numpy) of ``values``."""
    return {"n": len(values), **{f"p{q}": _round(percentile(values, q)) for q in qs}}


def page_figures(samples: Sequence[Mapping[str, Any]], deadline_s: float = NUMBERS_DEADLINE_S) -> dict[str, Any]:
    """First paint and numbers of the page probes of a phase. A probe whose numbers did not come within the
    deadline counts as the deadline (it did at least that badly); a probe that failed (no page) counts in
    neither and is listed under ``errors``."""
    ok = [s for s in samples if s.get("first_paint_s") is not None]
    numbers = [s["numbers_s"] if s.get("numbers_s") is not None else deadline_s for s in ok]
    return {
        "first_paint": spread([s["first_paint_s"] for s in ok]),
        "numbers": spread(numbers),
        "numbers_missed": sum(1 for s in ok if s.get("numbers_s") is None),
        "fresh_on_first_response": sum(1 for s in ok if s.get("numbers_s") is not None and s.get("polls", 1) == 1),
        "errors": [s["error"] for s in samples if s.get("error")],
    }


def sql_figures(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median and range of each SQL door's probes (``seconds``), failures listed."""
    out: dict[str, Any] = {}
    for kind in ("connect", "jdbc", "kdq_sql"):
        mine = [s for s in samples if s.get("kind") == kind]
        seconds = [s["seconds"] for s in mine if s.get("seconds") is not None]
        out[kind] = {
            "n": len(seconds),
            "median": _round(statistics.median(seconds)) if seconds else None,
            "max": _round(max(seconds)) if seconds else None,
            "errors": [s["error"] for s in mine if s.get("error")],
        }
    return out


def load_figures(loads: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean and maximum of the 1-minute load average and of the CPU busy share over a phase's probes."""
    load = [x["load_1m"] for x in loads if x.get("load_1m") is not None]
    busy = [x["cpu_busy_percent"] for x in loads if x.get("cpu_busy_percent") is not None]
    return {
        "load_1m_mean": _round(statistics.fmean(load), 2) if load else None,
        "load_1m_max": _round(max(load), 2) if load else None,
        "cpu_busy_percent_mean": _round(statistics.fmean(busy), 1) if busy else None,
        "cpu_busy_percent_max": _round(max(busy), 1) if busy else None,
        "n": len(load),
    }


def stream_figures(records: Sequence[Mapping[str, Any]], start_ms: int, end_ms: int) -> dict[str, Any]:
    """The micro-batches triggered in ``[start_ms, end_ms)`` (the stream's progress records): their duration and
    produce → visible latency, in seconds, p50 and p99. ``newest``: the batch's newest record, which waited only for
    the batch itself; ``oldest``: its oldest counted record (with the demo's out-of-order traffic, mostly that
    record's deliberate age). A batch replayed after a restart appears once (its last record)."""
    batches: dict[int, Mapping[str, Any]] = {}
    for record in records:
        ms = record_ms(record)
        if ms is not None and start_ms <= ms < end_ms and record.get("batch_id") is not None:
            batches[int(record["batch_id"])] = record
    chosen = [batches[b] for b in sorted(batches)]
    durations = [
        int((r.get("duration_ms") or {}).get("triggerExecution") or 0) / 1000 for r in chosen if r.get("duration_ms")
    ]
    latencies = [r.get("end_to_end_latency_ms") for r in chosen if r.get("end_to_end_latency_ms")]
    return {
        "batches": len(chosen),
        "rows": sum(int(r.get("input_rows") or 0) for r in chosen),
        "batch_seconds": spread(durations, (50, 99)),
        "batch_seconds_max": _round(max(durations)) if durations else None,
        "visible_newest_seconds": spread([lat["newest"] / 1000 for lat in latencies], (50, 99)),
        "visible_oldest_seconds": spread([lat["oldest"] / 1000 for lat in latencies], (50, 99)),
        "first_batch_id": min(batches) if batches else None,
        "last_batch_id": max(batches) if batches else None,
    }


def check(name: str, phase: str, value: float | None, limit: float, unit: str = "s") -> dict[str, Any]:
    """One target: ``value`` at most ``limit``; a figure that was not measured fails."""
    return {
        "target": name,
        "phase": phase,
        "value": value,
        "limit": limit,
        "unit": unit,
        "ok": value is not None and value <= limit,
    }


def targets(phases: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Issue 25's targets, per phase where they must hold whatever the daily jobs do; the stream's p99 produce →
    visible (newest record) with the daily jobs at most 1.2 x its quiet value."""
    out = []
    for phase in (QUIET, JOBS):
        figures = phases.get(phase)
        if not figures:
            continue
        page, sql = figures["page"], figures["sql"]
        out += [
            check("page numbers p95 <= 2 s", phase, page["numbers"]["p95"], PAGE_NUMBERS_P95_S),
            check("page first paint p95 <= 1 s", phase, page["first_paint"]["p95"], PAGE_FIRST_PAINT_P95_S),
            check("SQL median <= 1 s: Spark Connect", phase, sql["connect"]["median"], SQL_MEDIAN_S),
            check("SQL median <= 1 s: JDBC", phase, sql["jdbc"]["median"], SQL_MEDIAN_S),
            check("`kdq sql` <= 3 s (median, prompt to table)", phase, sql["kdq_sql"]["median"], KDQ_SQL_S),
        ]
    quiet = ((phases.get(QUIET) or {}).get("stream") or {}).get("visible_newest_seconds", {}).get("p99")
    busy = ((phases.get(JOBS) or {}).get("stream") or {}).get("visible_newest_seconds", {}).get("p99")
    ratio = round(busy / quiet, 2) if quiet and busy is not None else None
    out.append(check("stream p99 produce -> visible, daily jobs / quiet <= 1.2", JOBS, ratio, STREAM_P99_RATIO, "x"))
    return out


def incident_target(incident: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Issue 27's: the burst's incident visible within a minute of its last record (none when not measured)."""
    if not incident:
        return []
    return [check("incident open <= 60 s after the burst (issue 27)", INCIDENT, incident.get("open_seconds"),
                  INCIDENT_OPEN_S)]


def incident_query(opened_after: datetime) -> str:
    """The burst's incident: an ``invalid_ratio`` one opened after the burst began, on the burst's topic."""
    return (
        "SELECT topic, expectation, status, worst_value, opened_at FROM kdq.incidents "
        f"WHERE expectation = 'invalid_ratio' AND topic = 'orders' "
        f"AND opened_at >= TIMESTAMP '{opened_after.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%S')}'"
    )


def shows_rows(table: str) -> bool:
    """Whether a ``show()`` table has a data row (a header framed by +---+ lines, then rows, then a last line)."""
    lines = [line for line in table.splitlines() if line.strip()]
    return sum(1 for line in lines if line.startswith("|")) > 1


def phase_figures(
    samples: Sequence[Mapping[str, Any]],
    loads: Sequence[Mapping[str, Any]],
    progress: Sequence[Mapping[str, Any]],
    start_ms: int,
    end_ms: int,
) -> dict[str, Any]:
    return {
        "seconds": round((end_ms - start_ms) / 1000, 1),
        "page": page_figures([s for s in samples if s.get("kind") == "page"]),
        "sql": sql_figures(samples),
        "stream": stream_figures(progress, start_ms, end_ms),
        "load": load_figures(loads),
    }


def _s(value: Any, unit: str = " s") -> str:
    return "–" if value is None else f"{value}{unit}"


def markdown(result: Mapping[str, Any]) -> str:
    phases = result["phases"]
    names = [p for p in (QUIET, JOBS) if p in phases]
    head = "| | " + " | ".join(PHASE_TITLES[p] for p in names) + " |\n|---|" + "---|" * len(names) + "\n"

    def row(label: str, cell: Callable[[Mapping[str, Any]], str]) -> str:
        return f"| {label} | " + " | ".join(cell(phases[p]) for p in names) + " |\n"

    def pq(part: Mapping[str, Any], a: str = "p50", b: str = "p95") -> str:
        return f"{_s(part[a])} / {_s(part[b])} (n {part['n']})"

    def door(kind: str) -> Callable[[Mapping[str, Any]], str]:
        return lambda f: f"{_s(f['sql'][kind]['median'])} (max {_s(f['sql'][kind]['max'])}, n {f['sql'][kind]['n']})"

    table = (
        head
        + row("phase length", lambda f: _s(f["seconds"]))
        + row("page first paint, p50 / p95", lambda f: pq(f["page"]["first_paint"]))
        + row(
            "page numbers, p50 / p95",
            lambda f: (
                pq(f["page"]["numbers"])
                + (
                    f", {f['page']['numbers_missed']} past {NUMBERS_DEADLINE_S:.0f} s"
                    if f["page"]["numbers_missed"]
                    else ""
                )
            ),
        )
        + row("SQL Spark Connect (light client, open session), median", door("connect"))
        + row("SQL JDBC (beeline, open session), median", door("jdbc"))
        + row("`kdq sql`, prompt to table, median", door("kdq_sql"))
        + row("stream batches (rows)", lambda f: f"{f['stream']['batches']} ({f['stream']['rows']:,})")
        + row("stream batch duration, p50 / p99", lambda f: pq(f["stream"]["batch_seconds"], "p50", "p99"))
        + row(
            "produce → visible, newest record, p50 / p99",
            lambda f: pq(f["stream"]["visible_newest_seconds"], "p50", "p99"),
        )
        + row(
            "produce → visible, oldest record, p50 / p99",
            lambda f: pq(f["stream"]["visible_oldest_seconds"], "p50", "p99"),
        )
        + row(
            "load average 1 min, mean / max",
            lambda f: f"{_s(f['load']['load_1m_mean'], '')} / {_s(f['load']['load_1m_max'], '')}",
        )
        + row(
            "CPU busy, mean / max",
            lambda f: f"{_s(f['load']['cpu_busy_percent_mean'], ' %')} / {_s(f['load']['cpu_busy_percent_max'], ' %')}",
        )
        + row(
            "cores by process (mean)",
            lambda f: ", ".join(f"{role} {cores}" for role, cores in list(f.get("cores_by_role", {}).items())[:6])
            or "–",
        )
    )
    checks = "| target | phase | value | met |\n|---|---|---|---|\n" + "".join(
        f"| {c['target']} | {PHASE_TITLES[c['phase']]} | {_s(c['value'], ' ' + c['unit'])} | "
        f"{'yes' if c['ok'] else '**no**'} |\n"
        for c in result["targets"]
    )
    jobs = "".join(
        f"* `{r['dag_id']}` run `{r['run_id']}`: **{r.get('state')}**"
        + (f", {r['seconds']} s from start to end" if r.get("seconds") is not None else "")
        + (f" (queued {r['queued_seconds']} s)" if r.get("queued_seconds") is not None else "")
        + (f"; {r['what']}" if r.get("what") else "")
        + "".join(
            f"\n  * task `{t['task_id']}`: {t['state']}, queued {_s(t['queued_seconds'])}, ran {_s(t['seconds'])}"
            for t in r.get("tasks", [])
        )
        + "\n"
        for r in result.get("job_runs", [])
    )
    startup = result.get("startup", {})
    code = result.get("code", {})
    page_marker = result.get("page_marker")
    return (
        "# `make run` measured: the page, SQL and the stream, quiet and with the daily jobs\n\n"
        f"`{result.get('command', 'python -m benchmarks.local_run')}`, started {result.get('started_at', '?')} "
        f"(code {code.get('commit', '?')}{', uncommitted changes' if code.get('dirty') else ''}). The product as "
        "`make run` starts it (the project's kdq.toml, a private data folder, free loopback ports), demo traffic "
        f"`kdq demo {result.get('parameters', {}).get('demo_args', '')}`. First counts "
        f"{_s(startup.get('first_counts_seconds'))} after the start; one probe per "
        f"{result.get('parameters', {}).get('interval_seconds')} s per phase, at a random moment of its slot, the SQL "
        "doors in a random order each cycle.\n\n"
        f"{table}\n"
        "The page's numbers: "
        + (
            'its `<body data-numbers="fresh">`'
            if page_marker == "data-numbers"
            else "the page had no `data-numbers` attribute yet: a response with its SQL source line "
            '(`data-field="sql-source"`) counts as having numbers'
        )
        + f", polled every {NUMBERS_POLL_S} s from the first request for at most {NUMBERS_DEADLINE_S:.0f} s. "
        "Produce → visible: per micro-batch, from the Kafka timestamp of its newest (oldest) counted record to its "
        "MERGE's commit; the demo's out-of-order records carry their event time, up to 80 % of the allowed lateness "
        f"({result.get('parameters', {}).get('allowed_lateness_seconds', '?')} s) old, as their Kafka timestamp, so the "
        "oldest record's figure is mostly their age.\n\n"
        + incident_section(result.get("incident"))
        + f"## Targets (issues 25 and 27)\n\n{checks}\n"
        "## The daily jobs (triggered at the start of the second phase)\n\n" + (jobs or "none triggered\n")
        + maintenance_section(result.get("maintenance_steps"))
    )


_MAINTENANCE_LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) INFO kdq\.maintenance: maintenance: ([^\"\n]*)")
# The plan task logs the same lines through Airflow's own JSON task log (no Spark job output around them).
_PLAN_LINE = re.compile(r'"timestamp":"(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)\.(\d{3})\d*Z","level":"info",'
                        r'"event":"maintenance: ([^"\n]*)","logger":"kdq\.maintenance"')


def maintenance_steps(log_texts: Sequence[str]) -> list[dict[str, Any]]:
    """The maintenance job's steps as its task logs show them (the job logs each step as it begins), in order: the
    step, whether the plan skipped it, and the seconds until the next step began (None for the last one, which
    may still run): where a long maintenance run goes. With no Spark job (its plan task found nothing to do), the
    plan task's steps, each marked ``plan``."""
    begun: list[tuple[datetime, str]] = []
    planned: list[tuple[datetime, str]] = []
    for text in log_texts:
        for stamp, millis, step in _MAINTENANCE_LINE.findall(text):
            at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(microsecond=int(millis) * 1000)
            begun.append((at, step.strip()))
        for day, clock, millis, step in _PLAN_LINE.findall(text):
            at = datetime.strptime(f"{day} {clock}", "%Y-%m-%d %H:%M:%S").replace(microsecond=int(millis) * 1000)
            planned.append((at, step.strip()))
    if not begun:
        planned.sort(key=lambda b: b[0])
        return [{"step": what, "skipped": why or None, "at": at.strftime("%H:%M:%S"), "seconds": None, "plan": True}
                for at, (what, _, why) in ((at, step.partition(" skipped: ")) for at, step in planned)]
    begun.sort(key=lambda b: b[0])
    out = []
    for i, (at, step) in enumerate(begun):
        what, _, why = step.partition(" skipped: ")
        following = begun[i + 1][0] if i + 1 < len(begun) else None
        out.append({"step": what, "skipped": why or None, "at": at.strftime("%H:%M:%S"),
                    "seconds": round((following - at).total_seconds(), 1) if following else None})
    return out


def maintenance_section(steps: Sequence[Mapping[str, Any]] | None) -> str:
    if not steps:
        return ""
    if all(s.get("plan") for s in steps):
        todo = [s for s in steps if not s["skipped"]]
        return (f"\nThe maintenance's plan task (no Spark) found {len(todo)} of {len(steps)} steps to run"
                + (": no Spark job.\n" if not todo else ":\n\n" + "\n".join(f"  * {s['step']}" for s in todo) + "\n"))
    ran = [s for s in steps if not s["skipped"]]
    lines = [f"  * {s['at']} {s['step']}: " + (f"{s['seconds']} s" if s["seconds"] is not None else "until the end")
             for s in ran]
    return (f"\nThe maintenance's steps from its task log ({len(steps) - len(ran)} of {len(steps)} skipped by its "
            "plan; each step's seconds until the next began):\n\n" + "\n".join(lines) + "\n")


def maintenance_logs(config: Config) -> list[str]:
    """The text of every kdq_maintenance task log of the local Airflow (its logs folder)."""
    folder = config.data_dir / "airflow" / "logs"
    return [path.read_text(errors="replace") for path in sorted(folder.glob("dag_id=kdq_maintenance/**/*.log"))]


# -- probes ------------------------------------------------------------------------------------------------


class Load:
    """Load average and CPU busy share since the previous reading."""

    def __init__(self) -> None:
        self._last = self._read()

    @staticmethod
    def _read() -> tuple[int, int] | None:
        try:
            return cpu_times(Path("/proc/stat").read_text())
        except (OSError, ValueError):
            return None

    def sample(self) -> dict[str, Any]:
        now = self._read()
        busy = busy_percent(self._last, now) if self._last and now else None
        self._last = now
        return {"t_ms": int(time.time() * 1000), "load_1m": round(os.getloadavg()[0], 2), "cpu_busy_percent": busy}


class Probes:
    """The page and the three SQL doors of one running product."""

    def __init__(self, stack: Any, config: Config) -> None:
        import requests

        self.requests = requests
        self.stack = stack
        self.config = config
        self.api = stack.airflow.api()
        self.page_url = stack.airflow.url + PAGE_PATH
        self.markers: set[str] = set()
        self._connect = None
        self._connect_cold = True
        self._beeline: BeelineSession | None = None
        self._beeline_cold = True

    def _get_page(self, timeout: float) -> tuple[int, str]:
        for attempt in (1, 2):
            response = self.requests.get(
                self.page_url,
                headers={"Authorization": f"Bearer {self.api.token()}"},
                timeout=timeout,
                allow_redirects=False,
            )
            if response.status_code in (401, 303) and attempt == 1:
                self.api._token = None  # expired: log in again
                continue
            return response.status_code, response.text
        raise AssertionError("unreachable")

    def page(self) -> dict[str, Any]:
        started = time.monotonic()
        sample: dict[str, Any] = {"kind": "page", "t_ms": int(time.time() * 1000), "polls": 1}
        try:
            status, html = self._get_page(timeout=90)
        except Exception as exc:
            return {**sample, "error": f"GET failed: {exc!r}"[:300]}
        first = time.monotonic() - started
        if status != 200 or not painted(html):
            return {**sample, "error": f"HTTP {status}, no 'as-of' in the page: {html[:200]!r}"}
        sample["first_paint_s"] = round(first, 3)
        sample["numbers_state"] = numbers_state(html)
        self.markers.add("data-numbers" if numbers_state(html) is not None else "sql-source")
        while not has_numbers(html):
            if time.monotonic() - started + NUMBERS_POLL_S > NUMBERS_DEADLINE_S:
                sample["numbers_s"] = None
                return sample
            time.sleep(NUMBERS_POLL_S)
            sample["polls"] += 1
            try:
                status, html = self._get_page(timeout=max(1.0, NUMBERS_DEADLINE_S - (time.monotonic() - started)))
            except Exception as exc:
                sample["poll_error"] = repr(exc)[:200]
                continue
            if status != 200:
                html = ""
        sample["numbers_s"] = round(time.monotonic() - started, 3)
        return sample

    def connect(self) -> dict[str, Any]:
        """The query on one Spark Connect session kept for the run (a BI tool's connection), kdq's light client."""
        from kdq.sql_client import LightConnectClient

        sample: dict[str, Any] = {"kind": "connect", "t_ms": int(time.time() * 1000)}
        try:
            if self._connect is None:
                self._connect = LightConnectClient(self.stack.sql_endpoint.connect_url, timeout=120)
                self._connect_cold = True
            started = time.perf_counter()
            self._connect.show(QUERY, 50)
            seconds = time.perf_counter() - started
        except Exception as exc:
            self._close_connect()
            return {**sample, "error": repr(exc)[:300]}
        if self._connect_cold:  # the session's first query: reported apart, not in the median
            self._connect_cold = False
            return {**sample, "cold_seconds": round(seconds, 3)}
        return {**sample, "seconds": round(seconds, 3)}

    def jdbc(self) -> dict[str, Any]:
        """The query on one JDBC session kept for the run (beeline fed on its stdin), wall clock to its answer."""
        sample: dict[str, Any] = {"kind": "jdbc", "t_ms": int(time.time() * 1000)}
        try:
            if self._beeline is None:
                self._beeline = BeelineSession(self.stack.sql_endpoint.jdbc_url)
                self._beeline_cold = True
            seconds, own = self._beeline.query(QUERY)
        except Exception as exc:
            self._close_beeline()
            return {**sample, "error": repr(exc)[:300]}
        if self._beeline_cold:  # the session's first query (beeline's JVM start and login before it): apart
            self._beeline_cold = False
            return {**sample, "cold_seconds": round(seconds, 3), "beeline_seconds": own}
        return {**sample, "seconds": round(seconds, 3), "beeline_seconds": own}

    def _close_beeline(self) -> None:
        if self._beeline is not None:
            try:
                self._beeline.close()
            except Exception:
                pass
            self._beeline = None

    def kdq_sql(self) -> dict[str, Any]:
        sample: dict[str, Any] = {"kind": "kdq_sql", "t_ms": int(time.time() * 1000)}
        try:
            timing = kdq_sql_timings(self.config, 1)
        except Exception as exc:
            return {**sample, "error": repr(exc)[:300]}
        return {**sample, "seconds": round(timing["seconds"][0], 3)}

    def close(self) -> None:
        self._close_beeline()
        self._close_connect()

    def _close_connect(self) -> None:
        if self._connect is not None:
            try:
                self._connect.close()
            except Exception:
                pass
            self._connect = None


# -- the daily jobs ------------------------------------------------------------------------------------------


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def trigger_jobs(api: Any, interval_start: datetime, now: datetime) -> list[dict[str, Any]]:
    """One run of each daily job, through the REST API: the maintenance as the UI's Trigger starts it, the
    recompute over ``[interval_start, now)`` (minutes), so it has the stream's data to go through; a manual run
    without an interval recomputes the last full hour, empty on a data folder this young."""
    stamp = now.strftime("%Y%m%dT%H%M%S")
    start, end = interval_start.replace(second=0, microsecond=0), now.replace(second=0, microsecond=0)
    bodies = {
        "kdq_maintenance": (
            {"dag_run_id": f"bench_local_run_maintenance_{stamp}", "logical_date": None, "conf": {}},
            "compaction, retention and vacuum of every table, as the daily run",
        ),
        "kdq_hourly_recompute": (
            {
                "dag_run_id": f"bench_local_run_recompute_{stamp}",
                "logical_date": _iso(now),
                "data_interval_start": _iso(start),
                "data_interval_end": _iso(end),
                "conf": {},
            },
            f"recompute, push, catch-up and reconcile of ingest time [{start:%H:%M}, {end:%H:%M}) UTC",
        ),
    }
    runs = []
    for dag_id in JOB_DAGS:
        body, what = bodies[dag_id]
        row = {"dag_id": dag_id, "run_id": body["dag_run_id"], "what": what, "triggered_ms": int(time.time() * 1000)}
        try:
            response = api.request("POST", f"dags/{dag_id}/dagRuns", json=body)
            if response.status_code not in (200, 201):
                row |= {"state": "not triggered", "error": f"{response.status_code} {response.text[:300]}"}
        except Exception as exc:
            row |= {"state": "not triggered", "error": repr(exc)[:300]}
        runs.append(row)
    return runs


def _parse_iso(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def follow_jobs(api: Any, runs: list[dict[str, Any]]) -> bool:
    """Update each triggered run's state and times; True when every one has ended."""
    ended = True
    for row in runs:
        if row.get("state") in ("success", "failed", "not triggered"):
            continue
        try:
            run = api.get(f"dags/{row['dag_id']}/dagRuns/{row['run_id']}")
        except Exception as exc:
            row["poll_error"] = repr(exc)[:200]
            ended = False
            continue
        row["state"] = run.get("state")
        started, finished = _parse_iso(run.get("start_date")), _parse_iso(run.get("end_date"))
        queued = _parse_iso(run.get("queued_at"))
        if started and queued:
            row["queued_seconds"] = round((started - queued).total_seconds(), 1)
        if started and finished:
            row["seconds"] = round((finished - started).total_seconds(), 1)
        if row["state"] not in ("success", "failed"):
            ended = False
    return ended


def job_tasks(api: Any, runs: list[dict[str, Any]]) -> None:
    """Each triggered run's tasks: state, seconds queued for an executor slot, seconds running."""
    for row in runs:
        if row.get("state") == "not triggered":
            continue
        try:
            tis = api.get(f"dags/{row['dag_id']}/dagRuns/{row['run_id']}/taskInstances")["task_instances"]
        except Exception as exc:
            row["tasks_error"] = repr(exc)[:200]
            continue
        tasks = []
        for ti in tis:
            queued, started = _parse_iso(ti.get("queued_when")), _parse_iso(ti.get("start_date"))
            tasks.append(
                {
                    "task_id": ti["task_id"],
                    "state": ti.get("state"),
                    "try_number": ti.get("try_number"),
                    "queued_seconds": round((started - queued).total_seconds(), 1) if queued and started else None,
                    "seconds": _round(ti.get("duration"), 1),
                }
            )
        row["tasks"] = tasks


def all_dag_runs(api: Any, since: datetime) -> list[dict[str, Any]]:
    """Every kdq DAG run that began after ``since`` (the scheduler's own as well: the supervisor, an hourly run
    when an hour ended during the benchmark)."""
    from kdq.stack.airflow import KDQ_DAGS

    out = []
    for dag_id in KDQ_DAGS:
        try:
            runs = api.get(f"dags/{dag_id}/dagRuns", limit=100, order_by="-run_after")["dag_runs"]
        except Exception:
            continue
        for run in runs:
            started, finished = _parse_iso(run.get("start_date")), _parse_iso(run.get("end_date"))
            if started is None or started < since:
                continue
            out.append(
                {
                    "dag_id": dag_id,
                    "run_id": run["dag_run_id"],
                    "run_type": run.get("run_type"),
                    "state": run.get("state"),
                    "start": run.get("start_date"),
                    "seconds": round((finished - started).total_seconds(), 1) if finished else None,
                }
            )
    return sorted(out, key=lambda r: r["start"] or "")


# -- the run -------------------------------------------------------------------------------------------------


def local_run_config(work: Path) -> Config:
    """The project's kdq.toml (rules, summaries, stream settings of `make run`) without KDQ_* variables, its data
    in ``work``; written to a file for the product's processes (KDQ_CONFIG)."""
    overrides = {"paths": {"data_dir": str(work / "data"), "jars_dir": str(PROJECT / ".cache" / "jars")}}
    return write_config(load_config(path=PROJECT / "kdq.toml", env={}, overrides=overrides), work / "kdq.toml")


def _say(t0: float, message: str) -> None:
    print(f"[{time.monotonic() - t0:6.1f}s] {message}", flush=True)


def wait_first_counts(stack: Any, since_ms: int, timeout: float) -> float:
    """Seconds until the stream commits a batch with counts (after ``since_ms``)."""
    from kdq.stream.state import stream_status

    started = time.monotonic()
    while time.monotonic() - started < timeout:
        progress = stream_status(stack.config)["progress"] or {}
        if progress.get("input_rows") and progress.get("changed_windows") and (record_ms(progress) or 0) >= since_ms:
            return time.monotonic() - started
        if not stack.airflow.process.running():
            raise RuntimeError(f"Airflow stopped: {stack.airflow.process.log_tail()}")
        time.sleep(2)
    raise RuntimeError(f"no counts from the stream within {timeout:.0f} s")


def run_phase(
    probes: Probes,
    load: Load,
    seconds: float,
    interval: float,
    t0: float,
    name: str,
    tick: Callable[[], bool] | None = None,
    extend_s: float = 0.0,
) -> dict[str, Any]:
    """Probe in turn, one per ``interval`` s at a random moment of its slot (the module doc), for ``seconds``;
    ``tick`` (called each round) returning False keeps the phase going past ``seconds`` for at most ``extend_s``
    more."""
    start_ms = int(time.time() * 1000)
    started = time.monotonic()
    cpu_before = process_cpu()
    jitter = random.Random(f"{name}-{seconds}")  # seeded: a re-run probes at the same moments
    samples, loads = [], []
    i = 0
    while True:
        elapsed = time.monotonic() - started
        done = tick() if tick is not None else True
        if elapsed >= seconds and (done or elapsed >= seconds + extend_s):
            break
        if i % len(ROTATION) == 0:  # each cycle its own order of the queries (the page stays every other probe)
            queries = jitter.sample([k for k in ROTATION if k != "page"], k=3)
            cycle = [k if k == "page" else queries.pop() for k in ROTATION]
        kind = cycle[i % len(ROTATION)]
        loads.append(load.sample())
        sample = getattr(probes, kind)()
        samples.append(sample)
        shown = {k: v for k, v in sample.items() if k not in ("t_ms", "kind")}
        _say(t0, f"{name} {kind}: {shown}; load {loads[-1]['load_1m']}, cpu {loads[-1]['cpu_busy_percent']} %")
        i += 1
        next_at = started + (i + jitter.uniform(-0.5, 0.5)) * interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    cores = cores_by_role(cpu_before, process_cpu(), time.monotonic() - started, os.sysconf("SC_CLK_TCK"))
    return {"start_ms": start_ms, "end_ms": int(time.time() * 1000), "samples": samples, "loads": loads,
            "cores_by_role": cores}


def incident_section(incident: Mapping[str, Any] | None) -> str:
    if not incident:
        return ""
    return (
        f"## An incident from `kdq demo --burst {incident.get('burst')}`\n\n"
        f"The burst produced in {_s(incident.get('produce_seconds'))}; its `invalid_ratio` incident visible in "
        f"`kdq.incidents` (Spark Connect, polled every 2 s) **{_s(incident.get('open_seconds'))}** after its last "
        f"record ({incident.get('polls')} polls)"
        + (f"; {incident['error']}" if incident.get("error") else "")
        + ".\n\n"
        + evaluator_sentence(incident.get("evaluator"))
    )


def evaluator_sentence(figures: Mapping[str, Any] | None) -> str:
    """The always-on evaluator over the whole run, from its task logs (evaluation_figures)."""
    if not figures or not figures.get("evaluations"):
        return ""
    between = figures.get("seconds_between") or {}
    steps = ", ".join(f"{step} {v['median']} s (max {v['max']})" for step, v in figures["step_seconds"].items())
    return (f"The expectations run evaluated {figures['evaluations']} times during the run, "
            f"{between.get('median', '-')} s apart at the median (max {between.get('max', '-')}); "
            f"per evaluation, median: {steps}.\n\n")


# The expectations run's log line per evaluation (kdq.spark.expectations.evaluate_run): its time and steps.
_EVALUATION_LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ INFO kdq\.spark\.expectations: "
                              r"expectations: minutes .*? \(([^()]*)\)")
_STEP = re.compile(r"(\w+) (\d+(?:\.\d+)?) s")


def evaluation_figures(log_texts: Sequence[str]) -> dict[str, Any]:
    """From the evaluator's task logs: how many evaluations, the seconds between them (median, max) and each
    step's seconds (median, max): where the time from a burst to its incident goes besides the stream."""
    times: list[datetime] = []
    steps: dict[str, list[float]] = {}
    for text in log_texts:
        for stamp, parts in _EVALUATION_LINE.findall(text):
            times.append(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S"))
            for step, seconds in _STEP.findall(parts):
                steps.setdefault(step, []).append(float(seconds))
    times.sort()
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]

    def spread(values: Sequence[float]) -> dict[str, float]:
        return {"median": round(statistics.median(values), 1), "max": round(max(values), 1)}

    return {"evaluations": len(times), **({"seconds_between": spread(gaps)} if gaps else {}),
            "step_seconds": {step: spread(values) for step, values in steps.items()}}


def evaluator_logs(config: Config) -> list[str]:
    """The text of every kdq_expectations task log of the local Airflow (its logs folder)."""
    folder = config.data_dir / "airflow" / "logs"
    return [path.read_text(errors="replace") for path in sorted(folder.glob("dag_id=kdq_expectations/**/*.log"))]


def measure_incident(stack: Any, config: Config, burst: int, t0: float,
                     deadline_s: float = INCIDENT_DEADLINE_S) -> dict[str, Any]:
    """`kdq demo --burst N` as a user types it, then kdq.incidents over Spark Connect until the burst's incident."""
    import subprocess

    from kdq.sql_client import LightConnectClient

    began = datetime.now(UTC)
    out: dict[str, Any] = {"burst": burst, "started_at": _iso(began), "polls": 0}
    started = time.monotonic()
    done = subprocess.run([str(PROJECT / ".venv" / "bin" / "kdq"), "demo", "--burst", str(burst)],
                          env={**os.environ, "KDQ_CONFIG": config.source}, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return {**out, "error": f"kdq demo --burst exited {done.returncode}: {done.stderr[-300:]}"}
    produced = time.monotonic()
    out["produce_seconds"] = round(produced - started, 2)
    _say(t0, f"burst of {burst} invalid records produced: polling kdq.incidents")
    client = LightConnectClient(stack.sql_endpoint.connect_url, timeout=60)
    try:
        while time.monotonic() - produced < deadline_s:
            out["polls"] += 1
            try:
                table = client.show(incident_query(began), 5)
            except Exception as exc:  # the endpoint busy or restarting: the next poll asks again
                out["poll_error"] = repr(exc)[:200]
                table = ""
            if shows_rows(table):
                out["open_seconds"] = round(time.monotonic() - produced, 1)
                out["row"] = table
                _say(t0, f"incident visible {out['open_seconds']} s after the burst:\n{table}")
                return out
            time.sleep(2)
    finally:
        client.close()
    return {**out, "error": f"no incident within {deadline_s:.0f} s"}


def code_state() -> dict:
    from benchmarks.chaos_setup import code_state as chaos_code_state

    return chaos_code_state()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.local_run", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=4.0, help="length of each phase (default 4)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between probes (default 5)")
    parser.add_argument(
        "--job-wait-minutes",
        type=float,
        default=5.0,
        help="the daily-jobs phase goes on while their runs have not ended, at most this much longer",
    )
    parser.add_argument("--demo-args", default="", help='kdq demo options, as `make run DEMO="..."` (default: none)')
    parser.add_argument("--burst", type=int, default=400,
                        help="invalid records of the incident measurement (kdq demo --burst N; 0: none; default 400)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (printed)")
    parser.add_argument("--no-save", action="store_true", help="print the results, write no results files")
    args = parser.parse_args(argv)

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)

    from benchmarks.__main__ import machine_info
    from benchmarks.chaos_setup import kill_orphans
    from kdq.quality_health import read_progress_log
    from kdq.stack import airflow as airflow_module
    from kdq.stack.airflow import start_product
    from kdq.stack.manager import LocalStack

    # A user's fixed Airflow port or start date must not reach this private instance.
    for name in (airflow_module.PORT_ENV, airflow_module.START_DATE_ENV):
        os.environ.pop(name, None)
    work = Path(tempfile.mkdtemp(prefix="kdq-bench-local-run-"))
    config = local_run_config(work)
    command = shlex.join(["python", "-m", "benchmarks.local_run", *(sys.argv[1:] if argv is None else argv)])
    result: dict[str, Any] = {
        "command": command,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "code": code_state(),
        "machine": machine_info(),
        "parameters": {
            "minutes": args.minutes,
            "interval_seconds": args.interval,
            "demo_args": args.demo_args,
            "job_wait_minutes": args.job_wait_minutes,
            "query": QUERY,
            "trigger_seconds": config.stream.trigger_interval_seconds,
            "allowed_lateness_seconds": config.stream.allowed_lateness_seconds,
        },
        "work_dir": str(work),
    }
    # As `kdq run` builds it (kdq.cli): the shipped rules judge the demo's Avro and Protobuf topics through the registry.
    stack = LocalStack(config, with_sql_endpoint=True, product=True, with_registry=True)
    probes: Probes | None = None
    raw: dict[str, dict[str, Any]] = {}
    t0 = time.monotonic()
    start_wall = datetime.now(UTC)
    failure = None
    try:
        stack.check_shape()
        if start_product(stack, shlex.split(args.demo_args), started=t0) is None:
            raise RuntimeError("the local stack did not come up healthy")
        result["startup"] = {"product_ready_seconds": round(time.monotonic() - t0, 1)}
        wait_first_counts(stack, int(start_wall.timestamp() * 1000), timeout=900)
        result["startup"]["first_counts_seconds"] = round(time.monotonic() - t0, 1)
        _say(t0, "first counts in window_counts: phase 'quiet' begins")
        probes = Probes(stack, config)
        load = Load()
        raw[QUIET] = run_phase(probes, load, args.minutes * 60, args.interval, t0, QUIET)
        api = stack.airflow.api()
        runs = trigger_jobs(api, start_wall, datetime.now(UTC))
        result["job_runs"] = runs
        _say(t0, f"triggered {[(r['dag_id'], r.get('state', 'queued')) for r in runs]}: phase 'daily jobs' begins")
        last_poll = [0.0]

        def jobs_ended() -> bool:
            if time.monotonic() - last_poll[0] < 10:
                return all(r.get("state") in ("success", "failed", "not triggered") for r in runs)
            last_poll[0] = time.monotonic()
            return follow_jobs(api, runs)

        raw[JOBS] = run_phase(
            probes,
            load,
            args.minutes * 60,
            args.interval,
            t0,
            JOBS,
            tick=jobs_ended,
            extend_s=args.job_wait_minutes * 60,
        )
        follow_jobs(api, runs)
        job_tasks(api, runs)
        result["maintenance_steps"] = maintenance_steps(maintenance_logs(config))
        if args.burst > 0:
            result["incident"] = measure_incident(stack, config, args.burst, t0)
            result["incident"]["evaluator"] = evaluation_figures(evaluator_logs(config))
        result["dag_runs"] = all_dag_runs(api, start_wall - timedelta(minutes=5))
        result["page_marker"] = "data-numbers" if "data-numbers" in probes.markers else "sql-source"
        progress = read_progress_log(config, max_bytes=16 * 1024 * 1024)
        result["phases"] = {
            name: {**phase_figures(r["samples"], r["loads"], progress, r["start_ms"], r["end_ms"]),
                   "cores_by_role": r.get("cores_by_role", {})}
            for name, r in raw.items()
        }
        result["targets"] = targets(result["phases"]) + incident_target(result.get("incident"))
        result["samples"] = {name: {"samples": r["samples"], "loads": r["loads"]} for name, r in raw.items()}
    except KeyboardInterrupt as exc:
        failure = f"interrupted ({exc or 'SIGINT'})"
    except Exception as exc:
        failure = repr(exc)
        import traceback

        traceback.print_exc()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the shutdown short
        if probes is not None:
            probes.close()
        stopped = stack.down()
        _say(t0, "stopped: " + (", ".join(stopped) or "nothing was running"))
        left = kill_orphans(work)
        if left:
            _say(t0, f"killed processes left behind: {left}")
        result["leftover_processes"] = left
        result["total_seconds"] = round(time.monotonic() - t0, 1)
    if failure is not None:
        print(f"benchmarks.local_run failed: {failure}; work folder {work}", file=sys.stderr)
        return 1
    md = markdown(result)
    print(md)
    if not args.no_save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "local_run.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        (RESULTS / "local_run.md").write_text(md)
    if args.keep:
        print(f"work folder kept: {work}")
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    from benchmarks.signals import interrupt_on_stop_signals

    interrupt_on_stop_signals()  # a SIGTERM stops the stack this run started, as Ctrl-C does
    raise SystemExit(main())
