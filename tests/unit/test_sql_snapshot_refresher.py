"""The SQL endpoint's snapshot refresher (kdq.spark.sql_server.SnapshotRefresher), on real Delta tables.

After a commit, the first query of a table pays for Delta's new snapshot (the log's new entries, the table's state
rebuilt by Spark jobs). The refresher does that when it sees the commit, so a client's query after it runs fewer
Spark jobs than one right after an unrefreshed commit, and still sees the commit's rows.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from pathlib import Path

from kdq.spark.sql_server import SnapshotRefresher
from kdq.spark.tables import register_tables, table_path
from kdq.spark.writers import delta_snapshot, merge_window_increments
from kdq.tables import WINDOW_COUNTS, TableSpec

START_MS = int(dt.datetime(2026, 11, 29, 9, tzinfo=dt.UTC).timestamp() * 1000)
QUERY = "SELECT topic, status, sum(count) AS n FROM kdq.window_counts GROUP BY topic, status"


def _merge(spark, config, topic: str, batch: int) -> None:
    rows = [{"topic": topic, "window_start_ms": START_MS + batch * 1000, "status": "valid", "count": 1,
             "rules_version": "r1"}]
    merge_window_increments(spark, rows, config, topic, batch)  # the topic is unique to the test: its app id too


def _client_query(spark, topic: str, group: str) -> tuple[int, int]:
    """(the topic's count, how many Spark jobs the query ran), as a client's query on the session (the session's
    own kdq tables, registered by name as in the endpoint)."""
    context = spark.sparkContext
    context.setJobGroup(group, group)
    try:
        rows = spark.sql(QUERY).collect()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    return sum(r["n"] for r in rows if r["topic"] == topic), len(context.statusTracker().getJobIdsForGroup(group))


def test_a_query_after_a_refreshed_commit_runs_fewer_jobs_and_sees_the_commit(spark, spark_config) -> None:
    config, topic = spark_config, f"refresh-{uuid.uuid4().hex[:8]}"
    register_tables(spark, config)
    refresher = SnapshotRefresher(spark, config, interval=0.2, tables=(WINDOW_COUNTS,))
    for batch in range(1, 4):
        _merge(spark, config, topic, batch)
    assert refresher.refresh_once() == ["window_counts"]
    assert refresher.refresh_once() == []  # no commit since: nothing to do

    _merge(spark, config, topic, 4)
    count, cold_jobs = _client_query(spark, topic, f"{topic}-cold")
    assert count == 4

    _merge(spark, config, topic, 5)
    assert refresher.refresh_once() == ["window_counts"]
    count, warm_jobs = _client_query(spark, topic, f"{topic}-warm")
    assert count == 5  # the refreshed snapshot holds the commit: no stale read
    assert warm_jobs < cold_jobs, (warm_jobs, cold_jobs)


def test_the_thread_follows_commits_and_a_failing_table_only_logs(spark, spark_config, caplog) -> None:
    """A table not created yet is skipped; one whose refresh fails (a log Delta cannot read) is logged once and tried
    again, and the others are still kept current."""
    config, topic = spark_config, f"refresh-{uuid.uuid4().hex[:8]}"
    register_tables(spark, config)
    not_created = TableSpec(name=f"not_created_{topic[-8:]}", columns=(("window_date", "DATE"),))
    broken = TableSpec(name=f"broken_{topic[-8:]}", columns=(("window_date", "DATE"),))
    log_dir = Path(table_path(config, broken)) / "_delta_log"
    log_dir.mkdir(parents=True)
    (log_dir / f"{0:020d}.json").write_text("this is not a Delta commit\n")
    refresher = SnapshotRefresher(spark, config, interval=0.2, tables=(broken, not_created, WINDOW_COUNTS))
    stop = threading.Event()
    thread = refresher.start(stop)
    try:
        for batch in range(1, 3):
            _merge(spark, config, topic, batch)  # Spark jobs of this driver: clients are active
            version = delta_snapshot(spark, table_path(config, WINDOW_COUNTS)).version()
            for _ in range(150):  # at most 30 s for the thread to see the commit
                if refresher.versions.get("window_counts") == version:
                    break
                stop.wait(0.2)
            assert refresher.versions.get("window_counts") == version, (refresher.versions, version)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert set(refresher.versions) == {"window_counts"}
    warnings = [r.getMessage() for r in caplog.records if "could not refresh" in r.getMessage()]
    assert len(warnings) == 1 and broken.name in warnings[0], warnings  # once, not at every interval


def test_no_refresh_while_no_client_queries(spark, spark_config) -> None:
    """With no Spark job but its own for ``active_seconds``, the refresher leaves new commits to the next query;
    a client's query makes it work again."""
    config, topic = spark_config, f"refresh-{uuid.uuid4().hex[:8]}"
    register_tables(spark, config)
    _merge(spark, config, topic, 1)
    refresher = SnapshotRefresher(spark, config, interval=0.2, tables=(WINDOW_COUNTS,), active_seconds=0.5)
    time.sleep(1.0)
    assert refresher.tick() == [] and refresher.refreshes == 0  # the table moved, but nobody asked for a second

    count, _ = _client_query(spark, topic, f"{topic}-client")
    assert count == 1
    _merge(spark, config, topic, 2)
    assert refresher.tick() == ["window_counts"]
    assert refresher.tick() == []  # its own jobs keep it active, but nothing moved
