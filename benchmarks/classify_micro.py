"""Micro-benchmark of the classification step alone (no Kafka, no Delta), for profiling the classifier.

    .venv/bin/python -m benchmarks.classify_micro [--rows 200000] [--repeat 3] [--variants scan,verdict,classify]

Messages from the benchmark's generator are cached in memory first, so each
variant times only its own expressions (noop write: every column computed).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]

# verdict: the JVM classifier alone; verdict_1000: the same records with 1,000 topic rules in the rule set
# (each topic its own copy of the orders schema): rule lookup must not depend on the number of rules.
# summary_values / summary_states: the streaming summaries' per-record work over the classified rows
# (the two summaries of make bench's "summaries" variant).
# count_path_cached / count_path_single_pass / count_path_observe / count_path_write_only: one micro-batch's
# count path into a real Delta archive, as the stream ran it before issue 24 (classified rows cached, aggregated,
# archived from the cache), in one pass with the aggregate read back from the batch's narrow archive columns,
# as the stream runs it now (one pass, the counts an observed metric of the archive write), and the write alone.
VARIANTS = (
    "scan", "verdict", "verdict_1000", "classify", "cached", "aggregate", "summary_values", "summary_states",
    "count_path_cached", "count_path_single_pass", "count_path_write_only", "count_path_observe",
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--explain", action="store_true")
    p.add_argument("--archive-stats-columns", help="count_path_*: delta.dataSkippingStatsColumns of the archive")
    p.add_argument("--baseline-transforms", type=Path, help="another transforms.py for the 'fixed' variant")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark conf of the session")
    p.add_argument("--jfr", type=Path, help="record a Java Flight Recorder profile of the driver JVM into this file")
    args = p.parse_args(argv)

    from pyspark.sql import functions as F

    from benchmarks.__main__ import bench_summaries, make_config
    from benchmarks.workload import Generator, choose_kind
    from kdq.rules import load_rules
    from kdq.spark import transforms
    from kdq.spark.classifier import classifier
    from kdq.spark.session import build_session
    from kdq.spark.summaries import summary_states, summary_values

    work = Path(tempfile.mkdtemp(prefix="kdq-micro-"))
    rules_dir = work / "rules"
    rules_dir.mkdir()
    schema = json.loads((PROJECT / "config" / "rules" / "orders.schema.json").read_text())
    (rules_dir / "orders.schema.json").write_text(json.dumps(schema))
    (rules_dir / "topics.toml").write_text("[[topic]]\nmatch = 're:bench-.*'\nschema = \"orders.schema.json\"\n")
    (work / "r1000").mkdir()
    for i in range(996):
        (work / "r1000" / f"other-{i:04d}.schema.json").write_text(json.dumps({**schema, "title": f"other {i}"}))
    for i in range(4):
        (work / "r1000" / f"bench-s-{i}.schema.json").write_text(json.dumps({**schema, "title": f"bench {i}"}))
    conf = dict(item.split("=", 1) for item in args.conf)
    if args.jfr:
        conf["spark.driver.extraJavaOptions"] = f"-XX:StartFlightRecording=filename={args.jfr},settings=profile,dumponexit=true"
    config = make_config(work / "data", rules_dir, spark={"conf": conf})
    spark = build_session(config, app_name="kdq-micro")
    rules = load_rules(rules_dir)
    rules_1000 = load_rules(work / "r1000")

    import random

    gen = Generator(1024, 7)
    rng = random.Random(1)
    base = 1_700_000_000_000
    rows = [
        (None, gen.value(choose_kind(rng, 0.05), i), f"bench-s-{i % 4}", i % 3, i, base + i * 10)
        for i in range(args.rows)
    ]
    df = spark.createDataFrame(rows, "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, ts BIGINT").select(
        "key", "value", "topic", "partition", "offset", F.timestamp_millis("ts").alias("timestamp")
    )
    df = df.repartition(2).cache()
    df.count()

    stream = config.stream
    ingest = base + args.rows * 10
    summaries = config.with_summaries(bench_summaries("s")).summaries
    cached: list = []

    def classified_cache():
        # What the stream hands the summaries: the batch's classified rows, persisted.
        if not cached:
            frame = transforms.mark_late(transforms.classify(df, rules, stream, ingest), {}, stream).persist()
            frame.count()
            cached.append(frame)
        return cached[0]

    def variant(name: str):
        if name == "scan":
            return df.select(F.length("value").alias("n"))
        if name == "verdict":
            return df.select(classifier(spark, rules, stream)(F.col("topic"), F.col("value")).alias("v"))
        if name == "verdict_1000":
            return df.select(classifier(spark, rules_1000, stream)(F.col("topic"), F.col("value")).alias("v"))
        if name in ("classify", "cached"):
            return transforms.mark_late(transforms.classify(df, rules, stream, ingest), {}, stream)
        if name == "aggregate":
            return transforms.batch_aggregates(transforms.mark_late(transforms.classify(df, rules, stream, ingest), {}, stream))
        if name in ("summary_values", "summary_states"):
            values = summary_values(classified_cache(), summaries, {})
            return values if name == "summary_values" else summary_states(values)
        raise ValueError(name)

    if "fixed" in args.variants.split(","):
        # Per-batch fixed cost: a tiny batch, planned and run like a micro-batch, with a new ingest time each time.
        small = df.limit(200).cache()
        small.count()
        import importlib.util

        spec = importlib.util.spec_from_file_location("tr_base", args.baseline_transforms or transforms.__file__)
        tr_base = importlib.util.module_from_spec(spec)
        sys.modules["tr_base"] = tr_base
        spec.loader.exec_module(tr_base)
        for label, tr in (("current", transforms), ("baseline", tr_base), ("current", transforms), ("baseline", tr_base)):
            times = []
            for k in range(args.repeat):
                t0 = time.monotonic()
                frame = tr.batch_aggregates(
                    tr.mark_late(tr.classify(small, rules, stream, ingest + k * 1000), {"bench-s-0": ingest}, stream)
                )
                frame.collect()
                times.append(time.monotonic() - t0)
            print(f"fixed ({label}): {[round(t, 2) for t in times]}", flush=True)
    count_paths = [v for v in args.variants.split(",") if v.startswith("count_path_")]
    if count_paths:
        from kdq.spark.tables import ensure_tables, table_path
        from kdq.spark.writers import append_archive
        from kdq.tables import RAW_ARCHIVE

        ensure_tables(spark, config)
        archive_path = table_path(config, RAW_ARCHIVE)
        if args.archive_stats_columns:
            spark.sql(
                f"ALTER TABLE delta.`{archive_path}` SET TBLPROPERTIES "
                f"('delta.dataSkippingStatsColumns' = '{args.archive_stats_columns}')"
            )
        batch = [0]

        def count_path(name: str) -> int:
            batch[0] += 1
            ingest_ms = ingest + batch[0] * 1000
            classified = transforms.mark_late(transforms.classify(df, rules, stream, ingest_ms), {}, stream)
            if name == "count_path_cached":
                classified = classified.persist()
                rows = transforms.batch_aggregates(classified).collect()
                append_archive(classified, config, "micro", batch[0], batch[0], "stream")
                classified.unpersist()
            elif name == "count_path_write_only":
                append_archive(classified, config, "micro", batch[0], batch[0], "stream")
                return args.rows
            elif name == "count_path_observe":
                from pyspark.sql import Observation

                # The speed layer's path: the counts an observed metric of the archive write (issue 24).
                obs = Observation(f"o{batch[0]}")
                observed = classified.observe(obs, transforms.batch_counts_metric(classified).alias("counts"))
                append_archive(observed, config, "micro", batch[0], batch[0], "stream")
                rows = transforms.batch_counts_rows(obs.get["counts"])
            else:
                append_archive(classified, config, "micro", batch[0], batch[0], "stream")
                written = spark.read.format("delta").load(archive_path).where(
                    (F.col("batch_id") == batch[0]) & (F.col("ingest_time") == F.timestamp_millis(F.lit(ingest_ms)))
                )
                rows = transforms.batch_aggregates(written).collect()
            return sum(r["count"] for r in rows)

        from benchmarks.count_path_floor import interleaved

        interleaved(count_paths, count_path, args.rows, args.repeat, unit="row")
    for name in [v for v in args.variants.split(",") if v != "fixed" and not v.startswith("count_path_")]:
        frame = variant(name)
        if args.explain:
            frame.explain("formatted")
        times = []
        for _ in range(args.repeat):
            t0 = time.monotonic()
            if name in ("aggregate", "summary_states"):
                frame.collect()
            elif name == "cached":
                # What process_batch pays: classify once into the cache (1 KB values included), then read it.
                frame.persist()
                frame.count()
                frame.unpersist()
            else:
                frame.write.format("noop").mode("overwrite").save()
            times.append(time.monotonic() - t0)
        best = min(times)
        print(f"{name:18s} best {best:6.2f} s  {args.rows / best:10,.0f} rows/s  {best / args.rows * 1e6 * 2:7.1f} core-µs/row  (runs {[round(t, 2) for t in times]})", flush=True)
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    from benchmarks.signals import interrupt_on_stop_signals

    interrupt_on_stop_signals()  # a SIGTERM stops the stack this run started, as Ctrl-C does
    raise SystemExit(main())
