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
