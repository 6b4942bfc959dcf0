"""The SQL endpoint's security settings: what it refuses to start with, what goes to the process and the command
line (and what does not), the self-signed keystore, and how kdq's clients present the password to Spark Connect."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kdq.sql_client import connect_builder
from kdq.stack.sql_endpoint import (
    CONNECT_TOKEN_ENV,
    PASSWORD_ENV,
    TLS_KEYSTORE_ENV,
    TLS_KEYSTORE_PASSWORD_ENV,
    EndpointSecurityError,
    endpoint_env,
    security_check,
    self_signed_keystore,
    thrift_tls_conf,
)

SECRET = "s3cr3t-value-never-shown"


@pytest.fixture(scope="module")
def keystore(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tls") / "kdq-sql.p12"
    assert self_signed_keystore(path, SECRET, ["sql-endpoint", "localhost", "127.0.0.1"])
    return path


def test_loopback_needs_nothing() -> None:
    security_check({}, "127.0.0.1")
    security_check({PASSWORD_ENV: SECRET}, "localhost")


@pytest.mark.parametrize(
    ("env", "missing"),
    [
        ({}, f"set {PASSWORD_ENV} and {TLS_KEYSTORE_ENV}"),
        ({PASSWORD_ENV: SECRET}, f"set {TLS_KEYSTORE_ENV} ("),
    ],
)
def test_beyond_loopback_needs_the_password_and_tls(env: dict[str, str], missing: str) -> None:
    with pytest.raises(EndpointSecurityError, match="beyond loopback") as refused:
        security_check(env, "0.0.0.0")
    assert missing in str(refused.value)
    assert SECRET not in str(refused.value)


def test_beyond_loopback_with_password_and_keystore(keystore: Path) -> None:
    security_check({PASSWORD_ENV: SECRET, TLS_KEYSTORE_ENV: str(keystore), TLS_KEYSTORE_PASSWORD_ENV: SECRET}, "0.0.0.0")


def test_a_keystore_must_exist_and_have_its_password(tmp_path: Path, keystore: Path) -> None:
    with pytest.raises(EndpointSecurityError, match=f"{TLS_KEYSTORE_ENV}: no such keystore file"):
        security_check({TLS_KEYSTORE_ENV: str(tmp_path / "absent.p12"), TLS_KEYSTORE_PASSWORD_ENV: SECRET}, "127.0.0.1")
    with pytest.raises(EndpointSecurityError, match=f"{TLS_KEYSTORE_PASSWORD_ENV} is not"):
        security_check({TLS_KEYSTORE_ENV: str(keystore)}, "127.0.0.1")


def test_the_connect_token_goes_through_the_environment_only() -> None:
    assert endpoint_env({}) == {} and endpoint_env({PASSWORD_ENV: ""}) == {}
    assert endpoint_env({PASSWORD_ENV: SECRET}) == {CONNECT_TOKEN_ENV: SECRET}


def test_tls_conf_names_the_keystore_never_its_password(keystore: Path) -> None:
    assert thrift_tls_conf({}) == {}
    conf = thrift_tls_conf({TLS_KEYSTORE_ENV: str(keystore), TLS_KEYSTORE_PASSWORD_ENV: SECRET})
    assert conf == {"spark.hadoop.hive.server2.use.SSL": "true",
                    "spark.hadoop.hive.server2.keystore.path": str(keystore.resolve())}


def test_self_signed_keystore_names_the_hosts_and_is_kept(keystore: Path) -> None:
    certificate = Path(f"{keystore}.crt")
    assert certificate.read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert keystore.stat().st_mode & 0o077 == 0  # the key is the owner's only
    printed = subprocess.run(["keytool", "-printcert", "-file", str(certificate)], capture_output=True, text=True,
                             check=True).stdout
    assert "DNSName: sql-endpoint" in printed and "IPAddress: 127.0.0.1" in printed and "CN=kdq-sql-endpoint" in printed
    before = keystore.read_bytes()
    assert not self_signed_keystore(keystore, "another", ["x"])  # an existing keystore (a user's own) is never replaced
    assert keystore.read_bytes() == before
    # The password opens it.
    subprocess.run(["keytool", "-list", "-keystore", str(keystore), "-storepass", SECRET], check=True,
                   capture_output=True)


def _channel(url: str, password: str | None = None):
    return connect_builder(url, password)._channel_builder


def test_clients_send_the_password_as_connects_bearer_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    monkeypatch.delenv(CONNECT_TOKEN_ENV, raising=False)
    # No password: nothing sent, a plaintext channel.
    plain = _channel("sc://127.0.0.1:15002")
    assert plain.token is None and not plain.secure and dict(plain.metadata()).get("authorization") is None
    # Plaintext (loopback, or the compose deployment's private network): the header Spark's interceptor checks.
    sent = _channel("sc://sql-endpoint:15002", SECRET)
    assert not sent.secure and dict(sent.metadata())["authorization"] == f"Bearer {SECRET}"
    # Over TLS: Spark's own token parameter (call credentials on the TLS channel), not a header.
    tls = _channel("sc://sql.example.com:443/;use_ssl=true", SECRET)
    assert tls.secure and tls.token == SECRET and "authorization" not in dict(tls.metadata())
    # The password from the client's environment by default.
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    assert dict(_channel("sc://localhost:15002").metadata())["authorization"] == f"Bearer {SECRET}"
