"""Settings sweep: the speed layer's catch-up (and latency) with one setting changed at a time.

    .venv/bin/python -m benchmarks.sweep                   # every variant (~30 min on 2 cores)
    .venv/bin/python -m benchmarks.sweep --only defaults,max_offsets_50k --messages 300000

Each variant is one ``python -m benchmarks --phases throughput[,latency]`` run
(its own stack, the same generated workload, the raw and plain baselines on
one process as a check that the machine behaved alike across runs). Writes
``benchmarks/results/sweep.{json,md}`` (unless --no-save): msgs/s, per-batch
breakdown and, for the trigger variants, latency at a fixed rate.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger("kdq.bench.sweep")
RESULTS = Path(__file__).resolve().parent / "results"

# (name, what changes, extra arguments of `python -m benchmarks`)
THROUGHPUT = [
    ("defaults", "product defaults: trigger 5 s, maxOffsetsPerTrigger 200,000, 4 shuffle partitions, snappy, Parallel GC", []),
    ("max_offsets_50k", "kafka.max_offsets_per_trigger = 50,000", ["--max-offsets-per-trigger", "50000"]),
    ("max_offsets_400k", "kafka.max_offsets_per_trigger = 400,000", ["--max-offsets-per-trigger", "400000"]),
    ("shuffle_1", "spark.shuffle_partitions = 1", ["--shuffle-partitions", "1"]),
    ("shuffle_8", "spark.shuffle_partitions = 8", ["--shuffle-partitions", "8"]),
    # No codec variants: the archive is Snappy whatever the session's codec (kdq.spark.writers.ARCHIVE_WRITE_OPTIONS),
    # and LZ4_RAW files cannot always be read back by pyspark 4.2's Parquet (PERF_NOTES, twenty-fifth pass).
    (
        "kafka_fetch_large",
        "Kafka consumer: max.partition.fetch.bytes 8 MiB, fetch.max.bytes 64 MiB",
        ["--kafka-client", "max.partition.fetch.bytes=8388608", "--kafka-client", "fetch.max.bytes=67108864"],
    ),
    ("parallel_gc", "driver JVM with the Parallel GC (the default since the second pass)", ["--spark-conf", "spark.driver.extraJavaOptions=-XX:+UseParallelGC"]),
    ("g1_gc", "driver JVM with G1 (the JVM's default)", ["--spark-conf", "spark.driver.extraJavaOptions=-XX:+UseG1GC"]),
    ("batch_tasks_12", "stream.batch_tasks = 12: one task per Kafka partition (default 0: one per core, 2 here)", ["--stream-setting", "batch_tasks=12"]),
    ("aqe_off", "adaptive query execution off", ["--spark-conf", "spark.sql.adaptive.enabled=false"]),
    (
        "cache_uncompressed",
        "the batch's cached rows not compressed",
        ["--spark-conf", "spark.sql.inMemoryColumnarStorage.compressed=false"],
    ),
]
LATENCY = [
    ("trigger_1s", "trigger every 1 s, 5,000 msgs/s", ["--trigger-seconds", "1"]),
    ("trigger_5s", "trigger every 5 s (default), 5,000 msgs/s", ["--trigger-seconds", "5"]),
    ("trigger_15s", "trigger every 15 s, 5,000 msgs/s", ["--trigger-seconds", "15"]),
]


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sweep", description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=600_000, help="backlog per throughput variant")
    p.add_argument("--latency-messages", type=int, default=100_000, help="backlog before the fixed-rate phase")
    p.add_argument("--latency-rate", type=int, default=5000)
    p.add_argument("--latency-seconds", type=int, default=45)
    p.add_argument("--only", help="comma-separated variant names")
    p.add_argument("--work-dir", type=Path)
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--no-save", action="store_true")
    return p.parse_args(argv)


def run_variant(name: str, extra: list[str], args, work: Path, latency: bool) -> dict:
    out = work / name
    command = [
        sys.executable, "-m", "benchmarks", "--baseline-processes", "1", "--no-kstreams", "--output", str(out),
        "--phases", "throughput,latency" if latency else "throughput",
        "--messages", str(args.latency_messages if latency else args.messages),
    ]
    if latency:
        command += ["--latency-rate", str(args.latency_rate), "--latency-seconds", str(args.latency_seconds)]
    command += extra
    log.info("variant %s: %s", name, " ".join(command[1:]))
    started = time.monotonic()
    with open(work / f"{name}.log", "w") as logfile:
        done = subprocess.run(command, stdout=logfile, stderr=subprocess.STDOUT, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"variant {name} failed ({done.returncode}); see {work / f'{name}.log'}")
    result = json.loads((out / "latest.json").read_text())
    run = result["runs"][0]
    cu = run["catch_up"]
    row = {
        "name": name,
        "seconds": round(time.monotonic() - started),
        "msgs_per_s": cu["msgs_per_s"],
        "steady_msgs_per_s": cu["steady_msgs_per_s"],
        "batches": cu["batches"],
        "first_batch_seconds": cu["first_batch_seconds"],
        "writer_ms_mean": cu["writer_ms_mean"],
        "stream_cores": cu["cpu"]["stream_cores"],
        "other_cores": result["machine"].get("other_load_cores"),
        "peak_rss": run["peak_rss"],
        "exactly_once": run["checks"]["exactly_once"] and run["checks"]["archive_matches_expected"],
        "baselines": {f"{b['kind']}": b["msgs_per_s"] for b in run["baselines"]},
    }
    if latency and run.get("latency_phases"):
        lp = run["latency_phases"][0]
        row["latency_s"] = lp.get("latency_s")
        row["latency_exactly_once"] = lp.get("exactly_once")
    log.info("variant %s: %s", name, row)
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"## Speed-layer settings sweep ({meta['started_at']})",
        "",
        f"Command: `{meta['command']}` ({meta['minutes']} min). Workload: 1 KB JSON orders with the schema rule, "
        "4 topics × 3 partitions, 5% invalid, 10% out of order, 1% late; one setting changed per row, "
        "everything else at the product defaults. `steady` leaves out the first batch (JIT warm-up); "
        "a backlog that is no multiple of the batch size ends with a small batch, whose fixed cost is included. "
        "`plain ×1` is the plain-consumer baseline measured in the same run (a check that the machine behaved alike).",
        "",
        "| variant | change | msgs/s (catch-up) | steady | batches | first batch s | classify+agg ms | archive ms | merge ms | stream cores | peak RSS GB | plain ×1 | exactly once |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "latency_s" in r:
            continue
        w = r["writer_ms_mean"] or {}
        lines.append(
            f"| {r['name']} | {r['change']} | {r['msgs_per_s']:,} | {(r['steady_msgs_per_s'] or 0):,} | {r['batches']} | "
            f"{r['first_batch_seconds']} | {w.get('classify_aggregate', 0):,.0f} | {w.get('archive', 0):,.0f} | "
            f"{w.get('merge_counts', 0):,.0f} | {r['stream_cores']} | {r['peak_rss'] / 2**30:.2f} | "
            f"{int(r['baselines'].get('plain', 0)):,} | {r['exactly_once']} |"
        )
    lat = [r for r in rows if "latency_s" in r]
    if lat:
        lines += [
            "",
            "| variant | change | p50 s | p95 s | p99 s | max s | exactly once |",
            "|---|---|---:|---:|---:|---:|---|",
        ]
        for r in lat:
            ls = r["latency_s"] or {}
            lines.append(
                f"| {r['name']} | {r['change']} | {ls.get('p50')} | {ls.get('p95')} | {ls.get('p99')} | {ls.get('p100')} | "
                f"{r.get('latency_exactly_once')} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    wanted = set(args.only.split(",")) if args.only else None
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="kdq-sweep-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    meta = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python -m benchmarks.sweep", *(sys.argv[1:] if argv is None else argv)]),
    }
    rows = []
    for variants, latency in ((THROUGHPUT, False), (LATENCY, True)):
        for name, change, extra in variants:
            if wanted is not None and name not in wanted:
                continue
            row = run_variant(name, extra, args, work, latency)
            row["change"] = change
            rows.append(row)
    meta["minutes"] = round((time.monotonic() - started) / 60, 1)
    md = markdown(rows, meta)
    print(md)
    if not args.no_save:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "sweep.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
        (args.output / "sweep.md").write_text(md)
        print(f"written: {args.output}/sweep.json, sweep.md")
    return 0


if __name__ == "__main__":
    from benchmarks.signals import interrupt_on_stop_signals

    interrupt_on_stop_signals()  # a SIGTERM stops the stack this run started, as Ctrl-C does
    sys.exit(main())
