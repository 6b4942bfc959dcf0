"""[registry]: the Schema Registry kdq reads schemas from. Checked at start, each error naming its key and
never a secret; the local stack's registry is the default; the client settings are what Confluent's client takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kdq.config import ConfigError, load_config
from kdq.procs import StackError
from kdq.stack.manager import LocalStack
from kdq.stack.registry import LocalRegistry
from tests.conftest import make_config

SECRET = "S3cr3t-Regi5try"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "kdq.toml"
    path.write_text(text)
    return path


def test_default_is_the_local_stacks_registry_once_recorded(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""), env={})
    assert config.registry.url == ""
    with pytest.raises(ConfigError, match=r"registry.url is empty .*`make run`.*KDQ_REGISTRY__URL"):
        config.registry_url()
    config.state_file.parent.mkdir(parents=True)
    # A stack started without the registry records its port, never as the default (it would be a dead port).
    config.state_file.write_text(json.dumps({"registry_port": 18081}))
    with pytest.raises(ConfigError, match=r"registry.url is empty"):
        config.reload_stack_addresses().registry_url()
    config.state_file.write_text(json.dumps({"registry_port": 18081, "registry_started": True}))
    with pytest.raises(ConfigError, match=r"registry.url is empty"):
        config.registry_url()  # read once, when loaded
    config = load_config(write(tmp_path, ""), env={})  # loaded again
    assert config.registry_url() == "http://127.0.0.1:18081/apis/ccompat/v7"
    assert config.registry_client_conf() == {"url": "http://127.0.0.1:18081/apis/ccompat/v7", "timeout": 10.0}


def test_a_configured_registry_wins(tmp_path: Path) -> None:
    path = write(tmp_path, "[registry]\nurl = 'https://registry.example.com/apis/ccompat/v7/'\nusername = 'kdq'\n")
    config = load_config(path, env={"KDQ_REGISTRY__PASSWORD": SECRET})
    config.state_file.parent.mkdir(parents=True)
    config.state_file.write_text(json.dumps({"registry_port": 18081}))
    assert config.registry_url() == "https://registry.example.com/apis/ccompat/v7"
    assert config.registry_client_conf()["basic.auth.user.info"] == f"kdq:{SECRET}"


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("[registry]\nurl = 'registry:8081'\n", {}, "registry.url"),
        ("[registry]\nurl = 'http://registry:8081?x=1'\n", {}, "registry.url"),
        ("", {"KDQ_REGISTRY__URL": "ftp://registry"}, "registry.url (from KDQ_REGISTRY__URL)"),
        ("[registry]\nurll = 'http://r:8081'\n", {}, "unknown key registry.urll (did you mean 'url'?)"),
        ("", {"KDQ_REGISTRY__TOKEN": SECRET}, "unknown key registry.token"),
        ("[registry]\nurl = 'http://r:8081'\nusername = 'kdq'\n", {}, "registry.password (KDQ_REGISTRY__PASSWORD) is not set"),
        ("[registry]\nurl = 'http://r:8081'\n", {"KDQ_REGISTRY__PASSWORD": SECRET}, "registry.username is not set"),
        (
            "[registry]\nurl = 'http://r:8081'\nusername = 'kdq'\n",
            {"KDQ_REGISTRY__PASSWORD": SECRET, "KDQ_REGISTRY__BEARER_TOKEN": SECRET},
            "either basic auth",
        ),
        ("[registry]\nurl = 'http://r:8081'\nlogical_cluster = 'lsrc-1'\n", {}, "registry.logical_cluster"),
        ("", {"KDQ_REGISTRY__BEARER_TOKEN": SECRET}, "registry.url is empty"),
        ("[registry]\nurl = 'http://r:8081'\nca_file = 'ca.pem'\n", {}, "registry.ca_file is set but registry.url is not an https"),
        ("[registry]\nurl = 'https://r:8081'\nca_file = 'missing.pem'\n", {}, "registry.ca_file: no such file"),
        ("[registry]\ntimeout_seconds = 0\n", {}, "registry.timeout_seconds"),
        ("[registry]\nlocal_port = 70000\n", {}, "registry.local_port"),
    ],
)
def test_bad_values_name_the_key_and_no_secret(tmp_path: Path, text: str, env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, text), env=env)
    assert expected in str(error.value)
    assert SECRET not in str(error.value)


def test_credentials_in_the_url_are_refused_without_showing_them(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, ""), env={"KDQ_REGISTRY__URL": f"https://kdq:{SECRET}@registry:8081"})
    assert "credentials in the URL" in str(error.value) and "registry.url" in str(error.value)
    assert SECRET not in str(error.value)


def test_client_settings_with_bearer_token_and_ca_file(tmp_path: Path) -> None:
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    path = write(tmp_path, "[registry]\nurl = 'https://registry:8081'\nca_file = 'certs/ca.pem'\n")
    config = load_config(path, env={"KDQ_REGISTRY__BEARER_TOKEN": SECRET})
    conf = config.registry_client_conf()
    assert conf["bearer.auth.credentials.source"] == "STATIC_TOKEN" and conf["bearer.auth.token"] == SECRET
    # Relative to the config file's folder, whatever the working directory.
    assert conf["ssl.ca.location"] == str(tmp_path / "certs" / "ca.pem")
    assert "basic.auth.user.info" not in conf


def test_confluent_client_accepts_the_settings(tmp_path: Path) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    basic = load_config(
        write(tmp_path, "[registry]\nurl = 'http://registry:8081'\nusername = 'kdq'\n"),
        env={"KDQ_REGISTRY__PASSWORD": SECRET},
    )
    client = SchemaRegistryClient(basic.registry_client_conf())
    assert client._rest_client.auth == ("kdq", SECRET)
    bearer = load_config(write(tmp_path, "[registry]\nurl = 'http://registry:8081'\n"), env={"KDQ_REGISTRY__BEARER_TOKEN": SECRET})
    headers: dict[str, str] = {}
    SchemaRegistryClient(bearer.registry_client_conf())._rest_client.handle_bearer_auth(headers)
    assert headers["Authorization"] == f"Bearer {SECRET}"


def test_local_registry_command_is_loopback_on_disk_and_sized(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    registry = LocalRegistry(config, 18081)
    command = registry.command()
    assert "-Dquarkus.http.host=127.0.0.1" in command and "-Dquarkus.http.port=18081" in command
    assert f"-Dapicurio.datasource.url=jdbc:h2:file:{tmp_path / 'registry' / 'db' / 'registry'};WRITE_DELAY=0" in command
    assert "-Dapicurio.storage.kind=sql" in command and "-Dapicurio.storage.sql.kind=h2" in command
    assert "-Xmx256m" in command
    assert command[-2] == "-jar" and command[-1] == str(registry.runner_jar())
    assert registry.runner_jar().name.startswith("apicurio-registry-app-") and registry.runner_jar().is_file()
    # The pid file's process is ours only with this data folder's database on its command line.
    assert any(registry.process.marker in part for part in command)
    assert registry.url == "http://127.0.0.1:18081/apis/ccompat/v7"


def test_missing_registry_says_run_make_setup(tmp_path: Path) -> None:
    config = make_config(tmp_path, paths={"jars_dir": str(tmp_path / "no-jars")})
    with pytest.raises(StackError, match="make setup"):
        LocalRegistry(config, 18081).command()


def test_the_stack_records_the_registry_port_and_starts_none_for_a_configured_url(tmp_path: Path) -> None:
    config = make_config(tmp_path, registry={"local_port": 18099})
    stack = LocalStack(config, with_registry=True)
    assert stack.with_registry and stack.registry.port == 18099
    assert config.local_state()["registry_port"] == 18099
    # Not started yet: not the default registry either.
    with pytest.raises(ConfigError, match=r"registry.url is empty"):
        config.registry_url()
    # Never started: not listed by status (listed from its start until `down`).
    assert "registry" not in [s.name for s in stack.status()]
    external = make_config(tmp_path, registry={"url": "http://registry.example.com:8081"})
    assert not LocalStack(external, with_registry=True).with_registry
    assert not LocalStack(config).with_registry  # jobs and tests that need no registry


def test_jobs_get_the_registry_in_their_spark_configuration_and_the_secrets_in_a_properties_file(tmp_path: Path) -> None:
    """What io.kdq.spark.registry.RegistryConnection reads in every JVM: the URL, the timeout and the login; the
    password or token never on spark-submit's command line (a properties file only this user reads)."""
    from kdq.spark.session import registry_conf
    from kdq.spark.submit import submit_command
    from tests.conftest import PROJECT_ROOT

    path = write(tmp_path, "[registry]\nurl = 'https://registry.example.com'\nusername = 'kdq'\ntimeout_seconds = 4\n"
                 f"[paths]\njars_dir = '{PROJECT_ROOT / '.cache' / 'jars'}'\n")
    config = load_config(path, env={"KDQ_REGISTRY__PASSWORD": SECRET})
    assert registry_conf(config) == {
        "spark.kdq.registry.url": "https://registry.example.com",
        "spark.kdq.registry.timeout.ms": "4000",
        "spark.kdq.registry.username": "kdq",
        "spark.kdq.registry.password": SECRET,
    }
    command = submit_command(config, "batch_recompute", [])
    assert SECRET not in " ".join(command)
    assert "spark.kdq.registry.url=https://registry.example.com" in command
    properties = Path(command[command.index("--properties-file") + 1])
    assert f"spark.kdq.registry.password={SECRET}" in properties.read_text()

    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    token = load_config(write(tmp_path, "[registry]\nurl = 'https://r.example.com'\nlogical_cluster = 'lsrc-1'\n"
                              "ca_file = 'ca.pem'\n"), env={"KDQ_REGISTRY__BEARER_TOKEN": SECRET})
    assert {k: v for k, v in registry_conf(token).items() if "url" not in k and "timeout" not in k} == {
        "spark.kdq.registry.bearer.token": SECRET,
        "spark.kdq.registry.logical.cluster": "lsrc-1",
        "spark.kdq.registry.ca.file": str(tmp_path / "ca.pem"),
    }
    # Neither configured nor recorded by the local stack: nothing (a registry rule then stops its job at start).
    assert registry_conf(load_config(write(tmp_path, ""), env={})) == {}


def test_down_takes_the_local_registry_back_as_the_default(tmp_path: Path) -> None:
    config = make_config(tmp_path, registry={"local_port": 18098})
    stack = LocalStack(config, with_registry=True)
    stack._record_state(registry_started=True)  # what `up` records when it starts the registry
    assert stack.config.registry_url() == "http://127.0.0.1:18098/apis/ccompat/v7"  # read again by the stack
    assert make_config(tmp_path, registry={"local_port": 18098}).registry_url() == stack.config.registry_url()
    stack.down()
    with pytest.raises(ConfigError, match=r"registry.url is empty"):
        stack.config.registry_url()
    with pytest.raises(ConfigError, match=r"registry.url is empty"):
        make_config(tmp_path, registry={"local_port": 18098}).registry_url()
