"""The chaos run's batch-side jobs: those beside the stream during the fault phase, the batch layer's jobs at the
end, and Airflow's runs of them (see :mod:`benchmarks.chaos`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shlex
import subprocess
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchmarks import chaos_logic as cl
from benchmarks.chaos_setup import Clock, _now, _wait
from kdq.config import Config

log = logging.getLogger("kdq.chaos")


class Jobs:
    """The jobs that write the stream's tables beside it during the fault phase (issue 23, second edition).

    Each planned job (:func:`benchmarks.chaos_logic.plan_jobs`) runs in its own thread at its time, the way
    an operator starts it: the rebuilds and the maintenance as runs of their DAGs (REST API, the Trigger
    form's call), the recompute backfill as an Airflow backfill of ``kdq_hourly_recompute`` over the
    intervals that already ran (``reprocess_behavior = completed``), the archive backfill as
    ``spark_jobs/archive_from_kafka.py`` over the whole traffic so far (what ``kdq job archive_from_kafka``
    runs). Each thread then follows its job to the end (deadline ``job_timeout``) and records what
    happened. Meanwhile the recompute DAG runs on its own, shortened schedule.
    """

    def __init__(self, stack, config: Config, clock: Clock, seed: int, args: argparse.Namespace, work: Path,
                 topics: list[str], traffic_started: datetime, recompute_start: datetime,
                 job_timeout: float = 1800.0) -> None:
        self.stack = stack
        self.config = config
        self.clock = clock
        self.seed = seed
        self.args = args
        self.work = work
        self.topics = topics
        self.traffic_started = traffic_started
        self.recompute_start = recompute_start  # the recompute DAG's start date
        self.job_timeout = job_timeout
        self.rng = random.Random(seed + 30)
        self.stop = threading.Event()  # teardown: stop following
        self.done: list[dict] = []
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.plan: list[cl.PlannedJob] = []

    def start(self, window_s: float) -> None:
        a = self.args
        self.plan = cl.plan_jobs(self.rng, window_s, rebuilds=a.rebuilds, maintenance=a.maintenance_runs,
                                 backfills=a.backfills, archive_backfills=a.archive_backfills)
        log.info("job plan: %s", [f"{j.kind}#{j.n}@{j.at_s:.0f}s" for j in self.plan])
        for job in self.plan:
            thread = threading.Thread(target=self._run, args=(job,), daemon=True, name=f"job-{job.kind}-{job.n}")
            self.threads.append(thread)
            thread.start()

    def join(self, timeout: float) -> bool:
        """Wait for every job thread; False when one is still following its job at the deadline."""
        deadline = _now() + timeout
        for thread in self.threads:
            thread.join(max(0.1, deadline - _now()))
        return not any(t.is_alive() for t in self.threads)

    def _run(self, job: cl.PlannedJob) -> None:
        if self.stop.wait(max(0.0, self.clock.t0 + job.at_s - _now())):
            return
        row: dict = {"t": self.clock.t(), "kind": job.kind, "run": job.n}
        started = _now()
        try:
            action = {cl.REBUILD: self._rebuild, cl.MAINTENANCE: self._maintenance, cl.BACKFILL: self._backfill,
                      cl.ARCHIVE_BACKFILL: self._archive_backfill}[job.kind]
            action(job, row)
        except Exception as exc:
            log.exception("job %s failed", job.kind)
            row["error"] = repr(exc)[:500]
            row.setdefault("state", "error")
        row["seconds"] = round(_now() - started, 1)
        with self.lock:
            self.done.append(row)
        log.info("JOB %s", row)

    # -- through Airflow ------------------------------------------------------------------------------

    def _trigger(self, dag_id: str, run_id: str, conf: dict) -> None:
        response = self.stack.airflow.api().request(
            "POST", f"dags/{dag_id}/dagRuns", json={"dag_run_id": run_id, "logical_date": None, "conf": conf}
        )
        if response.status_code not in (200, 201):
            raise RuntimeError(f"triggering {dag_id}: {response.status_code} {response.text[:300]}")

    def _follow(self, dag_id: str, run_id: str) -> str:
        """The run's final state, polling until it ends (``timeout`` at the deadline)."""
        state = _wait(lambda: self._ended(dag_id, run_id), self.job_timeout, interval=5.0, stop=self.stop)
        return state or ("stopped following" if self.stop.is_set() else "timeout")

    def _ended(self, dag_id: str, run_id: str) -> str | None:
        state = self.stack.airflow.api().get(f"dags/{dag_id}/dagRuns/{run_id}")["state"]
        return state if state in ("success", "failed") else None

    def _rebuild(self, job: cl.PlannedJob, row: dict) -> None:
        hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        run_id = f"chaos_rebuild_{job.n}_{self.seed}"
        conf = {"from": hour.isoformat(), "to": (hour + timedelta(hours=1)).isoformat(), "topics": "",
                "reason": "chaos run: a rebuild of the hour the stream is writing"}
        row["what"] = f"kdq_rebuild run {run_id}: windows [{hour:%H:%M}, {hour + timedelta(hours=1):%H:%M}) of every topic"
        self._trigger("kdq_rebuild", run_id, conf)
        row["state"] = self._follow("kdq_rebuild", run_id)

    def _maintenance(self, job: cl.PlannedJob, row: dict) -> None:
        run_id = f"chaos_maintenance_{job.n}_{self.seed}"
        row["what"] = f"kdq_maintenance run {run_id} (compaction, retention, vacuum of every table)"
        self._trigger("kdq_maintenance", run_id, {})
        row["state"] = self._follow("kdq_maintenance", run_id)

    def _backfill(self, job: cl.PlannedJob, row: dict) -> None:
        """An Airflow backfill of the recompute intervals whose scheduled runs ended (re-run: the backfill
        recomputes what the schedule already did, beside the stream and the scheduled runs)."""
        api = self.stack.airflow.api()

        def ended_runs() -> list[dict]:
            runs = api.get("dags/kdq_hourly_recompute/dagRuns", limit=100)["dag_runs"]
            return [r for r in runs if r["state"] in ("success", "failed") and r.get("run_type") == "scheduled"]

        ended = _wait(ended_runs, 600, interval=10.0, stop=self.stop)
        if not ended:
            row.update(state="skipped", what="no scheduled recompute run had ended within 10 min")
            return
        dates = sorted(r["logical_date"] for r in ended)
        body = {"dag_id": "kdq_hourly_recompute", "from_date": dates[0], "to_date": dates[-1],
                "reprocess_behavior": "completed", "max_active_runs": 1, "run_backwards": False, "dag_run_conf": {}}
        response = api.request("POST", "backfills", json=body)
        if response.status_code not in (200, 201):
            raise RuntimeError(f"creating the backfill: {response.status_code} {response.text[:300]}")
        backfill = response.json()
        row["what"] = (f"Airflow backfill {backfill.get('id')} of kdq_hourly_recompute, logical dates "
                       f"{dates[0][11:16]}-{dates[-1][11:16]} ({len(dates)} ended runs re-run)")

        def finished() -> dict | None:
            current = api.get(f"backfills/{backfill['id']}")
            return current if current.get("completed_at") else None

        done = _wait(finished, self.job_timeout, interval=5.0, stop=self.stop)
        runs = [r for r in api.get("dags/kdq_hourly_recompute/dagRuns", limit=100)["dag_runs"] if r.get("run_type") == "backfill"]
        states = Counter(r["state"] for r in runs)
        if not done:
            row["state"] = "timeout"
        elif not runs:
            row["state"] = "no runs"
        else:
            row["state"] = "success" if set(states) == {"success"} else "failed"
        row["detail"] = "backfill runs: " + (", ".join(f"{k} {n}" for k, n in sorted(states.items())) or "none")

    # -- a job run from the command line --------------------------------------------------------------

    def _archive_backfill(self, job: cl.PlannedJob, row: dict) -> None:
        end = datetime.now(UTC)
        args = [f"--topics={','.join(self.topics)}", f"--start-time={self.traffic_started.isoformat()}",
                f"--end-time={end.isoformat()}", f"--run-id=chaos-archive-{job.n}-{self.seed}"]
        row["what"] = (f"archive_from_kafka of every chaos topic, Kafka time {self.traffic_started:%H:%M:%S}-{end:%H:%M:%S} "
                       "(the stream is archiving the same records)")
        outcome = run_job(self.config, "archive_from_kafka", args, self.work / "jobs.log", timeout=self.job_timeout)
        s = outcome["summary"]
        row["state"] = "success" if outcome["exit_code"] == 0 else f"exit {outcome['exit_code']}"
        held = sum(int(part.get("held_back_for_stream") or 0) for part in s.get("partitions") or [] if isinstance(part, dict))
        row["detail"] = (f"read {s.get('rows_read')}, loaded {s.get('rows_loaded')}, already archived "
                         f"{s.get('rows_skipped_already_archived')}, held back for the stream {held}")
        row["summary"] = {k: v for k, v in s.items() if not isinstance(v, (list, dict))}

def run_job(config: Config, job: str, job_args: list[str], log_file: Path, timeout: float = 1800.0) -> dict:
    """A batch-layer job through spark-submit, as the CLI and Airflow run it; its JSON summary (last line)."""
    from kdq.spark.stream_process import child_env
    from kdq.spark.submit import submit_command

    command = submit_command(config, job, job_args)
    started = _now()
    with open(log_file, "ab") as out:
        out.write(f"\n$ {shlex.join(command)}\n".encode())
        out.flush()
        done = subprocess.run(command, env={**os.environ, **child_env(config)}, cwd=config.base_dir,
                              stdout=subprocess.PIPE, stderr=out, timeout=timeout, start_new_session=True)
        out.write(done.stdout)
    summary: dict = {}
    for line in reversed(done.stdout.decode(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                summary = json.loads(line)
                break
            except json.JSONDecodeError:
                continue
    return {"exit_code": done.returncode, "seconds": round(_now() - started, 1), "summary": summary}


def hours_between(start: datetime, end: datetime) -> list[datetime]:
    hour = start.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    hours = []
    while hour <= end:
        hours.append(hour)
        hour += timedelta(hours=1)
    return hours


def airflow_runs(airflow) -> dict:
    api = airflow.api()
    out: dict = {"runs": {}, "supervisor_runs": []}
    for dag in ("kdq_stream_supervisor", "kdq_hourly_recompute", "kdq_rebuild", "kdq_maintenance"):
        runs: list = []
        offset = 0
        while True:
            page = api.get(f"dags/{dag}/dagRuns", limit=100, offset=offset, order_by="run_after")["dag_runs"]
            runs += page
            offset += len(page)
            if len(page) < 100:
                break
        out["runs"][dag] = dict(Counter(r["state"] for r in runs))
        if dag == "kdq_stream_supervisor":
            out["supervisor_runs"] = [{"start": r.get("start_date"), "end": r.get("end_date"), "state": r["state"]} for r in runs]
        elif dag == "kdq_hourly_recompute":
            out["hourly_runs"] = [{"logical_date": r.get("logical_date"), "run_type": r.get("run_type"),
                                   "state": r["state"]} for r in runs]
    return out


def settle_recompute(airflow, timeout: float) -> str:
    """Stop the recompute DAG between two runs, and a line for the report.

    Pausing a DAG also stops the tasks of its running runs from being scheduled: a run paused between its
    recompute (corrections MERGEd) and its push would never push them, and the outputs would miss those
    corrections (the first full run of the second edition lost 83 counts in the metrics topic and InfluxDB
    that way, Delta exact). So the DAG is paused only while none of its runs is queued or running, checked
    again after the pause (a run created meanwhile unpauses it until that run ended)."""
    api = airflow.api()
    started = _now()

    def active() -> list[str]:
        runs = api.get("dags/kdq_hourly_recompute/dagRuns", limit=100, order_by="-run_after")["dag_runs"]
        return [r["dag_run_id"] for r in runs if r["state"] in ("queued", "running")]

    def set_paused(paused: bool) -> None:
        response = api.request("PATCH", "dags/kdq_hourly_recompute", json={"is_paused": paused})
        if response.status_code != 200:
            raise RuntimeError(f"could not (un)pause kdq_hourly_recompute: {response.status_code} {response.text[:200]}")

    while _now() < started + timeout:
        if not active():
            set_paused(True)
            if not active():
                return f"kdq_hourly_recompute paused between two runs, {_now() - started:.0f} s after the traffic ended"
            set_paused(False)
        time.sleep(5)
    set_paused(True)
    return (f"kdq_hourly_recompute paused with runs in flight after {timeout:.0f} s (cut off when Airflow stopped: "
            f"{active()})")
