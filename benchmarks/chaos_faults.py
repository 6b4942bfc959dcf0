"""The chaos run's fault driver and the monitor it reads: the stream watched every second, its driver killed at
chosen points of its micro-batches, the broker, InfluxDB and Airflow's scheduler restarted (see :mod:`benchmarks.chaos`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import psutil

from benchmarks import chaos_logic as cl
from benchmarks.chaos_setup import Clock, _iso_s, _now, _read_json, _wait
from kdq.config import Config

log = logging.getLogger("kdq.chaos")


# -- watching the stream --------------------------------------------------------------------------------


class Monitor(threading.Thread):
    """Polls the stream's process and state files every second and records what changed."""

    def __init__(self, config: Config, clock: Clock, log_file: Path) -> None:
        super().__init__(name="chaos-monitor", daemon=True)
        self.config = config
        self.clock = clock
        self.events: list[dict] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.log_file = log_file
        self.state: dict = {}

    def emit(self, kind: str, **data) -> None:
        event = {"t": self.clock.t(), "kind": kind, **data}
        with self.lock:
            self.events.append(event)
        with open(self.log_file, "a") as out:
            out.write(json.dumps(event) + "\n")
        if kind not in ("batch_committed",):
            log.info("event %s", event)

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.events)

    def run(self) -> None:
        from kdq.spark.stream_process import stream_process

        folder = self.config.data_dir / "stream"
        last: dict = {}
        while not self.stop.wait(1.0):
            try:
                proc = stream_process(self.config).process()
                pid = proc.pid if proc else None
                if pid != last.get("pid"):
                    if last.get("pid"):
                        self.emit("stream_gone", pid=last["pid"])
                    if pid:
                        self.emit("stream_started", pid=pid)
                    last["pid"] = pid
                progress = _read_json(folder / "progress.json") or {}
                mark = (progress.get("batch_id"), progress.get("timestamp"))
                if progress and mark != last.get("progress"):
                    seconds = ((progress.get("duration_ms") or {}).get("triggerExecution") or 0) / 1000
                    self.emit("batch_committed", batch_id=progress.get("batch_id"), rows=progress.get("input_rows"),
                              replayed=progress.get("replayed"), influx_ok=progress.get("influx_ok"),
                              seconds=round(seconds, 1))
                    last["progress"] = mark
                    self.state["progress"] = progress
                supervisor = _read_json(folder / "supervisor_state.json") or {}
                if supervisor.get("last_restart") and supervisor.get("last_restart") != last.get("supervisor"):
                    self.emit("supervisor_restart", restarts=supervisor.get("restarts"), pid=supervisor.get("pid"),
                              hung_batch=supervisor.get("hung_batch"))
                    last["supervisor"] = supervisor.get("last_restart")
                failure = _read_json(folder / "batch_failure.json")
                mark = (failure["batch_id"], failure.get("attempts")) if failure else None
                if mark != last.get("failure"):
                    if failure:
                        self.emit("batch_failure", batch_id=failure["batch_id"], attempts=failure.get("attempts"),
                                  failure_kind=failure.get("kind"), error=(failure.get("error") or "")[:300])
                    last["failure"] = mark
                pending = (_read_json(folder / "influx_push_state.json") or {}).get("pending_since_ms")
                if pending != last.get("pending"):
                    self.emit("influx_pending" if pending else "influx_caught_up", since_ms=pending)
                    last["pending"] = pending
            except Exception as exc:  # a monitor must never stop the run
                log.debug("monitor: %s", exc)


# -- faults ---------------------------------------------------------------------------------------------


def _family(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return [proc]


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """The processes still alive after ``timeout``. A zombie counts as gone: it has exited, and its parent
    just has not reaped it yet (``airflow standalone`` never waits for a part that exited)."""

    def alive(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    deadline = _now() + timeout
    left = [p for p in procs if alive(p)]
    while left and _now() < deadline:
        time.sleep(0.2)
        left = [p for p in left if alive(p)]
    return left


def _where(proc: psutil.Process) -> dict:
    """What a lingering process is blocked in: its threads' kernel wait channels, and its Python stacks
    when py-spy is installed (a diagnostic only; the run does not need it)."""
    out: dict = {"pid": proc.pid}
    try:
        out["status"] = proc.status()
        out["parent"] = proc.ppid()
        channels: Counter = Counter()
        for task in Path(f"/proc/{proc.pid}/task").iterdir():
            channels[(task / "wchan").read_text().strip() or "running"] += 1
        out["threads_by_wait_channel"] = dict(channels)
    except OSError:
        pass
    spy = shutil.which("py-spy")
    if spy:
        try:
            dump = subprocess.run([spy, "dump", "--pid", str(proc.pid)], capture_output=True, text=True, timeout=60)
            out["py_spy"] = dump.stdout[-6000:]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return out


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


class Faults:
    """Runs the planned faults and the stream kills, each in its own thread, and records what it did."""

    def __init__(self, stack, config: Config, clock: Clock, monitor: Monitor, seed: int, args: argparse.Namespace,
                 work: Path) -> None:
        self.stack = stack
        self.config = config
        self.clock = clock
        self.monitor = monitor
        self.args = args
        self.work = work
        self.stop = threading.Event()  # the fault phase is over: no new faults
        self.abort = threading.Event()  # teardown: cut an outage short
        # No stream kill while InfluxDB is down: the outage must meet a running stream, whose failed
        # pushes are recorded for the catch-up (otherwise kills could keep it from pushing at all).
        self.influx_down = threading.Event()
        self.down: set[str] = set()  # components a fault thread has stopped on purpose, right now
        self.kill_rng = random.Random(seed + 10)
        self.plan_rng = random.Random(seed + 20)
        self.done: list[dict] = []
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.replacement_scheduler = None
        self.fault_end = 0.0  # monotonic time the fault phase should end (moved by the driver)
        self.kills = 0
        self.recovery_estimate = 90.0
        self.plan: list[cl.PlannedFault] = []

    def record(self, fault: dict) -> None:
        with self.lock:
            self.done.append(fault)
        log.info("FAULT %s", fault)

    def start(self, window_s: float) -> None:
        self.plan = cl.plan_faults(
            self.plan_rng, window_s, broker_restarts=self.args.broker_restarts,
            influx_outage_s=self.args.influx_outage_seconds, scheduler_restarts=self.args.scheduler_restarts,
        )
        log.info("fault plan: %s", [f"{f.kind}@{f.at_s:.0f}s" for f in self.plan])
        for fault in self.plan:
            self.threads.append(threading.Thread(target=self._guarded, args=(self._planned, fault), daemon=True,
                                                 name=f"fault-{fault.kind}"))
        self.threads.append(threading.Thread(target=self._guarded, args=(self._kill_loop,), daemon=True, name="fault-kills"))
        for thread in self.threads:
            thread.start()

    def _guarded(self, target, *args) -> None:
        try:
            target(*args)
        except Exception as exc:
            log.exception("fault thread failed")
            self.record({"t": self.clock.t(), "kind": "driver_error", "error": repr(exc)})

    def join(self, timeout: float) -> None:
        deadline = _now() + timeout
        for thread in self.threads:
            thread.join(max(0.1, deadline - _now()))

    # -- planned faults -------------------------------------------------------------------------------

    def _planned(self, fault: cl.PlannedFault) -> None:
        if self.stop.wait(max(0.0, self.clock.t0 + fault.at_s - _now())):
            return
        action = {cl.BROKER_RESTART: self._broker, cl.INFLUX_OUTAGE: self._influx, cl.SCHEDULER_RESTART: self._scheduler}
        action[fault.kind](fault)

    def _broker(self, fault: cl.PlannedFault) -> None:
        t = self.clock.t()
        kafka = self.stack.kafka
        row = {"t": t, "kind": fault.kind, "how": fault.how, "planned_down_s": fault.down_s}
        proc = kafka.process.process()
        self.down.add("kafka")
        try:
            if fault.how == "sigkill" and proc is not None:
                os.killpg(proc.pid, signal.SIGKILL)
                psutil.wait_procs([proc], timeout=30)
            else:
                kafka.stop()
            stopped = _now()
            self.abort.wait(fault.down_s)
            kafka.start(timeout=300)
            row["down_s"] = round(_now() - stopped, 1)
        except Exception as exc:
            row["error"] = repr(exc)[:500]
            try:
                kafka.start(timeout=300)
            except Exception as again:
                row["error"] += f"; restart failed: {again!r}"[:500]
        finally:
            self.down.discard("kafka")
        row["end_t"] = self.clock.t()
        self.record(row)

    def _influx(self, fault: cl.PlannedFault) -> None:
        influx = self.stack.influx
        row = {"t": self.clock.t(), "kind": fault.kind}
        self.influx_down.set()
        self.down.add("influxdb")
        try:
            influx.stop()
            stopped = _now()
            self.abort.wait(fault.down_s)  # the whole outage, even when the fault phase ends meanwhile
            influx.start(timeout=120)
            self.influx_down.clear()
            row["down_s"] = round(_now() - stopped, 1)
        except Exception as exc:
            row["error"] = repr(exc)[:500]
            influx.start(timeout=120)
        finally:
            self.influx_down.clear()
            self.down.discard("influxdb")
        row["end_t"] = self.clock.t()
        self.record(row)

    def _scheduler(self, fault: cl.PlannedFault) -> None:
        """SIGTERM the scheduler standalone started, start a replacement ``airflow scheduler`` with the same
        environment, and wait until Airflow reports a healthy scheduler again."""
        from kdq.procs import ManagedProcess

        airflow = self.stack.airflow
        row = {"t": self.clock.t(), "kind": fault.kind, "how": "scheduler alone (standalone keeps its other parts)"}
        started = _now()
        try:
            standalone = airflow.process.process()
            if standalone is None:
                raise RuntimeError("airflow standalone is not running")
            old = [p for p in standalone.children() if _cmdline(p).split()[-1:] == ["scheduler"]]
            if len(old) != 1:
                raise RuntimeError(f"expected one scheduler child of standalone, found {[_cmdline(p) for p in old]}")
            row["old_pid"] = old[0].pid
            # Airflow's own way: SIGTERM; its LocalExecutor then waits for running tasks ("signal again
            # if you don't want to wait"), so a second SIGTERM after 30 s, and SIGKILL as the last resort.
            old[0].terminate()
            alive = _wait_gone(old, timeout=30)
            if alive:
                row["second_sigterm"] = True
                for proc in alive:
                    proc.terminate()
                alive = _wait_gone(alive, timeout=60)
            for proc in alive:
                row["old_scheduler_killed"] = True
                row["old_scheduler_blocked_in"] = _where(proc)
                proc.kill()
            row["stopped_after_s"] = round(_now() - started, 1)
            command, env = airflow.command("scheduler")
            self.replacement_scheduler = ManagedProcess(
                name="airflow-scheduler", pid_file=self.work / "replacement-scheduler.pid",
                log_file=self.work / "replacement-scheduler.log", marker="scheduler",
            )
            new_since = time.time()
            row["new_pid"] = self.replacement_scheduler.start(command, env=env, cwd=self.config.base_dir)

            def scheduler_healthy() -> bool:
                # Healthy = a heartbeat within the last 30 s: it must be the new scheduler's own.
                scheduler = airflow.health().get("scheduler") or {}
                beat = _iso_s(scheduler.get("latest_scheduler_heartbeat"))
                return (scheduler.get("status") == "healthy" and beat is not None and beat > new_since
                        and self.replacement_scheduler.running())

            ok = _wait(scheduler_healthy, 300, interval=2.0)
            row["healthy_after_s"] = round(_now() - started, 1) if ok else None
            if not ok:
                row["error"] = "scheduler not healthy within 300 s"
        except Exception as exc:
            row["error"] = repr(exc)[:500]
        row["end_t"] = self.clock.t()
        self.record(row)

    # -- stream kills ---------------------------------------------------------------------------------

    def _kill_loop(self) -> None:
        from kdq.spark.stream_process import stream_process

        folder = self.config.data_dir / "stream"
        last_kill: float | None = None
        while not self.stop.is_set():
            proc = stream_process(self.config).process()
            if proc is None or self.influx_down.is_set():
                self.stop.wait(1.0)
                continue
            try:
                born_ms = proc.create_time() * 1000
            except psutil.Error:
                continue
            current = _read_json(folder / "current_batch.json") or {}
            if int(current.get("started_ms") or 0) < born_ms - 1000:
                self.stop.wait(0.5)  # no micro-batch of this process yet (JVM start-up)
                continue
            if last_kill is not None:  # how long a kill costs until the next batch runs: the delay budget
                self.recovery_estimate = 0.5 * self.recovery_estimate + 0.5 * (_now() - last_kill)
                last_kill = None
            remaining = self.fault_end - _now()
            mode, delay = cl.plan_kill(self.kill_rng, remaining, self.args.kills - self.kills, self.recovery_estimate,
                                       self.batch_seconds())
            target = cl.kill_target(self.kill_rng)
            if mode == cl.AFTER_COMMIT:
                committed = _wait(lambda b=born_ms, p=proc: self._committed_since(b, p), 600, interval=0.5, stop=self.stop)
                if self.stop.is_set():
                    return
                if committed is None or committed == "gone":
                    continue  # it died meanwhile (a broker restart) or never committed: start over
            if self.stop.wait(delay):
                return
            if self.influx_down.is_set():
                continue
            if not proc.is_running() or stream_process(self.config).process() is None:
                continue  # it died meanwhile (a broker restart); wait for the next one
            self._kill(proc, target, folder, mode, delay)
            last_kill = _now()

    def _committed_since(self, born_ms: float, proc: psutil.Process) -> str | None:
        """"yes" once ``proc`` committed a micro-batch, "gone" if it died first, None while neither."""
        if not proc.is_running():
            return "gone"
        try:
            written = (self.config.data_dir / "stream" / "progress.json").stat().st_mtime * 1000
        except FileNotFoundError:
            return None
        return "yes" if written > born_ms else None

    def batch_seconds(self) -> float:
        """Median duration of the last committed micro-batches (what a kill delay spreads over)."""
        durations = sorted(
            e["seconds"] for e in self.monitor.snapshot()[-200:] if e["kind"] == "batch_committed" and e.get("seconds")
        )[-10:]
        return durations[len(durations) // 2] if durations else 30.0

    def _kill(self, proc: psutil.Process, target: str, folder: Path, mode: str, delay: float) -> None:
        current = _read_json(folder / "current_batch.json") or {}
        row = {
            "t": self.clock.t(), "kind": cl.STREAM_KILL, "target": target, "pid": proc.pid,
            "mode": mode, "delay_s": round(delay, 1),
            "batch_in_flight": current.get("batch_id") if current.get("state") == "running" else f"none (last {current.get('batch_id')} done)",
            "batch_age_s": round(time.time() - int(current.get("started_ms") or 0) / 1000, 1) if current.get("state") == "running" else None,
        }
        family = _family(proc)
        try:
            if target == "driver_process_group":
                os.killpg(proc.pid, signal.SIGKILL)
            elif target == "driver_jvm":
                proc.kill()
            else:
                drivers = [p for p in family[1:] if "stream_counts.py" in _cmdline(p)]
                if not drivers:
                    row["target"] = target = "driver_jvm (no python driver found)"
                    proc.kill()
                for driver in drivers:
                    row["killed_pid"] = driver.pid
                    driver.kill()
        except (ProcessLookupError, psutil.Error) as exc:
            row["error"] = repr(exc)
        killed_at = _now()
        alive = _wait_gone(family, timeout=30)
        self.kills += 1
        row["end_t"] = row["t"]
        self.record(row)
        if alive:
            # A driver JVM killed alone can leave its Python driver behind: watch how long it lingers.
            row["left_over_after_30s"] = [f"{p.pid} {_cmdline(p)[:80]}" for p in alive]
            threading.Thread(target=self._reap, args=(row, alive, killed_at), daemon=True, name="fault-reap").start()

    def _reap(self, row: dict, alive: list[psutil.Process], killed_at: float, patience: float = 180.0) -> None:
        still = _wait_gone(alive, timeout=max(0.0, killed_at + 60 - _now()))
        if still:
            row["left_over_at_60s"] = [_where(p) for p in still]
            still = _wait_gone(still, timeout=max(0.0, killed_at + patience - _now()))
        if not still:
            row["left_over_exited_after_s"] = round(_now() - killed_at, 1)
            return
        row["left_over_killed_after_s"] = round(_now() - killed_at, 1)
        for p in still:
            try:
                p.kill()
            except psutil.Error:
                pass

    def watch_components(self) -> None:
        """A component found dead that no fault stopped (something outside the run killed it; seen on the
        shared machine): recorded as an unplanned event and started again, so the rest of the run still
        tests the product. The report lists these apart from the planned faults."""
        components = {"kafka": self.stack.kafka, "influxdb": self.stack.influx, "airflow": self.stack.airflow}
        for name, component in components.items():
            if name in self.down or component.process.running():
                continue
            row = {"t": self.clock.t(), "kind": "unplanned_death", "component": name}
            log.error("%s is not running and no fault stopped it: starting it again", name)
            started = _now()
            try:
                if name == "airflow":
                    self.stop_replacement_scheduler()  # one scheduler per SQLite database
                    component.start(timeout=600)
                else:
                    component.start(timeout=300)
                row["restarted_after_s"] = round(_now() - started, 1)
            except Exception as exc:
                row["error"] = repr(exc)[:500]
            row["end_t"] = self.clock.t()
            self.record(row)

    def stop_replacement_scheduler(self) -> None:
        if self.replacement_scheduler is not None:
            self.replacement_scheduler.stop(timeout=60)
