"""The sections of kdq.toml (``[paths]``, ``[kafka]``, ``[spark]``, ``[stream]``, ``[influxdb]``, ``[registry]``):
each a frozen pydantic model whose validators reject a bad value at start, naming the problem."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Section(BaseModel):
    """A section of the configuration: unknown keys refused, frozen, defaults validated too."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def check_regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from exc
    return value


class PathsConfig(Section):
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


class KafkaConfig(Section):
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

    _regex = field_validator("topic_include", "topic_exclude")(check_regex)

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


class SparkConfig(Section):
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
    sql_endpoint_refresh_seconds: float = Field(
        default=1.0, ge=0,
        description="while clients query the SQL endpoint, how often it looks for a new commit of window_counts and "
        "brings its snapshot up to date, so that the first query after a stream commit does not pay for it (0: off)",
    )

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


class StreamConfig(Section):
    window_seconds: int = Field(default=1, gt=0)
    allowed_lateness_seconds: int = Field(default=60, ge=0)
    future_margin_seconds: int = Field(default=300, ge=0)
    trigger_interval_seconds: float = Field(default=5.0, ge=0)
    max_value_bytes: int = Field(default=1024 * 1024, gt=0, description="larger values are invalid: too_large")
    reasons_window_seconds: int = Field(default=60, gt=0)
    reasons_flush_seconds: float = Field(
        default=60.0, ge=0,
        description="how often the stream appends the invalid reasons its micro-batches kept in their ledger entries "
        "(and at a graceful stop); 0: every micro-batch. invalid_reasons lags the counts by up to this long",
    )
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


class InfluxConfig(Section):
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


class RegistryConfig(Section):
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
