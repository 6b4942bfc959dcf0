"""What one partition read costs Spark's Kafka reader, call by call (issue 24: the 1,000-topic batches wait).

    .venv/bin/python -m benchmarks.kafka_read_cost [--topics 1000] [RUN ...]

Starts its own broker on free ports, creates ``--topics`` one-partition topics with a few 1 KB orders each, then
runs ``benchmarks/KafkaReadCost.java`` (the Java client Spark uses, kdq's jar cache) once per RUN: ``close`` or
``keep``, optionally followed by ``:key=value,...`` consumer settings over the ones Spark's reader and kdq set, e.g.
``close close:fetch.max.wait.ms=50 keep keep:fetch.max.wait.ms=50`` (kdq sets 1 ms). Each prints milliseconds per
partition for consumer creation, seek + poll, the two offset lookups and close. Nothing is saved (figures go to PERF_NOTES by hand).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

from benchmarks import workload
from benchmarks.__main__ import PROJECT, create_topics
from benchmarks.count_path_floor import floor_stack


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topics", type=int, default=1000)
    p.add_argument("runs", nargs="*", default=["close", "keep"], help="close|keep[:key=value,...]")
    args = p.parse_args(argv)

    import pyspark

    work, _, stack = floor_stack("kdq-read-cost-", "rc-")
    try:
        stack.up()
        bootstrap = stack.config.kafka_bootstrap()
        topics = [f"rc-{i}" for i in range(args.topics)]
        create_topics(stack.kafka, topics, 1)
        workload.produce_backlog(bootstrap, topics, workload.Workload(messages=5 * args.topics, topics=args.topics, partitions=1))
        jars = sorted((Path(stack.config.paths.jars_dir) / "spark").glob("kafka-clients-*.jar"))
        jars += sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))  # slf4j, lz4, snappy, zstd
        for run in args.runs:
            mode, _, extra = run.partition(":")
            print(f"=== {run}", flush=True)
            subprocess.run(["java", "-cp", ":".join(map(str, jars)), str(PROJECT / "benchmarks" / "KafkaReadCost.java"),
                            bootstrap, "rc-", str(args.topics), mode, extra], check=True, timeout=1800)
        return 0
    finally:
        stack.down()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    from benchmarks.signals import interrupt_on_stop_signals

    interrupt_on_stop_signals()  # a SIGTERM stops the broker this run started, as Ctrl-C does
    raise SystemExit(main())
