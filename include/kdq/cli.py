"""The `kdq` command: the local stack, SQL on the Delta tables, and (later) the jobs.

Every command loads the one Config (kdq.toml + KDQ_* environment) and fails
with a message naming the key when it is wrong.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kdq.config import Config, ConfigError, load_config


def _up(config: Config, args: argparse.Namespace) -> int:
    from kdq.stack.manager import LocalStack

    statuses = LocalStack(config).up()
    for status in statuses:
        print(status.line())
    healthy = all(s.healthy for s in statuses)
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
    from kdq.stream_status import describe_stream

    for line in describe_stream(config):
        print(line)
    return 0 if all(s.healthy for s in statuses) else 1


def _stream(config: Config, args: argparse.Namespace) -> int:
    from kdq.stream_process import child_env, start_stream, stream_process

    job_args = (["--available-now"] if args.available_now else []) + (
        ["--trigger-seconds", str(args.trigger_seconds)] if args.trigger_seconds is not None else []
    )
    if args.detach:
        pid = start_stream(config, job_args)
        print(f"speed layer running (pid {pid}); log: {stream_process(config).log_file}; stop: kdq stream-stop")
        return 0
    import os
    import subprocess

    from kdq.spark.submit import submit_command

    command = submit_command(config, "stream_counts", job_args, app_name="kdq-speed-layer")
    return subprocess.call(command, env={**os.environ, **child_env(config)}, cwd=config.base_dir)


def _stream_stop(config: Config, args: argparse.Namespace) -> int:
    from kdq.stream_process import stop_stream

    print("speed layer stopped" if stop_stream(config) else "speed layer was not running")
    return 0


def _submit(config: Config, job: str, job_args: list[str]) -> int:
    import os
    import subprocess

    from kdq.spark.submit import submit_command
    from kdq.stream_process import child_env

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


def _sql(config: Config, args: argparse.Namespace) -> int:
    from kdq.spark.session import build_session

    spark = build_session(config, app_name="kdq-sql")
    try:
        for statement in args.statement:
            spark.sql(statement).show(args.limit, truncate=False)
    finally:
        spark.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kdq", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="config file (default: $KDQ_CONFIG or kdq.toml)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("up", help="start the local stack (Kafka, InfluxDB) and wait until healthy").set_defaults(
        func=_up
    )
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
    sql = commands.add_parser("sql", help="run Spark SQL on the kdq tables (registered by name)")
    sql.add_argument("statement", nargs="+")
    sql.add_argument("--limit", type=int, default=50)
    sql.set_defaults(func=_sql)
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
        from kdq.stack.procs import StackError

        if isinstance(exc, StackError):
            print(f"kdq: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
