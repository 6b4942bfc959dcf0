"""The speed-layer benchmark on the cluster shape (kdq up --cluster) beside local[2].

What the cluster path costs or gains on this machine (issue 16).

    .venv/bin/python -m benchmarks.cluster                   # both shapes, make bench's size (1M messages)
    .venv/bin/python -m benchmarks.cluster --quick           # both shapes, 50k messages (smoke check)
    .venv/bin/python -m benchmarks.cluster --shapes cluster  # the cluster only, beside latest.json's local[2]

Same workload and phases as the speed layer of ``make bench`` (``benchmarks.__main__.speed_phase`` with the
``orders`` rule: backlog, baselines, catch-up, fixed-rate latency; every other option of ``python -m
benchmarks`` is accepted), once per shape, each on its own stack in a temporary folder:

* ``local``: ``kdq up`` (one KRaft broker), the stream in ``local[2]``: what ``make bench`` measures;
* ``cluster``: ``kdq up --cluster`` (three KRaft brokers, topics at RF 3 / ``min.insync.replicas`` 2; a Spark
  standalone master and two 1-core 2 GB workers), the stream submitted to the master the way a cluster
  needs it (``--py-files`` kdq.zip, ``--jars``; two 1-core executors; docs/cluster.md).

The shapes run one after the other, never together. Not part of ``make bench`` (``make bench-cluster``).
Writes benchmarks/results/cluster.{json,md} unless ``--no-save``. Figures from a loaded machine are not
comparable: only a quiet run's belong in the results.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import benchmarks.__main__ as bench
from benchmarks import report
from benchmarks.measure import ProcessSampler, machine_busy_seconds

log = logging.getLogger("kdq.bench")
SHAPES = ("local", "cluster")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, argparse.Namespace]:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.cluster", description=__doc__.splitlines()[0],
        epilog="Any other option goes to the workload (python -m benchmarks --help): --quick, --messages, "
        "--latency-rate, --latency-seconds, --topics, --partitions, --trigger-seconds, ...",
    )
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated, in order: local, cluster")
    p.add_argument("--output", type=Path, default=bench.RESULTS, help="where cluster.{json,md} go")
    p.add_argument("--no-save", action="store_true", help="print only")
    p.add_argument("--note", default="", help="free text stored with the result")
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs, tables)")
    own, rest = p.parse_known_args(argv)
    own.shapes = [s for s in own.shapes.split(",") if s]
    for shape in own.shapes:
        if shape not in SHAPES:
            p.error(f"--shapes: unknown shape {shape!r}; expected some of {', '.join(SHAPES)}")
    # The speed layer with the orders rule, as make bench's first run; no rule variants, no batch layer
    # (it runs in-process, the same on either shape), no Kafka Streams baseline (make bench has it).
    workload = bench.parse_args([*rest, "--schema", "on", "--rule-variants", "", "--phases", "throughput,latency", "--no-kstreams"])
    return own, workload


def run_shape(shape: str, args: argparse.Namespace, work: Path) -> dict:
    """One shape: its stack up, the speed phase, the stack down. The run's tables stay in ``work``."""
    from kdq.stack.manager import LocalStack

    stack = LocalStack(bench.make_config(work / "stack", bench.PROJECT / "config" / "rules"), cluster=shape == "cluster")
    own = bench.ProcessSampler(os.getpid())
    started = time.monotonic()
    try:
        statuses = stack.up()
        if not all(s.healthy for s in statuses):
            raise RuntimeError(f"{shape} stack not healthy: " + "; ".join(s.line() for s in statuses))
        up_seconds = time.monotonic() - started
        log.info("[%s] stack up in %.1f s", shape, up_seconds)
        own.start()
        run = bench.speed_phase(args, work, stack, "s", True, "latency" in args.phases, own)
    finally:
        own.stop()
        stack.down()
    run["shape"] = shape
    run["stack"] = {
        "up_seconds": round(up_seconds, 1),
        "kafka_brokers": len(stack.kafka.nodes),
        "replication_factor": stack.kafka.replication_factor,
        "min_insync_replicas": stack.kafka.min_insync_replicas,
        "spark": stack.spark.url.rsplit(":", 1)[0] + ":<port>, 2 workers x 1 core / 2 GB" if stack.spark else "local[2]",
    }
    return run


def _latency(run: dict) -> str:
    phases = [lp for lp in run.get("latency_phases", []) if lp.get("latency_s")]
    return "; ".join(
        f"{p['target_msgs_per_s']:,}/s: p50 {p['latency_s']['p50']:.1f} s, p99 {'≥ ' if p.get('records_censored') else ''}"
        f"{p['latency_s']['p99']:.1f} s" for p in phases
    ) or "–"


def comparison(result: dict) -> list[str]:
    """The shapes side by side (one row each), plus latest.json's local[2] row when this run has none."""
    rows = list(result["runs"])
    reference = result.get("reference_local")
    lines = [
        "| shape | Kafka | Spark | catch-up msgs/s | steady msgs/s | first batch | wall incl. start-up | latency produce → Delta | "
        "CPU: driver / executors / brokers / machine (cores) | peak RSS: driver / workers | exactly once |",
        "|---|---|---|---:|---:|---:|---:|---|---|---|---|",
    ]
    for run in rows + ([reference] if reference else []):
        cu, st = run.get("catch_up") or {}, run.get("stack") or {}
        c = cu.get("cpu") or {}
        brokers = st.get("kafka_brokers", 1)
        kafka = f"{brokers} broker{'s' if brokers > 1 else ''}, RF {st.get('replication_factor', 1)}"
        name = run.get("shape", "local")
        if run is reference:
            name = f"local (latest.json, {reference['started_at']}: another run)"
        checks = run.get("checks") or {}
        once = checks.get("exactly_once") and checks.get("archive_matches_expected") and checks.get("counted_matches")
        lines.append(
            f"| {name} | {kafka} | {st.get('spark', run.get('stream_settings', {}).get('master', '?'))} | "
            f"**{report._n(cu.get('msgs_per_s'))}** | {report._n(cu.get('steady_msgs_per_s'))} | {cu.get('first_batch_seconds', '–')} s | "
            f"{cu.get('wall_seconds_incl_startup', '–')} s | {_latency(run)} | "
            f"{c.get('stream_cores', '–')} / {c.get('executor_cores', '–')} / {c.get('broker_cores', '–')} / {c.get('machine_cores', '–')} | "
            f"{report._gb(run.get('catch_up_peak_rss'))} / {report._gb(run.get('executors_peak_rss'))} | "
            f"{'yes' if once else ('–' if not checks else 'NO')} |"
        )
    local = next((r for r in rows if r.get("shape") == "local"), reference)
    cluster = next((r for r in rows if r.get("shape") == "cluster"), None)
    if local and cluster and (local.get("catch_up") or {}).get("msgs_per_s") and (cluster.get("catch_up") or {}).get("msgs_per_s"):
        ratio = cluster["catch_up"]["msgs_per_s"] / local["catch_up"]["msgs_per_s"]
        lines += ["", f"Cluster ÷ local[2] catch-up throughput: **{ratio:.2f}×**."]
    return lines


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"## kdq benchmark: the cluster shape beside local[2] ({result['started_at']})",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB RAM; Python {m['python']}, PySpark {m['pyspark']}, "
        f"Delta {m['delta']}, Kafka {m['kafka_broker']}. Every process of both shapes shares this machine"
        + (
            f"; **other jobs were running too** (≈ {m.get('other_load_cores', 0):.2f} cores on average): these figures "
            "are not comparable with a quiet run's."
            if result.get("shared_machine") else f" (no other load seen: {m.get('other_load_cores', 0):.2f} cores)."
        ),
        "",
        f"Command: `{result['command']}` ({result.get('duration_seconds', 0) / 60:.1f} min)." + (f" {result['note']}" if result.get("note") else ""),
        "",
        "Stream CPU is the driver's process tree; on the cluster the executors run under the workers (their "
        "trees, the worker daemons included, are the executors' column and RSS). Stack start-up: "
        + ", ".join(f"{r['shape']} {r['stack']['up_seconds']} s" for r in result["runs"]) + ".",
        "",
        *comparison(result),
        "",
    ]
    for run in result["runs"]:
        detail = report.markdown({**result, "runs": [run]}).split("\n### ", 1)
        if len(detail) == 2:
            body = detail[1].split("\n### Targets", 1)[0]
            lines += [f"### {run['shape']}: {body.strip()}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    argv = sys.argv[1:] if argv is None else argv
    own, args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="kdq-bench-cluster-"))
    started = time.monotonic()
    result: dict = {
        "command": shlex.join(["python", "-m", "benchmarks.cluster", *argv]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": bench.machine_info(),
        "note": own.note,
        "runs": [],
    }
    me = ProcessSampler(os.getpid())
    me.start()
    own0, busy0, t0 = me.cpu_seconds(), machine_busy_seconds(), time.monotonic()
    spark = None
    try:
        for shape in own.shapes:
            result["runs"].append(run_shape(shape, args, work / shape))
        from kdq.spark.session import build_session

        spark = build_session(bench.make_config(work / "analysis", bench.PROJECT / "config" / "rules"), app_name="kdq-bench")
        for run in result["runs"]:
            bench.analyse(spark, run)
        wall = time.monotonic() - t0
        result["machine"]["other_load_cores"] = round(max(0.0, machine_busy_seconds() - busy0 - (me.cpu_seconds() - own0)) / wall, 2)
    finally:
        if spark is not None:
            spark.stop()
        me.stop()
        if not own.keep:
            shutil.rmtree(work, ignore_errors=True)
    if "local" not in own.shapes:
        latest = own.output / "latest.json"
        if latest.is_file():
            previous = json.loads(latest.read_text())
            first = next((r for r in previous.get("runs", []) if r.get("schema") and (r.get("rule") or "orders") == "orders"), None)
            if first:
                result["reference_local"] = {**first, "shape": "local", "started_at": previous.get("started_at")}
    result["duration_seconds"] = round(time.monotonic() - started, 1)
    result["shared_machine"] = result["machine"].get("other_load_cores", 0) > 0.15
    md = markdown(result)
    if not own.no_save:
        own.output.mkdir(parents=True, exist_ok=True)
        (own.output / "cluster.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        (own.output / "cluster.md").write_text(md)
    print(md)
    if not own.no_save:
        print(f"written: {own.output}/cluster.json, cluster.md")
    if own.keep:
        print(f"work dir kept: {work}")
    return 0


if __name__ == "__main__":
    from benchmarks.signals import interrupt_on_stop_signals

    interrupt_on_stop_signals()  # a SIGTERM stops the stack this run started, as Ctrl-C does
    sys.exit(main())
