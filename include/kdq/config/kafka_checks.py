"""Checks at start that the configured Kafka brokers answer and accept ``kafka.client``'s login: a clear
:class:`~kdq.config.errors.ConfigError` naming the servers or the refused user, instead of a client's timeout."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Mapping

from kdq.config.errors import ConfigError, scrub, secret_values
from kdq.config.model import Config

log = logging.getLogger(__name__)


def check_kafka_reachable(config: Config, timeout: float = 5.0, login_timeout: float = 15.0, wait: float = 60.0) -> None:
    """Fail at start, naming the servers, when none of the bootstrap servers accepts a connection for ``wait``
    seconds (tried again with backoff meanwhile, each miss logged: a broker restarting must not fail a job that
    starts beside it); with SASL in ``kafka.client``, also when the brokers refuse its login
    (:func:`check_kafka_login`)."""
    servers = [s.strip() for s in config.kafka_bootstrap().split(",") if s.strip()]
    deadline = time.monotonic() + wait
    pause = 1.0
    while True:
        failures = _unreachable(servers, timeout)
        if len(failures) < len(servers):
            break
        left = deadline - time.monotonic()
        if left <= 0:
            raise ConfigError(f"kafka.bootstrap_servers: cannot reach any broker: {', '.join(failures)}")
        pause = min(pause, left)
        log.warning("no Kafka broker answers (%s); trying again in %.0f s, for %.0f s more", ", ".join(failures), pause, left)
        time.sleep(pause)
        pause = min(2 * pause, 10.0)
    if str(config.kafka.client.get("security.protocol", "")).upper().startswith("SASL"):
        check_kafka_login(config, login_timeout)


def _unreachable(servers: list[str], timeout: float) -> list[str]:
    """The servers tried, each with why it refused, up to the first that accepts a connection (not listed)."""
    failures = []
    for server in servers:
        host, _, port = server.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                break
        except OSError as exc:
            failures.append(f"{server} ({exc.strerror or exc})")
    return failures


def check_kafka_login(config: Config, timeout: float = 15.0) -> None:
    """Log in with ``kafka.client`` (a metadata request of librdkafka's admin client) and raise a ConfigError
    naming the user and the mechanism when a broker refuses the credentials: otherwise a client only retries, and
    the user sees a timeout. Any other failure (no answer in time) is left to the clients, as before."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    refused: list[str] = []

    def on_error(error: KafkaError) -> None:
        if error.code() == KafkaError._AUTHENTICATION:
            refused.append(error.str())

    # log_level 0: librdkafka's own log line of the refusal would only repeat the error raised here.
    admin = AdminClient({**config.kafka_client_conf(), "error_cb": on_error, "log_level": 0})
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.list_topics(timeout=max(0.1, min(0.5, deadline - time.monotonic())))
            return
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if error is not None and error.code() == KafkaError._AUTHENTICATION:
                refused.append(error.str())
        admin.poll(0)  # serves error_cb
        if refused:
            message = kafka_login_refused(config.kafka.client, config.kafka_bootstrap(), refused[0])
            raise ConfigError(scrub(message, secret_values(dict(config.kafka.client), "kafka.client")))
        if time.monotonic() >= deadline:
            return


def kafka_login_refused(client: Mapping[str, str], bootstrap: str, reason: str) -> str:
    """What a refused Kafka login tells the user: who, how, where, what to check (never the password)."""
    user = client.get("sasl.username") or "(no sasl.username)"
    mechanism = str(client.get("sasl.mechanism") or "GSSAPI").upper()  # librdkafka's default mechanism
    return (
        f"Kafka refused the credentials of user {user} (SASL {mechanism} authentication failed at {bootstrap}): "
        f"check sasl.username and sasl.password of kafka.client (KDQ_KAFKA__CLIENT). The client said: {reason}"
    )
