"""The local broker's SASL option (server.properties, users at format time) and the refused-login error, without a
broker: librdkafka's admin client is replaced by a fake that answers as a broker refusing the credentials would."""

from __future__ import annotations

import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from kdq.config import Config, ConfigError, check_kafka_login, check_kafka_reachable, kafka_login_refused
from kdq.procs import StackError
from kdq.stack.kafka import KafkaSasl, LocalKafka
from tests.conftest import make_config

PASSWORD = "9f2c" * 16
LIBRDKAFKA_REASON = (
    "sasl_plaintext://127.0.0.1:{port}/bootstrap: SASL authentication error: Authentication failed during "
    "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 2ms in state AUTH_REQ)"
)


def sasl_client(password: str = PASSWORD, user: str = "kdq") -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": user, "sasl.password": password}


@pytest.fixture
def listening() -> Iterator[int]:
    """A port that accepts TCP connections (the reachability check's first step)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def config_for(tmp_path: Path, port: int, client: dict[str, str]) -> Config:
    return make_config(tmp_path, kafka={"bootstrap_servers": f"127.0.0.1:{port}", "client": client})


def test_default_broker_is_plaintext_and_unchanged(tmp_path: Path) -> None:
    kafka = LocalKafka(make_config(tmp_path), 9092, 9093)
    props = kafka.server_properties(kafka.nodes[0])
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092"
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert props["listener.security.protocol.map"] == "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert not any(key.startswith(("sasl.", "listener.name.")) for key in props)


def test_sasl_broker_properties_and_users(tmp_path: Path) -> None:
    sasl = KafkaSasl(users={"kdq": PASSWORD}, admin_password="a" * 64, controller_password="c" * 64)
    kafka = LocalKafka(make_config(tmp_path), 9092, 9093, [(9094, 9095)], sasl=sasl)
    props = kafka.server_properties(kafka.nodes[1])
    assert props["listeners"] == "INTERNAL://127.0.0.1:9094,CONTROLLER://127.0.0.1:9095"
    assert props["inter.broker.listener.name"] == "INTERNAL"
    assert props["listener.security.protocol.map"] == "INTERNAL:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093,2@127.0.0.1:9095"
    assert props["listener.name.internal.scram-sha-512.sasl.jaas.config"] == (
        f'org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="{"a" * 64}";'
    )
    assert props["listener.name.controller.plain.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="controller" password="{"c" * 64}" user_controller="{"c" * 64}";'
    )
    assert sasl.format_arguments() == [
        f"--add-scram=SCRAM-SHA-512=[name=admin,password={'a' * 64}]",
        f"--add-scram=SCRAM-SHA-512=[name=kdq,password={PASSWORD}]",
    ]
    assert sasl.client("kdq") == sasl_client()
    # The properties file holds passwords: the owner's only.
    kafka._write_config(kafka.nodes[0])
    assert stat.S_IMODE(kafka.nodes[0].properties.stat().st_mode) == 0o600
    assert f'password="{"a" * 64}"' in kafka.nodes[0].properties.read_text()


def test_generated_passwords_differ_and_unsafe_ones_are_refused() -> None:
    one, two = KafkaSasl(users={}), KafkaSasl(users={})
    assert len(one.admin_password) == 64 and one.admin_password != two.admin_password
    assert one.controller_password != two.controller_password
    for bad in ("a,b", "a]b", 'a"b', "a\\b", "a\nb", ""):
        with pytest.raises(StackError, match="openssl rand -hex 32"):
            KafkaSasl(users={"kdq": bad})
    with pytest.raises(StackError, match="controller password"):
        KafkaSasl(users={}, controller_password='x"y')


def test_refused_login_message_names_user_mechanism_and_servers() -> None:
    message = kafka_login_refused(sasl_client(), "a:1,b:2", "invalid credentials")
    assert message == (
        "Kafka refused the credentials of user kdq (SASL SCRAM-SHA-512 authentication failed at a:1,b:2): "
        "check sasl.username and sasl.password of kafka.client (KDQ_KAFKA__CLIENT). The client said: invalid credentials"
    )
    assert PASSWORD not in message


class FakeAdmin:
    """librdkafka's AdminClient as a broker refusing the login makes it behave: the error callback gets
    _AUTHENTICATION (served by poll), or list_topics raises it; ``accept`` answers the metadata request."""

    mode = "error_cb"
    created: list[dict] = []

    def __init__(self, conf: dict) -> None:
        FakeAdmin.created.append(conf)
        self.error_cb = conf["error_cb"]
        self.port = conf["bootstrap.servers"].rsplit(":", 1)[1]

    def list_topics(self, timeout: float):
        if self.mode == "accept":
            return object()
        if self.mode == "raise":
            raise KafkaException(KafkaError(KafkaError._AUTHENTICATION, LIBRDKAFKA_REASON.format(port=self.port)))
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: Local: Broker transport failure"))

    def poll(self, timeout: float) -> int:
        if self.mode == "error_cb":
            # A reason quoting the password, should a client ever do so: never shown.
            self.error_cb(KafkaError(KafkaError._AUTHENTICATION, LIBRDKAFKA_REASON.format(port=self.port) + PASSWORD))
        return 0


@pytest.fixture
def fake_admin(monkeypatch: pytest.MonkeyPatch) -> type[FakeAdmin]:
    import confluent_kafka.admin

    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", FakeAdmin)
    FakeAdmin.created = []
    return FakeAdmin


@pytest.mark.parametrize("mode", ["error_cb", "raise"])
def test_refused_credentials_fail_the_start_with_a_clear_error(tmp_path, listening, fake_admin, monkeypatch, mode):
    monkeypatch.setattr(fake_admin, "mode", mode)
    config = config_for(tmp_path, listening, sasl_client())
    with pytest.raises(ConfigError) as error:
        check_kafka_reachable(config)
    message = str(error.value)
    assert message.startswith(
        f"Kafka refused the credentials of user kdq (SASL SCRAM-SHA-512 authentication failed at 127.0.0.1:{listening}): "
        "check sasl.username and sasl.password of kafka.client (KDQ_KAFKA__CLIENT). The client said: "
        f"sasl_plaintext://127.0.0.1:{listening}/bootstrap: SASL authentication error: Authentication failed"
    ), message
    assert PASSWORD not in message
    assert fake_admin.created[0]["sasl.password"] == PASSWORD  # the login kafka.client says


def test_accepted_login_and_no_answer_pass(tmp_path, listening, fake_admin, monkeypatch) -> None:
    config = config_for(tmp_path, listening, sasl_client())
    monkeypatch.setattr(fake_admin, "mode", "accept")
    check_kafka_reachable(config)
    # No answer and no refusal within the time: left to the clients (they retry), as before this check.
    monkeypatch.setattr(fake_admin, "mode", "silent")
    check_kafka_login(config, timeout=0.3)


def test_without_sasl_only_the_connection_is_checked(tmp_path, listening, fake_admin) -> None:
    check_kafka_reachable(config_for(tmp_path, listening, {}))
    check_kafka_reachable(config_for(tmp_path, listening, {"security.protocol": "SSL"}))
    assert fake_admin.created == []
