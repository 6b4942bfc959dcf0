"""The floor of produce → visible latency in the speed layer's shape, one stage at a time (issue 24: "run the
experiment that would refute the ceiling").

    .venv/bin/python -m benchmarks.latency_floor [--rate 5000] [--seconds 60] [--trigger 0.5]

Starts its own broker on free ports and, per variant, a Structured Streaming query on a local[2] session (the
stream's Spark settings) over 4 topics × 3 partitions (``--topics``/``--partitions``) fed at ``--rate`` msgs/s of the `make bench` 1 KB orders
JSON (key = produce time in ms, as the benchmark's latency phase). Each micro-batch is classified as the speed
layer does (``transforms.classify``) and then:

* ``source``: no classification: the batch's rows counted per produce time and collected to the driver (Structured
  Streaming's own floor: the Kafka source, a micro-batch, one job);
* ``count``: its per-window counts collected to the driver (Structured Streaming + classification, no Delta);
* ``merge``: the counts MERGEd into a ``window_counts`` table with the speed layer's own writer
  (``merge_window_increments``, its idempotent guard, the small-query session);
* ``archive_merge``: the speed layer's first write before it: the classified records appended to a partitioned
  Delta archive, the counts an observed metric of that write (the stream's one pass), then the MERGE.

A record is visible when its batch's last step returned (the MERGE committed, for the Delta variants). Prints
p50/p95/p99 per variant and the mean batch duration; nothing is saved (figures go to PERF_NOTES by hand).
"""

from __future__ import annotations

import argparse
import shutil
import threading
import time
import uuid

from benchmarks import workload
from benchmarks.__main__ import create_topics, make_config
from benchmarks.count_path_floor import floor_stack
from benchmarks.measure import weighted_percentiles

VARIANTS = ("source", "count", "merge", "archive_merge")


def mean_ms(durations: list[float]) -> float:
    return 1000 * sum(durations) / len(durations) if durations else 0.0


def wait_for_leaders(bootstrap: str, topics: list[str], timeout: float = 120.0) -> None:
    """Until the broker's metadata has a leader for every partition of ``topics``: a producer started at once on a
    thousand new topics otherwise fails with "Unknown partition"."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while True:
        known = admin.list_topics(timeout=10).topics
        if all(t in known and known[t].partitions and all(p.leader >= 0 for p in known[t].partitions.values())
               for t in topics):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics without a leader after {timeout:.0f} s")
        time.sleep(0.5)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=5000)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--warmup", type=float, default=20, help="seconds of traffic before the measured ones")
    p.add_argument("--trigger", type=float, default=0.5, help="processing-time trigger, seconds (0: as fast as possible)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark conf")
    p.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                   help="extra option of the Kafka source, e.g. kafka.fetch.max.wait.ms=50")
    p.add_argument("--topics", type=int, default=4, help="topics the rate is spread over (1,000 for the 1,000-topic shape)")
    p.add_argument("--partitions", type=int, default=3, help="partitions per topic")
    p.add_argument("--log-kafka-reads", action="store_true",
                   help="Spark's Kafka reader logs each partition read at INFO (\"read N records through P polls, "
                        "taking T nanos\") to stderr: where a many-partition batch's time goes")
    p.add_argument("--window-counts-property", action="append", default=[], metavar="KEY=VALUE",
                   help="a table property of window_counts set after it is created, e.g. delta.enableDeletionVectors=false")
    args = p.parse_args(argv)

    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from kdq.rules import load_rules
    from kdq.spark import transforms
    from kdq.spark.session import build_session, small_query_session
    from kdq.spark.tables import ensure_tables
    from kdq.spark.writers import append_archive, merge_window_increments

    work, rules_dir, stack = floor_stack("kdq-latency-floor-", "lfloor-")
    spark = None
    try:
        stack.up()
        bootstrap = stack.config.kafka_bootstrap()
        rules = load_rules(rules_dir)
        results = []

        def measure(variant: str) -> str:
            nonlocal spark
            config = make_config(
                work / variant, rules_dir, kafka={"bootstrap_servers": bootstrap},
                spark={"conf": dict(item.split("=", 1) for item in args.conf)},
            )
            if spark is None:
                spark = build_session(config, app_name="kdq-latency-floor")
                if args.log_kafka_reads:
                    jvm = spark.sparkContext._jvm
                    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
                        "org.apache.spark.sql.kafka010.consumer.KafkaDataConsumer", jvm.org.apache.logging.log4j.Level.INFO)
            ensure_tables(spark, config)
            if args.window_counts_property:
                from kdq.spark.tables import table_path
                from kdq.tables import WINDOW_COUNTS

                settings = ", ".join(f"'{k}' = '{v}'" for k, v in (i.split("=", 1) for i in args.window_counts_property))
                spark.sql(f"ALTER TABLE delta.`{table_path(config, WINDOW_COUNTS)}` SET TBLPROPERTIES ({settings})")
            small = small_query_session(spark)
            stream = config.stream
            topics = [f"lfloor-{variant}-{i}" for i in range(args.topics)]
            create_topics(stack.kafka, topics, args.partitions)
            wait_for_leaders(bootstrap, topics)
            app_id = f"floor-{uuid.uuid4()}"
            pairs: list[tuple[float, int]] = []
            durations: list[float] = []
            lock = threading.Lock()
            measured_from_ms = 1 << 62  # set when the producer starts

            def batch(df, batch_id: int) -> None:
                started = time.time()
                ingest = int(started * 1000)
                if variant == "source":
                    produced_ms = F.col("key").cast("string").cast("bigint").alias("produced_ms")
                    record(started, [r.asDict() for r in
                                     df.groupBy("topic", produced_ms).agg(F.count(F.lit(1)).alias("count")).collect()])
                    return
                classified = transforms.mark_late(transforms.classify(df, rules, stream, ingest), {}, stream)
                keyed = classified.withColumn("produced_ms", F.col("key").cast("string").cast("bigint"))
                group = ["topic", F.unix_millis("window_start").alias("window_start_ms"), "valid", "produced_ms"]
                if variant == "archive_merge":
                    observation = Observation(f"floor_{batch_id}_{uuid.uuid4().hex[:6]}")
                    observed = keyed.observe(observation, F.collect_list(F.struct(
                        "topic", F.unix_millis("window_start").alias("window_start_ms"), "valid", "produced_ms",
                    )).alias("rows"))
                    append_archive(observed.drop("produced_ms"), config, app_id, batch_id, batch_id, "stream")
                    rows = [r.asDict() for r in observation.get["rows"]]
                    counted: dict = {}
                    for r in rows:
                        k = (r["topic"], r["window_start_ms"], r["valid"], r["produced_ms"])
                        counted[k] = counted.get(k, 0) + 1
                    agg = [{"topic": k[0], "window_start_ms": k[1], "valid": k[2], "produced_ms": k[3], "count": n}
                           for k, n in counted.items()]
                else:
                    agg = [r.asDict() for r in keyed.groupBy(*group).agg(F.count(F.lit(1)).alias("count")).collect()]
                if variant not in ("count", "source"):
                    windows: dict = {}
                    for r in agg:
                        k = (r["topic"], int(r["window_start_ms"]), "valid" if r["valid"] else "invalid")
                        windows[k] = windows.get(k, 0) + int(r["count"])
                    increments = [{"topic": t, "window_start_ms": w, "status": s, "count": n, "rules_version": "floor"}
                                  for (t, w, s), n in windows.items()]
                    merge_window_increments(small, increments, config, app_id, batch_id)
                record(started, agg)

            def record(started: float, agg: list[dict]) -> None:
                """The batch is done: each counted record's produce → visible time, and the batch's duration."""
                done = time.time()
                with lock:
                    # Records produced during the warm-up (the first batches with data compile the classification
                    # and the write path: seconds) are left out, as the benchmark's latency phase follows a catch-up.
                    pairs.extend(
                        (done - int(r["produced_ms"]) / 1000.0, int(r["count"])) for r in agg
                        if int(r["produced_ms"]) >= measured_from_ms
                    )
                    if started * 1000 >= measured_from_ms:
                        durations.append(done - started)

            query = (
                spark.readStream.format("kafka")
                .options(**{**config.spark_kafka_options(), **dict(item.split("=", 1) for item in args.kafka_option)})
                .option("subscribe", ",".join(topics)).option("startingOffsets", "earliest").load()
                .coalesce(spark.sparkContext.defaultParallelism)
                .writeStream.option("checkpointLocation", str(work / variant / "checkpoint"))
                .foreachBatch(batch)
                .trigger(processingTime=f"{args.trigger} seconds")
                .start()
            )
            try:
                proc, out = workload.start_rate_producer(
                    bootstrap, topics, workload.Workload(messages=0, topics=args.topics, partitions=args.partitions), args.rate,
                    args.warmup + args.seconds
                )
                measured_from_ms = int((time.time() + args.warmup) * 1000)
                produced = out.get(timeout=args.warmup + args.seconds + 120)
                proc.join(30)
                time.sleep(2 * args.trigger + 15)  # the last records' batch (counts below say if any were missed)
                # The slow batches, with Spark's own breakdown of their time (where the tail comes from).
                for progress in query.recentProgress:
                    took = int(progress.durationMs.get("triggerExecution", 0))
                    if took > 3 * max(mean_ms(durations), 100):
                        print(f"  slow batch {progress.batchId}: {took} ms, {progress.numInputRows} rows, "
                              f"{dict(progress.durationMs)}", flush=True)
            finally:
                query.stop()
            with lock:
                seen = sum(n for _, n in pairs)
                sent = produced["sent"]
                q = weighted_percentiles(pairs, (50, 95, 99, 100)) if pairs else {}
                mean = sum(durations) / len(durations) if durations else 0.0
                longest = max(durations, default=0.0)
            line = (f"{variant:14s} {seen:,} records measured ({sent:,} sent)  batches {len(durations)} (mean {mean:.2f} s, "
                    f"longest {longest:.2f} s)  "
                    + "  ".join(f"p{k} {v:.2f} s" for k, v in q.items()))
            print(line, flush=True)
            return line

        for variant in args.variants.split(","):
            results.append(measure(variant))
        print("\n".join(["", f"rate {args.rate:,} msgs/s over {args.topics} topics × {args.partitions} partitions, "
                                 f"{args.seconds:.0f} s, trigger {args.trigger} s"] + results))
        return 0
    finally:
        if spark is not None:
            spark.stop()
        stack.down()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    from benchmarks.signals import interrupt_on_stop_signals

    interrupt_on_stop_signals()  # a SIGTERM stops the stack this run started, as Ctrl-C does
    raise SystemExit(main())
