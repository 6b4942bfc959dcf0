"""The chaos run (issue 13): the real product under faults, then every output against the ground truth.

    .venv/bin/python -m benchmarks.chaos                  # ~20 minutes of traffic and faults (make chaos)
    .venv/bin/python -m benchmarks.chaos --minutes 5      # a short run
    .venv/bin/python -m benchmarks.chaos --seed 42 --keep # reproduce a plan, keep the work folder

Starts its own stack in a temporary folder on free loopback ports: a KRaft Kafka broker, InfluxDB 1.x and
``airflow standalone`` with every kdq DAG unpaused; the ``kdq_stream_supervisor`` DAG starts the speed
layer (spark-submit) and must bring it back after every fault. Then, for ``--minutes``:

* a transactional producer sends valid, invalid, out-of-order, late and poison records to three topics
  (``benchmarks.chaos_logic``), each stamped with its expected status and window in Kafka headers, and
  aborts a few transactions on purpose;
* a fault driver (seeded) SIGKILLs the stream's driver (its process group, or the JVM alone, or the
  Python driver alone) at random points of its micro-batches: half of the kills during the first batch
  after a restart (often the replay of the batch killed before), half after a batch committed (at least
  15 times in 20 minutes; the run is extended, up to ``--max-extension-minutes``, until that many
  happened; none while InfluxDB is down, so the outage meets a running stream); it restarts the Kafka
  broker twice (once SIGTERM, once SIGKILL), stops InfluxDB for two minutes, and restarts Airflow's
  scheduler alone (SIGTERM, as Airflow asks a second one after 30 s, SIGKILL at 90 s; standalone keeps its
  other parts and a replacement ``airflow scheduler`` takes over).

At the end it stops the traffic, waits for the stream to read everything, stops Airflow and the stream,
runs the batch layer (``spark_jobs/batch_recompute.py``) for every hour of ingest time the run touched and
the InfluxDB catch-up (``spark_jobs/influx_catch_up.py``), reads every topic back with a read_committed
consumer and tallies the headers (the ground truth), and compares Delta ``window_counts`` (and the raw
archive), the metrics topic (last value per key) and InfluxDB (valid/invalid per window) with it.
Writes ``benchmarks/results/chaos.{json,md}``; exits 1 when any output differs from the truth.
Every wait has a deadline; everything started is stopped at the end, also on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil

from benchmarks import chaos_logic as cl
from benchmarks.__main__ import machine_info
from benchmarks.__main__ import make_config as bench_config
from benchmarks.speed import read_progress, write_config
from kdq import writers_journal
from kdq.config import Config
from kdq.stack.procs import quiet_port

log = logging.getLogger("kdq.chaos")
PROJECT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=20.0, help="traffic and faults (default 20)")
    p.add_argument("--seed", type=int, help="seed of the traffic and the fault plan (default: random, printed)")
    p.add_argument("--rate", type=float, default=50.0, help="records per second over all topics (default 50)")
    p.add_argument("--kills", type=int, help="stream SIGKILLs wanted (default 15 per 20 minutes)")
    p.add_argument("--broker-restarts", type=int, default=2)
    p.add_argument("--influx-outage-seconds", type=float, default=120.0)
    p.add_argument("--scheduler-restarts", type=int, default=1)
    p.add_argument("--supervisor-seconds", type=float, default=30.0,
                   help="kdq_stream_supervisor schedule (KDQ_AIRFLOW_SUPERVISOR_SECONDS; product default 120)")
    p.add_argument("--transaction-seconds", type=float, default=1.0, help="records per transaction: this long")
    p.add_argument("--abort-ratio", type=float, default=0.03, help="transactions aborted on purpose")
    p.add_argument("--max-extension-minutes", type=float, help="extend traffic and faults until the kills happened "
                   "(default: half of --minutes)")
    p.add_argument("--recompute-minutes", type=int, default=5,
                   help="kdq_hourly_recompute's interval during the run (KDQ_AIRFLOW_RECOMPUTE_MINUTES; product 60)")
    p.add_argument("--rebuilds", type=int, default=2, help="kdq_rebuild runs of the hour being written (default 2)")
    p.add_argument("--maintenance-runs", type=int, default=1, help="kdq_maintenance runs (default 1)")
    p.add_argument("--backfills", type=int, default=1, help="Airflow backfills of the recompute DAG (default 1)")
    p.add_argument("--archive-backfills", type=int, default=1, help="archive_from_kafka runs (default 1)")
    p.add_argument("--airflow-parallelism", type=int, default=4,
                   help="task slots of the run's Airflow (the jobs beside the stream must not starve the supervisor)")
    p.add_argument("--storage", choices=("local", "s3a"), default="local",
                   help="where the tables and checkpoints are: local disk, or s3a:// on moto's server with kdq's "
                        "DynamoDB log store (needs make setup-s3; results in chaos_s3a.{json,md})")
    p.add_argument("--catch-up-minutes", type=float, default=20.0, help="deadline for the stream to read everything")
    p.add_argument("--work-dir", type=Path, help="default: a new temporary folder (removed unless --keep or a failure)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs, tables, checkpoint)")
    p.add_argument("--output", type=Path, default=RESULTS, help="where chaos.{json,md} go")
    p.add_argument("--no-save", action="store_true", help="print the report only")
    args = p.parse_args(argv)
    if args.kills is None:
        args.kills = cl.kills_wanted(args.minutes)
    if args.max_extension_minutes is None:
        args.max_extension_minutes = args.minutes / 2
    return args


def _now() -> float:
    return time.monotonic()


class Clock:
    """Seconds since the fault phase began (negative before), the time base of every event and fault."""

    def __init__(self) -> None:
        self.t0 = _now()

    def t(self) -> float:
        return round(_now() - self.t0, 1)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _wait(check, timeout: float, interval: float = 1.0, stop: threading.Event | None = None):
    """Poll ``check`` until it returns something true; None at the deadline (or when ``stop`` is set)."""
    deadline = _now() + timeout
    while _now() < deadline:
        try:
            value = check()
        except Exception:  # a probe that fails means "not yet"
            value = None
        if value:
            return value
        if stop is not None and stop.wait(interval):
            return None
        if stop is None:
            time.sleep(interval)
    return None


# -- set-up ---------------------------------------------------------------------------------------------


def chaos_config(work: Path, storage: dict | None = None) -> Config:
    """The benchmark's private config (defaults, no kdq.toml, no KDQ_* variables) with the chaos rules,
    its components on ports below the ephemeral range (:func:`quiet_port`); ``storage``: the s3a variant's
    settings (:meth:`kdq.stack.moto.LocalS3.settings`), tables and checkpoints on s3a://."""
    rng = random.Random()
    rules = work / "rules"
    rules.mkdir(parents=True, exist_ok=True)
    for name in ("orders.schema.json", "payments.schema.json"):
        shutil.copy(PROJECT / "config" / "rules" / name, rules / name)
    (rules / "events.schema.json").write_text(json.dumps(cl.EVENTS_SCHEMA, indent=1))
    (rules / "topics.toml").write_text(cl.TOPICS_TOML)
    config = bench_config(
        work / "data",
        rules,
        # 256 KiB: the too_large poison (300 KB) is too large, deep nesting (100 KB) is not.
        stream={"max_value_bytes": 256 * 1024, "allowed_lateness_seconds": 60, "trigger_interval_seconds": 5},
        # As in the Airflow integration tests: C1-only JIT and the serial GC start a JVM faster, which
        # matters for a stream restarted every minute or two on 2 shared cores; batches here are small.
        spark={"conf": {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
                        **(storage or {}).get("spark_conf", {})}},
        paths=(storage or {}).get("paths", {}),
        kafka={"local_port": quiet_port(rng), "local_controller_port": quiet_port(rng)},
        influxdb={"local_port": quiet_port(rng), "local_rpc_port": quiet_port(rng)},
    )
    return write_config(config, work / "kdq.toml")


def code_state() -> dict:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=PROJECT, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    dirty = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines() if line.strip()]
    return {"commit": git("rev-parse", "--short", "HEAD").strip(), "dirty": dirty}


# -- traffic --------------------------------------------------------------------------------------------


class Traffic(threading.Thread):
    """A transactional producer at a fixed rate (kdq.traffic.RateLimiter); broker outages abort or fail
    transactions, which is fine: the truth is what Kafka holds committed at the end."""

    def __init__(self, config: Config, seed: int, rate: float, mix: cl.TrafficMix, transaction_seconds: float,
                 abort_ratio: float) -> None:
        super().__init__(name="chaos-traffic", daemon=True)
        self.config = config
        self.generator = cl.ChaosTraffic(seed, mix)
        self.rng = random.Random(seed + 3)
        self.rate = rate
        self.transaction_seconds = transaction_seconds
        self.abort_ratio = abort_ratio
        self.stop = threading.Event()
        self.transactional_id = f"kdq-chaos-{seed}"
        self.stats: Counter = Counter()
        self.errors: list[str] = []
        self.error: BaseException | None = None

    def _producer(self):
        from confluent_kafka import Producer

        deadline = _now() + 300
        while True:
            producer = Producer({
                **self.config.kafka_client_conf(),
                "transactional.id": self.transactional_id,
                "linger.ms": 20,
                "message.max.bytes": 2_000_000,
                "transaction.timeout.ms": 60_000,
            })
            try:
                producer.init_transactions(30)
                return producer
            except Exception as exc:  # the broker may be restarting
                self._note(f"init_transactions: {exc}")
                if _now() > deadline or self.stop.is_set():
                    raise
                time.sleep(2)

    def _note(self, message: str) -> None:
        self.stats["errors"] += 1
        if len(self.errors) < 200:
            self.errors.append(f"{time.strftime('%H:%M:%S')} {message}")
        log.warning("producer: %s", message)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the driver
            self.error = exc
            log.exception("traffic failed")

    def _run(self) -> None:
        from confluent_kafka import KafkaException

        from kdq.traffic import RateLimiter

        producer = self._producer()
        limiter = RateLimiter(self.rate)
        while not self.stop.is_set():
            abort = self.rng.random() < self.abort_ratio
            intent = "abort" if abort else "commit"
            count = 0
            try:
                producer.begin_transaction()
                end = _now() + self.transaction_seconds
                while _now() < end and not self.stop.is_set():
                    due = limiter.due()
                    now_ms = int(time.time() * 1000)
                    for _ in range(due):
                        record = self.generator.record(now_ms)
                        while True:
                            try:
                                producer.produce(
                                    record.topic, value=record.value, key=record.key, partition=record.partition,
                                    timestamp=record.timestamp_ms, headers=record.headers(intent),
                                )
                                break
                            except BufferError:
                                producer.poll(0.1)
                        count += 1
                    producer.poll(0)
                    time.sleep(min(limiter.wait_seconds(), 0.05) if due == 0 else 0)
                if abort:
                    self._finish(producer.abort_transaction)
                    self.stats["aborted_on_purpose"] += count
                    self.stats["transactions_aborted_on_purpose"] += 1
                else:
                    self._finish(producer.commit_transaction)
                    self.stats["committed"] += count
                    self.stats["transactions_committed"] += 1
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                self._note(f"transaction of {count} records failed: {exc}")
                self.stats["lost_to_faults"] += count
                self.stats["transactions_failed"] += 1
                fatal = bool(error is not None and hasattr(error, "fatal") and error.fatal())
                if not fatal:
                    try:
                        self._finish(producer.abort_transaction)
                    except KafkaException as again:
                        self._note(f"abort after a failure: {again}")
                        fatal = True
                if fatal:
                    self.stats["producer_restarts"] += 1
                    producer = self._producer()  # a new instance with the same id fences the old one
        # The last transaction is finished above; nothing is left in the queue.
        producer.flush(30)

    def _finish(self, action) -> None:
        """commit/abort, retried while the error is retriable (a broker restarting), for up to 3 minutes."""
        from confluent_kafka import KafkaException

        deadline = _now() + 180
        while True:
            try:
                action(30)
                return
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if error is not None and hasattr(error, "retriable") and error.retriable() and _now() < deadline:
                    self._note(f"{action.__name__} retried: {exc}")
                    time.sleep(1)
                    continue
                raise


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
        from kdq.stream_process import stream_process

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
        from kdq.stack.procs import ManagedProcess

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
        from kdq.stream_process import stream_process

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


# -- reading back ---------------------------------------------------------------------------------------


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


def end_offsets(config: Config, topics: list[str]) -> dict[tuple[str, int], int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**config.kafka_client_conf(), "group.id": f"chaos-{uuid.uuid4().hex}"})
    try:
        meta = consumer.list_topics(timeout=30).topics
        return {
            (t, p): consumer.get_watermark_offsets(TopicPartition(t, p), timeout=30)[1]
            for t in topics for p in meta[t].partitions
        }
    finally:
        consumer.close()


def read_topics(config: Config, topics: list[str], isolation: str, on_message, timeout: float = 900.0) -> int:
    """Every record of ``topics`` from the beginning to the end, in offset order per partition."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({
        **config.kafka_client_conf(),
        "group.id": f"chaos-truth-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": isolation,
    })
    try:
        meta = consumer.list_topics(timeout=30).topics
        partitions = [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in meta[t].partitions]
        consumer.assign(partitions)
        pending = {(tp.topic, tp.partition) for tp in partitions}
        deadline = _now() + timeout
        n = 0
        while pending:
            if _now() > deadline:
                raise TimeoutError(f"reading {topics} back: partitions {sorted(pending)} not at their end after {timeout:.0f} s")
            for msg in consumer.consume(1000, 1.0):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        pending.discard((msg.topic(), msg.partition()))
                        continue
                    raise RuntimeError(f"reading {msg.topic()}: {msg.error()}")
                on_message(msg)
                n += 1
        return n
    finally:
        consumer.close()


def read_truth(config: Config, topics: list[str]) -> tuple[cl.Truth, int]:
    truth = cl.Truth()
    read_topics(config, topics, "read_committed", lambda m: truth.add(m.topic(), m.partition(), m.offset(), m.headers()))
    uncommitted = cl.Truth()
    read_topics(config, topics, "read_uncommitted", lambda m: uncommitted.add(m.topic(), m.partition(), m.offset(), m.headers()))
    return truth, uncommitted.meant_to_abort


def read_metrics(config: Config) -> tuple[dict, int]:
    messages: list[tuple[bytes | None, bytes | None]] = []
    read_topics(config, [config.kafka.metrics_topic], "read_committed", lambda m: messages.append((m.key(), m.value())))
    return cl.last_values(messages)


def read_influx(config: Config, topics: list[str]) -> dict[str, dict[int, tuple]]:
    import requests

    out: dict[str, dict[int, tuple]] = {}
    for topic in topics:
        response = requests.get(
            f"{config.influx_url()}/query",
            params={"db": config.influxdb.database, "q": f'SELECT valid, invalid FROM "{topic}"', "epoch": "ms"},
            timeout=60,
        )
        response.raise_for_status()
        body = response.json()["results"][0]
        if "error" in body:
            raise RuntimeError(f"InfluxDB query of {topic}: {body['error']}")
        series = body.get("series", [])
        out[topic] = {int(t): (v, i) for t, v, i in series[0]["values"]} if series else {}
    return out


def read_delta(config: Config, topics: list[str]) -> tuple[list[tuple], dict]:
    from pyspark.sql import functions as F

    from kdq.spark.session import build_session
    from kdq.storage import table_location

    spark = build_session(config, app_name="kdq-chaos-check")
    try:
        # kdq.storage's locations: a local folder, or s3a:// with paths.storage_uri (--storage s3a)
        counts = spark.read.format("delta").load(table_location(config, "window_counts")).where(F.col("topic").isin(topics))
        rows = [(r[0], int(r[1]), r[2], int(r[3])) for r in
                counts.select("topic", F.unix_millis("window_start"), "status", "count").collect()]
        archive = spark.read.format("delta").load(table_location(config, "raw_archive")).where(F.col("topic").isin(topics))
        archived = {(r[0], int(r[1]), int(r[2])): int(r[3]) for r in
                    archive.groupBy("topic", "partition", "offset").count().collect()}
        return rows, archived
    finally:
        spark.stop()


# -- the end of the run ---------------------------------------------------------------------------------


def run_job(config: Config, job: str, job_args: list[str], log_file: Path, timeout: float = 1800.0) -> dict:
    """A batch-layer job through spark-submit, as the CLI and Airflow run it; its JSON summary (last line)."""
    from kdq.spark.submit import submit_command
    from kdq.stream_process import child_env

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


def _iso_s(text: str | None) -> float | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def kill_orphans(work: Path) -> list[str]:
    """Processes of this run left behind (e.g. a Python driver whose JVM was killed): their command line
    names the run's unique work folder, or their environment its config file (KDQ_CONFIG). Killed by pid."""
    found = []
    marker = str(work)
    me = psutil.Process()
    # Not this process, its children (the check's own JVM) or its parents (a `timeout` wrapping the run).
    own = {me.pid, *(p.pid for p in me.children(recursive=True)), *(p.pid for p in me.parents())}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid in own:
            continue
        try:
            ours = any(marker in part for part in proc.info["cmdline"] or [])
            ours = ours or proc.environ().get("KDQ_CONFIG", "").startswith(marker)
            if ours:
                found.append(f"{proc.pid} {' '.join(proc.info['cmdline'] or [])[:100]}")
                proc.kill()
        except psutil.Error:
            continue
    return found


# -- main -----------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    print(f"chaos run: seed {seed} (reproduce the plan with --seed {seed})", flush=True)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="kdq-chaos-"))
    work.mkdir(parents=True, exist_ok=True)

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)

    from kdq.stack.airflow import RECOMPUTE_MINUTES_ENV, START_DATE_ENV, SUPERVISOR_INTERVAL_ENV, LocalAirflow
    from kdq.stack.manager import LocalStack
    from kdq.stream_process import stop_stream

    started = _now()
    local_s3 = None
    storage = None
    if args.storage == "s3a":
        from kdq.stack.moto import LocalS3

        local_s3 = LocalS3(quiet_port(random.Random()), work / "moto.log", bucket="kdq-chaos")
        local_s3.start()
        storage = local_s3.settings()
        log.info("tables and checkpoints on %s (moto at %s)", storage["paths"]["storage_uri"], local_s3.endpoint)
    config = chaos_config(work, storage)
    stack = LocalStack(config)
    config = stack.config  # with the ports the stack just recorded (a Config reads them when built)
    port_rng = random.Random()
    now = datetime.now(UTC)
    # The recompute DAG starts with the interval the run begins in: no catch-up of the hour before the run.
    recompute_start = now.replace(minute=now.minute - now.minute % args.recompute_minutes, second=0, microsecond=0)
    stack.airflow = LocalAirflow(config, quiet_port(port_rng), extra_env={
        SUPERVISOR_INTERVAL_ENV: str(args.supervisor_seconds),
        RECOMPUTE_MINUTES_ENV: str(args.recompute_minutes),
        START_DATE_ENV: recompute_start.isoformat(),
        "AIRFLOW__CORE__PARALLELISM": str(args.airflow_parallelism),
    })
    stack.airflow.log_server_ports = (quiet_port(port_rng), quiet_port(port_rng))
    topics = list(cl.TOPICS)
    mix = cl.TrafficMix()
    result: dict = {
        "command": shlex.join(["python", "-m", "benchmarks.chaos", *(sys.argv[1:] if argv is None else argv)]),
        "seed": seed,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "code": code_state(),
        "machine": machine_info(),
        "parameters": {
            "minutes": args.minutes, "rate": args.rate, "kills_wanted": args.kills,
            "topics": {t: n for t, (_, n) in cl.TOPICS.items()},
            "invalid_ratio": mix.invalid_ratio, "out_of_order": mix.out_of_order, "late": mix.late,
            "events_share": mix.events_share, "poison_ratio": mix.poison_ratio,
            "transaction_seconds": args.transaction_seconds, "abort_ratio": args.abort_ratio,
            "allowed_lateness_seconds": config.stream.allowed_lateness_seconds,
            "trigger_seconds": config.stream.trigger_interval_seconds,
            "max_value_bytes": config.stream.max_value_bytes,
            "supervisor_seconds": args.supervisor_seconds,
            "broker_restarts": args.broker_restarts, "influx_outage_seconds": args.influx_outage_seconds,
            "scheduler_restarts": args.scheduler_restarts,
            "recompute_minutes": args.recompute_minutes, "rebuilds": args.rebuilds,
            "maintenance_runs": args.maintenance_runs, "backfills": args.backfills,
            "archive_backfills": args.archive_backfills, "airflow_parallelism": args.airflow_parallelism,
            "storage": config.paths.storage_uri or "local disk",
        },
        "work_dir": str(work),
    }
    clock = Clock()
    monitor = Monitor(config, clock, work / "events.jsonl")
    traffic = Traffic(config, seed, args.rate, mix, args.transaction_seconds, args.abort_ratio)
    faults = Faults(stack, config, clock, monitor, seed, args, work)
    jobs: Jobs | None = None
    ok = False
    end_notes: list[str] = []
    try:
        statuses = stack.up()
        if not all(s.healthy for s in statuses):
            raise RuntimeError("local stack not healthy: " + "; ".join(s.line() for s in statuses))
        for topic, (_, partitions) in cl.TOPICS.items():
            stack.kafka.create_topic(topic, partitions=partitions)
        traffic_started = datetime.now(UTC)
        traffic.start()
        log.info("starting Airflow standalone (supervisor every %.0f s) in %s", args.supervisor_seconds, stack.airflow.home)
        stack.airflow.start(timeout=600)
        stack.airflow.wait_for_dags(timeout=300)
        monitor.start()
        first = _wait(lambda: (_read_json(config.data_dir / "stream" / "progress.json") or {}).get("input_rows"), 900)
        if not first:
            raise RuntimeError("the supervisor's stream committed no batch with records within 15 minutes")
        log.info("stream up and counting; fault phase of %.1f min begins", args.minutes)

        # -- traffic and faults ----------------------------------------------------------------------
        clock.t0 = _now()
        window = args.minutes * 60
        faults.fault_end = clock.t0 + window
        faults.start(window)
        jobs = Jobs(stack, config, clock, seed, args, work, topics, traffic_started, recompute_start)
        jobs.start(window)
        hard_end = clock.t0 + window + args.max_extension_minutes * 60
        next_report = _now()
        while True:
            now = _now()
            if now >= faults.fault_end:
                if faults.kills >= args.kills or now >= hard_end:
                    break
                faults.fault_end = min(hard_end, now + 60)  # more time for the kills still wanted
            if traffic.error is not None:
                raise RuntimeError(f"traffic failed: {traffic.error!r}")
            faults.watch_components()
            if now >= next_report:
                progress = monitor.state.get("progress") or {}
                log.info("t=%5.0fs kills %d/%d, faults %d, produced %s, stream batch %s lag %s",
                         clock.t(), faults.kills, args.kills, len(faults.done), dict(traffic.stats),
                         progress.get("batch_id"), sum((progress.get("consumer_lag") or {}).values()))
                next_report = now + 30
            time.sleep(1)
        result["fault_phase_seconds"] = round(_now() - clock.t0, 1)
        faults.stop.set()
        faults.join(timeout=400)
        traffic.stop.set()
        traffic.join(timeout=300)
        if traffic.is_alive():
            raise RuntimeError("the producer did not finish its last transaction within 300 s")
        traffic_stopped = _now()
        end_notes.append(f"traffic stopped at t={clock.t():.0f} s")

        # -- catch-up --------------------------------------------------------------------------------
        kafka_ends = end_offsets(config, topics)

        def caught_up() -> bool:
            progress = read_progress(config)
            if not progress:
                return False
            latest = max(progress, key=lambda p: p["batch_id"])
            return cl.records_behind(latest.get("end_offsets") or {}, kafka_ends) == 0

        if _wait(caught_up, args.catch_up_minutes * 60, interval=2.0):
            end_notes.append(f"the stream read every committed record {_now() - traffic_stopped:.0f} s after the traffic stopped")
        else:
            progress = read_progress(config)
            behind = cl.records_behind(max(progress, key=lambda p: p["batch_id"]).get("end_offsets") or {}, kafka_ends) if progress else None
            end_notes.append(f"the stream did NOT catch up within {args.catch_up_minutes:.0f} min ({behind} records behind); "
                             f"batch failure: {_read_json(config.data_dir / 'stream' / 'batch_failure.json')}")
        # -- the jobs beside the stream end; the recompute DAG stops being scheduled and settles -----------
        if not jobs.join(timeout=1800):
            end_notes.append("a job beside the stream was still running 30 min after the traffic stopped")
        end_notes.append(settle_recompute(stack.airflow, timeout=900))
        try:
            result["writers"] = writers_journal.describe(config)
        except Exception as exc:
            result["writers"] = [f"unreadable: {exc!r}"]
        try:
            result["airflow"] = airflow_runs(stack.airflow)
        except Exception as exc:
            result["airflow"] = {"error": repr(exc)}
        faults.stop_replacement_scheduler()
        stack.airflow.stop(timeout=120)
        stop_stream(config, timeout=180)
        end_notes.append("Airflow and the stream stopped (gracefully)")

        # -- the batch layer -------------------------------------------------------------------------
        result["batch_layer"] = []
        for hour in hours_between(traffic_started - timedelta(minutes=1), datetime.now(UTC)):
            job_args = [f"--start={hour.isoformat()}", f"--end={(hour + timedelta(hours=1)).isoformat()}",
                        f"--run-id=chaos-{seed}-{hour:%H}"]
            outcome = run_job(config, "batch_recompute", job_args, work / "batch_layer.log")
            s = outcome["summary"]
            result["batch_layer"].append({"job": "batch_recompute", "hour": hour.isoformat(), "exit_code": outcome["exit_code"],
                                          "seconds": outcome["seconds"], "late_windows": s.get("late_windows"),
                                          "corrections": s.get("corrections"), "ok": s.get("ok"),
                                          "stream_caught_up": s.get("stream_caught_up")})
            end_notes.append(f"batch_recompute {hour:%H:00}-{(hour + timedelta(hours=1)):%H:00}: exit {outcome['exit_code']}, "
                             f"{s.get('late_windows')} late windows, {s.get('corrections')} corrections")
        pending = (_read_json(config.data_dir / "stream" / "influx_push_state.json") or {}).get("pending_since_ms")
        outcome = run_job(config, "influx_catch_up", [], work / "batch_layer.log")
        s = outcome["summary"]
        result["batch_layer"].append({"job": "influx_catch_up", "exit_code": outcome["exit_code"], "pending_since_ms": pending,
                                      "summary": {k: v for k, v in s.items() if not isinstance(v, (list, dict))}})
        end_notes.append(f"influx_catch_up: exit {outcome['exit_code']}, pending since {pending}, summary {s}")

        # -- ground truth and every output -----------------------------------------------------------
        truth, aborted_in_log = read_truth(config, topics)
        result["truth"] = truth.summary()
        result["aborted_records_in_log"] = aborted_in_log
        rows, archived = read_delta(config, topics)
        delta_counts, duplicate_rows = cl.counts_from_rows(rows)
        metrics, unreadable = read_metrics(config)
        influx = cl.counts_from_points(read_influx(config, topics))
        metrics = {k: v for k, v in metrics.items() if k[0] in topics}
        comparison = {
            "delta window_counts": {**cl.compare_counts(truth.counts, delta_counts), "duplicate_rows": [list(k) for k in duplicate_rows]},
            "metrics topic (last value per key)": {**cl.compare_counts(truth.counts, metrics), "unreadable_messages": unreadable},
            "influxdb (valid, invalid per window)": cl.compare_counts(truth.counts, influx),
            "raw_archive": cl.compare_archive(truth.offsets, archived),
        }
        result["comparison"] = comparison
        sane = truth.unstamped == 0 and truth.meant_to_abort == 0
        ok = sane and all(c["equal"] and not c.get("duplicate_rows") for c in comparison.values())
        result["verdict"] = (
            "every output equals the ground truth: 0 lost, 0 counted twice" if ok else
            "DIFFERENCES: " + "; ".join(
                f"{name}: lost {c.get('lost', c.get('missing'))}, counted twice {c.get('counted_twice', c.get('duplicated'))}"
                + (f", unexpected {c['unexpected']}" if c.get("unexpected") else "")
                for name, c in comparison.items() if not c["equal"] or c.get("duplicate_rows")
            ) + ("" if sane else f"; ground truth not sane: {truth.unstamped} unstamped, {truth.meant_to_abort} aborted records read")
        )
    except KeyboardInterrupt as exc:
        result["verdict"] = f"INTERRUPTED ({exc or 'SIGINT'})"
        print(f"\n{result['verdict']}: stopping everything", flush=True)
    except Exception as exc:
        result["verdict"] = f"RUN FAILED: {exc!r}"[:2000]
        log.exception("chaos run failed")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the shutdown short
        faults.stop.set()
        faults.abort.set()
        traffic.stop.set()
        monitor.stop.set()
        faults.join(timeout=60)
        traffic.join(timeout=60)
        if jobs is not None:
            jobs.stop.set()
            jobs.join(timeout=60)
        faults.stop_replacement_scheduler()
        try:
            stopped = stack.down()
            log.info("stopped: %s", ", ".join(stopped) or "nothing was running")
        except Exception:
            log.exception("stopping the stack")
        if local_s3 is not None:
            local_s3.stop()
        orphans = kill_orphans(work)
        if orphans:
            end_notes.append(f"processes left behind and killed at the end: {orphans}")
    events = monitor.snapshot()
    in_a_row = [int(e.get("restarts") or 0) for e in events if e["kind"] == "supervisor_restart" and e["t"] >= 0]
    if in_a_row:
        end_notes.append(
            f"supervisor restarts in a row without a healthy check between them peaked at {max(in_a_row)} "
            "(beyond kdq_stream_supervisor's max_restarts = 3 its task fails and restarts back off, 120 s doubling)"
        )
    early = [e for e in events if e["t"] < 0 and e["kind"] in ("stream_gone", "batch_failure")]
    if early:
        end_notes.insert(0, f"before the fault phase (the stream's first start under the supervisor): {early}")
    supervisor_starts = [
        _iso_s(r["start"]) for r in (result.get("airflow") or {}).get("supervisor_runs", []) if r.get("start")
    ]
    wall0 = time.time() - (_now() - clock.t0)  # wall-clock time of t = 0
    for fault in faults.done:
        if fault["kind"] == cl.SCHEDULER_RESTART:
            after = [s - wall0 - fault["end_t"] for s in supervisor_starts if s and s - wall0 > fault["end_t"]]
            fault["next_supervisor_run_after_s"] = round(min(after), 1) if after else None
    result["faults"] = cl.fault_outcomes(faults.done, events)
    result["jobs"] = sorted(jobs.done, key=lambda j: j["t"]) if jobs is not None else []
    result["kills"] = faults.kills
    result["producer"] = dict(traffic.stats)
    result["producer_errors"] = traffic.errors[:50]
    result["end"] = {"notes": end_notes}
    result["events"] = len(events)
    result["duration_seconds"] = round(_now() - started, 1)
    if result.get("verdict", "").startswith("every") and faults.kills < args.kills:
        result["verdict"] += f" (but only {faults.kills} of {args.kills} kills happened)"
    planned_jobs = len(jobs.plan) if jobs is not None else 0
    failed_jobs = [j for j in result["jobs"] if j.get("state") not in ("success", "skipped")]
    if result.get("verdict", "").startswith("every") and (failed_jobs or len(result["jobs"]) < planned_jobs):
        result["verdict"] += (f" (but {len(failed_jobs)} of the {planned_jobs} jobs beside the stream did not succeed, "
                              f"{planned_jobs - len(result['jobs'])} did not run)")
    md = cl.markdown({**result, "verdict": result.get("verdict", "?")}) if "parameters" in result else ""
    print(md)
    if not args.no_save:
        args.output.mkdir(parents=True, exist_ok=True)
        name = "chaos" if args.storage == "local" else f"chaos_{args.storage}"
        (args.output / f"{name}.json").write_text(json.dumps(cl.as_jsonable(result), indent=1, default=str) + "\n")
        (args.output / f"{name}.md").write_text(md)
        print(f"written: {args.output}/{name}.json, {name}.md")
    if args.keep or args.work_dir or not ok:
        print(f"work folder kept: {work} (events.jsonl, batch_layer.log, data/stream/stream.log, data/airflow/)")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
