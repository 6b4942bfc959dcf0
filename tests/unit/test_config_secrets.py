"""No secret in any configuration error (issue 26, item 6): errors land in task logs, so a malformed or refused
setting is named with its problem, never with the value of a key Spark or Kafka treat as secret."""

from __future__ import annotations

import json

import pytest

from kdq.config import REDACTED, ConfigError, load_config, redact

SECRET = "S3cr3t-Pa55w0rd"
JAAS = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="kdq" password="{SECRET}";'


def _error(env: dict[str, str] | None = None, overrides: dict | None = None, toml: str | None = None, tmp_path=None) -> str:
    path = None
    if toml is not None:
        path = tmp_path / "kdq.toml"
        path.write_text(toml)
    with pytest.raises(ConfigError) as refused:
        config = load_config(path=path, env=env or {}, overrides=overrides)
        config.kafka_client_conf()  # some checks run when the clients' settings are built
    return str(refused.value)


CASES = {
    "malformed KDQ_KAFKA__CLIENT": dict(env={"KDQ_KAFKA__CLIENT": '{"sasl.password": "' + SECRET + '",'}),
    "malformed KDQ_SPARK__CONF": dict(env={"KDQ_SPARK__CONF": "{'spark.authenticate.secret': '" + SECRET + "'}"}),
    "read_uncommitted beside a SASL password": dict(
        env={"KDQ_KAFKA__CLIENT": json.dumps({"isolation.level": "read_uncommitted", "sasl.password": SECRET})}
    ),
    "read_uncommitted beside a JAAS line": dict(
        overrides={"kafka": {"client": {"isolation.level": "read_uncommitted", "sasl.jaas.config": JAAS}}}
    ),
    "a bad spark setting beside a secret": dict(
        overrides={"spark": {"driver_memory": "lots", "conf": {"spark.authenticate.secret": SECRET}}}
    ),
    "a spark.conf value of the wrong type holding a secret": dict(
        overrides={"spark": {"conf": {"spark.authenticate.secret": {"nested": SECRET}}}}
    ),
    "an InfluxDB URL with a password": dict(env={"KDQ_INFLUXDB__URL": f"ftp://kdq:{SECRET}@influx:8086"}),
    "a bad InfluxDB version beside its token": dict(env={"KDQ_INFLUXDB__VERSION": "7", "KDQ_INFLUXDB__TOKEN": SECRET}),
    "a bad InfluxDB password type": dict(overrides={"influxdb": {"password": [SECRET]}}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_config_errors_name_the_key_never_the_secret(case: str) -> None:
    message = _error(**CASES[case])
    assert SECRET not in message, message
    assert "invalid configuration" in message or "expected a JSON object" in message


def test_a_config_file_with_a_secret_and_a_bad_value(tmp_path) -> None:
    toml = f'[kafka.client]\n"sasl.password" = "{SECRET}"\n"isolation.level" = "read_uncommitted"\n'
    message = _error(toml=toml, tmp_path=tmp_path)
    assert SECRET not in message and "isolation.level" in message and "read_committed" in message


def test_the_refused_setting_is_still_named() -> None:
    message = _error(env={"KDQ_KAFKA__CLIENT": '{"sasl.password": "' + SECRET + '",'})
    assert "KDQ_KAFKA__CLIENT" in message and "not shown" in message
    message = _error(**CASES["a bad spark setting beside a secret"])
    assert "spark.driver_memory" in message and "lots" in message  # not a secret: shown


def test_redact() -> None:
    assert redact("kafka.client", {"sasl.jaas.config": JAAS, "security.protocol": "SASL_SSL"}) == {
        "sasl.jaas.config": REDACTED, "security.protocol": "SASL_SSL",
    }
    assert redact("influxdb.token", SECRET) == REDACTED
    assert redact("influxdb.url", f"http://kdq:{SECRET}@host:8086") == f"http://{REDACTED}@host:8086"
    assert redact("spark.conf", {"spark.authenticate.secret": SECRET, "spark.ui.enabled": "false"})[
        "spark.authenticate.secret"
    ] == REDACTED
