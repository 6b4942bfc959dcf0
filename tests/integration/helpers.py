"""Test-side helpers: produce exact records, read back every output. Ground truth is computed here,
from what the test produced, never by calling the code under test."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import requests
from confluent_kafka import Consumer, Producer, TopicPartition

from kdq.config import Config
from kdq.stack.manager import LocalStack
from tests.conftest import make_config

if TYPE_CHECKING:
    from kdq.stack.airflow import LocalAirflow

W0 = 1_700_000_000_000


def isolated_config(stack: LocalStack, data_dir: Path, prefix: str, **sections: dict) -> Config:
    """A config whose stream sees only topics starting with ``prefix`` and writes its own outputs."""
    suffix = uuid.uuid4().hex[:8]
    database = f"kdq_{suffix}"
    stack.influx.create_database(database)
    base = {
        "kafka": {
            "bootstrap_servers": stack.kafka.bootstrap,
            "topic_include": f"{prefix}.*",
            "metrics_topic": f"kdq.metrics-{suffix}",
            "max_offsets_per_trigger": 100_000,
        },
        "influxdb": {"url": stack.influx.url, "database": database, "retries": 1, "timeout_seconds": 3},
        "stream": {"window_seconds": 1, "allowed_lateness_seconds": 10, "trigger_interval_seconds": 1},
        "spark": {"master": "local[2]", "shuffle_partitions": 2},
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    return make_config(data_dir, **base)


def crash_test_config(stack: LocalStack, data_dir: Path, prefix: str) -> Config:
    """Small batches, so a wave spans several micro-batches and crashes land mid-stream."""
    return isolated_config(
        stack,
        data_dir,
        prefix,
        kafka={"max_offsets_per_trigger": 50},
        stream={"allowed_lateness_seconds": 3600, "trigger_interval_seconds": 0.5},
    )


def crash_then_restart(config: Config, point: str, marker: Path, master: str, timeout: float) -> None:
    """Start the stream with the fault switch at ``point`` (batch 1 or later, once: ``marker``), check it
    died there with the injected exit code, and start it again on ``master`` (another parallelism)."""
    import psutil

    from kdq.spark.stream_process import start_stream, stream_process

    env = {"KDQ_FAULT_POINT": point, "KDQ_FAULT_BATCH": "1", "KDQ_FAULT_MARKER": str(marker)}
    pid = start_stream(config, extra_env=env)
    try:
        code = psutil.Process(pid).wait(timeout=timeout)
    except psutil.NoSuchProcess:
        code = None
    assert marker.exists(), f"the fault at {point} did not fire; log:\n{stream_process(config).log_tail(40)}"
    assert code == 137, f"expected the injected crash (137) at {point}, got {code}"
    start_stream(config, extra_env={**env, "KDQ_SPARK__MASTER": master})


def produce(bootstrap: str, topic: str, records: list[tuple[int, bytes | None, int]], key: bytes | None = None) -> None:
    """records: (partition, value, timestamp_ms)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "message.max.bytes": 8_000_000})
    for partition, value, ts in records:
        producer.produce(topic, value=value, key=key, partition=partition, timestamp=ts)
    assert producer.flush(60) == 0


def _metrics_messages(config: Config, timeout: float) -> list[tuple[dict, bytes]]:
    """(key, value) of every message on the metrics topic up to its current end, in offset order per partition."""
    consumer = Consumer({**config.kafka_client_conf(), "group.id": f"t-{uuid.uuid4().hex}"})  # with kafka.client's login
    topic = config.kafka.metrics_topic
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        partitions = [TopicPartition(topic, p, 0) for p in meta.partitions]
        ends = {p.partition: consumer.get_watermark_offsets(p, timeout=10)[1] for p in partitions}
        consumer.assign(partitions)
        messages: list[tuple[dict, bytes]] = []
        position = {p: 0 for p in ends}
        deadline = time.monotonic() + timeout
        while any(position[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            position[msg.partition()] = msg.offset() + 1
            messages.append((json.loads(msg.key()), msg.value()))
        return messages
    finally:
        consumer.close()


def latest_metrics(config: Config, timeout: float = 30.0) -> dict[tuple[str, int, str], int]:
    """Latest count per window key on the metrics topic (what a compacted-topic consumer converges to)."""
    return {
        (key["topic"], key["window"], key["status"]): int(value)
        for key, value in _metrics_messages(config, timeout)
        if "status" in key
    }


def influx_rows(config: Config, measurement: str, fields: str) -> list[list]:
    """[time ms, *fields] of every point of ``measurement`` in the local InfluxDB (1.x query API)."""
    response = requests.get(
        f"{config.influx_url()}/query",
        params={"db": config.influxdb.database, "q": f'SELECT {fields} FROM "{measurement}"', "epoch": "ms"},
        timeout=10,
    )
    response.raise_for_status()
    series = response.json()["results"][0].get("series", [])
    return series[0]["values"] if series else []


def influx_points(config: Config, measurement: str) -> dict[int, tuple[int, int]]:
    return {t: (v, i) for t, v, i in influx_rows(config, measurement, "valid, invalid")}


def archived_offsets(spark, config: Config, topic: str) -> Counter:
    """How often each (partition, offset) of ``topic`` is in the raw archive (exactly once: every value 1)."""
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(str(config.tables_dir / "raw_archive")).where(F.col("topic") == topic)
    return Counter((r["partition"], r["offset"]) for r in df.select("partition", "offset").collect())


def window_counts(spark, config: Config, topic: str | None = None) -> dict[tuple[str, int, str], int]:
    from pyspark.sql import functions as F

    path = config.tables_dir / "window_counts"
    # Looked up on disk, not with DeltaTable.isDeltaTable: that caches a "no table"
    # answer per path, so a poll started before the stream created the table
    # would never see it.
    if not any((path / "_delta_log").glob("*.json")):
        return {}  # the stream has not created its tables yet
    df = spark.read.format("delta").load(str(path))
    if topic:
        df = df.where(F.col("topic") == topic)
    rows = df.select("topic", F.unix_millis("window_start").alias("w"), "status", "count").collect()
    return {(r["topic"], r["w"], r["status"]): r["count"] for r in rows}


def reason_counts(spark, config: Config, topic: str) -> dict[tuple[int, str], int]:
    """``invalid_reasons`` of ``topic`` summed like the invalid_reason_counts view: (coarse window, reason) → count
    (zero sums left out: a rebuild's adjustments can take a reason back to 0)."""
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(str(config.tables_dir / "invalid_reasons")).where(F.col("topic") == topic)
    rows = df.groupBy(F.unix_millis("window_start").alias("w"), "reason").agg(F.sum("count").alias("n")).collect()
    return {(r["w"], r["reason"]): r["n"] for r in rows if r["n"]}


def expected_reasons(records: list[tuple[int, str]], reasons_window_seconds: int = 60) -> dict[tuple[int, str], int]:
    """records: (timestamp_ms, reason) of the invalid records → ground truth per coarse reasons window."""
    size = reasons_window_seconds * 1000
    return dict(Counter((ts // size * size, reason) for ts, reason in records))


def expected_counts(topic: str, records: list[tuple[int, bool]]) -> dict[tuple[str, int, str], int]:
    """records: (timestamp_ms, valid) → ground truth with 1-second windows."""
    counter: Counter = Counter()
    for ts, valid in records:
        counter[(topic, ts // 1000 * 1000, "valid" if valid else "invalid")] += 1
    return dict(counter)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def write_config_file(config: Config, path: Path) -> Config:
    """Persist a Config as TOML so a child process (spark-submit) loads exactly the same settings."""
    from kdq.config import load_config

    sections = ("paths", "kafka", "spark", "stream", "influxdb")
    lines = []
    for name in sections:
        lines.append(f"[{name}]")
        for key, value in getattr(config, name).model_dump().items():
            if isinstance(value, dict):
                inner = ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items())
                lines.append(f"{key} = {{ {inner} }}")
            else:
                if name == "paths" and isinstance(value, Path):  # folders; not storage_uri or the dynamodb_* keys
                    value = str(config.path(value))
                lines.append(f"{key} = {_toml_value(value)}")
    path.write_text("\n".join(lines) + "\n")
    return load_config(path=path, env={})


def dags_test(airflow: LocalAirflow, dag_id: str, logical_date: datetime, timeout: float = 600) -> str:
    """`airflow dags test <dag> <logical date>`: the run must succeed; returns its output.

    The DAG is paused first when Airflow's scheduler runs: it examines the running runs of unpaused DAGs
    only, and would otherwise queue this run's tasks too, racing the test's in-process task runner
    (``TaskAlreadyRunningError``: "TI was not in a state where it could be marked as running").
    """
    if airflow.process.running():
        response = airflow.api().request("PATCH", f"dags/{dag_id}", json={"is_paused": True})
        response.raise_for_status()
    done = airflow.cli("dags", "test", dag_id, logical_date.isoformat(), timeout=timeout)
    return done.stdout + done.stderr


def process_cmdline(process: psutil.Process) -> str:
    """A process's command line, or "" for one that exited or is a zombie meanwhile (a JVM's short-lived
    children, such as a helper reaped late, are never what a test looks for)."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def wait_for(check, timeout: float, what: str, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not reached within {timeout:.0f}s (last: {last!r})")


# -- streaming summaries: ground truth with numpy, and readers of every output -------------------------


def truncate_significant(x: float, digits: int) -> float:
    """The test side's own bucket: the value's shortest decimal (repr) truncated toward zero (decimal module)."""
    from decimal import ROUND_DOWN, Decimal

    d = Decimal(repr(float(x)))
    if d == 0 or abs(d) < Decimal("1e-300"):
        return 0.0
    return float(d.quantize(Decimal(1).scaleb(d.adjusted() - digits + 1), rounding=ROUND_DOWN))


def numpy_summary(values: list[float], digits: int, percentiles=(50, 90, 99)) -> dict:
    """count, sum, min, max, mean, population stddev, and nearest-rank percentiles of the truncated values."""
    import numpy as np

    raw = np.array(values, dtype=float)
    truncated = np.array([truncate_significant(x, digits) for x in values])
    out = {
        "count": len(values),
        "sum": float(raw.sum()),
        "min": float(raw.min()),
        "max": float(raw.max()),
        "mean": float(raw.mean()),
        "stddev": float(raw.std(ddof=0)),
    }
    for q in percentiles:
        out[f"p{q:g}"] = float(np.percentile(truncated, q, method="inverted_cdf"))
    return out


def summary_rows(spark, config: Config, name: str | None = None) -> dict[tuple[str, str, int, str], dict]:
    """(summary, topic, window_start_ms, group_key) → the Delta row, as a dict."""
    from pyspark.sql import functions as F

    path = config.tables_dir / "summaries"
    if not any((path / "_delta_log").glob("*.json")):
        return {}
    df = spark.read.format("delta").load(str(path))
    if name:
        df = df.where(F.col("summary") == name)
    rows = df.withColumn("w", F.unix_millis("window_start")).collect()
    return {(r["summary"], r["topic"], r["w"], r["group_key"]): r.asDict() for r in rows}


def latest_summary_metrics(config: Config, timeout: float = 30.0) -> dict[tuple[str, str, int, str], dict]:
    """Latest statistics per summary key on the metrics topic; the group as canonical JSON text."""
    return {
        (key["summary"], key["topic"], key["window"], json.dumps(key["group"], separators=(",", ":"))): json.loads(value)
        for key, value in _metrics_messages(config, timeout)
        if "summary" in key
    }


def influx_summary_points(config: Config, measurement: str) -> dict[tuple[int, tuple], dict]:
    """(time_ms, sorted tag items) → fields, for every series of a summary's measurement."""
    response = requests.get(
        f"{config.influx_url()}/query",
        params={"db": config.influxdb.database, "q": f'SELECT * FROM "{measurement}" GROUP BY *', "epoch": "ms"},
        timeout=10,
    )
    response.raise_for_status()
    out: dict[tuple[int, tuple], dict] = {}
    for series in response.json()["results"][0].get("series", []):
        tags = tuple(sorted((k, v) for k, v in series.get("tags", {}).items() if v != ""))
        for values in series["values"]:
            fields = {c: v for c, v in zip(series["columns"], values, strict=True) if c != "time" and v is not None}
            out[(values[0], tags)] = fields
    return out


def write_config_file_with_summaries(config: Config, path: Path) -> Config:
    """write_config_file, plus the config's [[summaries]] tables."""
    write_config_file(config, path)
    lines = []
    for summary in config.summaries:
        lines.append("[[summaries]]")
        for key, value in summary.model_dump(exclude_none=True).items():
            if isinstance(value, (list, tuple)):
                lines.append(f"{key} = [{', '.join(_toml_value(v) for v in value)}]")
            else:
                lines.append(f"{key} = {_toml_value(value)}")
    with open(path, "a") as out:
        out.write("\n".join(lines) + "\n")
    from kdq.config import load_config

    return load_config(path=path, env={})
