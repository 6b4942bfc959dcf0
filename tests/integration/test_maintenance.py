"""The daily maintenance does work proportional to what changed, on real Delta tables.

Commits into two closed days and today's (the stream's MERGE, :func:`kdq.spark.writers.merge_window_increments`);
a first run compacts exactly the two closed days; a second run with nothing changed compacts nothing and says
so; a run after new commits into one closed day compacts only that day (Delta's history: the OPTIMIZE's
predicate and removed files); the counts never change.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from kdq import delta_log
from kdq.spark.maintenance import _spark_table_state, maintenance_has_work, run_maintenance
from kdq.spark.tables import ensure_tables, table_path
from kdq.spark.writers import merge_window_increments
from kdq.tables import ALL_TABLES, WINDOW_COUNTS
from tests.conftest import make_config

pytestmark = pytest.mark.integration

TODAY = dt.date(2026, 11, 24)  # a Tuesday: VACUUM LITE
DAYS = {day: int(dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC).timestamp() * 1000)
        for day in (dt.date(2026, 11, 20), dt.date(2026, 11, 21), TODAY)}


def _merge(spark, config, day: dt.date, version: int) -> None:
    rows = [{"topic": "orders", "window_start_ms": DAYS[day] + (version % 7) * 1000 + second * 60_000,
             "status": "valid", "count": 1 + second, "rules_version": "r1"} for second in range(3)]
    merge_window_increments(spark, rows, config, "test-maintenance", version)


def _counts(spark, config) -> dict:
    rows = spark.read.format("delta").load(table_path(config, WINDOW_COUNTS)).groupBy("window_date").agg(
        F.sum("count").alias("n"), F.count("*").alias("rows")).collect()
    return {(r["window_date"], r["n"], r["rows"]) for r in rows}


def _optimizes(spark, config) -> list:
    history = DeltaTable.forPath(spark, table_path(config, WINDOW_COUNTS)).history()
    return history.where("operation = 'OPTIMIZE'").orderBy("version").collect()


def _files(spark, config, day: dt.date) -> int:
    return len([f for f in spark.read.format("delta").load(table_path(config, WINDOW_COUNTS)).inputFiles()
                if f"window_date={day:%Y-%m-%d}/" in f])


def _same_log_as_spark(spark, config) -> None:
    """delta-rs's reading of every table's log (kdq.delta_log) is Spark's: the same partitions, compactable
    partitions and creation time; commit times within a second (Spark takes a commit file's time, delta-rs
    its commitInfo's)."""
    for spec in ALL_TABLES:
        ours, sparks = delta_log.table_state(config, spec), _spark_table_state(spark, config, spec, files=True)
        assert (ours.partitions, ours.compactable, ours.created_ms) == (
            sparks.partitions, sparks.compactable, sparks.created_ms), spec.name
        for field in ("last_data_commit_ms", "last_vacuum_ms"):
            a, b = getattr(ours, field), getattr(sparks, field)
            assert (a is None) == (b is None) and (a is None or abs(a - b) < 1000), (spec.name, field, a, b)
    assert delta_log.table_state(config, WINDOW_COUNTS).compactable == {"2026-11-24-00"}


def test_maintenance_compacts_only_what_changed(spark, tmp_path: Path) -> None:
    config = make_config(tmp_path, spark={"master": "local[2]", "shuffle_partitions": 2})
    ensure_tables(spark, config)
    version = 0
    for day in DAYS:
        for _ in range(3):
            version += 1
            _merge(spark, config, day, version)
    before = _counts(spark, config)
    assert all(_files(spark, config, day) >= 2 for day in DAYS)

    # Eight days on, the tables are older than the VACUUM's 168 hours retention: the first run vacuums them.
    eight_days_on = int(time.time() * 1000) + 8 * 86_400_000
    # The plan without Spark (the Airflow task before the job) sees the work too.
    assert maintenance_has_work(config, 30, 168, now_ms=eight_days_on, today=TODAY) is True
    first = run_maintenance(spark, config, 30, 168, TODAY, now_ms=eight_days_on)
    key = ("OPTIMIZE window_counts WHERE (window_date = DATE'2026-11-20' AND window_hour IN (0)) "
           "OR (window_date = DATE'2026-11-21' AND window_hour IN (0))")
    assert first.results[key]["partitions"] == ["2026-11-20-00", "2026-11-21-00"], first.results
    assert first.results[key]["files_removed"] >= 4 and first.results[key]["files_added"] == 2
    [optimize] = _optimizes(spark, config)
    predicate = optimize["operationParameters"]["predicate"]
    assert "2026-11-20" in predicate and "2026-11-21" in predicate and "2026-11-24" not in predicate, predicate
    assert _files(spark, config, dt.date(2026, 11, 20)) == _files(spark, config, dt.date(2026, 11, 21)) == 1
    assert _files(spark, config, TODAY) >= 2  # today's partition is open: left to the stream
    assert first.results["OPTIMIZE raw_archive"] == {"skipped": "no closed partition has files added since it was compacted"}
    [retire] = [v for k, v in first.results.items() if k.startswith("RETIRE+DELETE")]
    assert retire == {"skipped": "no archive partition before 2026-10-25"}
    assert first.results["VACUUM window_counts LITE RETAIN 168 HOURS"]["vacuumed"] == "LITE"
    assert _counts(spark, config) == before

    # Nothing changed: no OPTIMIZE at all, and the report says why; the plan without Spark says the job can be
    # skipped (no Spark start in the DAG), and it read each table's log as Spark does.
    _same_log_as_spark(spark, config)
    assert maintenance_has_work(config, 30, 168, today=TODAY) is False
    second = run_maintenance(spark, config, 30, 168, TODAY)
    assert {k: v for k, v in second.results.items() if k.startswith("OPTIMIZE")} == {
        f"OPTIMIZE {name}": {"skipped": "no closed partition has files added since it was compacted"}
        for name in ("raw_archive", "window_counts", "summaries")
    }
    assert len(_optimizes(spark, config)) == 1 and second.skipped >= 4
    # Today the tables are minutes old: no file they removed can be past the retention, so no VACUUM.
    assert second.results["VACUUM window_counts LITE RETAIN 168 HOURS"] == {
        "skipped": "the table is younger than the 168 hours retention: nothing it removed can go yet"}
    assert _counts(spark, config) == before

    # Late commits into one closed day: only that day is compacted.
    for _ in range(2):
        version += 1
        _merge(spark, config, dt.date(2026, 11, 20), version)
    after_merges = _counts(spark, config)
    assert maintenance_has_work(config, 30, 168, today=TODAY) is True
    files = _files(spark, config, dt.date(2026, 11, 20))
    assert files >= 2
    third = run_maintenance(spark, config, 30, 168, TODAY)
    result = third.results["OPTIMIZE window_counts WHERE (window_date = DATE'2026-11-20' AND window_hour IN (0))"]
    assert result.pop("seconds") >= 0
    assert result == {"partitions": ["2026-11-20-00"], "files_removed": files, "files_added": 1}, third.results
    latest = _optimizes(spark, config)[-1]
    assert "2026-11-20" in latest["operationParameters"]["predicate"]
    assert "2026-11-21" not in latest["operationParameters"]["predicate"]
    assert int(latest["operationMetrics"]["numRemovedFiles"]) == files
    assert _files(spark, config, dt.date(2026, 11, 20)) == 1
    assert _counts(spark, config) == after_merges
