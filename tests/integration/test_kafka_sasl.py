"""Kafka with SASL/SCRAM-SHA-512 as docker-compose.yml configures it, end to end.

A local KRaft broker of its own (:class:`kdq.stack.kafka.KafkaSasl`): client and inter-broker listener
SASL_PLAINTEXT with SCRAM-SHA-512, controller listener SASL_PLAINTEXT with PLAIN, the SCRAM users created
when the storage is formatted. kdq's clients get the compose file's ``KDQ_KAFKA__CLIENT`` settings (librdkafka's
form; Spark's Java client gets the JAAS line derived from them). The demo traffic (``kdq demo``), exact records
of the test's own producer, the stream (the spark-submit process, as in production), the metrics topic and a
batch job reading Kafka (archive from Kafka: librdkafka and Spark's batch Kafka source) all run authenticated.
A wrong password is refused with an error naming the user and the mechanism, at the demo's and the stream's start.
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from spark_jobs import archive_from_kafka

from kdq.config import Config, ConfigError, check_kafka_reachable
from kdq.procs import free_port
from kdq.spark.stream_process import start_stream, stop_stream, stream_process
from kdq.stack.kafka import KafkaSasl, LocalKafka
from tests.conftest import PROJECT_ROOT, make_config
from tests.integration.helpers import (
    W0,
    archived_offsets,
    expected_counts,
    latest_metrics,
    wait_for,
    window_counts,
    write_config_file,
)

USER = "kdq"
EXACT = "sasl-exact"  # the test's own records: exact windows
DEMO_TOPICS = ("orders", "payments")  # the demo traffic's topics, as `make run` produces them
WRONG_PASSWORD = "0123456789abcdef-wrong"
REFUSED = "Kafka refused the credentials of user {user} (SASL SCRAM-SHA-512 authentication failed at {bootstrap})"


@dataclass(frozen=True)
class SaslKafka:
    kafka: LocalKafka
    sasl: KafkaSasl
    root: Path

    def config(self, name: str, **login: str) -> Config:
        """A kdq config (written as a file, for child processes) with kafka.client as docker-compose.yml sets it
        (``KDQ_KAFKA__CLIENT``), logging in as user kdq unless ``login`` (username, password) says otherwise."""
        client = {**self.sasl.client(USER), **{f"sasl.{key}": value for key, value in login.items()}}
        data = self.root / name
        config = make_config(
            data,
            kafka={
                "bootstrap_servers": self.kafka.bootstrap,
                "client": client,
                "topic_include": "orders|payments|sasl-.*",
                "metrics_topic": "kdq.metrics",
                "max_offsets_per_trigger": 100_000,
            },
            stream={"window_seconds": 1, "allowed_lateness_seconds": 3600, "trigger_interval_seconds": 1},
            spark={"master": "local[2]", "shuffle_partitions": 2},
            influxdb={"enabled": False},
        )
        return write_config_file(config, self.root / f"{name}.toml")


@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslKafka]:
    root = tmp_path_factory.mktemp("sasl")
    sasl = KafkaSasl(users={USER: secrets.token_hex(32)})
    # The broker's own client settings (health check, create_topic) log in as kdq, as every kdq client does.
    port, controller_port = free_port(), free_port()
    config = make_config(root / "broker", kafka={"client": sasl.client(USER)})
    kafka = LocalKafka(config, port, controller_port, sasl=sasl)
    try:
        kafka.start(timeout=120)
        yield SaslKafka(kafka, sasl, root)
    finally:
        kafka.stop()


def _produce(config: Config, topic: str, records: list[tuple[int, bytes, int]]) -> None:
    producer = Producer({**config.kafka_client_conf(), "enable.idempotence": True})
    for partition, value, ts in records:
        producer.produce(topic, value=value, partition=partition, timestamp=ts)
    assert producer.flush(60) == 0


def _end_offsets(config: Config, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({**config.kafka_client_conf(), "group.id": "sasl-test", "enable.auto.commit": False})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1] for p in range(partitions)]
    finally:
        consumer.close()


def _kdq(config: Config, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kdq.cli", "--config", config.source, *args],
        capture_output=True, text=True, timeout=timeout, cwd=PROJECT_ROOT,
    )


def _totals(counts: dict[tuple[str, int, str], int], topics) -> dict[tuple[str, str], int]:
    out: Counter = Counter()
    for (topic, _, status), n in counts.items():
        if topic in topics:
            out[(topic, status)] += n
    return dict(out)


@pytest.mark.timeout(900)
def test_stream_batch_job_and_demo_traffic_run_authenticated(spark, sasl_kafka: SaslKafka) -> None:
    config = sasl_kafka.config("good")
    sasl_kafka.kafka.create_topic(EXACT, partitions=3)

    # The demo traffic, authenticated: `kdq demo` with on-time records only (every one counted by the stream).
    demo = _kdq(
        config, "demo", "--topics", "orders:orders,payments:payments", "--count", "300", "--rate", "1000",
        "--out-of-order", "0", "--late", "0", "--seed", "26",
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    stats = json.loads(demo.stdout.strip().splitlines()[-1])
    assert (stats["produced"], stats["delivered"], stats["failed"]) == (300, 300, 0), stats
    demo_truth = {
        (topic, status): stats["topics"][topic][status]
        for topic in DEMO_TOPICS
        for status in ("valid", "invalid")
        if stats["topics"][topic].get(status)
    }
    assert sum(demo_truth.values()) == 300 and any(s == "invalid" for _, s in demo_truth), demo_truth

    # The test's own records: 30 over three partitions and four 1-second windows, every fifth invalid.
    sent = [(i % 3, i % 5 != 0, W0 + i * 130) for i in range(30)]
    _produce(config, EXACT, [(p, b'{"id":1}' if ok else b"{oops", ts) for p, ok, ts in sent])
    truth = expected_counts(EXACT, [(ts, ok) for _, ok, ts in sent])

    # The stream as production runs it (spark-submit), until the metrics topic (read authenticated) has every count.
    def every_count_on_the_metrics_topic() -> bool:
        if config.kafka.metrics_topic not in AdminClient(config.kafka_client_conf()).list_topics(timeout=10).topics:
            return False  # not created by the stream yet
        metrics = latest_metrics(config, timeout=10)
        return {k: v for k, v in metrics.items() if k[0] == EXACT} == truth and _totals(metrics, DEMO_TOPICS) == demo_truth

    start_stream(config)
    try:
        wait_for(every_count_on_the_metrics_topic, 300, "every count on the metrics topic", interval=3)
        assert stop_stream(config, timeout=120)
    finally:
        stop_stream(config, timeout=30)
    log = stream_process(config).log_tail(400)
    assert "Traceback" not in log, log

    # Delta: the same exact counts, every record archived once.
    assert window_counts(spark, config, EXACT) == truth
    assert _totals(window_counts(spark, config), DEMO_TOPICS) == demo_truth
    every = Counter({(p, o): 1 for p in range(3) for o in range(10)})
    assert archived_offsets(spark, config, EXACT) == every

    # A batch job reading Kafka, authenticated (librdkafka resolves the offsets, Spark's Kafka source reads them):
    # archive from Kafka fills a gap cut into the archive, exactly.
    archive = config.tables_dir / "raw_archive"
    spark.sql(f"DELETE FROM delta.`{archive}` WHERE topic = '{EXACT}' AND partition = 0 AND offset BETWEEN 2 AND 4")
    args = argparse.Namespace(
        topics=[EXACT], pattern=None, starting_offsets="earliest", start_time=None,
        ending_offsets="latest", end_time=None, run_id=None,
    )
    report = archive_from_kafka.run(spark, config, args)
    assert report["ok"] and report["missing_in_kafka"] == [], report
    assert (report["rows_read"], report["rows_loaded"], report["rows_skipped_already_archived"]) == (30, 3, 27)
    assert archived_offsets(spark, config, EXACT) == every


def test_a_wrong_password_is_refused_with_a_clear_error(sasl_kafka: SaslKafka) -> None:
    good = sasl_kafka.config("reference")
    wrong = sasl_kafka.config("wrong", password=WRONG_PASSWORD)
    expected = REFUSED.format(user=USER, bootstrap=sasl_kafka.kafka.bootstrap)
    sasl_kafka.kafka.create_topic("orders", partitions=3)
    before = _end_offsets(good, "orders", 3)

    # The demo traffic: refused at its start, nothing produced.
    demo = _kdq(wrong, "demo", "--topics", "orders:orders", "--count", "20", "--rate", "1000")
    assert demo.returncode == 2, demo.stdout + demo.stderr
    assert demo.stderr.strip().splitlines()[-1].startswith(
        f"kdq: configuration error: {expected}: check sasl.username and sasl.password of kafka.client"
    ), demo.stderr
    assert "Traceback" not in demo.stderr
    assert WRONG_PASSWORD not in demo.stdout + demo.stderr
    assert _end_offsets(good, "orders", 3) == before

    # An unknown user, in process: the same error names that user.
    with pytest.raises(ConfigError) as error:
        check_kafka_reachable(sasl_kafka.config("stranger", username="nobody"))
    assert str(error.value).startswith(REFUSED.format(user="nobody", bootstrap=sasl_kafka.kafka.bootstrap))

    # The stream: its spark-submit process stops at the Kafka check with that error, before any Spark session.
    pid = start_stream(wrong)
    try:
        code = psutil.Process(pid).wait(timeout=180)
    except psutil.NoSuchProcess:
        code = None
    finally:
        stop_stream(wrong, timeout=30)
    log = stream_process(wrong).log_tail(200)
    assert f"kdq.config.ConfigError: {expected}" in log, log
    assert code != 0 and WRONG_PASSWORD not in log, (code, log)
    assert not (wrong.tables_dir / "window_counts").exists()
