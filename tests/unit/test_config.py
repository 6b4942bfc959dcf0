"""Configuration: defaults work, file + environment layering, and every error names the key."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest
from pydantic import ValidationError

from kdq.config import ConfigError, check_kafka_reachable, load_config


def write(tmp_path, text: str):
    path = tmp_path / "kdq.toml"
    path.write_text(text)
    return path


def test_defaults_work_locally(tmp_path) -> None:
    config = load_config(write(tmp_path, ""), env={})
    assert config.stream.window_seconds == 1
    assert config.kafka.topic_include == ".*"
    assert config.data_dir == (tmp_path / ".local").resolve()
    assert config.spark.master.startswith("local")


def test_environment_overrides_file(tmp_path) -> None:
    path = write(tmp_path, "[stream]\nwindow_seconds = 10\n[kafka]\nbootstrap_servers = 'a:1'\n")
    config = load_config(path, env={"KDQ_STREAM__WINDOW_SECONDS": "5", "KDQ_KAFKA__CLIENT": '{"security.protocol": "SSL"}'})
    assert config.stream.window_seconds == 5
    assert config.kafka_bootstrap() == "a:1"
    assert config.kafka_client_conf() == {"bootstrap.servers": "a:1", "security.protocol": "SSL"}


def test_config_is_frozen(tmp_path) -> None:
    config = load_config(write(tmp_path, ""), env={})
    with pytest.raises(ValidationError):
        config.stream.window_seconds = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("[stream]\nwindow_secnds = 1\n", {}, "unknown key stream.window_secnds (did you mean 'window_seconds'?)"),
        ("[strem]\n", {}, "unknown section [strem]"),
        ("", {"KDQ_STREAM__WINDOW": "1"}, "KDQ_STREAM__WINDOW: unknown key stream.window"),
        ("", {"KDQ_STREEM__WINDOW_SECONDS": "1"}, "unknown section 'streem'"),
        ("[stream]\nwindow_seconds = 0\n", {}, "stream.window_seconds"),
        ("", {"KDQ_STREAM__WINDOW_SECONDS": "abc"}, "stream.window_seconds (from KDQ_STREAM__WINDOW_SECONDS)"),
        ("[kafka]\ntopic_include = '(['\n", {}, "kafka.topic_include"),
        ("[kafka]\nbootstrap_servers = 'nohost'\n", {}, "expected host:port"),
        ("[kafka]\nstarting_offsets = 'sometimes'\n", {}, "kafka.starting_offsets"),
        ("[influxdb]\nversion = 4\n", {}, "influxdb.version"),
        ("[influxdb]\nurl = 'localhost:8086'\n", {}, "expected an http(s):// URL"),
        ("[spark]\ndriver_memory = 'lots'\n", {}, "spark.driver_memory"),
        ("[stream\n", {}, "not valid TOML"),
    ],
)
def test_bad_values_name_the_key(tmp_path, text, env, expected) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, text), env=env)
    assert expected in str(error.value)


def test_missing_config_file_is_reported(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(env={"KDQ_CONFIG": str(tmp_path / "missing.toml")})


def test_empty_bootstrap_without_local_stack_says_what_to_do(tmp_path) -> None:
    config = load_config(write(tmp_path, ""), env={})
    with pytest.raises(ConfigError, match="kdq up"):
        config.kafka_bootstrap()


def test_unreachable_bootstrap_servers_are_reported_as_such(tmp_path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = load_config(write(tmp_path, f"[kafka]\nbootstrap_servers = '127.0.0.1:{port}'\n"), env={})
    with pytest.raises(ConfigError, match=f"cannot reach any broker: 127.0.0.1:{port}"):
        check_kafka_reachable(config, timeout=1, wait=0)


def test_a_broker_that_comes_back_within_the_wait_is_not_an_error(tmp_path, caplog) -> None:
    # A job started while the broker restarts (the chaos run's archive backfill during a broker restart) waits for it.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = load_config(write(tmp_path, f"[kafka]\nbootstrap_servers = '127.0.0.1:{port}'\n"), env={})
        timer = threading.Timer(1.5, sock.listen)  # the broker is back 1.5 s later
        timer.start()
        try:
            started = time.monotonic()
            with caplog.at_level(logging.WARNING, logger="kdq.config.kafka_checks"):
                check_kafka_reachable(config, timeout=1, wait=30)
            waited = time.monotonic() - started
        finally:
            timer.cancel()
    assert 1.5 <= waited < 15, waited
    assert f"no Kafka broker answers (127.0.0.1:{port}" in caplog.text


def test_every_spark_kafka_reader_is_read_committed(tmp_path) -> None:
    path = write(tmp_path, "[kafka]\nbootstrap_servers = 'a:1'\nclient = { 'security.protocol' = 'SSL' }\n")
    options = load_config(path, env={}).spark_kafka_options()
    assert options["kafka.isolation.level"] == "read_committed"
    assert options["kafka.security.protocol"] == "SSL" and options["kafka.bootstrap.servers"] == "a:1"


def test_spark_kafka_readers_wait_briefly_for_an_empty_fetch(tmp_path) -> None:
    # The Java client's 500 ms default, paid about once per partition a task reads (Spark's offset lookups after a
    # poll wait behind the consumer's next fetch), stalled quiet batches for seconds; 50 ms still cost 72 ms per
    # partition over 1,000 topics.
    options = load_config(write(tmp_path, "[kafka]\nbootstrap_servers = 'a:1'\n"), env={}).spark_kafka_options()
    assert options["kafka.fetch.max.wait.ms"] == "1"


def test_read_uncommitted_is_refused_at_start(tmp_path) -> None:
    path = write(tmp_path, "[kafka]\nclient = { 'isolation.level' = 'read_uncommitted' }\n")
    with pytest.raises(ConfigError, match=r"kafka\.client.*read_committed"):
        load_config(path, env={})


def test_sasl_login_from_one_client_table_for_both_client_libraries(tmp_path) -> None:
    path = write(
        tmp_path,
        "[kafka]\nbootstrap_servers = 'a:1'\n"
        "client = { 'security.protocol' = 'SASL_PLAINTEXT', 'sasl.mechanism' = 'SCRAM-SHA-512', "
        "'sasl.username' = 'kdq', 'sasl.password' = 'p\"w' }\n",
    )
    config = load_config(path, env={})
    options = config.spark_kafka_options()
    assert options["kafka.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="kdq" password="p\\"w";'
    )
    assert "kafka.sasl.username" not in options and "kafka.sasl.password" not in options
    # librdkafka (producers, the fallback reader, the CLI) keeps its own keys.
    assert config.kafka_client_conf()["sasl.username"] == "kdq"
