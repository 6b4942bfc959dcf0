"""Latency of the always-on SQL endpoint (issue 15): a day of 1-second window counts, the usual GROUP BY.

    python -m benchmarks.sql_endpoint [--topics 3] [--runs 7] [--with-stream] [--keep]

Writes one day of ``window_counts`` (86,400 windows x topics x {valid, invalid}) with kdq's own writer
(``merge_window_increments``, one MERGE per topic), starts the endpoint with the stack's code on a
private data folder and free loopback ports, then times the query through both protocols:

* Spark Connect: a client process (PySpark ``builder.remote``) runs it ``--runs`` times, wall clock
  per query from the client's side (the first, cold one reported apart);
* JDBC: one beeline session runs it ``--runs`` times; beeline's own "(x seconds)" per query;
* ``kdq sql "<query>"``: the command a user types, ``--runs`` times, each from process start to exit (the
  client's start-up and its printed table included), its table checked against the expected sums.

``--with-stream``: the same while the speed layer runs beside the endpoint on a local stack (Kafka,
InfluxDB) of its own, fed by ``kdq demo`` at 200 records/s (its MERGEs commit to the same
``window_counts`` every trigger); timing starts once the stream's first counts are in the table.

Results in ``benchmarks/results/sql_endpoint[_with_stream].{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.speed import write_config
from kdq.config import Config, load_config

PROJECT = Path(__file__).resolve().parents[1]
RESULTS = PROJECT / "benchmarks" / "results"
# Yesterday (UTC), as live data would be: the endpoint's warm-up reads the last two days.
DAY_START_MS = (int(time.time() * 1000) // 86_400_000 - 1) * 86_400_000
DAY_WINDOWS = 86_400
QUERY = "SELECT topic, status, sum(count) AS n FROM kdq.window_counts GROUP BY topic, status ORDER BY topic, status"

CLIENT = """
import json, sys, time
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
times, rows = [], None
for _ in range(int(sys.argv[3])):
    started = time.perf_counter()
    rows = [list(r) for r in spark.sql(sys.argv[2]).collect()]
    times.append(time.perf_counter() - started)
print(json.dumps({"seconds": times, "rows": rows}))
"""


def bench_config(work: Path) -> Config:
    """Defaults only (no kdq.toml, no KDQ_* variables), data in ``work``; written to a file for the child."""
    empty = work / "empty.toml"
    empty.write_text("")
    overrides = {"paths": {"data_dir": str(work / "data"), "jars_dir": str(PROJECT / ".cache" / "jars")}}
    return write_config(load_config(path=empty, env={}, overrides=overrides), work / "kdq.toml")


def write_day(config: Config, topics: list[str]) -> dict:
    from kdq.spark.session import build_session
    from kdq.spark.writers import merge_window_increments

    spark = build_session(config, app_name="bench-sql-endpoint-write")
    expected = {}
    try:
        started = time.monotonic()
        for version, topic in enumerate(topics):
            rows = [
                {"topic": topic, "window_start_ms": DAY_START_MS + i * 1000, "status": status,
                 "count": count, "rules_version": "bench"}
                for i in range(DAY_WINDOWS)
                for status, count in (("valid", 10 + i % 7), ("invalid", i % 3))
            ]
            merge_window_increments(spark, rows, config, "bench-sql-endpoint", version)
            for status in ("invalid", "valid"):
                expected[f"{topic}/{status}"] = sum(r["count"] for r in rows if r["status"] == status)
        rows_written = spark.table("kdq.window_counts").count()
        return {"rows": rows_written, "write_seconds": round(time.monotonic() - started, 1), "expected": expected}
    finally:
        spark.stop()


def connect_timings(url: str, runs: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CLIENT, url, QUERY, str(runs + 1)], capture_output=True, text=True,
                          timeout=600, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"cold_seconds": result["seconds"][0], "seconds": result["seconds"][1:], "rows": result["rows"]}


# beeline's own time of a statement, printed after its result
ROWS_SELECTED = re.compile(r"rows? selected \(([\d.]+) seconds\)")


def beeline_command(url: str) -> tuple[list[str], dict[str, str]]:
    return ([str(PROJECT / ".venv" / "bin" / "beeline"), "-u", url, "-n", "kdq", "--outputformat=csv2"],
            {"PATH": f"{PROJECT / '.venv' / 'bin'}:/usr/bin:/bin"})


def jdbc_timings(url: str, runs: int) -> dict:
    command, env = beeline_command(url)
    script = "\n".join([f"{QUERY};"] * (runs + 1))
    done = subprocess.run([*command, "-e", script], capture_output=True, text=True, timeout=600, env=env, check=True)
    seconds = [float(s) for s in ROWS_SELECTED.findall(done.stdout + done.stderr)]
    return {"cold_seconds": seconds[0], "seconds": seconds[1:]}


class BeelineSession:
    """One beeline process and JDBC session kept open, fed one statement at a time on its stdin (a BI tool's
    connection that queries now and then, where :func:`jdbc_timings` runs its statements back to back)."""

    def __init__(self, url: str) -> None:
        import queue
        import threading

        command, env = beeline_command(url)
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)

    def query(self, statement: str, timeout: float = 120.0) -> tuple[float, float]:
        """(wall-clock seconds from sending the statement to beeline's "rows selected" line, beeline's own time);
        raises RuntimeError on beeline's "Error:" or at the deadline."""
        import queue

        while not self.lines.empty():  # what an earlier statement left behind
            self.lines.get_nowait()
        started = time.perf_counter()
        self.process.stdin.write(statement.rstrip().rstrip(";") + ";\n")
        self.process.stdin.flush()
        deadline = started + timeout
        while True:
            try:
                line = self.lines.get(timeout=1.0)
            except queue.Empty:
                if self.process.poll() is not None:
                    raise RuntimeError(f"beeline exited {self.process.returncode}") from None
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"beeline: no answer within {timeout:.0f} s") from None
                continue
            found = ROWS_SELECTED.search(line)
            if found:
                return time.perf_counter() - started, float(found.group(1))
            if line.startswith("Error:"):
                raise RuntimeError(f"beeline: {line.strip()[:300]}")

    def close(self) -> None:
        try:
            self.process.stdin.write("!quit\n")
            self.process.stdin.flush()
            self.process.wait(timeout=20)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait(timeout=20)


def kdq_sql_timings(config: Config, runs: int) -> dict:
    """Wall clock of ``kdq sql "<QUERY>"`` from process start to exit, as typed at the shell prompt (the venv's
    ``kdq`` script, this checkout's package first on the path); the printed table of the last run is returned."""
    env = {"PATH": f"{PROJECT / '.venv' / 'bin'}:/usr/bin:/bin", "KDQ_CONFIG": str(config.source),
           "PYTHONPATH": str(PROJECT / "include"), "HOME": os.environ.get("HOME", "/tmp")}
    seconds, out = [], ""
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run([str(PROJECT / ".venv" / "bin" / "kdq"), "sql", QUERY], capture_output=True, text=True,
                              timeout=300, env=env, cwd=PROJECT)
        seconds.append(time.perf_counter() - started)
        if done.returncode != 0 or "through the SQL endpoint" not in done.stderr:
            raise RuntimeError(f"kdq sql failed or did not use the endpoint: {done.stderr[-2000:]}")
        out = done.stdout
    return {"seconds": seconds, "table": out}


def table_cells(printed: str) -> list[list[str]]:
    """The cells of a table as ``show()`` prints it (``|a|b|`` lines; the header first)."""
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in printed.splitlines()
            if line.startswith("|")]


def wait_for_stream_counts(url: str, timeout: float = 420.0) -> float:
    """Seconds until the demo topics have rows in window_counts (read over the endpoint)."""
    query = "SELECT count(*) FROM kdq.window_counts WHERE topic IN ('orders', 'payments')"
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        done = subprocess.run([sys.executable, "-c", CLIENT, url, query, "1"], capture_output=True,
                              text=True, timeout=120)
        if done.returncode == 0 and json.loads(done.stdout.strip().splitlines()[-1])["rows"][0][0] > 0:
            return time.monotonic() - started
        time.sleep(5)
    raise RuntimeError(f"no stream counts in window_counts after {timeout:.0f} s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.sql_endpoint", description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=3)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--with-stream", action="store_true", help="measure while the speed layer runs")
    parser.add_argument("--keep", action="store_true", help="keep the data folder (printed)")
    args = parser.parse_args(argv)
    from kdq.stack.manager import LocalStack

    work = Path(tempfile.mkdtemp(prefix="kdq-bench-sql-"))
    config = bench_config(work)
    topics = [f"bench-sql-{i}" for i in range(args.topics)]
    written = write_day(config, topics)
    stack = LocalStack(config)
    endpoint = stack.sql_endpoint
    stream = {}
    try:
        if args.with_stream:
            assert all(s.healthy for s in stack.up()), "local stack not healthy"
        started = time.monotonic()
        endpoint.start(timeout=300)
        start_seconds = time.monotonic() - started
        if args.with_stream:
            from kdq.spark.stream_process import start_stream
            from kdq.traffic.process import start_demo

            start_stream(config)
            start_demo(config, ["--rate=200"])
            stream["first_counts_after_seconds"] = round(wait_for_stream_counts(endpoint.connect_url), 1)
        connect = connect_timings(endpoint.connect_url, args.runs)
        jdbc = jdbc_timings(endpoint.jdbc_url, args.runs)
        kdq_sql = kdq_sql_timings(config, args.runs)
    finally:
        if args.with_stream:
            from kdq.spark.stream_process import stop_stream
            from kdq.traffic.process import stop_demo

            stop_demo(config)
            stop_stream(config)
            stack.down()
        endpoint.stop()
    got = {f"{t}/{s}": n for t, s, n in connect["rows"] if t in topics}
    assert got == written["expected"], (got, written["expected"])
    printed = {f"{t}/{s}": int(n) for t, s, n in table_cells(kdq_sql["table"])[1:] if t in topics}
    assert printed == written["expected"], (printed, written["expected"])
    report = {
        "query": QUERY,
        "window_counts_rows": written["rows"],
        "topics": args.topics,
        "endpoint_start_seconds": round(start_seconds, 1),
        "with_stream": args.with_stream,
        **({"stream": stream, "result_rows": len(connect["rows"])} if args.with_stream else {}),
        "spark_connect": {"cold_seconds": round(connect["cold_seconds"], 3),
                          "median_seconds": round(statistics.median(connect["seconds"]), 3),
                          "seconds": [round(s, 3) for s in connect["seconds"]]},
        "jdbc_beeline": {"cold_seconds": jdbc["cold_seconds"], "median_seconds": statistics.median(jdbc["seconds"]),
                         "seconds": jdbc["seconds"]},
        "kdq_sql": {"median_seconds": round(statistics.median(kdq_sql["seconds"]), 3),
                    "seconds": [round(s, 3) for s in kdq_sql["seconds"]]},
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "sql_endpoint_with_stream" if args.with_stream else "sql_endpoint"
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    md = (
        f"# SQL endpoint latency\n\n`{QUERY}` over {written['rows']:,} window_counts rows "
        f"(one day of 1-second windows, {args.topics} topics x 2 statuses), written with merge_window_increments"
        + (", while the speed layer runs (kdq demo, 200 records/s, MERGEs into the same table)" if args.with_stream else "")
        + ".\n\n"
        "| client | first query (cold) | median of the next " f"{args.runs} |\n|---|---|---|\n"
        f"| Spark Connect (PySpark remote) | {report['spark_connect']['cold_seconds']} s | "
        f"{report['spark_connect']['median_seconds']} s |\n"
        f"| JDBC (beeline, HiveServer2) | {report['jdbc_beeline']['cold_seconds']} s | "
        f"{report['jdbc_beeline']['median_seconds']} s |\n\n"
        f"`kdq sql \"<query>\"` from process start to exit (client start-up and printed table included), "
        f"{args.runs} runs: median {report['kdq_sql']['median_seconds']} s "
        f"({', '.join(f'{s} s' for s in report['kdq_sql']['seconds'])}).\n\n"
        f"Endpoint start (spark-submit to both ports open): {report['endpoint_start_seconds']} s; "
        f"1-minute load average at the end: {report['load_average_1m_at_end']}.\n"
    )
    (RESULTS / f"{name}.md").write_text(md)
    print(md)
    if args.keep:
        print(f"data kept in {work}")
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    from benchmarks.signals import interrupt_on_stop_signals

    interrupt_on_stop_signals()  # a SIGTERM stops the stack this run started, as Ctrl-C does
    raise SystemExit(main())
