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

This module is the run's arguments and its course (:func:`main`); its parts: the set-up and small helpers
(``benchmarks.chaos_setup``), the traffic (``chaos_traffic``), the monitor and the fault driver (``chaos_faults``),
the batch-side jobs (``chaos_jobs``), reading the outputs back (``chaos_readback``), and the logic without
services (``chaos_logic``).
"""

from __future__ import annotations

import argparse
import logging
import random
import shlex
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchmarks import chaos_logic as cl
from benchmarks.__main__ import machine_info
from benchmarks.chaos_faults import Faults, Monitor
from benchmarks.chaos_jobs import Jobs, airflow_runs, hours_between, run_job, settle_recompute
from benchmarks.chaos_readback import end_offsets, read_delta, read_influx, read_metrics, read_truth
from benchmarks.chaos_setup import Clock, _iso_s, _now, _read_json, _wait, chaos_config, code_state, kill_orphans
from benchmarks.chaos_traffic import Traffic
from benchmarks.measure import write_results
from benchmarks.signals import ignore_stop_signals, interrupt_on_stop_signals
from benchmarks.speed import read_progress
from kdq import writers_journal
from kdq.procs import quiet_port

log = logging.getLogger("kdq.chaos")
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


# -- main -----------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    print(f"chaos run: seed {seed} (reproduce the plan with --seed {seed})", flush=True)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="kdq-chaos-"))
    work.mkdir(parents=True, exist_ok=True)

    interrupt_on_stop_signals()

    from kdq.spark.stream_process import stop_stream
    from kdq.stack.airflow import RECOMPUTE_MINUTES_ENV, START_DATE_ENV, SUPERVISOR_INTERVAL_ENV, LocalAirflow
    from kdq.stack.manager import LocalStack

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
        rows, archived, summary_rows = read_delta(config, topics)
        delta_counts, duplicate_rows = cl.counts_from_rows(rows)
        delta_summaries, duplicate_summaries = cl.summaries_from_rows(summary_rows)
        metrics, unreadable = read_metrics(config)
        influx = cl.counts_from_points(read_influx(config, topics))
        metrics = {k: v for k, v in metrics.items() if k[0] in topics}
        comparison = {
            "delta window_counts": {**cl.compare_counts(truth.counts, delta_counts), "duplicate_rows": [list(k) for k in duplicate_rows]},
            "metrics topic (last value per key)": {**cl.compare_counts(truth.counts, metrics), "unreadable_messages": unreadable},
            "influxdb (valid, invalid per window)": cl.compare_counts(truth.counts, influx),
            "raw_archive": cl.compare_archive(truth.offsets, archived),
            "delta summaries (values + rejections)": {
                **cl.compare_summaries(truth.summaries, delta_summaries),
                "duplicate_rows": [list(map(str, k)) for k in duplicate_summaries],
            },
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
        ignore_stop_signals()  # a second Ctrl-C must not cut the shutdown short
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
        write_results(args.output, "chaos" if args.storage == "local" else f"chaos_{args.storage}", cl.as_jsonable(result), md)
    if args.keep or args.work_dir or not ok:
        print(f"work folder kept: {work} (events.jsonl, batch_layer.log, data/stream/stream.log, data/airflow/)")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
