"""The `kdq` command: the local stack, the speed layer, the batch jobs, SQL, demo traffic and the operator's tools.

The local stack and the whole product (`up`, `run`, `down`, `status`, `airflow`), the speed layer (`stream`,
`stream-stop`), a micro-batch that keeps failing (`stream-failure`, `quarantine-offsets`, `quarantine-batch`:
:mod:`kdq.cli_failures`), the batch jobs (`recompute`, `influx-catch-up`, any job of ``spark_jobs/`` with `job`),
SQL on the Delta tables (`sql`, `sql-endpoint`: :mod:`kdq.cli_sql`) and demo traffic (`demo`).

Every command loads the one Config (kdq.toml + KDQ_* environment) and fails
with a message naming the key when it is wrong.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from kdq import cli_failures, cli_sql
from kdq.config import Config, ConfigError, load_config


def _up(config: Config, args: argparse.Namespace) -> int:
    from kdq.procs import StackError
    from kdq.stack.manager import LocalStack

    try:
        stack = LocalStack(
            config, with_sql_endpoint=not args.no_sql_endpoint, cluster=args.cluster, with_registry=not args.no_registry
        )
        statuses = stack.up()
    except StackError as exc:
        print(f"kdq up: {exc}", file=sys.stderr)
        return 1
    for status in statuses:
        print(status.line())
    healthy = all(s.healthy for s in statuses)
    if healthy and args.cluster:
        # stack.config: the addresses the start recorded (config was loaded before them).
        print(f"\nJobs of this data folder whose spark.master is local[...] now run on {stack.config.spark_master()}"
              " (docs/cluster.md).")
    if healthy:
        print(
            "\nThe local stack is up. Next: `kdq status`, `kdq sql \"SHOW TABLES IN kdq\"`; "
            "stop it with `make stop` (kdq down)."
        )
    return 0 if healthy else 1


def _down(config: Config, args: argparse.Namespace) -> int:
    from kdq.stack.manager import LocalStack

    stopped = LocalStack(config).down()
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def _status(config: Config, args: argparse.Namespace) -> int:
    from kdq.stack.manager import LocalStack

    statuses = LocalStack(config).status()
    for status in statuses:
        print(status.line())
    from kdq.spark.stream_process import describe_stream

    for line in describe_stream(config):
        print(line)
    from kdq.writers_journal import describe as describe_writers

    for line in describe_writers(config):  # the batch jobs that wrote beside the stream, and their waits
        print(line)
    return 0 if all(s.healthy for s in statuses) else 1


def _stream(config: Config, args: argparse.Namespace) -> int:
    from kdq.spark.stream_process import child_env, start_stream, stream_process

    job_args = (["--available-now"] if args.available_now else []) + (
        ["--trigger-seconds", str(args.trigger_seconds)] if args.trigger_seconds is not None else []
    )
    if args.detach:
        pid = start_stream(config, job_args)
        print(f"speed layer running (pid {pid}); log: {stream_process(config).log_file}; stop: kdq stream-stop")
        return 0
    import subprocess

    from kdq.spark.submit import submit_command

    command = submit_command(config, "stream_counts", job_args, app_name="kdq-speed-layer")
    return subprocess.call(command, env={**os.environ, **child_env(config)}, cwd=config.base_dir)


def _stream_stop(config: Config, args: argparse.Namespace) -> int:
    from kdq.spark.stream_process import stop_stream

    print("speed layer stopped" if stop_stream(config) else "speed layer was not running")
    return 0


def _submit(config: Config, job: str, job_args: list[str]) -> int:
    import subprocess

    from kdq.spark.stream_process import child_env
    from kdq.spark.submit import submit_command

    command = submit_command(config, job, job_args)
    return subprocess.call(command, env={**os.environ, **child_env(config)}, cwd=config.base_dir)


def _recompute(config: Config, args: argparse.Namespace) -> int:
    job_args = [f"--{name.replace('_', '-')}={value}" for name in ("start", "end", "run_id", "reason") if (value := getattr(args, name))]
    return _submit(config, "batch_recompute", job_args + (["--skip-push"] if args.skip_push else []))


def _catch_up(config: Config, args: argparse.Namespace) -> int:
    job_args = ([f"--since={args.since}"] if args.since else []) + (["--force"] if args.force else [])
    return _submit(config, "influx_catch_up", job_args)


def _job(config: Config, args: argparse.Namespace) -> int:
    return _submit(config, args.name, list(args.job_args))


# `kdq demo --burst`: how fast a burst goes out, and to which topic unless --topics says.
BURST_RATE = 500.0
BURST_TOPICS = "orders"


def _demo_spec(config: Config, args: argparse.Namespace):
    from kdq.traffic.generator import TrafficSpec
    from kdq.traffic.kinds import default_topics, parse_topics

    if args.burst is not None:
        # Only invalid records, now (no out-of-order or late ones), as fast as a producer sends a bad deploy's
        # output: what trips an invalid_ratio expectation within a minute (docs/expectations.md).
        if args.burst < 1:
            raise ValueError(f"--burst must be at least 1 record, got {args.burst}")
        if args.detach or args.count is not None or args.duration is not None:
            raise ValueError("--burst sends its records and exits: it takes no --detach, --count or --duration")
        return TrafficSpec(
            topics=parse_topics(args.topics or BURST_TOPICS),
            rate=max(args.rate, BURST_RATE),
            partitions=args.partitions,
            invalid_ratio=1.0,
            out_of_order=0.0,
            late=0.0,
            allowed_lateness_seconds=config.stream.allowed_lateness_seconds,
            count=args.burst,
            seed=args.seed,
        )
    return TrafficSpec(
        topics=parse_topics(args.topics or default_topics(config)),
        rate=args.rate,
        partitions=args.partitions,
        invalid_ratio=args.invalid_ratio,
        out_of_order=args.out_of_order,
        late=args.late,
        allowed_lateness_seconds=config.stream.allowed_lateness_seconds,
        duration_seconds=args.duration,
        count=args.count,
        seed=args.seed,
    )


def _demo(config: Config, args: argparse.Namespace) -> int:
    import json

    from kdq.traffic.process import demo_process, main_loop, start_demo

    try:
        spec = _demo_spec(config, args)
    except ValueError as exc:
        print(f"kdq demo: {exc}", file=sys.stderr)
        return 2
    if args.detach:
        options = {"rate": args.rate, "topics": args.topics, "partitions": args.partitions,
                   "invalid-ratio": args.invalid_ratio, "out-of-order": args.out_of_order, "late": args.late,
                   "duration": args.duration, "count": args.count, "seed": args.seed}
        pid = start_demo(config, [f"--{name}={value}" for name, value in options.items() if value is not None])
        print(f"demo traffic running (pid {pid}); log: {demo_process(config).log_file}; stop: make stop")
        return 0
    summary = main_loop(config, spec, Path(args.stats_file) if args.stats_file else None)
    print(json.dumps(summary))
    return 0 if summary["failed"] == 0 else 1


def _airflow(config: Config, args: argparse.Namespace) -> int:
    import subprocess

    from kdq.stack.manager import LocalStack

    command, env = LocalStack(config).airflow.command(*args.airflow_args)
    return subprocess.call(command, env=env, cwd=config.base_dir)


def _run(config: Config, args: argparse.Namespace) -> int:
    import shlex
    import signal

    from kdq.procs import StackError
    from kdq.stack.airflow import follow, print_banner, start_product
    from kdq.stack.manager import LocalStack

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    # Ctrl-C, a closed terminal or a plain kill all stop everything this command started. (A shell
    # starting it in the background leaves SIGINT ignored; the handler is installed regardless.)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    # --cluster: three brokers and the standalone master, its workers sized for the stream, the SQL endpoint
    # and the batch jobs side by side (docs/cluster.md). The shape asked for, not the recorded one.
    stack = LocalStack(config, with_sql_endpoint=True, cluster=args.cluster, product=True, with_registry=True)
    try:
        stack.check_shape()
    except StackError as exc:  # refused before anything started: leave what runs alone (no down below)
        print(f"kdq run: {exc}", file=sys.stderr)
        return 1
    keep = False
    try:
        started = start_product(stack, shlex.split(args.demo_args or ""))
        if started is None:
            return 1
        print_banner(stack)
        endpoint = stack.sql_endpoint
        print(f"SQL endpoint: {endpoint.connect_url} (Spark Connect, `kdq sql`), {endpoint.jdbc_url} (beeline, JDBC)\n",
              flush=True)
        if args.detach:
            keep = True
            return 0
        follow(stack, started)
        return 0
    except KeyboardInterrupt as exc:
        print(f"\n{exc or 'SIGINT'}: stopping everything", flush=True)
        return 0
    finally:
        if not keep:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the shutdown short
            stopped = stack.down()
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


def build_parser() -> argparse.ArgumentParser:
    from kdq.traffic.kinds import DEFAULT_TOPICS, REGISTRY_TOPICS

    parser = argparse.ArgumentParser(prog="kdq", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="config file (default: $KDQ_CONFIG or kdq.toml)")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser(
        "up", help="start the local stack (Kafka, InfluxDB, SQL endpoint, Schema Registry) and wait until healthy"
    )
    up.add_argument("--no-sql-endpoint", action="store_true", help="without the SQL endpoint (a Spark driver)")
    up.add_argument(
        "--no-registry", action="store_true",
        help="without the Schema Registry (started only while registry.url is empty)",
    )
    up.add_argument(
        "--cluster", action="store_true",
        help="three Kafka brokers (RF 3) and a Spark standalone master with two workers instead of one broker "
        "and local[2] (docs/cluster.md)",
    )
    up.set_defaults(func=_up)
    commands.add_parser("down", help="stop every local component").set_defaults(func=_down)
    commands.add_parser("status", help="each component with its address and health").set_defaults(func=_status)
    stream = commands.add_parser("stream", help="run the speed layer (spark-submit spark_jobs/stream_counts.py)")
    stream.add_argument("--detach", action="store_true", help="run in the background (log under .local/stream/)")
    stream.add_argument("--available-now", action="store_true", help="process what Kafka holds now, then exit")
    stream.add_argument("--trigger-seconds", type=float)
    stream.set_defaults(func=_stream)
    commands.add_parser("stream-stop", help="stop the background speed layer gracefully").set_defaults(
        func=_stream_stop
    )
    failure = commands.add_parser(
        "stream-failure", help="the micro-batch that keeps failing (error, offsets, way out) and the quarantine list"
    )
    failure.add_argument("--clear", action="store_true",
                         help="forget the failure (after deploying a fix): the supervisor retries the batch")
    failure.set_defaults(func=cli_failures.stream_failure)
    quarantine = commands.add_parser(
        "quarantine-offsets",
        help="count an offset range as invalid (internal_error:quarantined) without classifying it",
    )
    quarantine.add_argument("--topic", required=True)
    quarantine.add_argument("--partition", type=int, required=True)
    quarantine.add_argument("--from", dest="from_offset", type=int, required=True, help="first offset")
    quarantine.add_argument("--to", dest="to_offset", type=int, required=True, help="last offset (inclusive)")
    quarantine.add_argument("--reason", required=True, help="why (kept with the entry)")
    quarantine.set_defaults(func=cli_failures.quarantine_offsets)
    quarantine_batch = commands.add_parser(
        "quarantine-batch", help="quarantine every offset range of a micro-batch (the recorded failure's ranges)"
    )
    quarantine_batch.add_argument("batch_id", type=int)
    quarantine_batch.add_argument("--topic", action="append", help="only this topic's ranges (repeatable)")
    quarantine_batch.add_argument("--reason", required=True, help="why (kept with the entries)")
    quarantine_batch.set_defaults(func=cli_failures.quarantine_batch)
    recompute = commands.add_parser(
        "recompute", help="batch layer: recompute windows that got late records in [start, end) of ingest time"
    )
    recompute.add_argument("--start", help="ISO-8601 or epoch millis (default: the last full hour)")
    recompute.add_argument("--end")
    recompute.add_argument("--run-id")
    recompute.add_argument("--reason", help="recorded in the corrections table (default late_data)")
    recompute.add_argument("--skip-push", action="store_true", help="do not push corrections to Kafka/InfluxDB")
    recompute.set_defaults(func=_recompute)
    catch_up = commands.add_parser("influx-catch-up", help="push window counts InfluxDB missed (e.g. while down)")
    catch_up.add_argument("--since", help="ISO-8601 or epoch millis (default: the stream's first failed push)")
    catch_up.add_argument("--force", action="store_true", help="push even if no failure was recorded")
    catch_up.set_defaults(func=_catch_up)
    job = commands.add_parser(
        "job", help="spark-submit any job in spark_jobs/ (rebuild, archive_from_kafka, reconcile, ...) with its own arguments"
    )
    job.add_argument("name", help="file name in spark_jobs/ without .py")
    job.add_argument("job_args", nargs=argparse.REMAINDER, help="passed to the job (see its --help)")
    job.set_defaults(func=_job)
    demo = commands.add_parser(
        "demo", help="produce demo traffic: valid, invalid, out-of-order and late JSON records at a fixed rate"
    )
    demo.add_argument("--rate", type=float, default=50.0, help="records per second over all topics (default 50)")
    demo.add_argument("--topics", default=None,
                      help="comma-separated topic[:kind]; kinds: orders, payments, measurements, json, avro_orders, "
                      f"protobuf_payments (default {DEFAULT_TOPICS}, and {REGISTRY_TOPICS} when a Schema Registry is "
                      "configured or the local stack runs one)")
    demo.add_argument("--partitions", type=int, default=3, help="partitions of topics it creates (default 3)")
    demo.add_argument("--invalid-ratio", type=float, default=0.1, help="fraction of invalid records (default 0.1)")
    demo.add_argument("--out-of-order", type=float, default=0.05,
                      help="fraction with an older event time within the allowed lateness (default 0.05)")
    demo.add_argument("--late", type=float, default=0.01,
                      help="fraction with an event time beyond stream.allowed_lateness_seconds (default 0.01)")
    demo.add_argument("--duration", type=float, help="stop after this many seconds (default: run until stopped)")
    demo.add_argument("--count", type=int, help="stop after this many records")
    demo.add_argument("--seed", type=int, help="random seed, for reproducible traffic")
    demo.add_argument("--burst", type=int, metavar="N",
                      help=f"send N invalid records now (to {BURST_TOPICS} unless --topics, at least "
                           f"{BURST_RATE:.0f}/s) beside the running demo, then exit: opens an invalid_ratio incident")
    demo.add_argument("--detach", action="store_true", help="run in the background (log under .local/demo/)")
    demo.add_argument("--stats-file", help=argparse.SUPPRESS)
    demo.set_defaults(func=_demo)
    run = commands.add_parser(
        "run", help="the whole product locally: stack, Airflow standalone, stream (via its supervisor DAG), demo traffic"
    )
    run.add_argument(
        "--cluster", action="store_true",
        help="on the cluster shape: three Kafka brokers, Spark standalone master with two workers; the stream, the "
        "SQL endpoint and Airflow's jobs run on the master (docs/cluster.md)",
    )
    run.add_argument("--demo-args", default="", help='options for `kdq demo`, e.g. "--rate 200 --late 0.05"')
    run.add_argument("--detach", action="store_true", help="return once everything runs (stop with `kdq down`)")
    run.set_defaults(func=_run)
    airflow = commands.add_parser("airflow", help="any Airflow CLI command against the local Airflow (make run)")
    airflow.add_argument("airflow_args", nargs=argparse.REMAINDER, help="e.g. dags list-runs kdq_hourly_recompute")
    airflow.set_defaults(func=_airflow)
    endpoint = commands.add_parser(
        "sql-endpoint",
        help="run the SQL endpoint in the foreground (containers; `kdq up` starts it in the background locally)",
    )
    endpoint.add_argument("--host", default="127.0.0.1", help="address to listen on (a container: 0.0.0.0)")
    endpoint.add_argument("--connect-port", type=int, default=15002, help="Spark Connect port (default 15002)")
    endpoint.add_argument("--thrift-port", type=int, default=10000, help="Thrift (HiveServer2, JDBC) port (default 10000)")
    endpoint.add_argument(
        "--self-signed-tls", action="store_true",
        help="when the keystore KDQ_SQL_TLS_KEYSTORE does not exist, create it with a self-signed certificate "
        "(and its PEM beside it, <keystore>.crt, for clients to trust)",
    )
    endpoint.add_argument("--tls-name", action="append", default=[],
                          help="a host name or address clients use, added to the self-signed certificate (repeatable)")
    endpoint.set_defaults(func=cli_sql.sql_endpoint)
    sql = commands.add_parser("sql", help="run Spark SQL on the kdq tables (registered by name)")
    sql.add_argument("statement", nargs="+")
    sql.add_argument("--limit", type=int, default=50)
    sql.add_argument("--local", action="store_true", help="a Spark session of its own, even when the SQL endpoint runs")
    sql.set_defaults(func=cli_sql.sql)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
        return args.func(config, args)
    except ConfigError as exc:
        print(f"kdq: configuration error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from kdq.procs import StackError

        if isinstance(exc, StackError):
            print(f"kdq: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
