"""The Kafka Streams baseline: what a data team would run instead of kdq's speed layer.

jvm/kstreams-baseline (built by scripts/setup.sh into .cache/jars/kstreams-baseline/) is a small Kafka
Streams 4.x application at the broker's version: it reads the workload's topics (every partition, from
offset 0), classifies each value as kdq does for the benchmark (strict UTF-8, one JSON document, the
same JSON Schema file through networknt json-schema-validator, the library kdq's classifier uses), re-keys
by (topic, status), counts in 1 s tumbling windows of the record timestamp with kdq's allowed lateness as
the grace, and writes every count update to an output topic (key ``topic|window_start_ms|status``, value a
big-endian long); ``processing.guarantee=exactly_once_v2``, RocksDB window store, otherwise defaults.

It runs on the same pre-loaded topics in the same run as the other baselines, once per thread count
(``num.stream.threads``), each time with a fresh ``application.id`` and state dir. Its msgs/s is measured
inside the application: from the moment it is RUNNING (threads assigned) to the moment its committed
offsets have reached the end of every input partition and of every partition of its repartition topic
(offsets are committed in the same transaction as the counts they produced, so every record is then
counted, or dropped as too late, and its count committed). JVM start-up is left out, as the speed layer's
is. The counts are then read back from the output topic (read_committed, last value per key) and checked
against the workload's ground truth.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

log = logging.getLogger("kdq.bench.kstreams")
PROJECT = Path(__file__).resolve().parents[1]
JAR_DIR = PROJECT / ".cache" / "jars" / "kstreams-baseline"
MAIN_CLASS = "io.kdq.bench.KStreamsBaseline"
RESULT_PREFIX = "KSTREAMS_RESULT "
JVM_OPTIONS = ["-Xms512m", "-Xmx1g", "-XX:+UseG1GC"]
STATUSES = ("valid", "invalid")


def available() -> bool:
    return (JAR_DIR / "kstreams-baseline.jar").is_file()


def command(
    bootstrap: str, topics: list[str], output: str, threads: int, app_id: str, state_dir: Path,
    schema_path: str | None, window_ms: int = 1000, grace_ms: int = 60_000, timeout_s: float = 1800,
    extra: dict[str, str] | None = None,
) -> list[str]:
    cmd = [
        "java", *JVM_OPTIONS, "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", f"{JAR_DIR}/*", MAIN_CLASS,
        "--bootstrap", bootstrap, "--topics", ",".join(topics), "--output", output, "--threads", str(threads),
        "--app-id", app_id, "--state-dir", str(state_dir), "--schema", schema_path or "",
        "--window-ms", str(window_ms), "--grace-ms", str(grace_ms), "--timeout-s", str(timeout_s),
    ]
    for key, value in (extra or {}).items():
        cmd += ["--set", f"{key}={value}"]
    return cmd


def parse_output(stdout: str) -> dict:
    """The application's result: the JSON after the last ``KSTREAMS_RESULT`` line; ValueError without one."""
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if not lines:
        raise ValueError("the Kafka Streams baseline printed no result line")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def parse_key(key: str) -> tuple[str, int, str]:
    """``topic|window_start_ms|status`` → (topic, window_start_ms, status); the topic may hold ``|``."""
    topic, start, status = key.rsplit("|", 2)
    return topic, int(start), status


def parse_count(value: bytes) -> int:
    """A count as Kafka's LongSerializer writes it: 8 bytes, big-endian, signed."""
    return struct.unpack(">q", value)[0]


def read_counts(bootstrap: str, topic: str, timeout: float = 120) -> dict[tuple[str, int, str], int]:
    """The last committed value per key of ``topic`` (read_committed, every partition to its end)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"kdq-bench-kstreams-read-{time.time_ns()}",
        "enable.auto.commit": False, "isolation.level": "read_committed", "enable.partition.eof": True,
    })
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        pending = set(partitions)
        last: dict[str, int] = {}
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {topic}: partitions {sorted(pending)} did not reach their end in {timeout} s")
            for msg in consumer.consume(num_messages=10_000, timeout=1.0):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                        continue
                    raise RuntimeError(f"reading {topic}: {msg.error()}")
                last[msg.key().decode()] = parse_count(msg.value())
        return {parse_key(k): n for k, n in last.items()}
    finally:
        consumer.close()


def expected_by_topic(kinds: Counter, schema: bool) -> dict[str, dict[str, int]]:
    from benchmarks.workload import totals_by_topic

    return totals_by_topic(kinds, schema)


def check_counts(
    counts: dict[tuple[str, int, str], int],
    expected: dict[str, dict[str, int]],
    late: dict[str, dict[str, int]],
    classified: dict[str, int] | None = None,
    dropped: float | None = None,
) -> dict:
    """The baseline's counts against the ground truth.

    ``expected``/``late``: records per topic and status in the workload, and those among them shifted back
    beyond the allowed lateness (the grace). Which late records a windowed count still accepts depends on the
    stream time its task has seen when they arrive, so per topic and status the check is
    ``expected - late ≤ counted ≤ expected``: every on-time record counted, nothing counted twice or under the
    wrong status beyond what the late records allow. ``classified`` (the application's own verdicts by
    ``topic|status``) must equal ``expected`` exactly; ``dropped`` (its dropped-records metric) must make
    up the difference: counted + dropped = messages.
    """
    counted: dict[str, dict[str, int]] = {}
    for (topic, _start, status), n in counts.items():
        row = counted.setdefault(topic, dict.fromkeys(STATUSES, 0))
        row[status] = row.get(status, 0) + n
    out_of_bounds = []
    for topic in sorted(set(expected) | set(counted)):
        for status in sorted(set(STATUSES) | set(counted.get(topic, {}))):
            exp = expected.get(topic, {}).get(status, 0)
            lo = exp - late.get(topic, {}).get(status, 0)
            got = counted.get(topic, {}).get(status, 0)
            if not lo <= got <= exp:
                out_of_bounds.append({"topic": topic, "status": status, "counted": got, "expected": exp, "on_time": lo})
    total = {s: sum(r.get(s, 0) for r in counted.values()) for s in STATUSES}
    messages = sum(sum(r.values()) for r in expected.values())
    on_time = messages - sum(sum(r.values()) for r in late.values())
    result: dict = {
        "counted": total,
        "windows": len(counts),
        "late_counted": sum(total.values()) - on_time,
        "late_in_workload": messages - on_time,
        "within_ground_truth": not out_of_bounds,
    }
    if out_of_bounds:
        result["out_of_bounds"] = out_of_bounds[:20]
    ok = not out_of_bounds
    if classified is not None:
        flat = {f"{t}|{s}": n for t, row in expected.items() for s, n in row.items() if n}
        result["classified_matches"] = {k: n for k, n in classified.items() if n} == flat
        ok = ok and result["classified_matches"]
    if dropped is not None:
        result["dropped_late"] = int(dropped)
        result["counted_plus_dropped_is_messages"] = sum(total.values()) + int(dropped) == messages
        ok = ok and result["counted_plus_dropped_is_messages"]
    result["ok"] = ok
    return result


def best(results: list[dict]) -> dict | None:
    """The fastest run that completed (a failed run has no msgs/s)."""
    done = [r for r in results if r.get("msgs_per_s")]
    return max(done, key=lambda r: r["msgs_per_s"]) if done else None


def ratio(kdq_msgs_per_s: float | None, results: list[dict]) -> float | None:
    """kdq ÷ the Kafka Streams baseline's best run; None when either is missing."""
    b = best(results)
    if not kdq_msgs_per_s or b is None:
        return None
    return kdq_msgs_per_s / b["msgs_per_s"]


def run(
    bootstrap: str, topics: list[str], create_topic, threads: int, schema_path: str | None,
    expected: dict[str, dict[str, int]], late: dict[str, dict[str, int]], label: str,
    window_ms: int = 1000, grace_ms: int = 60_000, timeout_s: float = 1800, work: Path | None = None, extra: dict[str, str] | None = None,
) -> dict:
    """One run of the application with ``threads`` stream threads; its figures, or ``error`` (never raises
    for a failure of the application itself: the stderr tail is kept in the result)."""
    from benchmarks.measure import ProcessSampler

    stamp = time.time_ns()
    # Neither the output topic nor the application's internal topics may match the stream's
    # subscription (bench-<label>-.*).
    app_id = f"kdq-kstreams-{label}-{threads}t-{stamp}"
    output = f"kdq-kstreams-{label}-{threads}t-{stamp}-counts"
    create_topic(output)
    state = Path(tempfile.mkdtemp(prefix="kstreams-state-", dir=work))
    cmd = command(bootstrap, topics, output, threads, app_id, state, schema_path, window_ms=window_ms, grace_ms=grace_ms,
                  timeout_s=timeout_s, extra=extra)
    result: dict = {"kind": "kstreams", "threads": threads, "output_topic": output}
    started = time.monotonic()
    stderr = tempfile.TemporaryFile(mode="w+")
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True)
        sampler = ProcessSampler(proc.pid).start()
        try:
            stdout, _ = proc.communicate(timeout=timeout_s + 120)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, _ = proc.communicate()
        except BaseException:
            # Ctrl-C or the harness's SIGTERM (benchmarks.signals): the baseline's JVM would outlive the run.
            proc.kill()
            proc.wait(30)
            raise
        finally:
            sampler.stop()
        stderr.seek(0)
        err_tail = stderr.read()[-4000:]
    finally:
        stderr.close()
        shutil.rmtree(state, ignore_errors=True)
    result["wall_seconds_incl_startup"] = round(time.monotonic() - started, 1)
    result["peak_rss"] = sampler.stats.peak_rss
    try:
        app = parse_output(stdout)
    except ValueError as exc:
        app = {"error": f"{exc} (exit status {proc.returncode})"}
    if proc.returncode != 0 or "error" in app:
        result["error"] = app.get("error") or f"exit status {proc.returncode}"
        result["stderr_tail"] = err_tail
        log.error("Kafka Streams baseline x%d failed: %s\n%s", threads, result["error"], err_tail)
        return result
    result.update({
        "messages": app["messages"],
        "seconds": round(app["seconds"], 3),
        "msgs_per_s": round(app["msgs_per_s"], 1),
        "input_committed_seconds": round(app["input_committed_seconds"], 3),
        "startup_seconds": round(app["startup_seconds"], 1),
        "cpu_cores": round(app["cpu_cores"], 2),
        "rebalances_after_running": app["rebalances_after_running"],
        "settings": app.get("settings"),
    })
    counts = read_counts(bootstrap, output)
    result["checks"] = check_counts(counts, expected, late, app.get("classified"), app.get("dropped_records"))
    return result
