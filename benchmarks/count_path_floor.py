"""Where the speed layer's per-record cost goes, from Kafka on: the same backlog read by Spark's Kafka source and
taken one stage further per variant (issue 24: "run the experiment that would refute the ceiling").

    .venv/bin/python -m benchmarks.count_path_floor [--messages 1000000] [--repeat 2]

Starts its own local stack (broker) on free ports, produces the `make bench` workload (1 KB orders JSON, 4 topics
× 3 partitions), then reads it back as one Spark batch per variant, interleaved, each on a local[2] session:

* ``kafka_count``: the Kafka source alone (``count()``);
* ``kafka_rows``: every column of every record materialised (a noop write of the source's rows);
* ``classify``: the stream's classification (``transforms.classify`` + ``mark_late``), noop write;
* ``archive``: the stream's pass: classified, counted as an observed metric, appended to a partitioned Delta
  archive (the speed layer's first write);
* ``archive_unpartitioned``: the same into an unpartitioned Delta table (no per-task sort by ``event_hour``);
* ``archive_narrow``: the same pass writing every column but the value (what the value costs the archive);
* ``summary_entries``: ``classify`` plus each record's summary entries (``with_summary_entries``: the `make bench`
  summaries variant's two summaries), noop write;
* ``summaries``: ``archive`` plus the summaries' states as a second observed metric (the speed layer's pass with
  summaries configured: ``with_summary_states_metric``);
* ``summaries_entries``: the same with the states aggregated from the entries built as Spark columns (the way
  registry-backed topics take, and every topic's before the twenty-first pass).

A variant named ``<variant>+opt`` is the same with the ``--kafka-option`` settings on the Kafka source (e.g.
``--variants kafka_count,kafka_count+opt --kafka-option kafka.max.poll.records=10000``), interleaved with the plain
one in the same process. ``--topics``/``--partitions`` spread the same messages over more topic partitions.

Prints wall time, msgs/s on the two cores and the driver JVM's CPU time per record (core-µs), which holds still
when other programs load the machine.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import psutil

from benchmarks import workload
from benchmarks.__main__ import PROJECT, bench_summaries, create_topics, make_config

VARIANTS = (
    "kafka_count", "kafka_rows", "classify", "archive", "archive_unpartitioned", "archive_narrow", "summary_entries",
    "summaries", "summaries_entries",
)


def jvm_cpu_seconds() -> float:
    """CPU time of the driver JVM (the Python process's children): unlike wall time, it holds still when other
    programs load the machine, so two paths compare on a busy machine too."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def orders_rules(work: Path, topic_prefix: str) -> Path:
    """A rules folder in ``work``: the `make bench` orders schema for every topic starting with ``topic_prefix``."""
    rules_dir = work / "rules"
    rules_dir.mkdir()
    shutil.copy(PROJECT / "config" / "rules" / workload.ORDERS_SCHEMA_FILE, rules_dir / workload.ORDERS_SCHEMA_FILE)
    (rules_dir / "topics.toml").write_text(
        f"[[topic]]\nmatch = 're:{topic_prefix}.*'\nschema = \"{workload.ORDERS_SCHEMA_FILE}\"\n"
    )
    return rules_dir


def floor_stack(work_prefix: str, topic_prefix: str):
    """A new work folder, its orders rules folder (:func:`orders_rules`) and a local stack (not started) on it."""
    from kdq.stack.manager import LocalStack

    work = Path(tempfile.mkdtemp(prefix=work_prefix))
    rules_dir = orders_rules(work, topic_prefix)
    return work, rules_dir, LocalStack(make_config(work / "stack", rules_dir))


def interleaved(names: list[str], run, rows: int, repeat: int, unit: str = "record") -> None:
    """Run each variant ``repeat`` times, interleaved (each sees the same machine), checking it handled ``rows``;
    print wall time, rate and the driver JVM's CPU time per row."""
    for _ in range(repeat):
        for name in names:
            t0, c0 = time.monotonic(), jvm_cpu_seconds()
            handled = run(name)
            took, cpu = time.monotonic() - t0, jvm_cpu_seconds() - c0
            assert handled == rows, (name, handled)
            print(
                f"{name:24s} {took:6.1f} s {rows / took:9,.0f} {unit}s/s  "
                f"JVM CPU {cpu:6.1f} s = {cpu / rows * 1e6:5.1f} core-µs/{unit}",
                flush=True,
            )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark conf")
    p.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a Kafka source option for the variants named <variant>+opt")
    p.add_argument("--topics", type=int, default=4)
    p.add_argument("--partitions", type=int, default=3)
    args = p.parse_args(argv)

    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from kdq.rules import load_rules
    from kdq.spark import transforms
    from kdq.spark.session import build_session
    from kdq.spark.summaries import (
        summary_states_metric,
        summary_states_rows,
        with_summary_entries,
        with_summary_states_metric,
    )
    from kdq.spark.writers import ARCHIVE_WRITE_OPTIONS
    from kdq.tables import RAW_ARCHIVE

    work, rules_dir, stack = floor_stack("kdq-floor-", "floor-")
    spark = None
    try:
        stack.up()
        config = make_config(
            work / "data", rules_dir, kafka={"bootstrap_servers": stack.config.kafka_bootstrap()},
            spark={"conf": dict(item.split("=", 1) for item in args.conf)},
        )
        # The `make bench` summaries variant's two summaries, on this run's topics.
        summaries = config.with_summaries(
            [{**s, "topic": "re:floor-.*"} for s in bench_summaries("floor")]).summaries
        topics = [f"floor-{i}" for i in range(args.topics)]
        create_topics(stack.kafka, topics, args.partitions)
        w = workload.Workload(messages=args.messages)
        produced = workload.produce_backlog(config.kafka_bootstrap(), topics, w)
        workload.verify_complete(config.kafka_bootstrap(), topics, args.messages)
        print(f"produced {args.messages:,} messages in {produced['seconds']:.1f} s", flush=True)
        spark = build_session(config, app_name="kdq-floor")
        rules = load_rules(rules_dir)
        stream = config.stream

        kafka_options = dict(item.split("=", 1) for item in args.kafka_option)
        source_options = {}  # the current variant's extra Kafka source options (its name ends in +opt)

        def source():
            return (
                spark.read.format("kafka").options(**config.spark_kafka_options()).options(**source_options)
                .option("subscribe", ",".join(topics)).option("startingOffsets", "earliest").load()
                .coalesce(spark.sparkContext.defaultParallelism)
            )

        def classified():
            ingest = int(time.time() * 1000)
            return transforms.mark_late(transforms.classify(source(), rules, stream, ingest), {}, stream)

        def archive(frame, partitioned: bool, columns, with_summaries: str = "") -> int:
            observation = Observation(f"floor_{uuid.uuid4().hex[:8]}")
            metrics = [transforms.batch_counts_metric(frame).alias("counts")]
            if with_summaries == "entries":
                frame = with_summary_entries(frame, summaries, {}, rules)
                metrics.append(summary_states_metric(frame).alias("summaries"))
            elif with_summaries:
                frame, states = with_summary_states_metric(frame, summaries, {}, rules)
                metrics.append(states.alias("summaries"))
            observed = frame.observe(observation, *metrics)
            out = observed.withColumn("batch_id", F.lit(0).cast("bigint")).withColumn("source", F.lit("floor"))
            writer = out.select(*columns).write.format("delta").mode("append").options(**ARCHIVE_WRITE_OPTIONS)
            if partitioned:
                writer = writer.partitionBy("event_hour")
            writer.save(str(work / "tables" / uuid.uuid4().hex))
            if with_summaries and not summary_states_rows(observation.get["summaries"]):
                raise AssertionError("summaries: no summary states observed")
            return sum(int(r["count"]) for r in transforms.batch_counts_rows(observation.get["counts"]))

        every = list(RAW_ARCHIVE.column_names)

        def run(name: str) -> int:
            base, _, opt = name.partition("+")
            source_options.clear()
            if opt == "opt":
                source_options.update(kafka_options)
            elif opt:
                raise ValueError(name)
            return run_variant(base)

        def run_variant(name: str) -> int:
            if name == "kafka_count":
                return source().count()
            if name == "kafka_rows":
                source().write.format("noop").mode("overwrite").save()
                return args.messages
            if name == "classify":
                classified().write.format("noop").mode("overwrite").save()
                return args.messages
            if name == "archive":
                return archive(classified(), True, every)
            if name == "archive_unpartitioned":
                return archive(classified(), False, every)
            if name == "archive_narrow":
                return archive(classified(), True, [c for c in every if c != "value"])
            if name == "summary_entries":
                with_summary_entries(classified(), summaries, {}, rules).write.format("noop").mode("overwrite").save()
                return args.messages
            if name == "summaries":
                return archive(classified(), True, every, with_summaries="records")
            if name == "summaries_entries":
                return archive(classified(), True, every, with_summaries="entries")
            raise ValueError(name)

        interleaved([v for v in args.variants.split(",") if v], run, args.messages, args.repeat)
    finally:
        if spark is not None:
            spark.stop()
        stack.down()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    from benchmarks.signals import interrupt_on_stop_signals

    interrupt_on_stop_signals()  # a SIGTERM stops the stack this run started, as Ctrl-C does
    raise SystemExit(main())
