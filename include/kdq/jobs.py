"""The entrypoint shape every Spark job shares: main(argv) → args → frozen config → session → run() → report.

Each job module keeps its own ``parse_args`` and ``run(spark, config, args)``, which makes one library
call and returns its :class:`kdq.job_reports.JobReport` (tests and the CLI call ``run`` with an injected
session); this module holds the argument types, the session lifecycle, and the printing of the report
(one JSON line on stdout, exit 1 when it is not ``ok``) they would otherwise repeat.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kdq import writers_journal
from kdq.config import Config, load_config
from kdq.intervals import parse_time_ms, resolve_interval
from kdq.job_reports import JobReport


def time_arg(text: str) -> int:
    """argparse type: epoch millis or ISO-8601 (UTC when no zone is given) → epoch millis."""
    try:
        return parse_time_ms(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def topics_arg(text: str) -> list[str]:
    """argparse type: comma-separated topic names."""
    return [t.strip() for t in text.split(",") if t.strip()]


def interval_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The arguments of the jobs that work on one ingest-time interval: --config, --start, --end."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help="kdq config file (default: $KDQ_CONFIG or kdq.toml)")
    parser.add_argument("--start", type=time_arg, help="interval start (ingest time), inclusive; default: end - 1 h")
    parser.add_argument("--end", type=time_arg, help="interval end, exclusive; default: the current UTC hour")
    return parser


def parse_interval_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse and resolve --start/--end (defaults: the last whole UTC hour); a bad interval is a usage error."""
    args = parser.parse_args(argv)
    try:
        args.start, args.end = resolve_interval(args.start, args.end)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def run_main(
    argv: Sequence[str] | None,
    parse_args: Callable[[Sequence[str] | None], argparse.Namespace],
    run: Callable[[Any, Config, argparse.Namespace], JobReport],
    app_name: str,
    before_session: Callable[[Config], None] | None = None,
    session_conf: Callable[[Config], Mapping[str, str]] | None = None,
) -> int:
    """Parse, load the config (failing early on bad config), build the session (with the job's own settings of
    ``session_conf`` over kdq's), run, print the report, always stop the session. The exit code is 0 when the
    report is ``ok``, else 1; an exception fails the job as usual. A job that writes kdq's tables
    (:data:`kdq.writers_journal.WRITER_APPS`) records its start and end in the writers journal, with what it
    waited for."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    config = load_config(args.config)
    if before_session is not None:
        before_session(config)
    from kdq.spark.session import build_session

    # A job that writes kdq's tables records its run and what it waited for (kdq.writers_journal).
    journal = writers_journal.start_run(
        config, app_name, sys.argv[1:] if argv is None else argv, getattr(args, "run_id", None)
    )
    ok, error = False, None
    try:
        own = {"conf": session_conf(config)} if session_conf else {}
        spark = build_session(config, app_name=app_name, **own)
        try:
            started = time.monotonic()
            report = run(spark, config, args)
            report.seconds = round(time.monotonic() - started, 2)
            print(report.to_json(), flush=True)
            ok = bool(report.ok)
            return 0 if report.ok else 1
        finally:
            spark.stop()
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        writers_journal.end_run(journal, ok and error is None, error or (None if ok else "its report is not ok"))
