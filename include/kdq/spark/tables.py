"""Create (once) and register (every session) the Delta tables described in :mod:`kdq.tables`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kdq.config import Config
from kdq.tables import ALL_TABLES, VIEWS, TableSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def table_path(config: Config, spec: TableSpec) -> str:
    return str(config.tables_dir / spec.name)


def qualified_name(config: Config, spec: TableSpec) -> str:
    return f"{config.spark.database}.{spec.name}"


def _create_by_path(spec: TableSpec, path: str) -> str:
    parts = [f"CREATE TABLE IF NOT EXISTS delta.`{path}` ({spec.ddl_columns}) USING delta"]
    if spec.partitioned_by:
        parts.append(f"PARTITIONED BY ({', '.join(spec.partitioned_by)})")
    if spec.comment:
        parts.append("COMMENT '" + spec.comment.replace("'", "\\'") + "'")
    if spec.properties:
        props = ", ".join(f"'{k}' = '{v}'" for k, v in spec.properties)
        parts.append(f"TBLPROPERTIES ({props})")
    return " ".join(parts)


def _retrying(action, attempts: int = 3) -> None:
    """Two processes may create the same table at the same moment (the stream and a batch job
    starting together); Delta lets one commit win and fails the other, so creation is retried."""
    for attempt in range(1, attempts + 1):
        try:
            action()
            return
        except Exception as exc:  # py4j surfaces Delta's exceptions as generic ones
            if attempt == attempts or ("Concurrent" not in str(exc) and "already exists" not in str(exc)):
                raise
            time.sleep(0.5 * attempt)


def ensure_tables(spark: SparkSession, config: Config) -> None:
    """Create every missing kdq table at its path (its identity); existing ones are left as they are."""
    from delta.tables import DeltaTable

    for spec in ALL_TABLES:
        path = table_path(config, spec)
        if not DeltaTable.isDeltaTable(spark, path):
            _retrying(lambda spec=spec, path=path: spark.sql(_create_by_path(spec, path)))


def register_tables(spark: SparkSession, config: Config) -> None:
    """Create missing tables, then make each queryable by name (``kdq.window_counts``) in this session."""
    ensure_tables(spark, config)
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {config.spark.database}")
    for spec in ALL_TABLES:
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS {qualified_name(config, spec)} USING delta "
            f"LOCATION '{table_path(config, spec)}'"
        )
    for name, query in VIEWS:
        spark.sql(f"CREATE OR REPLACE VIEW {config.spark.database}.{name} AS {query.format(db=config.spark.database)}")
