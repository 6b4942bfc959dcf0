"""kdq benchmark: speed-layer throughput, latency, memory and CPU, and batch-layer cost, against baselines.

    .venv/bin/python -m benchmarks                 # default size (~1M x 1 KB messages; see --help)
    .venv/bin/python -m benchmarks --quick         # smoke check, 3-4 minutes on a quiet machine
    .venv/bin/python -m benchmarks --messages 2000000 --topics 8 --no-save
    .venv/bin/python -m benchmarks --rule-variants avro --phases throughput --name avro   # make bench-avro

Starts its own local stack (Kafka KRaft broker + InfluxDB) on free ports with
a temporary data folder, pre-loads the workload into Kafka, verifies it, then:

1. baselines on the backlog: raw consumption ceiling, plain consumer job, and a Kafka Streams
   application (exactly_once_v2, 1 and 2 stream threads; benchmarks/kstreams.py);
2. speed layer (spark-submit, as in production) catching up on the backlog;
3. the same stream fed at a fixed rate: end-to-end latency produce → Delta;
4. batch layer: hourly recompute with fixed late data over a growing archive.

With the ``avro`` rule variant the stack also starts the Schema Registry (Apicurio) and the same orders run once
more as Avro in Confluent's wire format, judged by a ``registry = true`` rule, beside the JSON orders rule.

Writes benchmarks/results/latest.{json,md,png} (unless --no-save; --name for another stem) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks import baselines, kstreams, report, workload
from benchmarks.measure import ProcessSampler, catch_up, commit_times, machine_busy_seconds, mean_breakdown
from benchmarks.speed import StreamRun, write_config
from kdq.config import Config, load_config

log = logging.getLogger("kdq.bench")
PROJECT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"

DEFAULTS = {
    "messages": 1_000_000,
    "latency_rate": "5000,20000",
    "latency_seconds": 60,
    "archive_sizes": "1000000,5000000,20000000",
    "late_rows": 10_000,
}
QUICK = {
    "messages": 50_000,
    "latency_rate": "2000",
    "latency_seconds": 15,
    "archive_sizes": "50000,250000,1000000",
    "late_rows": 1_000,
}


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke check of every phase (a few minutes)")
    p.add_argument("--messages", type=int, help=f"backlog size (default {DEFAULTS['messages']:,}; quick {QUICK['messages']:,})")
    p.add_argument("--topics", type=int, default=4)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--message-bytes", type=int, default=1024)
    p.add_argument("--invalid-ratio", type=float, default=0.05)
    p.add_argument("--out-of-order", type=float, default=0.10, help="fraction shifted back up to 5 s (within lateness)")
    p.add_argument("--late", type=float, default=0.01, help="fraction shifted back beyond the allowed lateness")
    p.add_argument("--event-rate", type=int, default=50_000, help="msgs/s of event time the backlog spans")
    p.add_argument("--schema", choices=("on", "off", "both"), default="on", help="orders JSON Schema rule on the topics")
    p.add_argument(
        "--rule-variants", default="refs,many,summaries,topics1000,avro",
        help="extra catch-up runs (no latency phase) with other rule sets, comma-separated: refs (the orders rule "
        "written with $ref + oneOf + format, benchmarks/rules/orders_refs.schema.json), many (1,000 topic rules, "
        "each topic its own copy of the orders schema), summaries (the orders rule plus two streaming summaries), "
        "topics1000 (the orders rule, the same messages and bytes over --active-topics topics of 1 partition, with a "
        "latency phase at 5,000 msgs/s over as many topics), avro (the orders workload as ≈ 1 KB Avro "
        "in Confluent's wire format through the Schema Registry the stack then starts, a registry = true rule, "
        "compared with the orders rule's run); empty for none",
    )
    p.add_argument(
        "--active-topics", type=int, default=ACTIVE_TOPICS,
        help=f"topics of the topics1000 variant (default {ACTIVE_TOPICS:,}; fewer for a quick check)",
    )
    p.add_argument("--producers", type=int, default=2, help="producer processes for the backlog")
    p.add_argument("--baseline-processes", default="1,2", help="process counts for the baselines")
    p.add_argument(
        "--kstreams-threads", default="1,2",
        help="num.stream.threads of the Kafka Streams baseline's runs (jvm/kstreams-baseline), comma-separated; "
        "run on the orders-rule (and no-rule) topics, not on the --rule-variants",
    )
    p.add_argument("--no-kstreams", action="store_true", help="skip the Kafka Streams baseline")
    p.add_argument(
        "--kstreams-config", action="append", default=[], metavar="KEY=VALUE",
        help="extra StreamsConfig setting of the Kafka Streams baseline (default: its defaults), e.g. commit.interval.ms=1000",
    )
    p.add_argument(
        "--latency-rate",
        help="msgs/s of the fixed-rate phases, ascending, comma-separated (default 5000,20000; quick 2000); "
        "a phase the stream cannot drain ends the series",
    )
    p.add_argument("--latency-seconds", type=float, help="duration of the fixed-rate phase (default 60; quick 15)")
    p.add_argument("--trigger-seconds", type=float, default=None, help="stream trigger interval (default: stream.trigger_interval_seconds)")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None, help="default: kafka.max_offsets_per_trigger")
    p.add_argument("--shuffle-partitions", type=int, default=None, help="default: spark.shuffle_partitions")
    p.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark conf for the stream")
    p.add_argument("--spark-master", help="spark.master of the stream (default: the config's, local[2] here)")
    p.add_argument(
        "--kafka-client", action="append", default=[], metavar="KEY=VALUE",
        help="extra Kafka consumer setting of the stream's source (kafka.client), e.g. fetch.max.bytes=67108864",
    )
    p.add_argument(
        "--stream-setting", action="append", default=[], metavar="KEY=VALUE",
        help="a [stream] setting of the speed layer's config (an integer, a number or text), e.g. batch_tasks=2",
    )
    p.add_argument("--event-log", action="store_true", help="write Spark event logs (for the History Server) to the work dir")
    p.add_argument("--archive-sizes", help="archive rows per batch-layer stage (default 1M,5M,20M; quick 50k,250k,1M)")
    p.add_argument("--late-rows", type=int, help="late records per hourly recompute (default 10,000; quick 1,000)")
    p.add_argument("--phases", default="throughput,latency,batch", help="subset of throughput,latency,batch")
    p.add_argument("--work-dir", type=Path, help="default: a new temporary folder, removed at the end")
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs, tables, event logs)")
    p.add_argument("--output", type=Path, default=RESULTS, help="where latest.{json,md,png} go")
    p.add_argument("--name", default="latest", help="file name stem of the results (make bench-avro: avro)")
    p.add_argument("--no-save", action="store_true", help="print only")
    p.add_argument("--note", default="", help="free text stored with the result")
    args = p.parse_args(argv)
    sizes = QUICK if args.quick else DEFAULTS
    for key, value in sizes.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.archive_sizes = [int(float(x)) for x in str(args.archive_sizes).split(",")]
    args.baseline_processes = [int(x) for x in args.baseline_processes.split(",") if x]
    args.kstreams_threads = [] if args.no_kstreams else [int(x) for x in args.kstreams_threads.split(",") if x]
    args.latency_rate = sorted(int(float(x)) for x in str(args.latency_rate).split(",") if x)
    args.phases = set(args.phases.split(","))
    args.rule_variants = [v for v in args.rule_variants.split(",") if v]
    if args.active_topics < 1:
        p.error("--active-topics: at least 1")
    for v in args.rule_variants:
        if v not in RULE_VARIANTS:
            p.error(f"--rule-variants: unknown variant {v!r}; expected some of {', '.join(RULE_VARIANTS)}")
    return args


def make_config(data_dir: Path, rules_dir: Path, **sections: dict) -> Config:
    """Defaults + overrides only: no kdq.toml, no KDQ_* variables (the benchmark must not depend on local settings)."""
    base = data_dir.parent / "empty.toml"
    base.parent.mkdir(parents=True, exist_ok=True)
    base.write_text("")
    overrides: dict[str, dict] = {
        "paths": {"data_dir": str(data_dir), "rules_dir": str(rules_dir), "jars_dir": str(PROJECT / ".cache" / "jars")},
    }
    for name, values in sections.items():
        overrides.setdefault(name, {}).update(values)
    return load_config(path=base, env={}, overrides=overrides)


# Rule sets of the speed-layer runs: label of the run's topics, rule file, title.
RULE_VARIANTS = {
    "orders": ("s", PROJECT / "config" / "rules" / workload.ORDERS_SCHEMA_FILE, "the `orders` JSON Schema rule"),
    "refs": ("r", PROJECT / "benchmarks" / "rules" / "orders_refs.schema.json", "the orders rule written with `$ref` + `oneOf` + `format`"),
    "many": ("m", PROJECT / "config" / "rules" / workload.ORDERS_SCHEMA_FILE, "1,000 topic rules, each topic its own schema"),
    "summaries": (
        "y", PROJECT / "config" / "rules" / workload.ORDERS_SCHEMA_FILE,
        "the `orders` rule plus two streaming summaries (amount per currency and channel; amount per customer tier)",
    ),
    "topics1000": (
        "t", PROJECT / "config" / "rules" / workload.ORDERS_SCHEMA_FILE,
        "the `orders` rule over 1,000 active topics of 1 partition (same messages and bytes)",
    ),
    # The rule file is the schema registered under each topic's subject (the rules folder has none: registry = true).
    "avro": ("a", workload.AVRO_SCHEMA, "the orders as Avro through the Schema Registry (`registry = true`)"),
}
# The topics1000 variant: every one of ACTIVE_TOPICS topics receives records (what a real cluster looks like),
# so each micro-batch's MERGE touches thousands of windows; the same total messages and bytes as the main run,
# and a latency phase at this rate (issue 24: its p99 against the 4-topic p99 at the same rate).
ACTIVE_TOPICS = 1000
ACTIVE_TOPICS_LATENCY_RATE = 5000


def active_topics_args(args: argparse.Namespace) -> argparse.Namespace:
    """The main run's settings with its messages spread over ``args.active_topics`` topics of 1 partition, and one
    latency phase: at the first of ``args.latency_rate`` ≥ 5,000 msgs/s (5,000 when there is none)."""
    variant = argparse.Namespace(**vars(args))
    variant.topics = args.active_topics
    variant.partitions = 1
    variant.latency_rate = [next((r for r in args.latency_rate if r >= ACTIVE_TOPICS_LATENCY_RATE), ACTIVE_TOPICS_LATENCY_RATE)]
    return variant


def bench_summaries(label: str) -> list[dict]:
    """The summaries of the ``summaries`` variant: over every record of its topics, two groupings each, so
    every batch merges histogram states of (windows × groups) per summary into the summaries table."""
    topics = f"re:bench-{label}-.*"
    return [
        {"name": "order_amount", "topic": topics, "value": "amount", "group_by": ["currency", "channel"],
         "window_seconds": 60, "significant_digits": 3},
        {"name": "order_amount_by_tier", "topic": topics, "value": "amount", "group_by": ["customer.tier"],
         "window_seconds": 60, "significant_digits": 2},
    ]
MANY_RULES = 1000


def create_topics(kafka, names: list[str], partitions: int, chunk: int = 500) -> None:
    """``kafka.create_topic`` for many topics at once: one admin client, one CreateTopics request per ``chunk``
    topics, every future awaited (one client and round trip per topic takes minutes for 2,000 topics)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    settings = {"min.insync.replicas": str(kafka.min_insync_replicas)} if kafka.replication_factor > 1 else {}
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap, **kafka.config.kafka.client})
    for start in range(0, len(names), chunk):
        batch = [NewTopic(n, partitions, kafka.replication_factor, config=dict(settings)) for n in names[start : start + chunk]]
        futures = admin.create_topics(batch, operation_timeout=60)
        for name, future in futures.items():
            try:
                future.result(timeout=120)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise RuntimeError(f"creating topic {name}: {exc}") from exc


def write_rules(folder: Path, schema: bool, rule: str = "orders", topics: list[str] = ()) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if not schema:
        return folder
    source = RULE_VARIANTS[rule][1]
    if rule == "many":
        # One rule per topic (convention files), each a distinct schema (its own title), so the
        # classifier compiles and looks up 1,000 rules; the workload's topics are among them.
        base = json.loads(source.read_text())
        names = list(topics) + [f"bench-other-{i:04d}" for i in range(MANY_RULES - len(topics))]
        for name in names:
            (folder / f"{name}.schema.json").write_text(json.dumps({**base, "title": f"orders of {name}"}))
        return folder
    if rule == "avro":
        # Judged by the schema each message's header names, which must be a version of <topic>-value.
        (folder / "topics.toml").write_text("[[topic]]\nmatch = 're:bench-.*'\nregistry = true\n")
        return folder
    shutil.copy(source, folder / source.name)
    (folder / "topics.toml").write_text(f"[[topic]]\nmatch = 're:bench-.*'\nschema = \"{source.name}\"\n")
    return folder


def machine_info() -> dict:
    import confluent_kafka
    import psutil
    import pyspark

    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    java = shutil.which("java")
    java_version = ""
    if java:
        import subprocess

        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
        java_version = (out.stderr or out.stdout).splitlines()[0] if (out.stderr or out.stdout) else ""
    def pick(folder: str, prefix: str) -> str:
        jars = sorted(p.name for p in (PROJECT / ".cache" / "jars" / folder).glob(f"{prefix}*.jar"))
        return jars[-1][len(prefix) : -4] if jars else "?"

    ck = confluent_kafka.version()
    return {
        "host": platform.node(),
        "cpu": cpu,
        "cores": psutil.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "java": java_version,
        "pyspark": pyspark.__version__,
        "delta": pick("spark", "delta-spark_2.13-"),
        "kafka_broker": pick("kafka", "kafka_2.13-"),
        "spark_kafka_clients": pick("spark", "kafka-clients-"),
        "confluent_kafka": ck[0] if isinstance(ck, tuple) else str(ck),
        "librdkafka": confluent_kafka.libversion()[0],
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


class Cpu:
    """CPU seconds of the stream, the broker(s), this harness's whole tree, and the machine, between marks.

    ``executors``: samplers of the standalone workers' trees (their executor JVMs and Python workers) when the
    stream runs on the cluster shape (benchmarks.cluster); ``stream`` is then the driver alone."""

    def __init__(self, stream: ProcessSampler, broker_pid: int | list[int] | None, own: ProcessSampler,
                 executors: list[ProcessSampler] = ()) -> None:
        self.stream, self.own, self.executors = stream, own, list(executors)
        self.broker_pids = broker_pid if isinstance(broker_pid, list) else [broker_pid] if broker_pid else []
        self.marks: dict[str, tuple] = {}

    def _broker(self) -> float:
        import psutil

        total = 0.0
        for pid in self.broker_pids:
            try:
                t = psutil.Process(pid).cpu_times()
                total += t.user + t.system
            except Exception:
                continue
        return total

    def mark(self, name: str) -> None:
        self.marks[name] = (time.monotonic(), self.stream.cpu_seconds(), self._broker(), self.own.cpu_seconds(),
                            machine_busy_seconds(), sum(e.cpu_seconds() for e in self.executors))

    def between(self, a: str, b: str) -> dict:
        (t0, s0, b0, o0, m0, e0), (t1, s1, b1, o1, m1, e1) = self.marks[a], self.marks[b]
        wall = max(t1 - t0, 1e-9)
        return {
            "seconds": round(wall, 1),
            "stream_cores": round((s1 - s0) / wall, 2),
            "broker_cores": round((b1 - b0) / wall, 2),
            "machine_cores": round((m1 - m0) / wall, 2),
            # Everything not started by this harness: other jobs sharing the machine.
            "other_cores": round(max(0.0, (m1 - m0) - (o1 - o0)) / wall, 2),
            **({"executor_cores": round((e1 - e0) / wall, 2)} if self.executors else {}),
        }


def speed_phase(
    args, work: Path, stack, label: str, schema: bool, latency: bool, own: ProcessSampler, rule: str = "orders"
) -> dict:
    """Backlog → baselines → stream catch-up (→ fixed-rate latency) for one topic set; the stream is stopped at the end."""
    topics = [f"bench-{label}-{i}" for i in range(args.topics)]
    lat_topics = {r: [f"bench-{label}-lat{r}-{i}" for i in range(args.topics)] for r in args.latency_rate} if latency else {}
    avro = schema and rule == "avro"
    registry = None
    if avro:
        # The orders' schema under every topic's subject (the ids the messages are framed with), and one schema of
        # another subject (the other_subject kind).
        registry = workload.register_avro(stack.registry.url, topics + [t for ts in lat_topics.values() for t in ts],
                                          f"bench-{label}-refunds-value")
        log.info("[%s] Avro schema registered: ids %s, other subject's %d", label, sorted(set(registry["ids"].values())),
                 registry["other_id"])
    w = workload.Workload(
        messages=args.messages,
        topics=args.topics,
        partitions=args.partitions,
        message_bytes=args.message_bytes,
        invalid_ratio=args.invalid_ratio,
        out_of_order=args.out_of_order,
        late=args.late,
        schema=schema,
        event_rate=args.event_rate,
        **({"encoding": "avro", "registry": registry} if avro else {}),
    )
    bootstrap = stack.kafka.bootstrap
    created = time.monotonic()
    create_topics(stack.kafka, topics + [t for ts in lat_topics.values() for t in ts], args.partitions)
    log.info("[%s] %d topics created in %.1f s", label, len(topics) + sum(map(len, lat_topics.values())), time.monotonic() - created)
    result: dict = {"label": label, "schema": schema, "rule": rule if schema else None, "workload": w.describe()}

    log.info("[%s] producing %d messages into %d topics x %d partitions", label, w.messages, w.topics, w.partitions)
    produced = workload.produce_backlog(bootstrap, topics, w, workers=args.producers)
    workload.verify_complete(bootstrap, topics, w.messages)
    ends = workload.end_offsets(bootstrap, topics)
    expected = workload.totals(produced["kinds"], schema)
    by_kind: Counter = Counter()
    for (_, kind), n in produced["kinds"].items():
        by_kind[kind] += n
    result["produce"] = {"seconds": round(produced["seconds"], 1), "msgs_per_s": round(w.messages / produced["seconds"]),
                         "expected": expected, "kinds": dict(sorted(by_kind.items()))}
    log.info("[%s] produced in %.1f s (%s), verified complete", label, produced["seconds"], expected)

    schema_path = str(RULE_VARIANTS[rule][1]) if schema else None
    if avro:
        # The plain consumer's Avro check: the writer's schema and each topic's id (benchmarks.baselines.avro_validator).
        spec = work / label / "plain_avro.json"
        spec.parent.mkdir(parents=True, exist_ok=True)
        spec.write_text(json.dumps({"avro_schema": workload.avro_schema(), "ids": registry["ids"]}))
        schema_path = str(spec)
    result["baselines"] = []
    for kind in ("raw", "plain"):
        for n in args.baseline_processes:
            r = baselines.run_consumers(kind, bootstrap, ends, n, schema_path)
            if r["messages"] != w.messages:
                raise RuntimeError(f"{kind} baseline read {r['messages']} of {w.messages}")
            if kind == "plain":
                r["matches_expected"] = r["totals"] == expected
            log.info("[%s] baseline %s x%d: %.0f msgs/s, %.1f MB/s", label, kind, n, r["msgs_per_s"], r["mb_per_s"])
            result["baselines"].append(r)

    data = work / label
    overrides_spark = {"conf": dict(kv.split("=", 1) for kv in args.spark_conf)}
    if args.shuffle_partitions:
        overrides_spark["shuffle_partitions"] = args.shuffle_partitions
    if args.event_log:
        (work / "eventlog").mkdir(exist_ok=True)
        overrides_spark["conf"].update({"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(work / "eventlog")})
    if args.spark_master:
        overrides_spark["master"] = args.spark_master
    spark_cluster = getattr(stack, "spark", None)
    if spark_cluster is not None:
        # The cluster shape (benchmarks.cluster): the stream is submitted to its standalone master.
        overrides_spark["master"] = spark_cluster.url
    kafka = {"bootstrap_servers": bootstrap, "topic_include": f"bench-{label}-.*"}
    if args.max_offsets_per_trigger:
        kafka["max_offsets_per_trigger"] = args.max_offsets_per_trigger
    if args.kafka_client:
        kafka["client"] = dict(kv.split("=", 1) for kv in args.kafka_client)
    config = make_config(
        data / "data",
        write_rules(data / "rules", schema, rule, topics),
        kafka=kafka,
        spark=overrides_spark,
        stream=dict(kv.split("=", 1) for kv in args.stream_setting),  # validated (and typed) by the config
        influxdb={"url": stack.influx.url},
        **({"registry": {"url": stack.registry.url}} if avro else {}),
    )
    if rule == "summaries":
        config = config.with_summaries(bench_summaries(label))
    config = write_config(config, data / "kdq.toml")
    if rule == "orders" and getattr(args, "kstreams_threads", None):
        # The Kafka Streams baseline on the same pre-loaded topics, before the stream starts: kdq's window and
        # allowed lateness (as its grace), the same rule file.
        late = workload.totals_by_topic(produced["late_kinds"], schema)
        by_topic = workload.totals_by_topic(produced["kinds"], schema)
        result["kstreams"] = []
        for n in args.kstreams_threads:
            if not kstreams.available():
                result["kstreams"].append({"kind": "kstreams", "threads": n, "error": f"not built: {kstreams.JAR_DIR} (make setup)"})
                log.error("[%s] Kafka Streams baseline not built (%s): run make setup", label, kstreams.JAR_DIR)
                break
            r = kstreams.run(
                bootstrap, topics, lambda name: stack.kafka.create_topic(name, partitions=args.partitions), n, schema_path,
                by_topic, late, label, window_ms=config.stream.window_seconds * 1000,
                grace_ms=config.stream.allowed_lateness_seconds * 1000, timeout_s=max(600, w.messages / 1000), work=work,
                extra=dict(kv.split("=", 1) for kv in getattr(args, "kstreams_config", [])),
            )
            if r.get("msgs_per_s"):
                r["mb_per_s"] = round(result["baselines"][0]["bytes"] / r["seconds"] / 1e6, 2) if result["baselines"] else None
                log.info("[%s] baseline Kafka Streams x%d threads: %.0f msgs/s, checks %s", label, n, r["msgs_per_s"], r["checks"])
            result["kstreams"].append(r)
    result["stream_settings"] = {
        "trigger_seconds": args.trigger_seconds if args.trigger_seconds is not None else config.stream.trigger_interval_seconds,
        "max_offsets_per_trigger": config.kafka.max_offsets_per_trigger,
        "shuffle_partitions": config.spark.shuffle_partitions,
        "driver_memory": config.spark.driver_memory,
        "master": config.spark.master,
        "extra_conf": config.spark.conf,
        "kafka_client": config.kafka.client,
        "stream": {kv.split("=", 1)[0]: getattr(config.stream, kv.split("=", 1)[0]) for kv in args.stream_setting},
    }
    stream = StreamRun(config, args.trigger_seconds)
    brokers = [p.pid for p in (node.process.process() for node in stack.kafka.nodes) if p]
    workers = [p.pid for p in (w.process() for w in spark_cluster.workers) if p] if spark_cluster else []
    executors = [ProcessSampler(pid).start() for pid in workers]
    try:
        stream.start()
        cpu = Cpu(stream.sampler, brokers, own, executors)
        cpu.mark("start")
        progress = stream.wait_consumed(topics, w.messages, timeout=max(900, w.messages / 1000))
        cpu.mark("caught_up")
        stream.sampler.sample()
        result["catch_up_peak_rss"] = stream.sampler.stats.peak_rss
        result["catch_up_peak_rss_by_process"] = dict(stream.sampler.stats.peak_parts)
        cu = catch_up(progress, w.messages)
        mb = sum(r["bytes"] for r in result["baselines"][:1]) / 1e6
        result["catch_up"] = {
            "messages": cu.rows,
            "batches": cu.batches,
            "seconds": round(cu.seconds, 1),
            "msgs_per_s": round(cu.msgs_per_s),
            "mb_per_s": round(mb / cu.seconds, 1),
            "steady_msgs_per_s": round(cu.steady_msgs_per_s) if cu.steady_msgs_per_s else None,
            "first_batch_seconds": round(cu.first_batch_seconds, 1),
            "wall_seconds_incl_startup": round(time.monotonic() - stream.started, 1),
            "writer_ms_mean": mean_breakdown([p for p in progress if any(t in (p.get("end_offsets") or {}) for t in topics)]),
            "cpu": cpu.between("start", "caught_up"),
        }
        log.info("[%s] speed layer caught up: %s", label, result["catch_up"])
        result["latency_phases"] = []
        for rate, rate_topics in lat_topics.items():
            stream.sampler.reset_peak()
            time.sleep(2 * float(result["stream_settings"]["trigger_seconds"]) + 1)
            cpu.mark("lat_start")
            proc, queue = workload.start_rate_producer(bootstrap, rate_topics, w, rate, args.latency_seconds)
            sent = queue.get(timeout=args.latency_seconds + 300)
            proc.join(30)
            cpu.mark("lat_produced")
            # Let the stream drain what it received, within a deadline: when it cannot keep up
            # with the rate, the records still unread when it is stopped are reported as censored.
            drained = True
            try:
                stream.wait_consumed(rate_topics, sent["sent"], timeout=max(120.0, 3 * args.latency_seconds))
            except RuntimeError as exc:
                if not stream.alive():
                    raise
                drained = False
                log.warning("[%s] the stream did not drain the %d msgs/s phase: %s", label, rate, str(exc).splitlines()[0])
            result["latency_phases"].append(
                {
                    "topics": rate_topics,
                    "drained": drained,
                    "produce_ended_at": sent["ended_at"],
                    "stopped_at": time.time(),
                    "target_msgs_per_s": rate,
                    "sent": sent["sent"],
                    "achieved_msgs_per_s": round(sent["sent"] / sent["seconds"]),
                    "seconds": round(sent["seconds"], 1),
                    "cpu": cpu.between("lat_start", "lat_produced"),
                    "peak_rss": stream.sampler.stats.peak_rss,
                    "peak_rss_by_process": dict(stream.sampler.stats.peak_parts),
                    "expected": workload.totals(Counter({(t, k): n for t, k, n in sent["kinds"]}), schema),
                }
            )
            if not drained:
                break  # a backlog would distort every later phase
    finally:
        stream.stop()
        for sampler in executors:
            sampler.stop()
    if executors:
        result["executors_peak_rss"] = sum(e.stats.peak_rss for e in executors)
    result["peak_rss"] = max([result.get("catch_up_peak_rss", 0)] + [lp["peak_rss"] for lp in result.get("latency_phases", [])])
    result["_config"] = config
    result["_topics"] = topics
    result["_app_id"] = stream.app_id()
    return result


def analyse(spark, run: dict) -> None:
    """Counts written by the stream vs ground truth; end-to-end latency from the archive and the Delta log."""
    from pyspark.sql import functions as F

    from benchmarks.measure import weighted_percentiles

    config: Config = run.pop("_config")
    topics, app_id = run.pop("_topics"), run.pop("_app_id")
    archive = spark.read.format("delta").load(str(config.tables_dir / "raw_archive"))
    counts = spark.read.format("delta").load(str(config.tables_dir / "window_counts"))

    def totals(ts: list[str]) -> dict:
        rows = archive.where(F.col("topic").isin(ts)).groupBy("valid", "counted").count().collect()
        arch = {"valid": 0, "invalid": 0, "late_uncounted": 0, "rows": 0}
        for r in rows:
            arch["rows"] += r["count"]
            arch["valid" if r["valid"] else "invalid"] += r["count"]
            if not r["counted"]:
                arch["late_uncounted"] += r["count"]
        wc = {r["status"]: r["n"] for r in counts.where(F.col("topic").isin(ts)).groupBy("status").agg(F.sum("count").alias("n")).collect()}
        return {"archive": arch, "window_counts": wc}

    t = totals(topics)
    exp = run["produce"]["expected"]
    t["archive_matches_expected"] = t["archive"]["valid"] == exp["valid"] and t["archive"]["invalid"] == exp["invalid"]
    t["exactly_once"] = t["archive"]["rows"] == run["workload"]["messages"]
    t["counted_matches"] = sum(t["window_counts"].values()) == t["archive"]["rows"] - t["archive"]["late_uncounted"]
    if run["workload"].get("encoding") == "avro":
        # Each Avro kind's reason (benchmarks.workload.AVRO_REASONS) in the raw archive, against the kinds produced.
        got: Counter = Counter()
        for r in archive.where(F.col("topic").isin(topics)).groupBy("reason").count().collect():
            got[workload.avro_kind_of(r["reason"])] += r["count"]
        t["reasons"] = dict(sorted(got.items()))
        t["reasons_match_expected"] = got == Counter(run["produce"]["kinds"])
    run["checks"] = t
    if not run.get("latency_phases"):
        return
    commits = commit_times(config.tables_dir / "window_counts" / "_delta_log", app_id)
    for lp in run["latency_phases"]:
        lat_topics = lp.pop("topics")
        rows = (
            archive.where(F.col("topic").isin(lat_topics) & F.col("counted"))
            .groupBy("batch_id", F.col("key").cast("string").cast("bigint").alias("produced_ms"))
            .count()
            .collect()
        )
        pairs = []
        censored = 0
        for r in rows:
            done = commits.get(int(r["batch_id"]))
            if done is None:  # archived, but the stream was stopped before its MERGE: at least this late
                censored += r["count"]
                pairs.append((lp["stopped_at"] - r["produced_ms"] / 1000.0, r["count"]))
                continue
            pairs.append((done - r["produced_ms"] / 1000.0, r["count"]))
        lt = totals(lat_topics)
        unread = lp["sent"] - lt["archive"]["rows"]
        if not lp["drained"] and unread > 0:
            # Never read before the stop: produced by produce_ended_at at the latest, not visible at stopped_at.
            censored += unread
            pairs.append((lp["stopped_at"] - lp["produce_ended_at"], unread))
        lp["latency_s"] = {f"p{q}": round(v, 2) for q, v in weighted_percentiles(pairs, (50, 95, 99, 100)).items()}
        lp["records_measured"] = sum(n for _, n in pairs) - censored
        lp["records_censored"] = censored  # their latency is a lower bound: percentiles above their share are too
        lp["archive_rows"] = lt["archive"]["rows"]
        lp["exactly_once"] = lp["drained"] and lt["archive"]["rows"] == lp["sent"]
        log.info("latency phase: %s", {k: v for k, v in lp.items() if k != "expected"})


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    args = parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="kdq-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    from kdq.stack.manager import LocalStack

    stack_config = make_config(work / "stack", PROJECT / "config" / "rules")
    # The Schema Registry only for the avro variant (an Apicurio JVM, ≈ 250 MB, on the shared cores otherwise).
    stack = LocalStack(stack_config, with_registry=bool(args.phases & {"throughput", "latency"}) and "avro" in args.rule_variants)
    own = ProcessSampler(os.getpid())
    result: dict = {
        "command": shlex.join(["python", "-m", "benchmarks", *(sys.argv[1:] if argv is None else argv)]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "note": args.note,
        "runs": [],
    }
    spark = None
    try:
        statuses = stack.up()
        if not all(s.healthy for s in statuses):
            raise RuntimeError("local stack not healthy: " + "; ".join(s.line() for s in statuses))
        own.start()
        own0, busy0, t0 = own.cpu_seconds(), machine_busy_seconds(), time.monotonic()
        if args.phases & {"throughput", "latency"}:
            variants = {"on": [True], "off": [False], "both": [True, False]}[args.schema]
            for i, schema in enumerate(variants):
                label = "s" if schema else "n"
                result["runs"].append(speed_phase(args, work, stack, label, schema, "latency" in args.phases and i == 0, own))
            for rule in args.rule_variants:
                label = RULE_VARIANTS[rule][0]
                if rule == "topics1000":
                    # With its own latency phase (the p99 target), over as many latency topics; no Kafka Streams
                    # baseline (speed_phase runs it on the orders-rule topics only, like for the other variants).
                    run = speed_phase(active_topics_args(args), work, stack, label, True, "latency" in args.phases, own, rule=rule)
                else:
                    run = speed_phase(args, work, stack, label, True, False, own, rule=rule)
                result["runs"].append(run)
        from kdq.spark.session import build_session

        if result["runs"] or "batch" in args.phases:
            spark = build_session(make_config(work / "analysis", PROJECT / "config" / "rules"), app_name="kdq-bench")
        for run in result["runs"]:
            analyse(spark, run)
        comparison = report.avro_comparison(result)
        if comparison:
            result["avro_vs_json"] = comparison
        if "batch" in args.phases:
            from benchmarks import batch

            bconfig = make_config(work / "batch", PROJECT / "config" / "rules", influxdb={"url": stack.influx.url},
                                  kafka={"bootstrap_servers": stack.kafka.bootstrap})
            result["batch"] = batch.run(spark, bconfig, args.archive_sizes, args.late_rows, topics=args.topics)
        wall = time.monotonic() - t0
        result["machine"]["other_load_cores"] = round(max(0.0, machine_busy_seconds() - busy0 - (own.cpu_seconds() - own0)) / wall, 2)
    finally:
        if spark is not None:
            spark.stop()
        own.stop()
        stack.down()
        if not args.keep and args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    result["duration_seconds"] = round(time.monotonic() - started, 1)
    result["shared_machine"] = result["machine"].get("other_load_cores", 0) > 0.15
    if not args.no_save:
        # The figures first: a report that fails to render must not lose a run.
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / f"{args.name}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    md = report.markdown(result)
    print(md)
    if not args.no_save:
        (args.output / f"{args.name}.md").write_text(md)
        report.plot(result, args.output / f"{args.name}.png")
        print(f"written: {args.output}/{args.name}.json, {args.name}.md, {args.name}.png")
    if args.keep or args.work_dir:
        print(f"work dir kept: {work}")
    return 0


if __name__ == "__main__":
    from benchmarks.signals import interrupt_on_stop_signals

    interrupt_on_stop_signals()  # a SIGTERM stops the stack this run started, as Ctrl-C does
    sys.exit(main())
