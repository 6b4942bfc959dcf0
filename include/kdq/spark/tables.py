"""Create (once) and register (every session) the Delta tables described in :mod:`kdq.tables`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kdq.config import Config
from kdq.storage import table_location
from kdq.tables import ALL_TABLES, VIEWS, TableSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def table_path(config: Config, spec: TableSpec) -> str:
    """The table's location: a local path or a URI (``paths.storage_uri``; :mod:`kdq.storage`)."""
    return table_location(config, spec.name)


def qualified_name(config: Config, spec: TableSpec) -> str:
    return f"{config.spark.database}.{spec.name}"


def _create_by_path(spark: SparkSession, spec: TableSpec, path: str) -> None:
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
    builder.execute()


# What a creation racing another process's creation of the same table fails with: a commit conflict,
# the table registered meanwhile, or (seen in the chaos run) the location holding the other process's
# first files before its first log entry is visible.
_CREATION_RACES = ("Concurrent", "already exists", "DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION")


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
    """Create every missing kdq table at its path (its identity); existing ones are left as they are."""
    from delta.tables import DeltaTable

    for spec in ALL_TABLES:
        path = table_path(config, spec)
        if not DeltaTable.isDeltaTable(spark, path):
            _retrying(lambda spec=spec, path=path: _create_by_path(spark, spec, path))


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
