"""The typed, frozen :class:`Config`: the sections, the summaries, the folders they name, and the addresses of
Kafka, Spark, InfluxDB and the Schema Registry (configured, else the local stack's, :mod:`kdq.config.local_stack`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import PrivateAttr, ValidationError, model_validator

from kdq.config.errors import ConfigError
from kdq.config.local_stack import StackAddresses
from kdq.config.sections import (
    LOCAL_REGISTRY_API,
    InfluxConfig,
    KafkaConfig,
    PathsConfig,
    RegistryConfig,
    Section,
    SparkConfig,
    StreamConfig,
)
from kdq.config.summary import SummaryConfig


class Config(Section):
    """Typed, frozen configuration. Build it with :func:`kdq.config.load_config`."""

    base_dir: Path = Path(".")
    source: str = "defaults"
    paths: PathsConfig = PathsConfig()
    kafka: KafkaConfig = KafkaConfig()
    spark: SparkConfig = SparkConfig()
    stream: StreamConfig = StreamConfig()
    influxdb: InfluxConfig = InfluxConfig()
    registry: RegistryConfig = RegistryConfig()
    summaries: tuple[SummaryConfig, ...] = ()
    # The local stack's addresses, read from the state file when the config is built (kdq.config.local_stack).
    _stack: StackAddresses = PrivateAttr(default_factory=StackAddresses)

    @model_validator(mode="after")
    def _summaries_fit_the_stream(self) -> Config:
        names: set[str] = set()
        for i, summary in enumerate(self.summaries):
            if summary.name in names:
                raise ValueError(f"summaries[{i}].name: {summary.name!r} is defined twice")
            names.add(summary.name)
            if summary.window_seconds % self.stream.window_seconds:
                # A summary window is a whole number of count windows, so both layers can
                # derive it from the classified window_start (see kdq.spark.summaries).
                raise ValueError(
                    f"summaries[{i}].window_seconds: {summary.window_seconds} is not a multiple of "
                    f"stream.window_seconds ({self.stream.window_seconds})"
                )
        return self

    @model_validator(mode="after")
    def _registry_settings(self) -> Config:
        """Checks across the [registry] keys, here so that each message names its keys alone (no input echoed) and
        the CA file is looked for where :meth:`path` resolves it."""
        registry = self.registry
        if bool(registry.username) != bool(registry.password):
            missing = "registry.password (KDQ_REGISTRY__PASSWORD)" if registry.username else "registry.username"
            raise ValueError(f"registry: basic auth needs registry.username and registry.password; {missing} is not set")
        if registry.bearer_token and registry.username:
            raise ValueError("registry: set either basic auth (registry.username/password) or registry.bearer_token, not both")
        if registry.logical_cluster and not registry.bearer_token:
            raise ValueError("registry.logical_cluster goes with registry.bearer_token, which is not set")
        if (registry.password or registry.bearer_token) and not registry.url:
            raise ValueError(
                "registry: credentials are set but registry.url is empty (the local stack's registry takes none); "
                "set registry.url to the registry they are for"
            )
        if registry.ca_file:
            if not registry.url.startswith("https://"):
                raise ValueError("registry.ca_file is set but registry.url is not an https:// URL")
            if not self.path(registry.ca_file).is_file():
                raise ValueError(f"registry.ca_file: no such file: {self.path(registry.ca_file)}")
        return self

    def with_summaries(self, summaries: Sequence[Mapping[str, Any] | SummaryConfig]) -> Config:
        """This config with another list of summaries, validated like the file's (tests, tools)."""
        fields = {name: getattr(self, name) for name in type(self).model_fields if name != "summaries"}
        try:
            return type(self).model_validate({**fields, "summaries": list(summaries)})
        except ValidationError as exc:
            # Each problem by its key, without pydantic's input_value: a check across sections gets the whole
            # config as its input, secrets included.
            problems = [
                f"{'.'.join(str(part) for part in err['loc']) or 'summaries'}: {str(err['msg']).removeprefix('Value error, ')}"
                for err in exc.errors()
            ]
            raise ConfigError("invalid summaries:\n  " + "\n  ".join(problems)) from None

    def summary(self, name: str) -> SummaryConfig:
        for summary in self.summaries:
            if summary.name == name:
                return summary
        raise KeyError(f"no summary named {name!r} (configured: {[s.name for s in self.summaries]})")

    def path(self, relative: Path | str) -> Path:
        p = Path(relative).expanduser()
        return p if p.is_absolute() else (self.base_dir / p).resolve()

    @property
    def data_dir(self) -> Path:
        return self.path(self.paths.data_dir)

    @property
    def rules_dir(self) -> Path:
        return self.path(self.paths.rules_dir)

    @property
    def jars_dir(self) -> Path:
        return self.path(self.paths.jars_dir)

    @property
    def tables_dir(self) -> Path:
        """The local folder of the Delta tables; with ``paths.storage_uri`` set there is none: use
        :func:`kdq.storage.tables_location` (a string, a URI or a local path) wherever storage may be remote."""
        return self._local_storage("delta")

    @property
    def checkpoints_dir(self) -> Path:
        """The local folder of the Spark checkpoints (see :attr:`tables_dir`; :func:`kdq.storage.checkpoints_location`)."""
        return self._local_storage("checkpoints")

    def _local_storage(self, folder: str) -> Path:
        if self.paths.storage_uri:
            raise ConfigError(
                f"tables and checkpoints are at paths.storage_uri = {self.paths.storage_uri!r}, not in a local "
                "folder (kdq.storage builds their locations)"
            )
        return self.data_dir / folder

    @property
    def state_file(self) -> Path:
        """Ports chosen by the local stack, so every process finds the same broker."""
        return self.data_dir / "stack" / "state.json"

    def local_state(self) -> dict[str, Any]:
        """The state file as it is now: the local stack's own bookkeeping (its ports, its shape). The addresses
        below come from :attr:`stack_addresses`, read when this config was built."""
        try:
            return json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {}

    @model_validator(mode="after")
    def _read_stack_addresses(self) -> Config:
        # Last: the folders are known. Once per Config; see kdq.config.local_stack.
        self._stack = StackAddresses.read(self.state_file)
        return self

    @property
    def stack_addresses(self) -> StackAddresses:
        """The local stack's addresses as the state file recorded them when this config was built."""
        return self._stack

    def reload_stack_addresses(self) -> Config:
        """This config with the local stack's addresses read again from the state file: for a process that has
        just recorded them (the stack's start, :class:`kdq.stack.manager.LocalStack`) or waited for another
        one to."""
        config = self.model_copy()
        config._stack = StackAddresses.read(self.state_file)
        return config

    def kafka_bootstrap(self) -> str:
        if self.kafka.bootstrap_servers:
            return self.kafka.bootstrap_servers
        stack = self._stack.recorded()
        if stack.kafka_bootstrap:  # the local stack as a cluster: every broker (kdq up --cluster)
            return stack.kafka_bootstrap
        port = stack.kafka_port
        if not port:
            raise ConfigError(
                "kafka.bootstrap_servers is empty and no local broker is recorded in "
                f"{self.state_file}: start the local stack with `kdq up` or set KDQ_KAFKA__BOOTSTRAP_SERVERS"
            )
        return f"127.0.0.1:{port}"

    def spark_master(self) -> str:
        """``spark.master``, except that a ``local[...]`` master gives way to the local stack's standalone
        master while the stack of this data folder is a cluster (``kdq up --cluster``): the stack has one
        shape at a time, and every job of the folder runs on it. Any other master is used as configured."""
        master = self.spark.master
        if master.startswith("local"):
            stack = self._stack.recorded()
            if stack.cluster and stack.spark_master:
                return stack.spark_master
        return master

    def influx_url(self) -> str:
        if self.influxdb.url:
            return self.influxdb.url
        port = self._stack.recorded().influx_port
        if not port:
            raise ConfigError(
                "influxdb.url is empty and no local InfluxDB is recorded in "
                f"{self.state_file}: start the local stack with `kdq up` or set KDQ_INFLUXDB__URL"
            )
        return f"http://127.0.0.1:{port}"

    def registry_url(self) -> str:
        """``registry.url``, else the local stack's registry (its Confluent-compatible API) once `make run` (or
        `kdq up`) has started it, until `kdq down`; a ConfigError saying what to do when neither is there. A stack
        started without the registry records its port too (kept for the next start), but never as the default."""
        if self.registry.url:
            return self.registry.url
        stack = self._stack.recorded()
        port = stack.registry_port
        if not port or not stack.registry_started:
            raise ConfigError(
                "registry.url is empty and no local Schema Registry is recorded in "
                f"{self.state_file}: start the local stack with `make run` (or `kdq up`) or set KDQ_REGISTRY__URL"
            )
        return f"http://127.0.0.1:{port}{LOCAL_REGISTRY_API}"

    def registry_client_conf(self) -> dict[str, Any]:
        """Settings of Confluent's Schema Registry clients (``confluent_kafka.schema_registry.SchemaRegistryClient``;
        the Java client's keys are the same): the URL, basic auth or a static bearer token, the CA file."""
        conf: dict[str, Any] = {"url": self.registry_url(), "timeout": self.registry.timeout_seconds}
        if self.registry.username:
            conf["basic.auth.user.info"] = f"{self.registry.username}:{self.registry.password}"
        if self.registry.bearer_token:
            conf |= {
                "bearer.auth.credentials.source": "STATIC_TOKEN",
                "bearer.auth.token": self.registry.bearer_token,
                # Required by the Python client (Confluent Cloud's header); any other registry ignores it.
                "bearer.auth.logical.cluster": self.registry.logical_cluster,
            }
        if self.registry.ca_file:
            conf["ssl.ca.location"] = str(self.path(self.registry.ca_file))
        return conf

    def kafka_client_conf(self) -> dict[str, str]:
        """librdkafka/Java client settings shared by every client we create."""
        return {"bootstrap.servers": self.kafka_bootstrap(), **self.kafka.client}

    def spark_kafka_options(self) -> dict[str, str]:
        """The ``kafka.*`` options of every Spark Kafka reader (the stream and archive-from-Kafka).

        read_committed: records of aborted transactions are skipped, and a reader
        never passes an open transaction (it stops at the last stable offset), so
        what is counted is exactly what producers committed.
        """
        client = dict(self.kafka.client)
        username, password = client.get("sasl.username"), client.get("sasl.password")
        if username is not None and password is not None and "sasl.jaas.config" not in client:
            # One [kafka.client] for both client libraries: librdkafka takes sasl.username /
            # sasl.password (and refuses sasl.jaas.config), the Java client behind Spark only a
            # JAAS login line, built here from the same two values.
            del client["sasl.username"], client["sasl.password"]
            module = _JAAS_MODULES.get(client.get("sasl.mechanism", "PLAIN").upper(), _JAAS_MODULES["PLAIN"])
            quoted = {k: v.replace("\\", "\\\\").replace('"', '\\"') for k, v in (("u", username), ("p", password))}
            client["sasl.jaas.config"] = f'{module} required username="{quoted["u"]}" password="{quoted["p"]}";'
        return {
            "kafka.bootstrap.servers": self.kafka_bootstrap(),
            "kafka.max.partition.fetch.bytes": str(self.kafka.max_message_bytes),
            # A Spark task reads its Kafka partitions one after the other, and a fetch finding nothing new waits
            # this long at the broker (the Java client's default is 500 ms). Spark's reader pays it about once per
            # partition a task reads, even where the data is there: after each poll it looks the partition's offset
            # range up (two ListOffsets), and those wait on the same connection behind the fetch the consumer sent
            # ahead, which finds nothing past the batch's end. Per partition read, 1,000 one-partition topics:
            # 72 ms at 50 ms, 22 ms at 1 ms (a consumer kept open: 53 -> 3 ms) (benchmarks/PERF_NOTES.md,
            # "the 3-second stall is the Kafka fetch's wait" and "twenty-fifth pass"). 1 ms, not 0: a fetch that
            # finds nothing is not repeated in a busy loop. The Java client's own name, so not in [kafka.client],
            # which librdkafka reads too (its name is fetch.wait.max.ms).
            "kafka.fetch.max.wait.ms": "1",
            **{f"kafka.{key}": value for key, value in client.items()},
            "kafka.isolation.level": "read_committed",
        }


# The Java client's login module per SASL mechanism (librdkafka needs none).
_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
