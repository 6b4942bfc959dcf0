"""What a Delta table's log says, read without a Spark session: delta-rs (the ``deltalake`` package).

The daily maintenance plans from each table's snapshot (its file list: which partitions hold small files) and
its last commits (when data last changed, when it was last vacuumed, when it was created):
:class:`TableState`. Reading that through Spark costs a session start (~30-40 s on the 2-core machine,
more at the idle CPU priority the maintenance runs at) and a small job per table; most days on a small
deployment, and every day of the local run, the plan then skips every step. delta-rs reads the same log
(the last checkpoint plus the commits after it) in tens of milliseconds per table, so the maintenance DAG
plans first in its Airflow task and starts Spark only when a step has work to do
(:func:`kdq.spark.maintenance.plan_from_log`); the Spark job and the hourly compaction plan from it too.

Storage delta-rs reads here: the local disk and ``s3a://`` (mapped to ``s3://``, with the ``fs.s3a`` settings of
``[spark.conf]``, else the AWS environment, as delta-rs's own defaults). For any other storage URI
(``hdfs://``, ``abfss://``, ``gs://``) :func:`readable` is False and callers read the log through Spark.

No Spark import here (the pure package).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from kdq import storage

# OPTIMIZE compacts files below this size (Delta's spark.databricks.delta.optimize.minFileSize default)
DEFAULT_MIN_FILE_SIZE = 1024 * 1024 * 1024
MIN_FILE_SIZE_CONF = "spark.databricks.delta.optimize.minFileSize"
HISTORY_LOOKBACK = 32  # commits read to find the last data commit behind the VACUUM commits

# The partition key of the window tables' (window_date, window_hour) pair as the maintenance plan names it:
# one "%Y-%m-%d-%H" value, like the archive's event_hour.
WINDOW_HOUR = "window_hour"


@dataclass(frozen=True)
class TableState:
    """What the maintenance plan needs to know of one table, from its Delta log.

    ``partitions``: every partition value holding a file; ``compactable``: those holding two or more files
    below OPTIMIZE's minimum size; ``last_data_commit_ms``: time of the newest commit other than a VACUUM
    (None: none among the last :data:`HISTORY_LOOKBACK`); ``last_vacuum_ms``: the newest completed VACUUM
    after it (None: none); ``created_ms``: when the table was created (its metadata's ``createdTime``; None:
    not recorded)."""

    partitions: frozenset[str] = frozenset()
    compactable: frozenset[str] = frozenset()
    last_data_commit_ms: int | None = None
    last_vacuum_ms: int | None = None
    created_ms: int | None = None


class TableMissing(LookupError):
    """The table has no Delta log yet (a deployment whose jobs have not created it)."""


class LogUnreadable(RuntimeError):
    """delta-rs could not read the table's log (a protocol feature it does not support, one a newer Delta enabled;
    or its own error reaching the storage): read it with Spark, whose error, if any, is the one to report."""


def partition_key_column(spec: Any) -> str:
    """The one partition column the plan keys ``spec``'s partitions by (:data:`WINDOW_HOUR` for the pair)."""
    from kdq.tables import WINDOW_PARTITIONS

    return WINDOW_HOUR if tuple(spec.partitioned_by) == WINDOW_PARTITIONS else spec.partitioned_by[0]


def min_file_size(config: Any) -> int:
    """OPTIMIZE's minimum file size as the deployment's Spark sessions have it (``[spark.conf]``)."""
    return int(config.spark.conf.get(MIN_FILE_SIZE_CONF, DEFAULT_MIN_FILE_SIZE))


def readable(config: Any) -> bool:
    """delta-rs can read the tables' storage from this process (local disk or ``s3a://``)."""
    return storage.scheme(storage.tables_location(config)) in (None, "file", "s3a")


def storage_options(config: Any) -> dict[str, str]:
    """delta-rs's storage options for the tables' storage: for ``s3a://``, the ``spark.hadoop.fs.s3a.*``
    settings of ``[spark.conf]`` that say where and who (endpoint, region, path style, keys); what they leave
    unset delta-rs takes from the AWS environment, as Hadoop's default credential chain does."""
    if storage.scheme(storage.tables_location(config)) != "s3a":
        return {}
    conf = config.spark.conf

    def s3a(name: str) -> str | None:
        value = conf.get(f"spark.hadoop.fs.s3a.{name}")
        return str(value).strip() if value is not None and str(value).strip() else None

    options: dict[str, str] = {}
    endpoint = s3a("endpoint")
    if endpoint:
        if "://" not in endpoint:
            ssl = (s3a("connection.ssl.enabled") or "true").lower() != "false"
            endpoint = f"{'https' if ssl else 'http'}://{endpoint}"
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    for name, option in (("endpoint.region", "AWS_REGION"), ("access.key", "AWS_ACCESS_KEY_ID"),
                         ("secret.key", "AWS_SECRET_ACCESS_KEY"), ("session.token", "AWS_SESSION_TOKEN")):
        if (value := s3a(name)) is not None:
            options[option] = value
    if (s3a("path.style.access") or "false").lower() != "true" and endpoint is None:
        options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "true"  # AWS itself; a custom endpoint keeps path style
    return options


def log_uri(config: Any, spec: Any) -> str:
    """The table's location as delta-rs names it (``s3a://`` is Hadoop's name for ``s3://``)."""
    location = storage.table_location(config, spec.name)
    if storage.scheme(location) == "s3a":
        return "s3://" + location.split("://", 1)[1]
    return str(storage.local_path(location))


def _partition_key(column: str, values: dict[str, list]) -> list[str | None]:
    """Each file's partition value under the plan's key (``%Y-%m-%d-%H`` for the window tables' pair)."""
    if column == WINDOW_HOUR:
        days, hours = values["window_date"], values["window_hour"]
        return [
            f"{day:%Y-%m-%d}-{int(hour):02d}" if isinstance(day, dt.date) and hour is not None else None
            for day, hour in zip(days, hours, strict=True)
        ]
    return [None if v is None else str(v) for v in values[column]]


def table_state(config: Any, spec: Any, files: bool = True) -> TableState:
    """:class:`TableState` of ``spec``'s table from its Delta log, read by delta-rs (:func:`readable` first).
    ``files``: read the snapshot's file list (only for a partitioned table the plan compacts or retires from).
    Raises :class:`TableMissing` when the table has no log yet, :class:`LogUnreadable` on any other error of
    delta-rs's."""
    from deltalake.exceptions import DeltaError, TableNotFoundError

    try:
        return _table_state(config, spec, files)
    except TableNotFoundError as exc:
        raise TableMissing(f"{spec.name}: no Delta table at {storage.table_location(config, spec.name)}") from exc
    except DeltaError as exc:  # delta-rs reports an unsupported table feature as a generic DeltaError ("Unsupported")
        raise LogUnreadable(f"{spec.name}: delta-rs cannot read this table's log: {str(exc)[:300]}") from exc


def _table_state(config: Any, spec: Any, files: bool) -> TableState:
    import pyarrow as pa
    from deltalake import DeltaTable

    table = DeltaTable(log_uri(config, spec), storage_options=storage_options(config) or None)
    partitions: frozenset[str] = frozenset()
    compactable: frozenset[str] = frozenset()
    if files and spec.partitioned_by:
        column = partition_key_column(spec)
        actions = pa.table(table.get_add_actions(flatten=True))
        names = ("window_date", "window_hour") if column == WINDOW_HOUR else (column,)
        keys = _partition_key(column, {n: actions.column(f"partition.{n}").to_pylist() for n in names})
        threshold = min_file_size(config)
        small: dict[str, int] = {}
        for key, size in zip(keys, actions.column("size_bytes").to_pylist(), strict=True):
            if key is not None:
                small[key] = small.get(key, 0) + (1 if size is not None and size < threshold else 0)
        partitions = frozenset(small)
        compactable = frozenset(key for key, count in small.items() if count >= 2)
    last_data = last_vacuum = None
    for commit in table.history(HISTORY_LOOKBACK):  # newest first
        millis = commit.get("timestamp")
        if millis is None:
            continue
        operation = commit.get("operation")
        if operation == "VACUUM END":
            status = (commit.get("operationParameters") or {}).get("status", "COMPLETED")
            if status == "COMPLETED" and last_vacuum is None:
                last_vacuum = int(millis)
        elif operation != "VACUUM START":
            last_data = int(millis)
            break
    created = table.metadata().created_time
    return TableState(partitions, compactable, last_data, last_vacuum, int(created) if created is not None else None)
