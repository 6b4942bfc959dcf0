"""Where the Delta tables and the Spark checkpoints live, and the few file operations Python does on them.

Tables and checkpoints live under ``paths.storage_uri`` when it is set (``s3a://bucket/kdq``, ``hdfs://nn/kdq``,
``abfss://...``, ``gs://...``: any Hadoop FileSystem URI), else under the local ``data_dir``, in the same
layout: ``<root>/delta/<table>``, ``<root>/checkpoints/<query>``. Local process state (the stack's
state.json, heartbeats, the stream's state files, logs, pid files) always stays in ``data_dir``.

Locations are plain strings, built by :func:`join` (never :mod:`pathlib`: ``Path("s3a://b/x")`` is the
local folder ``s3a:/b/x``). The few reads and writes kdq's Python code does inside a checkpoint (Spark's
offset and commit logs, the stream's app id) go through :func:`files_for`: the local disk directly for a
local location; for a URI, Hadoop's FileSystem API through the JVM of the process's Spark session, which
:mod:`kdq.spark.storage` registers when a session is built (:func:`use_remote_files`). A process without
a Spark session (the Airflow supervisor, the CLI) cannot read a remote checkpoint:
:class:`RemoteStorageUnavailable` (an ``OSError``) says so, and those callers degrade (no offset ranges).

No Spark import here (the pure package).
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kdq.config import ConfigError

if TYPE_CHECKING:
    from kdq.config import Config

Location = str | os.PathLike

# scheme://... (two characters at least, so a Windows drive letter is not a scheme)
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")

TABLES_FOLDER = "delta"
CHECKPOINTS_FOLDER = "checkpoints"
WAREHOUSE_FOLDER = "warehouse"


def scheme(location: Location) -> str | None:
    """The URI scheme (``s3a``), or None for a local path."""
    match = _URI.match(os.fspath(location))
    return match.group(1).lower() if match else None


def is_remote(location: Location) -> bool:
    """A location Python cannot open as a local file (any URI scheme but ``file``)."""
    return scheme(location) not in (None, "file")


def local_path(location: Location) -> Path:
    """The local path of a local location (a path, or a ``file:`` URI)."""
    text = os.fspath(location)
    if scheme(text) == "file":
        text = re.sub(r"^file://", "", text, flags=re.IGNORECASE)
    if is_remote(text):
        raise RemoteStorageUnavailable(f"{text} is not a local path")
    return Path(text)


def join(location: Location, *parts: str | int) -> str:
    """``location/part/part``: string joining that keeps a URI a URI."""
    text = os.fspath(location)
    if not parts:
        return text
    return "/".join([text.rstrip("/"), *(str(p).strip("/") for p in parts)])


def name_of(location: Location) -> str:
    """The last segment (``speed_layer`` of ``s3a://b/kdq/checkpoints/speed_layer``)."""
    return os.fspath(location).rstrip("/").rsplit("/", 1)[-1]


# Delta's log store for s3a:// paths. Its default (S3SingleDriverLogStore) is safe for one writing driver only: S3
# has no put-if-absent, so two drivers committing version N of a table both "succeed" and one commit is lost.
S3A_LOG_STORE_KEY = "spark.delta.logStore.s3a.impl"
SINGLE_DRIVER_LOG_STORES = ("S3SingleDriverLogStore",)
# kdq's log store that coordinates the commits through a DynamoDB table (jvm/hadoop-aws/kdq-dynamodb; docs/cluster.md,
# "Concurrent writers on S3"), and its settings.
DYNAMODB_LOG_STORE = "io.kdq.storage.DynamoDBLogStore"
DYNAMODB_PREFIX = "spark.kdq.dynamodb."


def log_store_conf(config: Config) -> dict[str, str]:
    """The Spark settings of kdq's DynamoDB log store for ``paths.dynamodb_table`` (none without it, or when the
    tables are not on s3a://): every commit to a table first claims its version in that DynamoDB table, so two
    drivers never both write it."""
    paths = config.paths
    if not paths.dynamodb_table or scheme(paths.storage_uri) != "s3a":
        return {}
    conf = {
        S3A_LOG_STORE_KEY: DYNAMODB_LOG_STORE,
        f"{DYNAMODB_PREFIX}table": paths.dynamodb_table,
        f"{DYNAMODB_PREFIX}region": paths.dynamodb_region,
    }
    if paths.dynamodb_endpoint:
        conf[f"{DYNAMODB_PREFIX}endpoint"] = paths.dynamodb_endpoint
    return conf


def check_commits_coordinated(config: Config) -> None:
    """With tables on s3a://, a ConfigError unless concurrent commits are coordinated (``paths.dynamodb_table``, or
    a log store of the user's own in ``[spark.conf]``) or ``paths.s3_single_writer`` acknowledges that one job writes
    at a time. kdq's stream, hourly recompute, rebuild and maintenance are separate Spark drivers writing the same
    tables: with Delta's default log store on S3 two of them committing at once lose a commit, silently."""
    paths = config.paths
    if scheme(paths.storage_uri) != "s3a" or paths.s3_single_writer or paths.dynamodb_table:
        return
    log_store = config.spark.conf.get(S3A_LOG_STORE_KEY, "").strip()
    if log_store and log_store.rsplit(".", 1)[-1] not in SINGLE_DRIVER_LOG_STORES:
        return  # the user's own choice, in [spark.conf]
    raise ConfigError(
        f"paths.storage_uri = {paths.storage_uri!r}: Delta's default log store for s3a:// is safe for one writing "
        "Spark driver only, and kdq's stream and batch jobs are separate drivers writing the same tables (two commits "
        "of one table at the same moment: one is silently lost). Set paths.dynamodb_table (KDQ_PATHS__DYNAMODB_TABLE: "
        "a DynamoDB table that coordinates the commits; docs/cluster.md), or "
        f"[spark.conf] {S3A_LOG_STORE_KEY} to such a log store yourself, or paths.s3_single_writer = true if only "
        "one kdq job ever writes at a time"
    )


def storage_root(config: Config) -> str:
    """``paths.storage_uri`` (without a trailing /), else the local data folder."""
    uri = config.paths.storage_uri
    return uri.rstrip("/") if uri else str(config.data_dir)


def tables_location(config: Config) -> str:
    return join(storage_root(config), TABLES_FOLDER)


def checkpoints_location(config: Config) -> str:
    return join(storage_root(config), CHECKPOINTS_FOLDER)


def warehouse_location(config: Config) -> str:
    """Spark's ``spark.sql.warehouse.dir`` (kdq makes no managed table; a database folder goes there)."""
    return join(storage_root(config), WAREHOUSE_FOLDER)


def table_location(config: Config, name: str) -> str:
    return join(tables_location(config), name)


def checkpoint_location(config: Config, name: str) -> str:
    return join(checkpoints_location(config), name)


# -- file operations --------------------------------------------------------------------------------------


class RemoteStorageUnavailable(OSError):
    """A remote location was to be read in a process without a Spark session (no Hadoop FileSystem)."""


class Files(Protocol):
    """The file operations kdq's Python code needs on table and checkpoint locations."""

    def exists(self, location: Location) -> bool: ...

    def names(self, location: Location) -> list[str]:
        """Names of a folder's entries; [] when the folder does not exist."""
        ...

    def read_bytes(self, location: Location) -> bytes:
        """The whole file; FileNotFoundError when it does not exist."""
        ...

    def mkdirs(self, location: Location) -> None: ...

    def create_if_absent(self, location: Location, data: bytes) -> bool:
        """Write ``data`` to a new file unless one exists (a reader never sees it half-written); True if written."""
        ...

    def write_bytes(self, location: Location, data: bytes) -> None:
        """Create or replace a file (a reader sees the old or the new content on local disks and object stores)."""
        ...

    def delete(self, location: Location) -> bool:
        """Delete a file; False when it did not exist."""
        ...


class LocalFiles:
    """:class:`Files` on the local disk."""

    def exists(self, location: Location) -> bool:
        return local_path(location).exists()

    def names(self, location: Location) -> list[str]:
        try:
            return [p.name for p in local_path(location).iterdir()]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def read_bytes(self, location: Location) -> bytes:
        return local_path(location).read_bytes()

    def mkdirs(self, location: Location) -> None:
        local_path(location).mkdir(parents=True, exist_ok=True)

    def create_if_absent(self, location: Location, data: bytes) -> bool:
        path = local_path(location)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        tmp.write_bytes(data)
        try:
            os.link(tmp, path)  # atomic create-if-absent: two writers agree on one content
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def write_bytes(self, location: Location, data: bytes) -> None:
        path = local_path(location)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def delete(self, location: Location) -> bool:
        try:
            local_path(location).unlink()
            return True
        except FileNotFoundError:
            return False


LOCAL_FILES = LocalFiles()
_remote: Files | None = None


def use_remote_files(files: Files | None) -> None:
    """Register (or, with None, forget) the :class:`Files` remote locations are read with in this process
    (:mod:`kdq.spark.storage` registers Hadoop's FileSystem of the session it builds)."""
    global _remote
    _remote = files


def files_for(location: Location) -> Files:
    """The :class:`Files` that reads ``location``: the local disk, or the registered remote one."""
    if not is_remote(location):
        return LOCAL_FILES
    if _remote is None:
        raise RemoteStorageUnavailable(
            f"{os.fspath(location)} is on remote storage ({scheme(location)}://): this process has no Spark "
            "session to read it with (Hadoop's FileSystem)"
        )
    return _remote
