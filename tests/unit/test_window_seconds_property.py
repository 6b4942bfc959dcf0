"""window_counts records its window size; a configuration with another size is refused at start."""

from __future__ import annotations

import pytest
from delta.tables import DeltaTable

from kdq.config import ConfigError
from kdq.spark.tables import ensure_tables, table_path
from kdq.tables import WINDOW_COUNTS, WINDOW_SECONDS_PROPERTY
from tests.conftest import make_config


def _config(data_dir, window_seconds: int):
    return make_config(
        data_dir, spark={"master": "local[2]", "shuffle_partitions": 2}, stream={"window_seconds": window_seconds}
    )


def _recorded(spark, config) -> str | None:
    detail = DeltaTable.forPath(spark, table_path(config, WINDOW_COUNTS)).detail().first()
    return (detail["properties"] or {}).get(WINDOW_SECONDS_PROPERTY)


def test_a_new_table_records_its_window_size_and_another_size_is_refused(spark, tmp_path) -> None:
    ensure_tables(spark, _config(tmp_path, 1))
    assert _recorded(spark, _config(tmp_path, 1)) == "1"
    ensure_tables(spark, _config(tmp_path, 1))  # the same size: fine, again and again

    with pytest.raises(ConfigError) as refused:
        ensure_tables(spark, _config(tmp_path, 10))
    message = str(refused.value)
    assert "stream.window_seconds is 10" in message
    assert "1-second windows" in message
    assert "new data folder" in message
    assert _recorded(spark, _config(tmp_path, 1)) == "1"  # refused, not changed


def test_a_table_without_the_property_gets_it_once_from_the_configuration(spark, tmp_path) -> None:
    config = _config(tmp_path, 5)
    ensure_tables(spark, config)
    path = table_path(config, WINDOW_COUNTS)
    # A table created before the property existed.
    spark.sql(f"ALTER TABLE delta.`{path}` UNSET TBLPROPERTIES ('{WINDOW_SECONDS_PROPERTY}')")
    assert _recorded(spark, config) is None

    ensure_tables(spark, config)
    assert _recorded(spark, config) == "5"
    with pytest.raises(ConfigError, match="stream.window_seconds is 1 .*5-second windows"):
        ensure_tables(spark, _config(tmp_path, 1))
