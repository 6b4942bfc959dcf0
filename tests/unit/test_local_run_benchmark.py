"""`benchmarks.local_run`'s pure logic: what counts as the page's numbers, the machine's CPU share, the phase
figures from probes and progress records, and the run's targets (``targets``) as checks."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from benchmarks.local_run import (
    JOBS,
    QUIET,
    busy_percent,
    cores_by_role,
    cpu_times,
    evaluation_figures,
    evaluator_sentence,
    has_numbers,
    load_figures,
    markdown,
    numbers_state,
    page_figures,
    painted,
    phase_figures,
    process_cpu,
    process_role,
    sql_figures,
    stream_figures,
    targets,
)

PAGE_HEAD = "<!DOCTYPE html><html><head><script>const s='<body data-numbers=\"fresh\">';</script></head>"


def page(body_attrs: str = "", source: bool = True) -> str:
    line = '<p data-field="sql-source">Counts from ...</p>' if source else '<div data-field="sql-error">down</div>'
    return f'{PAGE_HEAD}<body{body_attrs}><p data-field="as-of" data-now-ms="1">As of</p>{line}</body></html>'


def test_the_body_tag_says_whether_the_numbers_are_fresh() -> None:
    assert numbers_state(page(' class="x" data-numbers="fresh"')) == "fresh"
    assert numbers_state(page(' data-numbers="stale"')) == "stale"
    assert numbers_state(page(' data-numbers="none"')) == "none"
    # Only the body tag counts: the same text inside the page's script is not the page's state.
    assert numbers_state(page()) is None
    assert has_numbers(page(' data-numbers="fresh"'))
    # A page that says its numbers are stale has none yet, even with its source line.
    assert not has_numbers(page(' data-numbers="stale"'))
    assert not has_numbers(page(' data-numbers="none"', source=False))


def test_a_page_without_the_attribute_has_numbers_when_it_names_their_source() -> None:
    assert has_numbers(page())
    assert not has_numbers(page(source=False))
    assert painted(page(source=False))
    assert not painted("<html><body>Sign in</body></html>")


PROC_STAT = """cpu  100 10 50 800 40 0 0 0 0 0
cpu0 50 5 25 400 20 0 0 0 0 0
intr 1 2 3
"""


def test_cpu_busy_share_between_two_readings() -> None:
    assert cpu_times(PROC_STAT) == (160, 1000)  # idle 800 and iowait 40 are not busy
    later = "cpu  190 10 60 850 50 0 0 0 0 0\n"
    assert cpu_times(later) == (260, 1160)
    assert busy_percent((160, 1000), (260, 1160)) == 62.5
    assert busy_percent((160, 1000), (160, 1000)) is None
    with pytest.raises(ValueError):
        cpu_times("intr 1 2 3\n")


def test_page_figures_count_a_missed_deadline_as_the_deadline_and_leave_failures_out() -> None:
    samples = [
        {"kind": "page", "first_paint_s": 0.2, "numbers_s": 0.2, "polls": 1},
        {"kind": "page", "first_paint_s": 0.4, "numbers_s": 1.5, "polls": 5},
        {"kind": "page", "first_paint_s": 0.6, "numbers_s": None, "polls": 100},
        {"kind": "page", "error": "HTTP 500"},
    ]
    figures = page_figures(samples, deadline_s=30.0)
    assert figures["first_paint"] == {"n": 3, "p50": 0.4, "p95": 0.58}
    assert figures["numbers"]["n"] == 3 and figures["numbers"]["p50"] == 1.5
    assert figures["numbers"]["p95"] == pytest.approx(27.15)  # 1.5 + 0.9 * (30 - 1.5)
    assert figures["numbers_missed"] == 1
    assert figures["fresh_on_first_response"] == 1
    assert figures["errors"] == ["HTTP 500"]


def test_sql_figures_take_the_median_per_door_without_cold_queries_and_errors() -> None:
    samples = [
        {"kind": "connect", "cold_seconds": 4.0},
        {"kind": "connect", "seconds": 0.5},
        {"kind": "connect", "seconds": 0.9},
        {"kind": "connect", "seconds": 0.6},
        {"kind": "jdbc", "seconds": 1.4, "cold_seconds": 2.0},
        {"kind": "jdbc", "error": "beeline exited 1"},
        {"kind": "page", "seconds": 99},
    ]
    figures = sql_figures(samples)
    assert figures["connect"] == {"n": 3, "median": 0.6, "max": 0.9, "errors": []}
    assert figures["jdbc"] == {"n": 1, "median": 1.4, "max": 1.4, "errors": ["beeline exited 1"]}
    assert figures["kdq_sql"] == {"n": 0, "median": None, "max": None, "errors": []}


def test_load_figures() -> None:
    loads = [
        {"load_1m": 2.0, "cpu_busy_percent": None},
        {"load_1m": 4.0, "cpu_busy_percent": 80.0},
        {"load_1m": 6.5, "cpu_busy_percent": 100.0},
    ]
    assert load_figures(loads) == {
        "load_1m_mean": 4.17,
        "load_1m_max": 6.5,
        "cpu_busy_percent_mean": 90.0,
        "cpu_busy_percent_max": 100.0,
        "n": 3,
    }
    assert load_figures([])["load_1m_mean"] is None


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def progress(batch_id: int, at: str, duration_ms: int, newest: int | None, oldest: int | None, rows: int = 100) -> dict:
    record = {
        "batch_id": batch_id,
        "timestamp": f"{at}Z",
        "input_rows": rows,
        "duration_ms": {"triggerExecution": duration_ms, "addBatch": duration_ms - 10},
    }
    if newest is not None:
        record["end_to_end_latency_ms"] = {"newest": newest, "oldest": oldest}
    return record


def test_stream_figures_take_the_batches_triggered_in_the_phase() -> None:
    records = [
        progress(1, "2026-11-27T10:00:55.000", 9000, 9500, 40000),  # before the phase
        progress(2, "2026-11-27T10:01:00.000", 2000, 2500, 30000),
        progress(3, "2026-11-27T10:01:05.000", 4000, 4600, 50000, rows=0),
        progress(3, "2026-11-27T10:01:06.000", 3000, 3600, 45000),  # batch 3 again (a restart): the last one counts
        progress(4, "2026-11-27T10:01:10.000", 1000, None, None),  # no latency (nothing counted)
        progress(5, "2026-11-27T10:02:00.000", 7000, 7500, 9000),  # at the phase's end: the next phase's
        {"batch_id": 6, "timestamp": None},
    ]
    figures = stream_figures(records, ms("2026-11-27T10:01:00"), ms("2026-11-27T10:02:00"))
    assert figures["batches"] == 3 and (figures["first_batch_id"], figures["last_batch_id"]) == (2, 4)
    assert figures["rows"] == 300
    assert figures["batch_seconds"] == {"n": 3, "p50": 2.0, "p99": 2.98}
    assert figures["batch_seconds_max"] == 3.0
    assert figures["visible_newest_seconds"] == {"n": 2, "p50": 3.05, "p99": 3.589}
    assert figures["visible_oldest_seconds"]["p50"] == 37.5
    empty = stream_figures(records, ms("2026-11-27T11:00:00"), ms("2026-11-27T12:00:00"))
    assert empty["batches"] == 0 and empty["batch_seconds"]["p99"] is None


def figures(
    numbers_p95: float, paint_p95: float, connect: float | None, jdbc: float, kdq_sql: float, newest_p99: float | None
) -> dict:
    return {
        "page": {"numbers": {"p95": numbers_p95}, "first_paint": {"p95": paint_p95}},
        "sql": {"connect": {"median": connect}, "jdbc": {"median": jdbc}, "kdq_sql": {"median": kdq_sql}},
        "stream": {"visible_newest_seconds": {"p99": newest_p99}},
    }


def test_targets_hold_per_phase_and_the_stream_ratio_compares_the_phases() -> None:
    checks = targets({QUIET: figures(1.5, 0.8, 0.7, 0.9, 2.0, 5.0), JOBS: figures(2.5, 0.9, None, 1.0, 3.1, 6.0)})
    by = {(c["target"], c["phase"]): c["ok"] for c in checks}
    assert by[("page numbers p95 <= 2 s", QUIET)] is True
    assert by[("page numbers p95 <= 2 s", JOBS)] is False
    assert by[("page first paint p95 <= 1 s", JOBS)] is True
    assert by[("SQL median <= 1 s: Spark Connect", JOBS)] is False  # not measured: not met
    assert by[("SQL median <= 1 s: JDBC", JOBS)] is True  # the limit itself is met
    assert by[("`kdq sql` <= 3 s (median, prompt to table)", JOBS)] is False
    ratio = checks[-1]
    assert (ratio["value"], ratio["ok"]) == (1.2, True)
    worse = targets({QUIET: figures(1, 1, 1, 1, 1, 5.0), JOBS: figures(1, 1, 1, 1, 1, 6.1)})[-1]
    assert (worse["value"], worse["ok"]) == (1.22, False)
    unmeasured = targets({QUIET: figures(1, 1, 1, 1, 1, None), JOBS: figures(1, 1, 1, 1, 1, 6.1)})[-1]
    assert (unmeasured["value"], unmeasured["ok"]) == (None, False)


def test_markdown_shows_both_phases_the_checks_and_the_jobs() -> None:
    records = [
        progress(1, "2026-11-27T10:00:10.000", 2000, 2500, 30000),
        progress(2, "2026-11-27T10:05:10.000", 3000, 3500, 30000),
    ]
    samples = [
        {"kind": "page", "first_paint_s": 0.3, "numbers_s": 0.3, "polls": 1},
        {"kind": "connect", "seconds": 0.4},
        {"kind": "jdbc", "seconds": 0.5},
        {"kind": "kdq_sql", "seconds": 1.1},
    ]
    loads = [{"load_1m": 3.0, "cpu_busy_percent": 70.0}]
    phases = {
        QUIET: phase_figures(samples, loads, records, ms("2026-11-27T10:00:00"), ms("2026-11-27T10:05:00")),
        JOBS: phase_figures(samples, loads, records, ms("2026-11-27T10:05:00"), ms("2026-11-27T10:10:00")),
    }
    result = {
        "phases": phases,
        "targets": targets(phases),
        "page_marker": "sql-source",
        "parameters": {"interval_seconds": 5, "demo_args": "", "allowed_lateness_seconds": 60},
        "job_runs": [
            {
                "dag_id": "kdq_maintenance",
                "run_id": "r1",
                "state": "success",
                "seconds": 41.0,
                "tasks": [{"task_id": "optimize", "state": "success", "queued_seconds": 2.5, "seconds": 38.1}],
            }
        ],
    }
    text = markdown(result)
    assert "| page first paint, p50 / p95 | 0.3 s / 0.3 s (n 1) | 0.3 s / 0.3 s (n 1) |" in text
    assert "| stream batch duration, p50 / p99 | 2.0 s / 2.0 s (n 1) | 3.0 s / 3.0 s (n 1) |" in text
    assert "| stream p99 produce -> visible, daily jobs / quiet <= 1.2 | daily jobs running | 1.4 x | **no** |" in text
    assert "`kdq_maintenance` run `r1`: **success**, 41.0 s" in text
    assert "  * task `optimize`: success, queued 2.5 s, ran 38.1 s" in text
    assert 'data-field=\\"sql-source\\"' not in text and "sql-source" in text


def test_the_evaluators_steps_from_its_task_logs() -> None:
    """The evaluator's log line per evaluation (as spark-submit's output inside Airflow's JSON task log) gives
    the evaluations, the seconds between them and each step's seconds."""
    def line(stamp: str, read: float, write: float) -> str:
        return ('{"timestamp":"x","event":"' + stamp + ',123 INFO kdq.spark.expectations: expectations: minutes '
                f'29000..29179 at window_counts v12: 4 verdicts, 0 violated, 0 rows changed, 0 notifications '
                f'(read {read} s, judge 0.0 s, sample 0.0 s, write {write} s)","logger":"airflow.task.hooks"}}\n')

    logs = [line("2026-11-28 08:00:00", 2.5, 0.1) + "unrelated line (read 99 s)\n" + line("2026-11-28 08:00:20", 3.5, 0.3),
            line("2026-11-28 08:00:50", 9.0, 0.2)]
    figures = evaluation_figures(logs)
    assert figures["evaluations"] == 3
    assert figures["seconds_between"] == {"median": 25.0, "max": 30.0}
    assert figures["step_seconds"]["read"] == {"median": 3.5, "max": 9.0}
    assert figures["step_seconds"]["write"] == {"median": 0.2, "max": 0.3}
    assert "3 times" in evaluator_sentence(figures) and "read 3.5 s (max 9.0)" in evaluator_sentence(figures)
    assert evaluation_figures([]) == {"evaluations": 0, "step_seconds": {}} and evaluator_sentence(None) == ""
def test_processes_are_counted_by_role_in_cores_over_the_phase(tmp_path) -> None:
    def proc(pid: int, cmdline: str, ticks: tuple[int, int]) -> None:
        folder = tmp_path / str(pid)
        folder.mkdir(exist_ok=True)
        (folder / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode())
        rest = " ".join(["S", *["0"] * 10, str(ticks[0]), str(ticks[1]), *["0"] * 5])
        (folder / "stat").write_text(f"{pid} (java (x)) {rest}\n")

    proc(10, "java -cp x org.apache.spark.deploy.SparkSubmit /p/spark_jobs/stream_counts.py", (100, 20))
    proc(11, "java -cp x SparkSubmit /p/spark_jobs/evaluate_expectations.py --every=15", (50, 10))
    (tmp_path / "self").mkdir()
    before = process_cpu(tmp_path)
    assert before == {10: ("stream", 120), 11: ("expectations", 60)}
    proc(10, "java -cp x org.apache.spark.deploy.SparkSubmit /p/spark_jobs/stream_counts.py", (200, 40))
    proc(12, "python spark_jobs/batch_recompute.py --start=x", (30, 0))  # started during the phase
    proc(13, "/usr/bin/java kafka.Kafka server.properties", (10, 0))
    after = process_cpu(tmp_path)
    # 120 more ticks of the stream over 10 s at 100 ticks/s: 0.12 cores; a new process counts from zero.
    assert cores_by_role(before, after, 10.0) == {"stream": 0.12, "batch jobs": 0.03, "kafka": 0.01}
    assert process_role("/v/bin/python -m kdq.cli --config k.toml demo") == "demo traffic"
    assert process_role("bash") == "other"


def test_the_maintenance_steps_from_its_task_log() -> None:
    """The maintenance job logs each step as it begins (inside Airflow's JSON task log): the steps in order, the
    ones its plan skipped, and each step's seconds until the next began; the section lists those that ran."""
    from benchmarks.local_run import maintenance_section, maintenance_steps

    def line(stamp: str, step: str) -> str:
        return ('{"timestamp":"x","event":"' + stamp + ' INFO kdq.maintenance: maintenance: ' + step
                + '","logger":"airflow.task.hooks"}\n')

    log = (line("2026-11-29 05:38:10,500", "OPTIMIZE raw_archive skipped: no closed partition has files added since it was compacted")
           + line("2026-11-29 05:38:11,000", "VACUUM raw_archive FULL RETAIN 168 HOURS")
           + "unrelated INFO kdq.maintenance: something else\n"
           + line("2026-11-29 05:40:41,250", "VACUUM window_counts FULL RETAIN 168 HOURS"))
    steps = maintenance_steps([log])
    assert [(s["step"], s["skipped"], s["seconds"]) for s in steps] == [
        ("OPTIMIZE raw_archive", "no closed partition has files added since it was compacted", 0.5),
        ("VACUUM raw_archive FULL RETAIN 168 HOURS", None, 150.2),
        ("VACUUM window_counts FULL RETAIN 168 HOURS", None, None),
    ]
    section = maintenance_section(steps)
    assert "(1 of 3 skipped by its plan" in section
    assert "  * 05:38:11 VACUUM raw_archive FULL RETAIN 168 HOURS: 150.2 s" in section
    assert "  * 05:40:41 VACUUM window_counts FULL RETAIN 168 HOURS: until the end" in section
    assert maintenance_steps([]) == [] and maintenance_section([]) == ""


def test_the_maintenance_plan_task_alone() -> None:
    """No Spark job ran (the plan task found nothing to do): its steps, read from Airflow's JSON lines."""
    from benchmarks.local_run import maintenance_section, maintenance_steps

    def line(stamp: str, step: str) -> str:
        return ('{"timestamp":"' + stamp + '","level":"info","event":"maintenance: ' + step
                + '","logger":"kdq.maintenance","ti_id":"x","task_id":"plan"}\n')

    log = (line("2026-11-29T16:14:49.334323Z", "VACUUM incidents FULL RETAIN 168 HOURS skipped: the table is younger")
           + line("2026-11-29T16:14:49.100000Z", "OPTIMIZE raw_archive skipped: no closed partition"))
    steps = maintenance_steps([log])
    assert [(s["step"], s["skipped"], s["at"], s["plan"]) for s in steps] == [
        ("OPTIMIZE raw_archive", "no closed partition", "16:14:49", True),
        ("VACUUM incidents FULL RETAIN 168 HOURS", "the table is younger", "16:14:49", True),
    ]
    assert maintenance_section(steps) == "\nThe maintenance's plan task (no Spark) found 0 of 2 steps to run: no Spark job.\n"


def test_each_probe_cycle_asks_every_door_once_in_its_own_order() -> None:
    """The page every other probe; the three SQL probes once per cycle in an order that changes between cycles, so
    that no door always meets the same moment of the product's periodic work (the expectations run every 15 s)."""
    from benchmarks.local_run import ROTATION, run_phase

    asked: list[str] = []

    class Probes:
        def __getattr__(self, kind: str):
            return lambda: asked.append(kind) or {"kind": kind}

    class Load:
        def sample(self) -> dict:
            return {"load_1m": 0.0, "cpu_busy_percent": 0.0}

    run_phase(Probes(), Load(), seconds=0.6, interval=0.01, t0=0.0, name="test")
    cycles = [asked[i:i + len(ROTATION)] for i in range(0, len(asked) - len(ROTATION) + 1, len(ROTATION))]
    assert len(cycles) >= 8, asked
    assert all(cycle[::2] == ["page"] * 3 for cycle in cycles)
    assert all(sorted(cycle[1::2]) == ["connect", "jdbc", "kdq_sql"] for cycle in cycles)
    assert len({tuple(cycle[1::2]) for cycle in cycles}) > 1  # not one fixed order
