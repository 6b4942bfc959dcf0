"""Create (once) and register (every session) the Delta tables described in :mod:`kdq.tables`."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from kdq.config import Config, ConfigError
from kdq.storage import table_location
from kdq.tables import ALL_TABLES, VIEWS, WINDOW_COUNTS, WINDOW_PARTITIONS, WINDOW_SECONDS_PROPERTY, TableSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("kdq.tables")


def table_path(config: Config, spec: TableSpec) -> str:
    """The table's location: a local path or a URI (``paths.storage_uri``; :mod:`kdq.storage`)."""
    return table_location(config, spec.name)


def qualified_name(config: Config, spec: TableSpec) -> str:
    return f"{config.spark.database}.{spec.name}"


def _create_by_path(spark: SparkSession, spec: TableSpec, path: str, config: Config) -> None:
    """Create the table at ``path`` with Delta's builder API (no path or other config value in SQL text)."""
    from delta.tables import DeltaTable

    builder = DeltaTable.createIfNotExists(spark).location(path)
    for name, sql_type in spec.columns:
        builder = builder.addColumn(name, sql_type)
    if spec.partitioned_by:
        builder = builder.partitionedBy(*spec.partitioned_by)
    if spec.comment:
        builder = builder.comment(spec.comment)
    for key, value in spec.properties:
        builder = builder.property(key, value)
    if spec is WINDOW_COUNTS:
        builder = builder.property(WINDOW_SECONDS_PROPERTY, str(int(config.stream.window_seconds)))
    builder.execute()


# What a creation racing another process's creation of the same table fails with: a commit conflict,
# the table registered meanwhile, or (seen in the chaos run) the location holding the other process's
# first files before its first log entry is visible.
_CREATION_RACES = ("Concurrent", "already exists", "DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION", "DELTA_METADATA_CHANGED",
                   "DELTA_PROTOCOL_CHANGED")


def _retrying(action, attempts: int = 5) -> None:
    """Two processes may create the same table at the same moment (the stream and a batch job
    starting together); Delta lets one commit win and fails the other, so creation is retried
    (``createIfNotExists`` then finds the winner's table)."""
    for attempt in range(1, attempts + 1):
        try:
            action()
            return
        except Exception as exc:  # py4j surfaces Delta's exceptions as generic ones
            if attempt == attempts or not any(race in str(exc) for race in _CREATION_RACES):
                raise
            time.sleep(0.5 * attempt)


def ensure_tables(spark: SparkSession, config: Config) -> None:
    """Create every missing kdq table at its path (its identity). Existing ones keep their data; they get the
    table properties of :mod:`kdq.tables` they lack (and the window tables their layout), and ``window_counts``
    must have been counted with this configuration's window size (:func:`check_window_seconds`)."""
    from delta.tables import DeltaTable

    for spec in ALL_TABLES:
        path = table_path(config, spec)
        if not DeltaTable.isDeltaTable(spark, path):
            _retrying(lambda spec=spec, path=path: _create_by_path(spark, spec, path, config))
        elif spec.partitioned_by == WINDOW_PARTITIONS:
            _retrying(lambda spec=spec: ensure_window_layout(spark, config, spec))
        elif spec.properties:
            _retrying(lambda spec=spec, path=path: ensure_properties(spark, spec, path))
    check_window_seconds(spark, config)


def ensure_window_layout(spark: SparkSession, config: Config, spec: TableSpec) -> None:
    """Bring a ``window_counts`` or ``summaries`` table of an earlier kdq to today's layout, once: partitioned by
    (window_date, window_hour) with deletion vectors (:data:`kdq.tables.WINDOW_PARTITIONS`).

    Delta cannot re-partition in place, so the table is rewritten by one overwrite of itself (its history,
    properties and idempotent-write versions stay in its log; readers see the old or the new files, never a
    mix). A kdq writer committing meanwhile makes the overwrite fail with a conflict, and it is tried again
    (:func:`_retrying`). A stream of the earlier kdq is stopped for the upgrade (docs/operations.md)."""
    from delta.tables import DeltaTable

    from kdq.spark.transforms import window_partition_columns

    path = table_path(config, spec)
    detail = DeltaTable.forPath(spark, path).detail().select("partitionColumns", "properties").first()
    if tuple(detail["partitionColumns"]) != spec.partitioned_by:
        log.warning("%s at %s is partitioned by %s: rewriting it once, partitioned by %s",
                    spec.name, path, list(detail["partitionColumns"]), list(spec.partitioned_by))
        from pyspark.sql import functions as F

        current = spark.read.format("delta").load(path)
        hour = window_partition_columns(F.unix_millis("window_start"))[1]
        rewritten = current.select(*[c for c in current.columns if c != "window_hour"], hour).select(*spec.column_names)
        (
            rewritten.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
            .partitionBy(*spec.partitioned_by).save(path)
        )
    ensure_properties(spark, spec, path, detail["properties"])


def ensure_properties(spark: SparkSession, spec: TableSpec, path: str, properties: dict | None = None) -> None:
    """Set the table properties of ``spec`` that the table at ``path`` lacks or holds other values of (a table of
    an earlier kdq); ``properties``: the table's, when the caller has read them already."""
    if properties is None:
        from delta.tables import DeltaTable

        properties = DeltaTable.forPath(spark, path).detail().select("properties").first()["properties"]
    properties = properties or {}
    missing = [(key, value) for key, value in spec.properties if properties.get(key) != value]
    if missing:
        settings = ", ".join(f"'{key}' = '{value}'" for key, value in missing)  # constants of kdq.tables
        spark.sql(f"ALTER TABLE {_delta_path_identifier(path)} SET TBLPROPERTIES ({settings})")


def _delta_path_identifier(path: str) -> str:
    """``delta.`<path>``` with backticks doubled (a data_dir with a backtick is refused by kdq.config anyway)."""
    return "delta.`" + path.replace("`", "``") + "`"


def check_window_seconds(spark: SparkSession, config: Config) -> None:
    """Refuse (:class:`ConfigError`) a ``stream.window_seconds`` other than the one ``window_counts`` was counted with.

    The size is the table property ``kdq.window_seconds``, set when the table is created. A table created
    before the property existed gets it once, from the current configuration (the size it has been counted
    with, as nothing refused a change before: the operator's configuration is the best witness there is).
    Counts of different window sizes in one table would be silently wrong: a 1 s row and a 10 s row of the
    same start would both be summed by every reader, and the stream's MERGE would add to rows of the other size.
    """
    from delta.tables import DeltaTable

    path = table_path(config, WINDOW_COUNTS)
    current = str(int(config.stream.window_seconds))
    properties = DeltaTable.forPath(spark, path).detail().select("properties").first()["properties"] or {}
    recorded = properties.get(WINDOW_SECONDS_PROPERTY)
    if recorded is None:
        _retrying(
            lambda: spark.sql(
                f"ALTER TABLE {_delta_path_identifier(path)} SET TBLPROPERTIES "
                f"('{WINDOW_SECONDS_PROPERTY}' = '{current}')"
            )
        )
        properties = DeltaTable.forPath(spark, path).detail().select("properties").first()["properties"] or {}
        recorded = properties.get(WINDOW_SECONDS_PROPERTY, current)  # another starter may have set it first
    if recorded != current:
        raise ConfigError(
            f"stream.window_seconds is {current} but the window_counts table at {path} holds "
            f"{recorded}-second windows (its table property {WINDOW_SECONDS_PROPERTY}); one table cannot mix "
            f"window sizes. Set stream.window_seconds = {recorded} again, or count with {current}-second windows "
            "in a new data folder (paths.data_dir, or paths.storage_uri): a rebuild re-classifies records but "
            "keeps the table's window size"
        )


def register_tables(spark: SparkSession, config: Config) -> None:
    """Create missing tables, then make each queryable by name (``kdq.window_counts``) in this session."""
    ensure_tables(spark, config)
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {config.spark.database}")
    for spec in ALL_TABLES:
        # The catalog API takes the path as a value, not as SQL text (a data_dir may hold any character).
        if not spark.catalog.tableExists(qualified_name(config, spec)):
            _retrying(
                lambda spec=spec: spark.catalog.createTable(
                    qualified_name(config, spec), path=table_path(config, spec), source="delta"
                )
            )
    values = {
        "db": config.spark.database,  # a validated SQL identifier (kdq.config)
        "coarse_ms": int(config.stream.reasons_window_seconds) * 1000,
        "per_window": int(config.stream.quarantine_per_window),
    }
    for name, query in VIEWS:
        spark.sql(f"CREATE OR REPLACE VIEW {config.spark.database}.{name} AS {query.format(**values)}")
