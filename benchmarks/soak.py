"""The soak run (issue 24): the speed layer for hours at a fixed rate, with the hourly recompute DAG running as
scheduled beside it, and whether its per-batch fixed cost and its produce → visible p99 stay flat.

    .venv/bin/python -m benchmarks.soak                                  # 2 hours at 5,000 msgs/s (make bench-soak)
    .venv/bin/python -m benchmarks.soak --minutes 20 --rate 500 --no-save # a short check

Starts its own stack in a temporary folder on free loopback ports, as the chaos run does: a KRaft Kafka broker,
InfluxDB 1.x and ``airflow standalone`` with every kdq DAG unpaused. The ``kdq_stream_supervisor`` DAG starts the
speed layer; ``kdq_hourly_recompute`` runs on its product schedule (hourly, from the hour the run starts in; its
first run covers that hour). The traffic is ``make bench``'s workload (≈ 1 KB JSON orders, 5 % invalid, 10 % out of
order, 1 % beyond the allowed lateness, so each recompute has late records to correct), produced at ``--rate`` for
the whole run, each record's produce time in its key.

At the end it stops the traffic, waits for the stream to read everything, lets the recompute DAG settle, stops
Airflow and the stream, recomputes every hour the run touched (what the DAG's next runs would do), and reads back:

* per ``--bucket-minutes`` of the run (10): the micro-batches triggered in it (count, records, batch duration p50 and
  p99, the **fixed cost** p50 = a batch's duration minus its classify + archive step, the one step whose work is
  per record, and the per-record cost of that step), the produce → visible latency p50/p95/p99 of the records
  produced in it (each record's produce time against the commit time of its batch's window-count MERGE), the
  stream's cores and peak RSS, and whether a recompute run was active;
* the flatness verdict: the last hour's buckets against the first hour's (the first bucket, JIT warm-up, left
  out), fixed cost p50 and latency p99 each within 1.2×;
* exactness: archive rows = records produced, window counts + records left to the batch layer and not yet
  recomputed = archive rows, after the final recomputes every archived record counted once.

Writes ``benchmarks/results/soak.{json,md}``. Every wait has a deadline; everything started is stopped at the end,
also on Ctrl-C, SIGTERM or an error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.measure import percentile, record_ms, weighted_percentiles, write_results

log = logging.getLogger("kdq.soak")
RESULTS = Path(__file__).resolve().parent / "results"
FLAT_RATIO = 1.2  # the last hour against the first: at most this much higher, or the run is not flat
PER_RECORD_STEP = "classify_archive"  # the micro-batch step whose work grows with its records


# -- pure figures (unit-tested) ---------------------------------------------------------------------------


def counted_batches(progress: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The micro-batches with records, one record per batch id (a batch replayed after a restart: its last
    attempt), in batch order."""
    batches: dict[int, Mapping[str, Any]] = {}
    for record in progress:
        if record.get("batch_id") is not None and record.get("input_rows") and record_ms(record) is not None:
            batches[int(record["batch_id"])] = record
    return [batches[b] for b in sorted(batches)]


def batch_costs(record: Mapping[str, Any]) -> dict[str, float] | None:
    """One batch's duration, fixed cost (its duration minus its per-record step) and per-record cost, from its
    progress record; None without the stream's step timings."""
    total = int((record.get("duration_ms") or {}).get("triggerExecution") or 0)
    steps = record.get("writer_ms") or {}
    rows = int(record.get("input_rows") or 0)
    if not total or PER_RECORD_STEP not in steps or rows <= 0:
        return None
    per_record = float(steps[PER_RECORD_STEP])
    return {
        "batch_s": total / 1000.0,
        "fixed_s": max(0.0, total - per_record) / 1000.0,
        "per_record_us": per_record * 1000.0 / rows,
        "rows": float(rows),
        **{f"{step}_s": float(ms) / 1000.0 for step, ms in steps.items()},
    }


def _p(values: Sequence[float], q: float, digits: int = 3) -> float | None:
    value = percentile(values, q)
    return None if value is None else round(value, digits)


def bucket_figures(
    progress: Iterable[Mapping[str, Any]],
    latencies: Iterable[tuple[int, float, int]],
    start_ms: int,
    end_ms: int,
    bucket_ms: int,
    recompute_runs: Sequence[tuple[int, int]] = (),
    cores: Mapping[int, Mapping[str, float]] | None = None,
    peak_rss: Mapping[int, int] | None = None,
) -> list[dict[str, Any]]:
    """Per bucket of ``bucket_ms`` from ``start_ms`` to ``end_ms``: the batches triggered in it and the latency of the
    records produced in it. ``latencies``: (produced_ms, seconds to visible, records); ``recompute_runs``: (start_ms,
    end_ms) of the recompute DAG's runs; ``cores`` / ``peak_rss``: per bucket index, sampled during the run."""
    count = max(1, -(-(end_ms - start_ms) // bucket_ms))
    batches: list[list[dict[str, float]]] = [[] for _ in range(count)]
    for record in counted_batches(progress):
        at = record_ms(record)
        costs = batch_costs(record)
        if costs is not None and at is not None and start_ms <= at < end_ms:
            batches[(at - start_ms) // bucket_ms].append(costs)
    pairs: list[list[tuple[float, int]]] = [[] for _ in range(count)]
    for produced_ms, seconds, n in latencies:
        if start_ms <= produced_ms < end_ms:
            pairs[(produced_ms - start_ms) // bucket_ms].append((seconds, n))
    out = []
    for i in range(count):
        lo, hi = start_ms + i * bucket_ms, min(end_ms, start_ms + (i + 1) * bucket_ms)
        b = batches[i]

        def col(name: str, rows: list[dict[str, float]] = b) -> list[float]:
            return [r[name] for r in rows if name in r]

        latency = weighted_percentiles(pairs[i], (50, 95, 99)) if pairs[i] else {}
        out.append({
            "bucket": i,
            "from_minute": round((lo - start_ms) / 60000, 1),
            "to_minute": round((hi - start_ms) / 60000, 1),
            "batches": len(b),
            "rows": int(sum(col("rows"))),
            "rows_per_batch_p50": None if not b else int(_p(col("rows"), 50, 0)),
            "batch_s_p50": _p(col("batch_s"), 50),
            "batch_s_p99": _p(col("batch_s"), 99),
            "fixed_s_p50": _p(col("fixed_s"), 50),
            "per_record_us_p50": _p(col("per_record_us"), 50, 1),
            "steps_s_p50": {
                step: _p(col(f"{step}_s"), 50)
                for step in ("before", "plan", PER_RECORD_STEP, "merge_counts", "read_back", "reasons")
                if col(f"{step}_s")
            },
            "records_measured": sum(n for _, n in pairs[i]),
            "latency_s": {f"p{q}": round(v, 2) for q, v in latency.items()},
            "recompute_active": any(s < hi and e > lo for s, e in recompute_runs),
            "stream_cores": (cores or {}).get(i, {}).get("stream"),
            "cores_by_role": dict((cores or {}).get(i, {})),
            "stream_peak_rss_gb": round((peak_rss or {}).get(i, 0) / 1e9, 2) if (peak_rss or {}).get(i) else None,
        })
    return out


def flatness(buckets: Sequence[Mapping[str, Any]], bucket_minutes: float) -> dict[str, Any]:
    """The last hour's buckets against the first hour's (its first bucket, warm-up, left out): the median over
    each hour of the buckets' fixed cost p50 and latency p99, their ratio, and whether both are within
    :data:`FLAT_RATIO`. With less than two hours of buckets, the last half against the first half."""
    per_hour = max(1, round(60 / bucket_minutes))
    filled = [b for b in buckets if b["batches"]]
    if len(filled) < 3:
        return {"verdict": "too short to tell", "flat": None}
    if len(filled) >= 2 * per_hour:
        first, last = filled[1:per_hour], filled[-per_hour:]
        span = "the first hour (its first bucket left out) against the last hour"
    else:
        half = len(filled) // 2
        first, last = filled[1:half] or filled[:half], filled[half:]
        span = "the first half of the run (its first bucket left out) against the second half"

    def median_of(rows: Sequence[Mapping[str, Any]], get) -> float | None:
        values = [v for v in (get(r) for r in rows) if v is not None]
        return _p(values, 50)

    figures: dict[str, Any] = {"span": span, "flat": True}
    for name, get in (("fixed_s_p50", lambda r: r["fixed_s_p50"]), ("latency_p99_s", lambda r: r["latency_s"].get("p99"))):
        a, z = median_of(first, get), median_of(last, get)
        ratio = round(z / a, 2) if a and z is not None else None
        figures[name] = {"first": a, "last": z, "ratio": ratio}
        if ratio is None or ratio > FLAT_RATIO:
            figures["flat"] = False
    figures["verdict"] = (
        f"flat: fixed cost ×{figures['fixed_s_p50']['ratio']}, p99 ×{figures['latency_p99_s']['ratio']} ({span})"
        if figures["flat"] else
        f"NOT flat (limit ×{FLAT_RATIO}): fixed cost ×{figures['fixed_s_p50']['ratio']}, "
        f"p99 ×{figures['latency_p99_s']['ratio']} ({span})"
    )
    return figures


def markdown(result: Mapping[str, Any]) -> str:
    p = result.get("parameters", {})
    lines = [
        f"## kdq soak run ({result.get('started_at', '?')})",
        "",
        f"Machine: {result.get('machine', {}).get('cpu', '?')}, {result.get('machine', {}).get('cores', '?')} cores. "
        f"Code: `{result.get('code', {}).get('commit', '?')}`"
        + (f" (uncommitted: {', '.join(result['code']['dirty'])})" if result.get("code", {}).get("dirty") else "") + ".",
        "",
        f"Command: `{result.get('command', '?')}`. {p.get('minutes', '?')} min of traffic at {p.get('rate', '?')} msgs/s "
        f"(≈ {p.get('message_bytes', '?')} B JSON orders over {p.get('topics', '?')} topics × {p.get('partitions', '?')} "
        f"partitions, 5 % invalid, 10 % out of order, 1 % late); the stream started by `kdq_stream_supervisor`, "
        f"`kdq_hourly_recompute` every {p.get('recompute_minutes', '?')} min as scheduled.",
        "",
        f"**{result.get('flatness', {}).get('verdict', result.get('verdict', '?'))}**",
        "",
        f"Verdict: {result.get('verdict', '?')}",
        "",
        "| minutes | batches | records | per batch | batch p50 | batch p99 | fixed cost p50 | µs/record | "
        "latency p50 | p95 | p99 | stream cores | stream RSS | recompute |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def s(value: Any, unit: str = " s") -> str:
        return "–" if value is None else f"{value}{unit}"

    for b in result.get("buckets", []):
        lat = b.get("latency_s", {})
        lines.append(
            f"| {b['from_minute']:.0f}–{b['to_minute']:.0f} | {b['batches']} | {b['rows']:,} | "
            f"{s(b['rows_per_batch_p50'], '')} | {s(b['batch_s_p50'])} | {s(b['batch_s_p99'])} | {s(b['fixed_s_p50'])} | "
            f"{s(b['per_record_us_p50'], '')} | {s(lat.get('p50'))} | {s(lat.get('p95'))} | {s(lat.get('p99'))} | "
            f"{s(b.get('stream_cores'), '')} | {s(b.get('stream_peak_rss_gb'), ' GB')} | {'yes' if b.get('recompute_active') else ''} |"
        )
    checks = result.get("checks") or {}
    if checks:
        lines += ["", "Checks: " + "; ".join(f"{k}: {v}" for k, v in checks.items())]
    runs = result.get("recompute_runs") or []
    if runs:
        lines += ["", "Recompute DAG runs: " + "; ".join(
            f"{r.get('logical_date')} {r.get('state')} ({r.get('seconds')} s)" for r in runs)]
    notes = result.get("notes") or []
    if notes:
        lines += ["", "Notes:", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


# -- the run --------------------------------------------------------------------------------------------


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.splitlines()[0])
    p.add_argument("--hours", type=float, default=2.0, help="traffic (default 2)")
    p.add_argument("--minutes", type=float, help="traffic in minutes (instead of --hours; a short check)")
    p.add_argument("--rate", type=int, default=5000, help="msgs/s over all topics (default 5,000)")
    p.add_argument("--bucket-minutes", type=float, default=10.0, help="the results' time buckets (default 10)")
    p.add_argument("--recompute-minutes", type=int, default=60,
                   help="kdq_hourly_recompute's interval (KDQ_AIRFLOW_RECOMPUTE_MINUTES; default 60, the product's)")
    p.add_argument("--topics", type=int, default=4)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--message-bytes", type=int, default=1024)
    p.add_argument("--stream-setting", action="append", default=[], metavar="KEY=VALUE",
                   help="a [stream] setting of the stream, e.g. trigger_interval_seconds=1 (repeatable)")
    p.add_argument("--airflow-parallelism", type=int, default=4)
    p.add_argument("--drain-minutes", type=float, default=20.0, help="deadline for the stream to read everything")
    p.add_argument("--work-dir", type=Path, help="default: a new temporary folder (removed unless --keep)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs, tables, checkpoint)")
    p.add_argument("--output", type=Path, default=RESULTS, help="where soak.{json,md} go")
    p.add_argument("--no-save", action="store_true", help="print the report only")
    p.add_argument("--analyse", type=Path, metavar="WORK_DIR",
                   help="no run: the figures of a kept work folder (its tables, progress and samples)")
    args = p.parse_args(argv)
    args.minutes = args.minutes if args.minutes is not None else args.hours * 60
    if args.minutes <= 0 or args.rate <= 0 or args.bucket_minutes <= 0:
        p.error("--hours/--minutes, --rate and --bucket-minutes must be positive")
    if 60 % args.recompute_minutes:
        p.error("--recompute-minutes must divide 60")
    return args


def soak_config(work: Path, topics: list[str], stream: Mapping[str, str]):
    """The run's private config (defaults, no kdq.toml, no KDQ_* variables): the orders rule on the soak's topics,
    components on ports below the ephemeral range."""
    from benchmarks.__main__ import make_config, write_rules
    from benchmarks.speed import write_config
    from kdq.procs import quiet_port

    rng = random.Random()
    config = make_config(
        work / "data",
        write_rules(work / "rules", True, "orders", topics),
        kafka={"topic_include": "bench-soak-.*", "local_port": quiet_port(rng), "local_controller_port": quiet_port(rng)},
        influxdb={"local_port": quiet_port(rng), "local_rpc_port": quiet_port(rng)},
        stream=dict(stream),
    )
    return write_config(config, work / "kdq.toml")


def recompute_runs(airflow) -> list[dict[str, Any]]:
    api = airflow.api()
    runs = api.get("dags/kdq_hourly_recompute/dagRuns", limit=100, order_by="run_after")["dag_runs"]
    out = []
    for r in runs:
        start, end = r.get("start_date"), r.get("end_date")
        seconds = None
        if start and end:
            seconds = round((datetime.fromisoformat(end.replace("Z", "+00:00"))
                             - datetime.fromisoformat(start.replace("Z", "+00:00"))).total_seconds(), 1)
        out.append({"logical_date": r.get("logical_date"), "state": r["state"], "start": start, "end": end,
                    "seconds": seconds, "interval": [r.get("data_interval_start"), r.get("data_interval_end")]})
    return out


def _iso_ms(text: str | None) -> int | None:
    if not text:
        return None
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def read_latencies(config, topics: list[str], app_id: str) -> tuple[list[tuple[int, float, int]], dict[str, Any]]:
    """(produced_ms, seconds to visible, records) of the counted records, and the exactness figures, read from the
    raw archive (each record's batch and produce time) and the window-count commits (:func:`commit_times`)."""
    from pyspark.sql import functions as F

    from benchmarks.__main__ import make_config
    from benchmarks.measure import commit_times
    from kdq.spark.session import build_session

    spark = build_session(make_config(config.data_dir.parent / "analysis", config.rules_dir), app_name="kdq-soak")
    try:
        archive = spark.read.format("delta").load(str(config.tables_dir / "raw_archive")).where(F.col("topic").isin(topics))
        rows = (
            archive.where(F.col("counted") & (F.col("source") == "stream"))
            .groupBy("batch_id", F.col("key").cast("string").cast("bigint").alias("produced_ms"))
            .count()
            .collect()
        )
        commits = commit_times(config.tables_dir / "window_counts" / "_delta_log", app_id)
        latencies = []
        unmatched = 0
        for r in rows:
            done = commits.get(int(r["batch_id"]))
            if done is None:
                unmatched += int(r["count"])
                continue
            latencies.append((int(r["produced_ms"]), done - int(r["produced_ms"]) / 1000.0, int(r["count"])))
        archived = archive.count()
        counts = spark.read.format("delta").load(str(config.tables_dir / "window_counts")).where(F.col("topic").isin(topics))
        counted = counts.agg(F.sum("count")).first()[0] or 0
        figures = {"archive_rows": archived, "window_counts_total": int(counted),
                   "records_without_a_merge_commit": unmatched}
        return latencies, figures
    finally:
        spark.stop()


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    args = parse_args(argv)
    if args.analyse is not None:
        return analyse_kept(args.analyse, args.no_save, args.output)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="kdq-soak-"))
    work.mkdir(parents=True, exist_ok=True)

    from benchmarks import workload
    from benchmarks.__main__ import create_topics, machine_info
    from benchmarks.chaos_jobs import hours_between, run_job, settle_recompute
    from benchmarks.chaos_logic import records_behind
    from benchmarks.chaos_readback import end_offsets
    from benchmarks.chaos_setup import code_state, kill_orphans
    from benchmarks.local_run import cores_by_role, process_cpu, process_role
    from benchmarks.signals import ignore_stop_signals
    from benchmarks.speed import read_progress
    from kdq.procs import quiet_port
    from kdq.spark.stream_process import stop_stream
    from kdq.stack.airflow import RECOMPUTE_MINUTES_ENV, START_DATE_ENV, LocalAirflow
    from kdq.stack.manager import LocalStack

    topics = [f"bench-soak-{i}" for i in range(args.topics)]
    config = soak_config(work, topics, dict(kv.split("=", 1) for kv in args.stream_setting))
    stack = LocalStack(config)
    config = stack.config
    now = datetime.now(UTC)
    # The recompute DAG's first interval is the one the run starts in (no catch-up of earlier hours).
    recompute_start = now.replace(minute=now.minute - now.minute % args.recompute_minutes, second=0, microsecond=0)
    port_rng = random.Random()
    stack.airflow = LocalAirflow(config, quiet_port(port_rng), extra_env={
        RECOMPUTE_MINUTES_ENV: str(args.recompute_minutes),
        START_DATE_ENV: recompute_start.isoformat(),
        "AIRFLOW__CORE__PARALLELISM": str(args.airflow_parallelism),
    })
    stack.airflow.log_server_ports = (quiet_port(port_rng), quiet_port(port_rng))
    w = workload.Workload(messages=0, topics=args.topics, partitions=args.partitions, message_bytes=args.message_bytes,
                          allowed_lateness_s=config.stream.allowed_lateness_seconds)
    result: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "benchmarks.soak", *(sys.argv[1:] if argv is None else argv)]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "code": code_state(),
        "machine": machine_info(),
        "parameters": {"minutes": args.minutes, "rate": args.rate, "bucket_minutes": args.bucket_minutes,
                       "recompute_minutes": args.recompute_minutes, "topics": args.topics,
                       "partitions": args.partitions, "message_bytes": args.message_bytes,
                       "stream_settings": args.stream_setting,
                       "trigger_seconds": config.stream.trigger_interval_seconds,
                       "max_offsets_per_trigger": config.kafka.max_offsets_per_trigger},
        "work_dir": str(work),
    }
    notes: list[str] = []
    bucket_ms = int(args.bucket_minutes * 60_000)
    cores: dict[int, dict[str, float]] = {}
    peak_rss: dict[int, int] = {}
    ok = False
    producer = None
    try:
        statuses = stack.up()
        if not all(s.healthy for s in statuses):
            raise RuntimeError("local stack not healthy: " + "; ".join(s.line() for s in statuses))
        create_topics(stack.kafka, topics, args.partitions)
        stack.airflow.start(timeout=600)
        stack.airflow.wait_for_dags(timeout=300)
        log.info("Airflow at %s; waiting for the supervisor to start the stream", stack.airflow.url)
        deadline = time.monotonic() + 900
        while not read_progress(config):
            if time.monotonic() > deadline:
                raise RuntimeError("the supervisor's stream reported no progress within 15 minutes")
            time.sleep(2)

        # -- traffic at a fixed rate, sampled per bucket ------------------------------------------------------
        start_ms = int(time.time() * 1000)
        samples: dict[str, Any] = {"start_ms": start_ms, "end_ms": start_ms + int(args.minutes * 60_000),
                                   "bucket_minutes": args.bucket_minutes, "topics": topics}
        producer, sent_queue = workload.start_rate_producer(stack.kafka.bootstrap, topics, w, args.rate, args.minutes * 60)
        bucket = 0
        cpu_before, cpu_at = process_cpu(), time.monotonic()
        next_log = time.monotonic()
        while producer.is_alive():
            time.sleep(5)
            now_ms = int(time.time() * 1000)
            current = min((now_ms - start_ms) // bucket_ms, max(0, int(args.minutes * 60_000 - 1) // bucket_ms))
            rss = 0
            for proc in _processes():
                try:
                    if process_role(" ".join(proc.cmdline())) == "stream":
                        rss += proc.memory_info().rss
                except Exception:  # gone meanwhile
                    continue
            peak_rss[current] = max(peak_rss.get(current, 0), rss)
            if current != bucket:
                after = process_cpu()
                cores[bucket] = cores_by_role(cpu_before, after, time.monotonic() - cpu_at, os.sysconf("SC_CLK_TCK"))
                cpu_before, cpu_at, bucket = after, time.monotonic(), current
                save_samples(work, {**samples, "cores": cores, "peak_rss": peak_rss})
            if time.monotonic() >= next_log:
                progress = read_progress(config)
                latest = max(progress, key=lambda p: p["batch_id"]) if progress else {}
                log.info("minute %.1f: stream batch %s (%s rows), stream RSS %.2f GB", (now_ms - start_ms) / 60000,
                         latest.get("batch_id"), latest.get("input_rows"), rss / 1e9)
                next_log = time.monotonic() + 60
        cores[bucket] = cores_by_role(cpu_before, process_cpu(), time.monotonic() - cpu_at, os.sysconf("SC_CLK_TCK"))
        sent = sent_queue.get(timeout=120)
        end_ms = start_ms + int(args.minutes * 60_000)
        result["produced"] = {"sent": sent["sent"], "seconds": round(sent["seconds"], 1), "undelivered": sent["undelivered"],
                              "msgs_per_s": round(sent["sent"] / sent["seconds"])}
        samples.update(cores=cores, peak_rss=peak_rss, sent=sent["sent"])
        save_samples(work, samples)
        # -- drain, settle, stop -------------------------------------------------------------------------------
        ends = end_offsets(config, topics)
        drain_started = time.monotonic()
        drained = False
        while time.monotonic() - drain_started < args.drain_minutes * 60:
            progress = read_progress(config)
            if progress and records_behind(max(progress, key=lambda p: p["batch_id"]).get("end_offsets") or {}, ends) == 0:
                drained = True
                break
            time.sleep(5)
        notes.append(f"the stream read every record {time.monotonic() - drain_started:.0f} s after the traffic stopped"
                     if drained else f"the stream did NOT read every record within {args.drain_minutes:.0f} min")
        notes.append(settle_recompute(stack.airflow, timeout=1800))
        runs = recompute_runs(stack.airflow)
        result["recompute_runs"] = runs
        save_samples(work, {**samples, "recompute_runs": runs})
        stack.airflow.stop(timeout=120)
        stop_stream(config, timeout=180)
        app_id = stream_app_id(config)
        # -- what the DAG's next runs would do: every hour the run touched, recomputed -----------------------
        latencies, figures = read_latencies(config, topics, app_id)
        counted_before_final = figures["window_counts_total"]
        final = []
        recomputed = {_iso_ms(r["interval"][0]) for r in runs
                      if r["state"] == "success" and None not in r["interval"]
                      and _iso_ms(r["interval"][1]) - _iso_ms(r["interval"][0]) == 3_600_000}
        for hour in hours_between(datetime.fromtimestamp(start_ms / 1000, UTC), datetime.now(UTC)):
            if int(hour.timestamp() * 1000) in recomputed:
                continue  # the DAG's own run of this hour succeeded
            outcome = run_job(config, "batch_recompute",
                              [f"--start={hour.isoformat()}", f"--end={(hour + timedelta(hours=1)).isoformat()}",
                               f"--run-id=soak-{hour:%H}"], work / "batch_layer.log")
            final.append({"hour": hour.isoformat(), "exit_code": outcome["exit_code"], "seconds": outcome["seconds"],
                          "corrections": outcome["summary"].get("corrections")})
        result["final_recomputes"] = final
        _, after = read_latencies(config, topics, app_id)
        result["checks"] = {
            "archive rows = records produced": after["archive_rows"] == sent["sent"],
            "window counts = archive rows after the final recomputes": after["window_counts_total"] == after["archive_rows"],
            "archive rows": after["archive_rows"],
            "records produced": sent["sent"],
            "window counts before the final recomputes": counted_before_final,
            "window counts after": after["window_counts_total"],
            "final recomputes ok": all(f["exit_code"] == 0 for f in final),
        }
        windows = [(_iso_ms(r["start"]), _iso_ms(r["end"]) or end_ms) for r in runs if r.get("start")]
        result["buckets"] = bucket_figures(read_progress(config), latencies, start_ms, end_ms, bucket_ms,
                                           [(s, e) for s, e in windows if s], cores, peak_rss)
        result["flatness"] = flatness(result["buckets"], args.bucket_minutes)
        exact = all(v for k, v in result["checks"].items() if isinstance(v, bool))
        ok = exact and drained
        result["verdict"] = (
            ("exact" if exact else "NOT EXACT") + ("" if drained else ", the stream did not drain")
            + f"; {result['flatness']['verdict']}"
        )
    except KeyboardInterrupt as exc:
        result["verdict"] = f"INTERRUPTED ({exc or 'SIGINT'})"
    except Exception as exc:
        result["verdict"] = f"RUN FAILED: {exc!r}"[:2000]
        log.exception("soak run failed")
    finally:
        ignore_stop_signals()  # a second Ctrl-C must not cut the shutdown short
        if producer is not None and producer.is_alive():
            producer.terminate()
        try:
            log.info("stopped: %s", ", ".join(stack.down()) or "nothing was running")
        except Exception:
            log.exception("stopping the stack")
        orphans = kill_orphans(work)
        if orphans:
            notes.append(f"processes left behind and killed at the end: {orphans}")
    result["notes"] = notes
    md = markdown(result)
    print(md)
    if not args.no_save:
        write_results(args.output, "soak", result, md)
    if args.keep or args.work_dir or not ok:
        print(f"work folder kept: {work} (data/stream/stream.log, batch_layer.log, data/airflow/)")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


SAMPLES = "soak_samples.json"


def save_samples(work: Path, samples: Mapping[str, Any]) -> None:
    """What only the live run can see (its start, the cores and RSS per bucket, the records sent, the recompute
    runs), kept in the work folder so ``--analyse`` can redo the figures from a kept folder."""
    (work / SAMPLES).write_text(json.dumps(samples, default=str))


def analyse_kept(work: Path, no_save: bool, output: Path) -> int:
    """The figures of a kept work folder (``--keep``, or a run that failed after its traffic): its progress records,
    raw archive, Delta log and samples; no component needs to run."""
    from kdq.config import load_config

    config = load_config(path=work / "kdq.toml", env={})
    samples = json.loads((work / SAMPLES).read_text())
    cores = {int(k): v for k, v in (samples.get("cores") or {}).items()}
    peak_rss = {int(k): int(v) for k, v in (samples.get("peak_rss") or {}).items()}
    runs = samples.get("recompute_runs") or []
    latencies, figures = read_latencies(config, samples["topics"], stream_app_id(config))
    from benchmarks.speed import read_progress

    bucket_ms = int(float(samples["bucket_minutes"]) * 60_000)
    windows = [(_iso_ms(r["start"]), _iso_ms(r["end"]) or samples["end_ms"]) for r in runs if r.get("start")]
    buckets = bucket_figures(read_progress(config), latencies, samples["start_ms"], samples["end_ms"], bucket_ms,
                             [(a, z) for a, z in windows if a], cores, peak_rss)
    from benchmarks.__main__ import machine_info
    from benchmarks.chaos_setup import code_state

    minutes = (samples["end_ms"] - samples["start_ms"]) / 60_000
    started = datetime.fromtimestamp(samples["start_ms"] / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    result = {"command": f"python -m benchmarks.soak --analyse {work}", "started_at": samples.get("started_at", started),
              "code": code_state(), "machine": machine_info(),
              "parameters": {"minutes": round(minutes, 1), "topics": len(samples["topics"]),
                             "rate": round(samples["sent"] / (minutes * 60)) if samples.get("sent") else "?",
                             "bucket_minutes": samples["bucket_minutes"],
                             "trigger_seconds": config.stream.trigger_interval_seconds},
              "work_dir": str(work), "buckets": buckets, "flatness": flatness(buckets, float(samples["bucket_minutes"])),
              "recompute_runs": runs, "checks": {**figures, "records produced": samples.get("sent")}}
    result["verdict"] = f"analysed from the kept folder; {result['flatness']['verdict']}"
    md = markdown(result)
    print(md)
    if not no_save:
        write_results(output, "soak", result, md)
    return 0


def _processes():
    import psutil

    return psutil.process_iter()


def stream_app_id(config) -> str:
    """The stream's idempotent-write app id (kept in its checkpoint: :func:`kdq.spark.speed_layer.app_id_for`)."""
    from kdq import storage
    from kdq.stream.checkpoint_offsets import speed_layer_checkpoint

    checkpoint = speed_layer_checkpoint(config)
    return storage.files_for(checkpoint).read_bytes(storage.join(checkpoint, "kdq_app_id")).decode().strip()


if __name__ == "__main__":
    from benchmarks.signals import interrupt_on_stop_signals

    interrupt_on_stop_signals()  # a SIGTERM stops the stack this run started, as Ctrl-C does
    sys.exit(main())
