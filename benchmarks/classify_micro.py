"""Micro-benchmark of the classification step alone (no Kafka, no Delta), for profiling rule compilation.

    .venv/bin/python -m benchmarks.classify_micro [--rows 200000] [--repeat 3] [--variants parse,reason,classify]

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

VARIANTS = ("scan", "parse", "reason", "reason_no_items", "classify", "cached", "aggregate")


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--explain", action="store_true")
    p.add_argument("--baseline", type=Path, help="another rule_compiler.py: variant 'base' uses its value_reason")
    p.add_argument("--baseline-transforms", type=Path, help="another transforms.py for the 'fixed' variant")
    p.add_argument("--jfr", type=Path, help="record a Java Flight Recorder profile of the driver JVM into this file")
    args = p.parse_args(argv)

    from pyspark.sql import functions as F

    from benchmarks.__main__ import make_config
    from benchmarks.workload import Generator, choose_kind
    from kdq.rules import load_rules
    from kdq.spark import transforms
    from kdq.spark.rule_compiler import parse_value, value_reason
    from kdq.spark.session import build_session

    work = Path(tempfile.mkdtemp(prefix="kdq-micro-"))
    rules_dir = work / "rules"
    rules_dir.mkdir()
    schema = json.loads((PROJECT / "config" / "rules" / "orders.schema.json").read_text())
    (rules_dir / "orders.schema.json").write_text(json.dumps(schema))
    (rules_dir / "topics.toml").write_text("[[topic]]\nmatch = 're:bench-.*'\nschema = \"orders.schema.json\"\n")
    no_items = json.loads(json.dumps(schema))
    no_items["properties"]["lines"].pop("items")
    (work / "r2").mkdir()
    (work / "r2" / "orders.schema.json").write_text(json.dumps(no_items))
    (work / "r2" / "topics.toml").write_text("[[topic]]\nmatch = 're:bench-.*'\nschema = \"orders.schema.json\"\n")
    conf = {}
    if args.jfr:
        conf["spark.driver.extraJavaOptions"] = f"-XX:StartFlightRecording=filename={args.jfr},settings=profile,dumponexit=true"
    config = make_config(work / "data", rules_dir, spark={"conf": conf})
    spark = build_session(config, app_name="kdq-micro")
    rules = load_rules(rules_dir)
    rules_no_items = load_rules(work / "r2")

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

    def variant(name: str):
        if name == "scan":
            return df.select(F.length("value").alias("n"))
        if name == "parse":
            return df.select(parse_value(F.col("value")).isNull().alias("bad"))
        if name == "reason":
            parsed = df.select("*", parse_value(F.col("value")).alias("__p"))
            return parsed.select(value_reason(F.col("topic"), F.col("value"), F.col("__p"), rules, stream.max_value_bytes).alias("r"))
        if name == "base":
            import importlib.util

            spec = importlib.util.spec_from_file_location("rc_base", args.baseline)
            base = importlib.util.module_from_spec(spec)
            sys.modules["rc_base"] = base
            spec.loader.exec_module(base)
            parsed = df.select("*", base.parse_value(F.col("value")).alias("__p"))
            return parsed.select(base.value_reason(F.col("topic"), F.col("value"), F.col("__p"), rules, stream.max_value_bytes).alias("r"))
        if name == "reason_no_items":
            parsed = df.select("*", parse_value(F.col("value")).alias("__p"))
            return parsed.select(value_reason(F.col("topic"), F.col("value"), F.col("__p"), rules_no_items, stream.max_value_bytes).alias("r"))
        if name in ("classify", "cached"):
            return transforms.mark_late(transforms.classify(df, rules, stream, ingest), {}, stream)
        if name == "aggregate":
            return transforms.batch_aggregates(transforms.mark_late(transforms.classify(df, rules, stream, ingest), {}, stream))
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
    for name in [v for v in args.variants.split(",") if v != "fixed"]:
        frame = variant(name)
        if args.explain:
            frame.explain("formatted")
        times = []
        for _ in range(args.repeat):
            t0 = time.monotonic()
            if name == "aggregate":
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
    raise SystemExit(main())
