"""The one configuration object every part of kdq reads.

Configuration flows one way: a TOML file plus ``KDQ_<SECTION>__<KEY>``
environment variables become a typed, frozen :class:`Config`, which is passed
to functions. Nothing below the entrypoints reads the environment.

Bad configuration is rejected at start with a :class:`ConfigError` that names
the key, where it came from (file or variable) and the problem, because a typo
in a config key that silently falls back to a default is how monitoring
products end up monitoring nothing.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import socket
import time
import tomllib
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENV_PREFIX = "KDQ_"
CONFIG_FILE_ENV = "KDQ_CONFIG"
DEFAULT_CONFIG_NAME = "kdq.toml"


class ConfigError(ValueError):
    """A configuration value is missing, unknown or invalid. The message names the key, never a secret value."""


# Keys whose values Spark (spark.redaction.regex), Hadoop (hadoop.security.sensitive-config-keys) or a Kafka client
# (the Java client's PASSWORD-type settings, librdkafka's sensitive ones) treat as secret: passwords, JAAS lines with
# them, tokens, keys, private-key PEMs. An error names such a key and the problem, never its value, since errors land
# in task logs. Matched against the dotted path of a setting (``kafka.client.ssl.key.pem``), so a nested TOML table
# (``ssl.key.pem = ...`` without quotes) is recognised too.
SECRET_KEY = re.compile(
    r"(?i)secret|password|passwd|token|credential|jaas|access[._-]?key|private[._-]?key"
    r"|ssl[._]key(?:[._]pem)?$|ssl\.keystore\.key$|certificate\.chain$|truststore\.certificates$"
    r"|oauthbearer\.config$|account\.key|encryption\.key"
)
# The settings maps that hold such keys: a value of the wrong type there (a string, a list) is not shown at all.
SECRET_MAPS = ("kafka.client", "spark.conf")
REDACTED = "<redacted>"
# A URL's user info (user:password@), up to the last @ of the authority (a password may hold an unescaped @).
_URL_USERINFO = re.compile(r"(?<=://)[^/?#\s'\"]*@")


def redact(key: str, value: Any) -> Any:
    """``value`` of ``key`` (a dotted path) as an error message may show it: a secret key's value hidden, mappings
    redacted key by key, a settings map of the wrong type hidden whole, URLs without their user info."""
    if SECRET_KEY.search(key):
        return REDACTED
    if isinstance(value, Mapping):
        return {k: redact(f"{key}.{k}" if key else str(k), v) for k, v in value.items()}
    if key in SECRET_MAPS:
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_text(text: str) -> str:
    """``text`` without the user info (``user:password@``) of the URLs in it: for messages that quote a URL
    (``influxdb.url`` may carry credentials)."""
    return _URL_USERINFO.sub(REDACTED + "@", text)


def _secret_values(raw: Any, key: str = "", secret: bool = False) -> set[str]:
    """Every string under a secret key of the raw configuration (file, environment, overrides), every string of a
    settings map that is not a mapping, and URLs' user info: scrubbed from a message whatever path led a validator
    to quote it. ``key`` is the dotted path of ``raw``."""
    found: set[str] = set()
    secret = secret or bool(key and SECRET_KEY.search(key))
    if isinstance(raw, Mapping):
        for k, v in raw.items():
            found |= _secret_values(v, f"{key}.{k}" if key else str(k), secret)
    elif isinstance(raw, list | tuple):
        for v in raw:
            found |= _secret_values(v, key, secret or key in SECRET_MAPS)
    elif isinstance(raw, str) and raw:
        if secret or key in SECRET_MAPS:
            found.add(raw)
        found.update(m.group(0)[:-1] for m in _URL_USERINFO.finditer(raw))
    return {v for v in found if len(v) >= 3}


def _scrub(message: str, secrets: set[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        message = message.replace(secret, REDACTED)
    return redact_text(message)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def _check_regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from exc
    return value


class PathsConfig(_Section):
    """Where local state lives. Relative paths are resolved against the config file's folder."""

    data_dir: Path = Path(".local")
    rules_dir: Path = Path("config/rules")
    jars_dir: Path = Path(".cache/jars")
    storage_uri: str = Field(
        default="",
        description="where Delta tables and Spark checkpoints live (s3a://bucket/prefix, hdfs://..., abfss://..., "
        "gs://...); empty: under data_dir. Local process state stays in data_dir either way",
    )
    dynamodb_table: str = Field(
        default="",
        description="with s3a:// storage: the DynamoDB table that coordinates Delta commits (kdq's DynamoDB log "
        "store), so the stream and the batch jobs (separate Spark drivers) can commit to the same table at once. "
        "Every writer must use the same table and region",
    )
    dynamodb_region: str = Field(default="us-east-1", description="the AWS region of paths.dynamodb_table (empty: us-east-1)")
    dynamodb_endpoint: str = Field(
        default="",
        description="a DynamoDB-compatible endpoint (http://host:port: DynamoDB Local, LocalStack, moto); empty: "
        "the AWS SDK's (AWS_ENDPOINT_URL_DYNAMODB, else AWS's endpoint of paths.dynamodb_region)",
    )
    s3_single_writer: bool = Field(
        default=False,
        description="with s3a:// storage and no DynamoDB log store: acknowledge that only one kdq job writes at a "
        "time (Delta's default log store for S3 is safe for one writing driver only; two jobs committing to the same "
        "table at once can lose a commit)",
    )

    @field_validator("data_dir", mode="before")
    @classmethod
    def _local_folder(cls, value: Any) -> Any:
        # Path("s3a://bucket/x") is the local folder s3a:/bucket/x: a URI here would quietly become one.
        if isinstance(value, str) and re.match(r"^[A-Za-z][A-Za-z0-9+.-]+://", value):
            raise ValueError(
                "data_dir is a local folder (the stack's state, logs, pid files); put the Delta tables and "
                f"checkpoints on {value.split('://')[0]}:// with paths.storage_uri = {value!r} instead"
            )
        return value

    @field_validator("data_dir")
    @classmethod
    def _no_backtick(cls, value: Path) -> Path:
        # Delta names a path-based table delta.`<path>` internally and parses that back: a backtick in the
        # path breaks table creation deep inside a job, so it is refused here, at start.
        if "`" in str(value):
            raise ValueError(f"a backtick cannot appear in the data directory (Delta table paths), got {str(value)!r}")
        return value

    @field_validator("storage_uri")
    @classmethod
    def _storage_uri(cls, value: str) -> str:
        value = value.strip()
        if not value:
            return value
        match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]+)://(.*)$", value)
        if not match:
            raise ValueError(
                "expected a Hadoop FileSystem URI such as s3a://bucket/prefix, hdfs://namenode/path, "
                "abfss://container@account.dfs.core.windows.net/path or gs://bucket/prefix (leave it empty for "
                "tables and checkpoints under data_dir)"
            )
        scheme, rest = match.group(1).lower(), match.group(2)
        if re.match(r"[^/?#@]*:[^/?#]*@", rest):
            # s3a://KEY:SECRET@bucket: Hadoop refuses secrets in URIs, and every message naming the storage root
            # would carry them (the value is not shown: the error scrubs user info).
            raise ValueError(
                "credentials in the URI (user:secret@) are not supported: put them in [spark.conf] "
                "(spark.hadoop.fs.s3a.access.key / spark.hadoop.fs.s3a.secret.key, ...) or the environment"
            )
        if scheme in ("s3", "s3n"):
            raise ValueError(f"{scheme}:// has no FileSystem in Apache Hadoop: use s3a:// (hadoop-aws), got {value!r}")
        if scheme != "file" and not rest.split("/", 1)[0]:
            raise ValueError(f"the URI names no bucket, container or host, got {value!r}")
        if "`" in value:
            raise ValueError(f"a backtick cannot appear in table locations (Delta table paths), got {value!r}")
        return value.rstrip("/")

    @field_validator("dynamodb_table")
    @classmethod
    def _dynamodb_table(cls, value: str) -> str:
        value = value.strip()
        if value and not re.fullmatch(r"[A-Za-z0-9_.-]{3,255}", value):
            raise ValueError("expected a DynamoDB table name: 3 to 255 letters, digits, '_', '-' or '.'")
        return value

    @field_validator("dynamodb_region")
    @classmethod
    def _dynamodb_region(cls, value: str) -> str:
        value = value.strip() or "us-east-1"  # Delta's default
        if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d+", value):
            raise ValueError("expected an AWS region name such as us-east-1 or eu-west-3")
        return value

    @field_validator("dynamodb_endpoint")
    @classmethod
    def _dynamodb_endpoint(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if value and not re.fullmatch(r"https?://[^/\s]+", value):
            raise ValueError("expected http://host:port or https://host[:port] (empty: AWS's endpoint of the region)")
        return value


class KafkaConfig(_Section):
    bootstrap_servers: str = Field(
        default="",
        description="host:port list; empty means the local stack's broker (kdq up).",
    )
    local_port: int = Field(default=0, ge=0, le=65535, description="0 picks a free port once.")
    local_controller_port: int = Field(default=0, ge=0, le=65535)
    local_partitions: int = Field(default=3, ge=1, description="default partitions of auto-created local topics")
    topic_include: str = ".*"
    topic_exclude: str = r"_.*|kdq\..*"
    metrics_topic: str = "kdq.metrics"
    starting_offsets: str = "earliest"
    # A catch-up's batch size. The count path keeps no batch in memory (one pass into the archive), so a bigger
    # batch costs no memory and amortises the per-batch MERGE and commits (benchmarks/PERF_NOTES.md, "where a batch's time goes").
    max_offsets_per_trigger: int = Field(default=1_000_000, gt=0)
    fail_on_data_loss: bool = True
    max_message_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    client: dict[str, str] = Field(
        default_factory=dict,
        description="extra Kafka client configs (security.protocol, sasl.*, ...), passed to every client",
    )

    _regex = field_validator("topic_include", "topic_exclude")(_check_regex)

    @field_validator("client")
    @classmethod
    def _committed_only(cls, value: dict[str, str]) -> dict[str, str]:
        # Records of aborted transactions must never be counted: every reader is read_committed.
        level = value.get("isolation.level", "read_committed")
        if level != "read_committed":
            raise ValueError(
                f"isolation.level = {level!r}: kdq reads with read_committed only "
                "(records of aborted transactions are never counted); remove the setting"
            )
        return value

    @field_validator("starting_offsets")
    @classmethod
    def _offsets(cls, value: str) -> str:
        if value in ("earliest", "latest"):
            return value
        try:
            json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError("expected 'earliest', 'latest' or a JSON offsets object") from exc
        return value

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, value: str) -> str:
        for server in filter(None, (s.strip() for s in value.split(","))):
            host, sep, port = server.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"expected host:port entries separated by commas, got {server!r}")
        return value


class SparkConfig(_Section):
    master: str = "local[2]"
    shuffle_partitions: int = Field(default=4, gt=0)
    driver_memory: str = "2g"
    ui_enabled: bool = False
    database: str = "kdq"
    conf: dict[str, str] = Field(default_factory=dict, description="extra spark.* settings")
    stream_cores_max: int = Field(
        default=0, ge=0,
        description="spark.cores.max of the stream's application only (0: no cap). A standalone application takes "
        "every free core and the stream never gives its executors back: without a cap the batch jobs wait",
    )
    sql_endpoint_cores_max: int = Field(default=0, ge=0, description="the same for the SQL endpoint's application")

    @field_validator("driver_memory")
    @classmethod
    def _memory(cls, value: str) -> str:
        if not re.fullmatch(r"\d+[kmgt]?", value.lower()):
            raise ValueError(f"expected a JVM memory size such as 2g or 512m, got {value!r}")
        return value

    @field_validator("database")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError(f"expected a SQL identifier, got {value!r}")
        return value


class StreamConfig(_Section):
    window_seconds: int = Field(default=1, gt=0)
    allowed_lateness_seconds: int = Field(default=60, ge=0)
    future_margin_seconds: int = Field(default=300, ge=0)
    trigger_interval_seconds: float = Field(default=5.0, ge=0)
    max_value_bytes: int = Field(default=1024 * 1024, gt=0, description="larger values are invalid: too_large")
    reasons_window_seconds: int = Field(default=60, gt=0)
    quarantine_per_window: int = Field(default=20, ge=0)
    on_fresh_checkpoint: str = Field(
        default="refuse",
        description="a new checkpoint over a non-empty archive: refuse | resume_from_archive | starting_offsets",
    )
    max_batch_failures: int = Field(
        default=3, ge=1,
        description="consecutive failures (or hangs) of one micro-batch after which the supervisor stops "
        "restarting the stream and fails its task with the error and the batch's offsets",
    )
    max_batch_seconds: float = Field(
        default=900.0, gt=0,
        description="a micro-batch running longer is hung: the supervisor reports it and restarts the stream",
    )
    hung_stop_grace_seconds: float = Field(
        default=30.0, gt=0, description="SIGTERM-to-SIGKILL grace when the supervisor stops a hung stream"
    )
    supervisor_max_backoff_seconds: float = Field(
        default=600.0, gt=0,
        description="cap of the supervisor's backoff between restarts of a stream that keeps dying (120 s doubling "
        "per restart past the third): after a long outage the next restart is at most this far away",
    )
    max_startup_seconds: float = Field(
        default=3600.0, gt=0,
        description="a driver still beating 'starting' (rules compile, lost-checkpoint scan, query start) after this "
        "long is stuck: the supervisor restarts it",
    )
    driver_lease_seconds: float = Field(
        default=60.0, ge=2,
        description="expiry of the driver lease in the checkpoint (one driver per checkpoint; renewed every tenth "
        "of it): a driver that died without releasing it blocks a new one on another host this long",
    )
    batch_tasks: int = Field(
        default=0, ge=0,
        description="tasks per micro-batch: the Kafka partitions read are coalesced (no shuffle) into at most this "
        "many tasks; 0 = the application's cores (Spark's default parallelism). Fewer tasks: less per-task overhead "
        "and fewer archive files. A value at least the partition count keeps one task per partition",
    )

    @field_validator("on_fresh_checkpoint")
    @classmethod
    def _fresh_checkpoint(cls, value: str) -> str:
        if value not in FRESH_CHECKPOINT_POLICIES:
            raise ValueError(f"expected one of {', '.join(FRESH_CHECKPOINT_POLICIES)}, got {value!r}")
        return value


FRESH_CHECKPOINT_POLICIES = ("refuse", "resume_from_archive", "starting_offsets")


class InfluxConfig(_Section):
    enabled: bool = True
    version: int = Field(default=1, description="1 (database/retention policy) or 2 (org/bucket/token; also 3.x)")
    url: str = Field(default="", description="empty means the local stack's influxd")
    local_port: int = Field(default=0, ge=0, le=65535)
    local_rpc_port: int = Field(default=0, ge=0, le=65535)
    database: str = "kdq"
    retention_policy: str = "autogen"
    username: str = ""
    password: str = ""
    org: str = ""
    bucket: str = ""
    token: str = ""
    timeout_seconds: float = Field(default=10.0, gt=0)
    retries: int = Field(default=3, ge=0)

    @field_validator("version")
    @classmethod
    def _version(cls, value: int) -> int:
        if value not in (1, 2, 3):
            raise ValueError(f"expected 1 (InfluxDB 1.x) or 2 (2.x/3.x, influxdb-client), got {value}")
        return 2 if value == 3 else value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if value and not re.match(r"https?://[^/\s]+", value):
            raise ValueError(f"expected an http(s):// URL, got {value!r}")
        return value


class RegistryConfig(_Section):
    """The Schema Registry kdq reads schemas from: its Confluent-compatible REST API, whichever product
    serves it (Confluent Schema Registry, Apicurio Registry's ``/apis/ccompat/v7``, Karapace, Redpanda).

    Secrets (``password``, ``bearer_token``) belong in the environment (``KDQ_REGISTRY__PASSWORD``,
    ``KDQ_REGISTRY__BEARER_TOKEN``), not in kdq.toml, which is kept with the project; like every key matching
    :data:`SECRET_KEY` they are never shown in a message."""

    url: str = Field(
        default="",
        description="base URL of the Confluent-compatible API (http://host:8081, https://host/apis/ccompat/v7); "
        "empty: the local stack's Apicurio Registry (make run)",
    )
    username: str = Field(default="", description="HTTP basic auth user (with password)")
    password: str = Field(default="", description="HTTP basic auth password (KDQ_REGISTRY__PASSWORD)")
    bearer_token: str = Field(
        default="", description="a static bearer token (KDQ_REGISTRY__BEARER_TOKEN), instead of basic auth"
    )
    logical_cluster: str = Field(
        default="",
        description="with bearer_token on Confluent Cloud: the registry's logical cluster id (lsrc-...), sent as "
        "target-sr-cluster; other registries ignore it",
    )
    ca_file: str = Field(
        default="",
        description="PEM file of the certificate authorities that sign an https:// registry's certificate (relative "
        "paths: from the config file's folder); empty: the system's trust store",
    )
    local_port: int = Field(default=0, ge=0, le=65535, description="the local registry's port; 0 picks a free one once")
    timeout_seconds: float = Field(default=10.0, gt=0, description="per request to the registry")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value:
            return value
        match = re.fullmatch(r"(https?)://([^/?#\s]+)(/[^?#\s]*)?", value)
        if not match:
            raise ValueError(
                "expected the http(s):// base URL of a Confluent-compatible registry API, such as http://host:8081 or "
                "https://host/apis/ccompat/v7 (no query or fragment)"
            )
        if "@" in match.group(2):
            # Credentials in the URL would be in every message and log line naming it.
            raise ValueError("credentials in the URL (user:password@) are not supported: set registry.username and "
                             "KDQ_REGISTRY__PASSWORD, or KDQ_REGISTRY__BEARER_TOKEN")
        return value

    @field_validator("ca_file")
    @classmethod
    def _ca_file(cls, value: str) -> str:
        return value.strip()


# The path of the Confluent-compatible API on Apicurio Registry, the local stack's registry (kdq.stack.registry).
LOCAL_REGISTRY_API = "/apis/ccompat/v7"

SUMMARY_PATTERN_PREFIX = "re:"
_PATH_SEGMENT = re.compile(r"[^.\s'\"]+")


def _check_json_path(value: str) -> str:
    """A dotted field path (``value``, ``labels.env``): the same syntax as a rule's event_time_field."""
    if not value or not all(_PATH_SEGMENT.fullmatch(part) for part in value.split(".")):
        raise ValueError(f"expected a dotted JSON field path such as 'value' or 'labels.env', got {value!r}")
    return value


class SummaryConfig(_Section):
    """One streaming summary (``[[summaries]]`` in kdq.toml): statistics of a numeric field per window and group.

    ``topic`` is an exact topic name or ``re:<regex>`` (whole-name match, like
    the rules). The topic is always part of a summary's key: lateness is
    judged per topic, so a window is closed topic by topic.
    """

    name: str = Field(description="identifier; InfluxDB measurement and metrics-topic key")
    topic: str = Field(description="exact topic name, or re:<regex> (full match)")
    value: str = Field(description="dotted JSON path of the numeric field")
    group_by: tuple[str, ...] = Field(default=(), description="dotted JSON paths of the group fields")
    window_seconds: int = Field(default=600, gt=0)
    allowed_lateness_seconds: int = Field(default=3600, ge=0)
    significant_digits: int | None = Field(default=None, ge=1, le=15)
    step: float | None = Field(default=None, gt=0)
    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)
    max_groups: int = Field(default=10_000, gt=0, description="groups per (summary, topic, window)")
    max_buckets: int = Field(default=20_000, gt=0, description="histogram buckets per (summary, topic, window, group)")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError(f"expected an identifier (letters, digits, _), got {value!r}")
        return value

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        if not value:
            raise ValueError("expected a topic name or re:<regex>")
        if value.startswith(SUMMARY_PATTERN_PREFIX):
            _check_regex(value[len(SUMMARY_PATTERN_PREFIX) :])
        return value

    _paths = field_validator("value")(_check_json_path)

    @field_validator("group_by")
    @classmethod
    def _group_by(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            _check_json_path(path)
        if len(set(value)) != len(value):
            raise ValueError(f"group fields must be distinct, got {list(value)}")
        return value

    @field_validator("percentiles")
    @classmethod
    def _percentiles(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value:
            raise ValueError("expected at least one percentile")
        for q in value:
            if not 0 < q <= 100:
                raise ValueError(f"percentiles must be in (0, 100], got {q}")
        if len(set(value)) != len(value):
            raise ValueError(f"percentiles must be distinct, got {list(value)}")
        return value

    @field_validator("step")
    @classmethod
    def _step(cls, value: float | None) -> float | None:
        # Buckets are multiples of the step's decimal value (kdq.summaries.step_decimal); with at
        # most 3 digits and 1e12 steps they have at most 15 digits, so each is a distinct double.
        if value is not None and len(Decimal(repr(float(value))).normalize().as_tuple().digits) > 3:
            raise ValueError(f"a step has at most 3 significant digits (0.5, 0.25, 10, 0.001), got {value!r}")
        return value

    @model_validator(mode="after")
    def _precision(self) -> SummaryConfig:
        if self.significant_digits is not None and self.step is not None:
            raise ValueError("set either significant_digits or step, not both")
        if self.significant_digits is None and self.step is None:
            object.__setattr__(self, "significant_digits", 3)
        return self

    @property
    def is_pattern(self) -> bool:
        return self.topic.startswith(SUMMARY_PATTERN_PREFIX)

    @property
    def topic_match(self) -> str:
        """The exact name, or the regex without its ``re:`` prefix."""
        return self.topic[len(SUMMARY_PATTERN_PREFIX) :] if self.is_pattern else self.topic

    def matches(self, topic: str) -> bool:
        if self.is_pattern:
            return re.fullmatch(self.topic_match, topic) is not None
        return topic == self.topic


class Config(_Section):
    """Typed, frozen configuration. Build it with :func:`load_config`."""

    base_dir: Path = Path(".")
    source: str = "defaults"
    paths: PathsConfig = PathsConfig()
    kafka: KafkaConfig = KafkaConfig()
    spark: SparkConfig = SparkConfig()
    stream: StreamConfig = StreamConfig()
    influxdb: InfluxConfig = InfluxConfig()
    registry: RegistryConfig = RegistryConfig()
    summaries: tuple[SummaryConfig, ...] = ()

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
        try:
            return json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {}

    def kafka_bootstrap(self) -> str:
        if self.kafka.bootstrap_servers:
            return self.kafka.bootstrap_servers
        state = self.local_state()
        if state.get("kafka_bootstrap"):  # the local stack as a cluster: every broker (kdq up --cluster)
            return state["kafka_bootstrap"]
        port = state.get("kafka_port")
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
            state = self.local_state()
            if state.get("cluster") and state.get("spark_master"):
                return state["spark_master"]
        return master

    def influx_url(self) -> str:
        if self.influxdb.url:
            return self.influxdb.url
        port = self.local_state().get("influx_port")
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
        state = self.local_state()
        port = state.get("registry_port")
        if not port or not state.get("registry_started"):
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
            **{f"kafka.{key}": value for key, value in client.items()},
            "kafka.isolation.level": "read_committed",
        }


# The Java client's login module per SASL mechanism (librdkafka needs none).
_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}

_SECTIONS: dict[str, type[_Section]] = {
    "paths": PathsConfig,
    "kafka": KafkaConfig,
    "spark": SparkConfig,
    "stream": StreamConfig,
    "influxdb": InfluxConfig,
    "registry": RegistryConfig,
}


def _suggest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _merge_env(raw: dict[str, dict[str, Any]], env: Mapping[str, str], origins: dict[str, str]) -> None:
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX) :].lower().partition("__")
        if section == "summaries":
            raise ConfigError(f"{name}: summaries are defined in the config file only ([[summaries]] tables)")
        if section not in _SECTIONS:
            raise ConfigError(f"{name}: unknown section {section!r}{_suggest(section, list(_SECTIONS))}")
        fields = _SECTIONS[section].model_fields
        if key not in fields:
            raise ConfigError(f"{name}: unknown key {section}.{key}{_suggest(key, list(fields))}")
        annotation = str(fields[key].annotation)
        parsed: Any = value
        if annotation.startswith("dict"):
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError as exc:
                # Not the value itself: such settings hold passwords (sasl.jaas.config, spark.authenticate.secret).
                raise ConfigError(
                    f"{name}: expected a JSON object ({exc.msg} at character {exc.pos}; the value is not shown, "
                    "it may hold secrets)"
                ) from None
        raw.setdefault(section, {})[key] = parsed
        origins[f"{section}.{key}"] = name


def find_config_file(env: Mapping[str, str]) -> Path | None:
    """KDQ_CONFIG, else kdq.toml in the working directory or its parents, else the project's own."""
    if env.get(CONFIG_FILE_ENV):
        path = Path(env[CONFIG_FILE_ENV]).expanduser()
        if not path.is_file():
            raise ConfigError(f"{CONFIG_FILE_ENV}={path}: no such file")
        return path.resolve()
    cwd = Path.cwd()
    for folder in (cwd, *cwd.parents):
        if (folder / DEFAULT_CONFIG_NAME).is_file():
            return (folder / DEFAULT_CONFIG_NAME).resolve()
    project = Path(__file__).resolve().parents[2] / DEFAULT_CONFIG_NAME
    return project if project.is_file() else None


def load_config(
    path: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """File (``path`` or :func:`find_config_file`) + environment + ``overrides`` → frozen Config."""
    env = os.environ if env is None else env
    file = Path(path).resolve() if path is not None else find_config_file(env)
    raw: dict[str, dict[str, Any]] = {}
    origins: dict[str, str] = {}
    if file is not None:
        try:
            data = tomllib.loads(file.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"{file}: no such config file") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
        for section, values in data.items():
            if section == "summaries":
                if not isinstance(values, list) or not all(isinstance(v, dict) for v in values):
                    raise ConfigError(f"{file}: summaries must be an array of tables ([[summaries]])")
                raw[section] = [dict(v) for v in values]
                for i in range(len(values)):
                    origins[f"summaries.{i}"] = str(file)
                continue
            if section not in _SECTIONS:
                raise ConfigError(f"{file}: unknown section [{section}]{_suggest(section, list(_SECTIONS))}")
            if not isinstance(values, dict):
                raise ConfigError(f"{file}: [{section}] must be a table")
            fields = _SECTIONS[section].model_fields
            for key in values:
                if key not in fields:
                    raise ConfigError(f"{file}: unknown key {section}.{key}{_suggest(key, list(fields))}")
                origins[f"{section}.{key}"] = str(file)
            raw[section] = dict(values)
    _merge_env(raw, env, origins)
    for section, values in (overrides or {}).items():
        if section == "summaries":
            raw[section] = [dict(v) for v in values]  # a list replaces the file's, it is not merged
            origins.update({f"summaries.{i}": "overrides" for i in range(len(values))})
            continue
        raw.setdefault(section, {}).update(values)
        for key in values:
            origins[f"{section}.{key}"] = "overrides"
    base_dir = file.parent if file is not None else Path.cwd()
    try:
        return Config(base_dir=base_dir, source=str(file or "defaults"), **raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = [str(part) for part in err["loc"]]
            origin = origins.get(".".join(loc[:2]), "defaults")
            if loc[:1] == ["summaries"] and len(loc) >= 2 and loc[1].isdigit():
                entry = raw["summaries"][int(loc[1])]
                named = f" (name {entry['name']!r})" if isinstance(entry, dict) and "name" in entry else ""
                loc = [f"summaries[{loc[1]}]{named}", *loc[2:]]
            if not loc:  # a check across sections (Config's own validator): its message names the keys
                problems.append(str(err["msg"]).removeprefix("Value error, "))
                continue
            problems.append(f"{'.'.join(loc)} (from {origin}): {err['msg']}, got {redact('.'.join(loc), err.get('input'))!r}")
        message = "invalid configuration:\n  " + "\n  ".join(problems)
        raise ConfigError(_scrub(message, _secret_values(raw))) from None


def check_kafka_reachable(config: Config, timeout: float = 5.0, login_timeout: float = 15.0) -> None:
    """Fail at start, naming the servers, when none of the bootstrap servers accepts a connection; with SASL in
    ``kafka.client``, also when the brokers refuse its login (:func:`check_kafka_login`)."""
    servers = [s.strip() for s in config.kafka_bootstrap().split(",") if s.strip()]
    failures = []
    for server in servers:
        host, _, port = server.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                break
        except OSError as exc:
            failures.append(f"{server} ({exc.strerror or exc})")
    else:
        raise ConfigError(f"kafka.bootstrap_servers: cannot reach any broker: {', '.join(failures)}")
    if str(config.kafka.client.get("security.protocol", "")).upper().startswith("SASL"):
        check_kafka_login(config, login_timeout)


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
            raise ConfigError(_scrub(message, _secret_values(dict(config.kafka.client), "kafka.client")))
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
