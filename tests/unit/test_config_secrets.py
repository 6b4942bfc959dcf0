"""No secret in any configuration error: errors land in task logs, so a malformed or refused
setting is named with its problem, never with the value of a key Spark or Kafka treat as secret.

Every error path of :func:`kdq.config.load_config` that can see a secret is fed one here: the environment
(``KDQ_KAFKA__CLIENT`` / ``KDQ_SPARK__CONF`` as malformed JSON, JSON of the wrong shape, unknown sections and keys),
the file (TOML syntax errors, unknown sections and keys, tables of the wrong type, ``[kafka.client]`` /
``[spark.conf]`` of the wrong type or with nested tables), the settings' validation (read_committed refusal beside
every kind of Kafka secret, bad Spark and InfluxDB settings beside theirs, URLs with credentials), the errors of a
loaded config, and the SQL endpoint's security check (``KDQ_SQL_PASSWORD``). The Airflow task log of a failing job:
tests/integration/test_airflow_task_log_secrets.py.
"""

from __future__ import annotations

import json

import pytest

from kdq.config import REDACTED, ConfigError, load_config, redact, redact_text

SECRET = "S3cr3t-Pa55w0rd"
JAAS = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="kdq" password="{SECRET}";'
PEM = f"-----BEGIN PRIVATE KEY-----\nMII{SECRET}\n-----END PRIVATE KEY-----"

# Settings whose values the Kafka clients treat as secret: the Java client's PASSWORD-type configs, librdkafka's
# sensitive properties.
KAFKA_SECRETS = {
    "sasl.password": SECRET,
    "sasl.jaas.config": JAAS,
    "sasl.oauthbearer.client.secret": SECRET,
    "sasl.oauthbearer.config": f"principal=kdq scope=all extension_key={SECRET}",
    "ssl.key.password": SECRET,
    "ssl.keystore.password": SECRET,
    "ssl.truststore.password": SECRET,
    "ssl.keystore.key": PEM,
    "ssl.keystore.certificate.chain": PEM,
    "ssl.truststore.certificates": PEM,
    "ssl.key.pem": PEM,
    "ssl_key": PEM,
}
# Settings whose values Spark (spark.redaction.regex) or Hadoop (sensitive config keys) treat as secret.
SPARK_SECRETS = {
    "spark.authenticate.secret": SECRET,
    "spark.hadoop.fs.s3a.secret.key": SECRET,
    "spark.hadoop.fs.s3a.access.key": SECRET,
    "spark.hadoop.fs.s3a.session.token": SECRET,
    "spark.hadoop.fs.s3a.encryption.key": SECRET,
    "spark.hadoop.fs.azure.account.key.kdq.dfs.core.windows.net": SECRET,
    "spark.hadoop.fs.gs.auth.service.account.private.key": PEM,
    "spark.ssl.keyPassword": SECRET,
    "spark.ssl.keyStorePassword": SECRET,
    "spark.hadoop.javax.jdo.option.ConnectionPassword": SECRET,
}


def _error(env: dict[str, str] | None = None, overrides: dict | None = None, toml: str | None = None, tmp_path=None) -> str:
    path = None
    if toml is not None:
        path = tmp_path / "kdq.toml"
        path.write_text(toml)
    with pytest.raises(ConfigError) as refused:
        config = load_config(path=path, env=env or {}, overrides=overrides)
        config.kafka_client_conf()  # some checks run when the clients' settings are built
    return str(refused.value)


def _leaked(message: str) -> list[str]:
    """The secrets (or a telling piece of one) the message shows."""
    return [s for s in (SECRET, "MII", "Pa55w0rd", "S3cr3t") if s in message]


def _toml(section: str, values: dict[str, str]) -> str:
    return f"[{section}]\n" + "".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in values.items())


CASES = {
    # The environment: JSON settings maps.
    "malformed KDQ_KAFKA__CLIENT": dict(env={"KDQ_KAFKA__CLIENT": '{"sasl.password": "' + SECRET + '",'}),
    "malformed KDQ_SPARK__CONF": dict(env={"KDQ_SPARK__CONF": "{'spark.authenticate.secret': '" + SECRET + "'}"}),
    "KDQ_KAFKA__CLIENT as a JSON string": dict(env={"KDQ_KAFKA__CLIENT": json.dumps(f"sasl.password={SECRET}")}),
    "KDQ_KAFKA__CLIENT as a JSON array": dict(env={"KDQ_KAFKA__CLIENT": json.dumps(["sasl.password", SECRET])}),
    "KDQ_SPARK__CONF as JSON pairs": dict(env={"KDQ_SPARK__CONF": json.dumps([["spark.authenticate.secret", SECRET]])}),
    "KDQ_SPARK__CONF as a JSON number": dict(env={"KDQ_SPARK__CONF": "7"}),
    "KDQ_KAFKA__CLIENT with a secret of the wrong type": dict(
        env={"KDQ_KAFKA__CLIENT": json.dumps({"sasl.jaas.config": [JAAS], "sasl.password": {"value": SECRET}})}
    ),
    "KDQ_SPARK__CONF with a secret of the wrong type": dict(
        env={"KDQ_SPARK__CONF": json.dumps({"spark.authenticate.secret": 12345678, "spark.ssl.keyPassword": [SECRET]})}
    ),
    "read_uncommitted in KDQ_KAFKA__CLIENT beside a SASL password": dict(
        env={"KDQ_KAFKA__CLIENT": json.dumps({"isolation.level": "read_uncommitted", "sasl.password": SECRET})}
    ),
    # The environment: names that are no setting (only the name is shown).
    "an unknown key holding a secret": dict(env={"KDQ_KAFKA__SASL_PASSWORD": SECRET}),
    "an unknown section holding a secret": dict(env={"KDQ_SASL__PASSWORD": SECRET}),
    "summaries from the environment": dict(env={"KDQ_SUMMARIES__TOKEN": SECRET}),
    # Validation: the read_committed refusal shows [kafka.client], every kind of Kafka secret hidden.
    "read_uncommitted beside a JAAS line": dict(
        overrides={"kafka": {"client": {"isolation.level": "read_uncommitted", "sasl.jaas.config": JAAS}}}
    ),
    "read_uncommitted beside every Kafka secret": dict(
        overrides={"kafka": {"client": {"isolation.level": "read_uncommitted", "security.protocol": "SASL_SSL",
                                        **KAFKA_SECRETS}}}
    ),
    # Validation: Spark.
    "a bad spark setting beside a secret": dict(
        overrides={"spark": {"driver_memory": "lots", "conf": {"spark.authenticate.secret": SECRET}}}
    ),
    "a bad spark setting beside every Spark secret": dict(
        overrides={"spark": {"database": "no such name", "conf": SPARK_SECRETS}}
    ),
    "a spark.conf value of the wrong type holding a secret": dict(
        overrides={"spark": {"conf": {"spark.authenticate.secret": {"nested": SECRET}}}}
    ),
    "a spark.conf of the wrong type": dict(overrides={"spark": {"conf": f"spark.authenticate.secret={SECRET}"}}),
    # Validation: InfluxDB.
    "an InfluxDB URL with a password": dict(env={"KDQ_INFLUXDB__URL": f"ftp://kdq:{SECRET}@influx:8086"}),
    "an InfluxDB URL with an @ in its password": dict(env={"KDQ_INFLUXDB__URL": f"ftp://kdq:Pa@55@{SECRET}@influx:8086"}),
    "a bad InfluxDB version beside its token": dict(env={"KDQ_INFLUXDB__VERSION": "7", "KDQ_INFLUXDB__TOKEN": SECRET}),
    "a bad InfluxDB setting beside its password": dict(
        env={"KDQ_INFLUXDB__TIMEOUT_SECONDS": "-1", "KDQ_INFLUXDB__PASSWORD": SECRET,
             "KDQ_INFLUXDB__URL": f"http://kdq:{SECRET}@influx:8086"}
    ),
    "a bad InfluxDB password type": dict(overrides={"influxdb": {"password": [SECRET]}}),
    "a bad InfluxDB token type": dict(overrides={"influxdb": {"token": {"value": SECRET}}}),
    # Validation: storage.
    "a storage URI with credentials": dict(env={"KDQ_PATHS__STORAGE_URI": f"s3a://AKIAKDQ:{SECRET}@bucket/kdq"}),
    "an s3:// storage URI with credentials": dict(env={"KDQ_PATHS__STORAGE_URI": f"s3://AKIAKDQ:{SECRET}@bucket/kdq"}),
    # A check across sections, beside secrets.
    "a summary window that does not fit, beside secrets": dict(
        env={"KDQ_KAFKA__CLIENT": json.dumps(KAFKA_SECRETS), "KDQ_SPARK__CONF": json.dumps(SPARK_SECRETS)},
        overrides={"summaries": [{"name": "s", "topic": "t", "value": "v", "window_seconds": 7}],
                   "stream": {"window_seconds": 2}},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_config_errors_name_the_key_never_the_secret(case: str) -> None:
    message = _error(**CASES[case])
    assert not _leaked(message), message
    assert "invalid configuration" in message or "expected a JSON object" in message or "KDQ_" in message


FILES = {
    "a secret beside a refused isolation level": _toml(
        "kafka.client", {"sasl.password": SECRET, "isolation.level": "read_uncommitted"}
    ),
    "every Kafka secret beside a refused isolation level": _toml(
        "kafka.client", {**KAFKA_SECRETS, "isolation.level": "read_uncommitted"}
    ),
    # Unquoted dotted keys make nested tables: {"ssl": {"key": {"pem": ...}}}.
    "nested tables in [kafka.client]": f'[kafka.client]\nssl.key.pem = {json.dumps(PEM)}\nsasl.password = "{SECRET}"\n',
    "a [kafka.client] secret of the wrong type": '[kafka.client]\n"ssl.key.password" = 12345678\n'
    f'"sasl.jaas.config" = [{json.dumps(JAAS)}]\n',
    "[kafka] client as a string": f'[kafka]\nclient = "sasl.password={SECRET}"\n',
    "[spark] conf as an array": f'[spark]\nconf = ["spark.authenticate.secret={SECRET}"]\n',
    "[spark.conf] secrets beside a bad spark setting": '[spark]\ndriver_memory = "lots"\n' + _toml("spark.conf", SPARK_SECRETS),
    "[spark.conf] secret of the wrong type": '[spark.conf]\n"spark.authenticate.secret" = {value = "' + SECRET + '"}\n',
    "[influxdb] password of the wrong type": f'[influxdb]\npassword = ["{SECRET}"]\ntoken = "{SECRET}"\nversion = 9\n',
    # Syntax errors: tomllib's messages give the position, never the text.
    "an unterminated secret string": f'[kafka.client]\n"sasl.password" = "{SECRET}\n',
    "a bare secret value": f'[kafka.client]\n"sasl.password" = {SECRET}\n',
    "a secret given twice": f'[kafka.client]\n"sasl.password" = "{SECRET}"\n"sasl.password" = "{SECRET}x"\n',
    "a secret in a broken inline table": '[kafka]\nclient = { "sasl.password" = "' + SECRET + '", }\n',
    "a multi-line secret cut short": f'[influxdb]\ntoken = """{SECRET}\n',
    # Names that are no setting: only the name is shown.
    "an unknown section with a secret": f'[sasl]\npassword = "{SECRET}"\n',
    "an unknown key with a secret": f'[kafka]\n"sasl.password" = "{SECRET}"\n',
    "a section that is not a table": f'kafka = "{SECRET}"\n',
    "summaries that are not tables": f'summaries = ["{SECRET}"]\n',
}


@pytest.mark.parametrize("case", sorted(FILES))
def test_config_file_errors_name_the_key_never_the_secret(case: str, tmp_path) -> None:
    message = _error(toml=FILES[case], tmp_path=tmp_path)
    assert not _leaked(message), message
    assert str(tmp_path / "kdq.toml") in message or "(from " in message, message


def test_a_config_file_with_a_secret_and_a_bad_value(tmp_path) -> None:
    message = _error(toml=FILES["a secret beside a refused isolation level"], tmp_path=tmp_path)
    assert SECRET not in message and "isolation.level" in message and "read_committed" in message


def test_the_refused_setting_is_still_named(tmp_path) -> None:
    message = _error(env={"KDQ_KAFKA__CLIENT": '{"sasl.password": "' + SECRET + '",'})
    assert "KDQ_KAFKA__CLIENT" in message and "not shown" in message
    message = _error(**CASES["a bad spark setting beside a secret"])
    assert "spark.driver_memory" in message and "lots" in message  # not a secret: shown
    message = _error(**CASES["KDQ_KAFKA__CLIENT as a JSON array"])
    assert "kafka.client (from KDQ_KAFKA__CLIENT)" in message and "valid dictionary" in message
    message = _error(**CASES["read_uncommitted beside every Kafka secret"])
    assert "security.protocol': 'SASL_SSL'" in message  # the settings that are no secret stay readable
    assert message.count(REDACTED) >= len(KAFKA_SECRETS), message
    message = _error(toml=FILES["nested tables in [kafka.client]"], tmp_path=tmp_path)
    assert "kafka.client.ssl" in message and "kafka.client.sasl" in message, message
    message = _error(**CASES["an unknown key holding a secret"])
    assert "KDQ_KAFKA__SASL_PASSWORD: unknown key kafka.sasl_password" in message
    message = _error(**CASES["a storage URI with credentials"])
    assert "paths.storage_uri" in message and "credentials in the URI" in message and "bucket/kdq" in message


def test_a_loaded_configs_errors_show_no_credentials(tmp_path) -> None:
    """Errors raised by a valid config's methods, and InfluxDB write errors that quote influxdb.url."""
    from kdq.influx import InfluxSink, InfluxWriteError, Point

    env = {"KDQ_INFLUXDB__URL": f"http://kdq:{SECRET}@127.0.0.1:1", "KDQ_INFLUXDB__RETRIES": "0",
           "KDQ_INFLUXDB__TIMEOUT_SECONDS": "2", "KDQ_KAFKA__CLIENT": json.dumps(KAFKA_SECRETS),
           "KDQ_SPARK__CONF": json.dumps(SPARK_SECRETS), "KDQ_PATHS__DATA_DIR": str(tmp_path)}
    config = load_config(path=None, env=env)
    with pytest.raises(ConfigError) as no_broker:
        config.kafka_client_conf()
    assert not _leaked(str(no_broker.value))
    with pytest.raises(InfluxWriteError) as refused:
        InfluxSink(config).write([Point("t", 0, {"valid": 1, "invalid": 0})])
    assert not _leaked(str(refused.value)) and "127.0.0.1:1" in str(refused.value), refused.value


SQL_SECURITY = {
    "a keystore that does not exist": ({"KDQ_SQL_PASSWORD": SECRET, "KDQ_SQL_TLS_KEYSTORE": "/nonexistent/ks.p12",
                                        "KDQ_SQL_TLS_KEYSTORE_PASSWORD": SECRET}, "127.0.0.1"),
    "a keystore without its password": ({"KDQ_SQL_PASSWORD": SECRET, "KDQ_SQL_TLS_KEYSTORE": "{keystore}"}, "127.0.0.1"),
    "beyond loopback without TLS": ({"KDQ_SQL_PASSWORD": SECRET, "KDQ_SQL_TLS_KEYSTORE_PASSWORD": SECRET}, "0.0.0.0"),
}


@pytest.mark.parametrize("case", sorted(SQL_SECURITY))
def test_sql_endpoint_security_errors_never_show_the_password(case: str, tmp_path) -> None:
    from kdq.stack.sql_endpoint import EndpointSecurityError, security_check

    env, host = SQL_SECURITY[case]
    keystore = tmp_path / "ks.p12"
    keystore.write_bytes(b"\0")
    env = {k: v.replace("{keystore}", str(keystore)) for k, v in env.items()}
    with pytest.raises(EndpointSecurityError) as refused:
        security_check(env, host)
    assert not _leaked(str(refused.value)) and "KDQ_SQL" in str(refused.value), refused.value


def test_redact() -> None:
    assert redact("kafka.client", {"sasl.jaas.config": JAAS, "security.protocol": "SASL_SSL"}) == {
        "sasl.jaas.config": REDACTED, "security.protocol": "SASL_SSL",
    }
    assert redact("influxdb.token", SECRET) == REDACTED
    assert redact("influxdb.url", f"http://kdq:{SECRET}@host:8086") == f"http://{REDACTED}@host:8086"
    assert redact("influxdb.url", f"http://kdq:p@ss{SECRET}@host:8086/x") == f"http://{REDACTED}@host:8086/x"
    assert redact("spark.conf", {"spark.authenticate.secret": SECRET, "spark.ui.enabled": "false"})[
        "spark.authenticate.secret"
    ] == REDACTED
    # A settings map of the wrong type is hidden whole; nested tables are matched by their dotted path.
    assert redact("kafka.client", f"sasl.password={SECRET}") == REDACTED
    assert redact("spark.conf", [SECRET]) == REDACTED
    assert redact("kafka.client", {"ssl": {"keystore": {"key": PEM, "location": "/k.p12"}}}) == {
        "ssl": {"keystore": {"key": REDACTED, "location": "/k.p12"}}
    }
    assert redact("kafka.client", {"ssl": {"key": {"pem": PEM}}}) == {"ssl": {"key": REDACTED}}  # ssl.key: as ssl_key
    for key in (*KAFKA_SECRETS, *SPARK_SECRETS):
        assert redact(f"kafka.client.{key}", "x") == REDACTED, key
    for key in ("ssl.key.location", "ssl.keystore.location", "ssl.keystore.type", "security.protocol",
                "sasl.mechanism", "sasl.username", "spark.hadoop.fs.s3a.endpoint", "spark.ui.enabled"):
        assert redact(f"kafka.client.{key}", "x") == "x", key
    assert redact_text(f"at http://kdq:{SECRET}@influx:8086/write, and abfss://c@a/b") == (
        f"at http://{REDACTED}@influx:8086/write, and abfss://{REDACTED}@a/b"
    )


def test_every_spark_secret_goes_to_the_properties_file(tmp_path) -> None:
    """[spark.conf]'s secrets reach spark-submit in its private properties file, never as --conf arguments: the
    process list shows those, and Airflow's SparkSubmitHook logs them masking only *secret*/*password* keys (an
    Azure account key, an S3 access key or session token, a private key would be in the task log)."""
    from kdq.spark.submit import submission, submit_command
    from tests.conftest import make_config

    config = make_config(tmp_path, spark={"conf": SPARK_SECRETS})
    line = " ".join(submit_command(config, "batch_recompute", ["--start=0"]))
    assert not _leaked(line), line
    parts = submission(config, "batch_recompute")
    private = parts.properties_file.read_text()
    assert all(f"{key}=" in private for key in SPARK_SECRETS), private
    assert not set(SPARK_SECRETS) & set(parts.conf)


def test_summaries_set_later_show_no_secret() -> None:
    """Config.with_summaries: a check across sections gets the whole config as its input, secrets included."""
    config = load_config(path=None, env={
        "KDQ_KAFKA__CLIENT": json.dumps(KAFKA_SECRETS), "KDQ_SPARK__CONF": json.dumps(SPARK_SECRETS),
        "KDQ_INFLUXDB__PASSWORD": SECRET, "KDQ_STREAM__WINDOW_SECONDS": "2",
    })
    for summaries in ([{"name": "s", "topic": "t", "value": "v", "window_seconds": 7}],
                      [{"name": "s", "topic": "t", "value": "v", "step": 1.2345}]):
        with pytest.raises(ConfigError) as refused:
            config.with_summaries(summaries)
        assert not _leaked(str(refused.value)) and "summaries" in str(refused.value), refused.value
