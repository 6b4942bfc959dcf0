"""Create (once) and register (every session) the Delta tables described in :mod:`kdq.tables`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kdq.config import Config
from kdq.tables import ALL_TABLES, TableSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def table_path(config: Config, spec: TableSpec) -> str:
    return str(config.tables_dir / spec.name)


def qualified_name(config: Config, spec: TableSpec) -> str:
    return f"{config.spark.database}.{spec.name}"


def _create_statement(config: Config, spec: TableSpec, exists: bool) -> str:
    if exists:
        # Schema, partitioning and properties come from the table's own log;
        # restating them would fail once a property was changed by ALTER TABLE.
        return f"CREATE TABLE IF NOT EXISTS {qualified_name(config, spec)} USING delta LOCATION '{table_path(config, spec)}'"
    parts = [
        f"CREATE TABLE IF NOT EXISTS {qualified_name(config, spec)} ({spec.ddl_columns}) USING delta",
    ]
    if spec.partitioned_by:
        parts.append(f"PARTITIONED BY ({', '.join(spec.partitioned_by)})")
    parts.append(f"LOCATION '{table_path(config, spec)}'")
    if spec.comment:
        parts.append("COMMENT '" + spec.comment.replace("'", "\\'") + "'")
    if spec.properties:
        props = ", ".join(f"'{k}' = '{v}'" for k, v in spec.properties)
        parts.append(f"TBLPROPERTIES ({props})")
    return " ".join(parts)


def register_tables(spark: SparkSession, config: Config, attempts: int = 3) -> None:
    """Make every kdq table queryable by name in this session, creating missing ones.

    Two processes may create the same table at the same moment (the stream and
    a batch job starting together); Delta lets one commit win and the other
    fails with a concurrent-modification error, so creation is retried.
    """
    from delta.tables import DeltaTable

    spark.sql(f"CREATE DATABASE IF NOT EXISTS {config.spark.database}")
    for spec in ALL_TABLES:
        for attempt in range(1, attempts + 1):
            try:
                exists = DeltaTable.isDeltaTable(spark, table_path(config, spec))
                spark.sql(_create_statement(config, spec, exists))
                break
            except Exception as exc:  # py4j surfaces Delta's exceptions as generic ones
                if attempt == attempts or "Concurrent" not in str(exc) and "already exists" not in str(exc):
                    raise
                time.sleep(0.5 * attempt)
