"""The daily maintenance does work proportional to what changed. The plan (pure) from what the Delta
log says of each table (:class:`kdq.spark.maintenance.TableState`): OPTIMIZE names exactly the closed partitions
with files added since their compaction, nothing when there are none; retention only with archive partitions
before its cutoff; VACUUM LITE unless the table's last data commit was vacuumed at least the retention later,
FULL once a week."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace

import pytest

from kdq.spark.maintenance import (
    TableState,
    closed_hours_plan,
    compaction_where,
    first_open_hour,
    maintenance_plan,
    vacuum_needed,
)
from kdq.tables import ALL_TABLES
from tests.conftest import make_config

TODAY = dt.date(2026, 11, 24)  # a Tuesday
HOUR_MS = 3_600_000


def _tables(**states: TableState) -> dict[str, TableState]:
    return {spec.name: states.get(spec.name, TableState()) for spec in ALL_TABLES}


def test_compaction_names_exactly_the_closed_partitions_with_new_files() -> None:
    where, chosen = compaction_where("window_date", {"2026-11-24", "2026-11-20", "2026-11-23"}, TODAY)
    assert where == "window_date IN (DATE'2026-11-20', DATE'2026-11-23')" and chosen == ("2026-11-20", "2026-11-23")
    where, chosen = compaction_where("event_hour", {"2026-11-23-23", "2026-11-24-00", "2026-11-23-02"}, TODAY)
    assert where == "event_hour IN ('2026-11-23-02', '2026-11-23-23')"
    assert compaction_where("window_date", {"2026-11-24"}, TODAY) == (None, ())  # only today's: open
    assert compaction_where("event_hour", set(), TODAY) == (None, ())


def test_the_window_tables_are_compacted_by_date_and_hour() -> None:
    """window_counts and summaries are partitioned by (window_date, window_hour): the plan keys them as one hour
    value and names the pairs, per date."""
    where, chosen = compaction_where("window_hour", {"2026-11-23-23", "2026-11-24-00", "2026-11-23-02", "2026-11-22-05"}, TODAY)
    assert where == (
        "(window_date = DATE'2026-11-22' AND window_hour IN (5)) OR (window_date = DATE'2026-11-23' AND window_hour IN (2, 23))"
    )
    assert chosen == ("2026-11-22-05", "2026-11-23-02", "2026-11-23-23")
    assert compaction_where("window_hour", {"2026-11-24-03"}, "2026-11-24-04")[1] == ("2026-11-24-03",)  # an hour key
    assert compaction_where("window_hour", {"2026-11-24-04"}, "2026-11-24-04") == (None, ())


def test_closed_hours_of_today_are_compacted_once_past_their_lateness() -> None:
    """The hourly batch layer compacts today's hours whose windows the stream can no longer count in: the
    counts' allowed lateness (a minute) after the hour's end in the archive and window_counts, the summaries'
    (30 minutes here) in summaries."""
    config = SimpleNamespace(stream=SimpleNamespace(allowed_lateness_seconds=60),
                             summaries=[SimpleNamespace(allowed_lateness_seconds=1800)])
    now = int(dt.datetime(2026, 11, 24, 5, 20, tzinfo=dt.UTC).timestamp() * 1000)
    assert first_open_hour(1800, now) == "2026-11-24-04"  # 05:20 - 30 min = 04:50: hour 04 may still get records
    assert first_open_hour(60, now) == "2026-11-24-05"
    hours = frozenset({"2026-11-24-02", "2026-11-24-03", "2026-11-24-04", "2026-11-24-05"})
    tables = _tables(raw_archive=TableState(compactable=hours), window_counts=TableState(compactable=hours),
                     summaries=TableState(compactable=hours))
    steps = {s.table: s for s in closed_hours_plan(config, tables, now)}
    assert steps["raw_archive"].where == "event_hour IN ('2026-11-24-02', '2026-11-24-03', '2026-11-24-04')"
    assert steps["window_counts"].where == "(window_date = DATE'2026-11-24' AND window_hour IN (2, 3, 4))"
    assert steps["summaries"].where == "(window_date = DATE'2026-11-24' AND window_hour IN (2, 3))"
    assert {s.action for s in steps.values()} == {"optimize"}  # nothing else: no retention, no VACUUM
    tables = _tables(window_counts=TableState(compactable=frozenset({"2026-11-24-05"})))
    assert all(s.skipped == "no closed hour has files added since it was compacted"
               for s in closed_hours_plan(config, tables, now))


def test_only_reformatted_dates_and_hours_reach_the_sql() -> None:
    """Partition values come from the log (data): anything that is not a date or an hour kdq writes is left
    out, never quoted into the predicate."""
    hostile = {"2026-11-20') OR (1=1", "x' OR '1'='1", "2026-11-2", "__HIVE_DEFAULT_PARTITION__", "2026-11-20-3"}
    assert compaction_where("event_hour", hostile | {"2026-11-20-03"}, TODAY)[0] == "event_hour IN ('2026-11-20-03')"
    assert compaction_where("window_date", hostile, TODAY) == (None, ())
    assert compaction_where("window_hour", hostile, TODAY) == (None, ())


def test_nothing_changed_plans_no_work(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    vacuumed = TableState(last_data_commit_ms=0, last_vacuum_ms=200 * HOUR_MS)
    tables = {spec.name: TableState(partitions=frozenset({"2026-11-23-05"} if spec.name == "raw_archive" else set()),
                                    last_data_commit_ms=vacuumed.last_data_commit_ms,
                                    last_vacuum_ms=vacuumed.last_vacuum_ms) for spec in ALL_TABLES}
    steps = maintenance_plan(config, TODAY, 30, tables=tables)
    assert len(steps) == len(maintenance_plan(config, TODAY, 30))  # the same steps, every one skipped
    assert all(step.skipped for step in steps), [s for s in steps if not s.skipped]
    reasons = {s.action: s.skipped for s in steps}
    assert reasons["optimize"] == "no closed partition has files added since it was compacted"
    assert reasons["retire"] == "no archive partition before 2026-10-25"
    assert reasons["vacuum"].startswith("no data commit since a VACUUM")


def test_a_change_plans_work_only_where_it_is(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    tables = _tables(
        raw_archive=TableState(partitions=frozenset({"2026-10-01-07", "2026-11-23-05", "2026-11-24-01"}),
                               compactable=frozenset({"2026-11-23-05", "2026-11-24-01"})),
        window_counts=TableState(compactable=frozenset({"2026-11-24-00"})),  # today's only: open
    )
    steps = {(s.action, s.table): s for s in maintenance_plan(config, TODAY, 30, tables=tables)}
    archive = steps[("optimize", "raw_archive")]
    assert not archive.skipped and archive.where == "event_hour IN ('2026-11-23-05')"
    assert archive.describe() == "OPTIMIZE raw_archive WHERE event_hour IN ('2026-11-23-05')"
    assert steps[("optimize", "window_counts")].skipped and steps[("optimize", "summaries")].skipped
    assert not steps[("retire", "raw_archive")].skipped  # 2026-10-01 is before the cutoff
    # No history known (a table never vacuumed): VACUUM LITE.
    vacuum = steps[("vacuum", "corrections")]
    assert (vacuum.skipped, vacuum.mode) == (None, "LITE")
    assert vacuum.describe() == "VACUUM corrections LITE RETAIN 168 HOURS"


def test_an_hour_written_before_the_last_runs_optimize_is_still_compacted(tmp_path: Path) -> None:
    """The hours 00-02 of yesterday were open when yesterday's run compacted at 03:00 and got no file since:
    they still hold their micro-batches' files, so they are compactable now (a log read of the commits since the
    last OPTIMIZE would miss them)."""
    config = make_config(tmp_path)
    tables = _tables(raw_archive=TableState(partitions=frozenset({"2026-11-23-00", "2026-11-23-01"}),
                                            compactable=frozenset({"2026-11-23-00", "2026-11-23-01"})))
    [step] = [s for s in maintenance_plan(config, TODAY, 30, tables=tables) if s.table == "raw_archive" and s.action == "optimize"]
    assert step.partitions == ("2026-11-23-00", "2026-11-23-01")


def test_vacuum_is_skipped_only_when_every_removed_file_was_already_eligible() -> None:
    assert vacuum_needed(TableState(), 168)  # nothing known
    assert vacuum_needed(TableState(last_data_commit_ms=0), 168)  # never vacuumed
    assert vacuum_needed(TableState(last_data_commit_ms=0, last_vacuum_ms=167 * HOUR_MS), 168)
    assert not vacuum_needed(TableState(last_data_commit_ms=0, last_vacuum_ms=168 * HOUR_MS), 168)


def test_a_weekly_full_vacuum_is_skipped_only_on_a_table_younger_than_the_retention(tmp_path: Path) -> None:
    """The weekly FULL VACUUM also deletes files of writes that died before their commit, so a quiet table
    gets it; a table created less than the retention ago does not (every file in its folder is younger than
    the retention: `make run` started on a Sunday listed every table's folder for nothing)."""
    config = make_config(tmp_path)
    sunday = dt.date(2026, 11, 29)
    now = 1_000 * HOUR_MS
    quiet = {spec.name: TableState(last_data_commit_ms=0, last_vacuum_ms=500 * HOUR_MS, created_ms=0) for spec in ALL_TABLES}
    vacuums = [s for s in maintenance_plan(config, sunday, 30, tables=quiet, now_ms=now) if s.action == "vacuum"]
    assert {(s.mode, s.skipped) for s in vacuums} == {("FULL", None)}
    young = {spec.name: TableState(last_data_commit_ms=now - HOUR_MS, created_ms=now - 2 * HOUR_MS) for spec in ALL_TABLES}
    vacuums = [s for s in maintenance_plan(config, sunday, 30, tables=young, now_ms=now) if s.action == "vacuum"]
    assert {s.mode for s in vacuums} == {"FULL"}
    assert {s.skipped for s in vacuums} == {"the table is younger than the 168 hours retention: nothing it removed can go yet"}


@pytest.mark.parametrize("lateness_days", [2])
def test_a_lateness_over_a_day_keeps_changed_partitions_open(tmp_path: Path, lateness_days: int) -> None:
    config = make_config(tmp_path, stream={"allowed_lateness_seconds": lateness_days * 86400})
    tables = _tables(window_counts=TableState(compactable=frozenset({"2026-11-22-23", "2026-11-23-00"})))
    [step] = [s for s in maintenance_plan(config, TODAY, 30, tables=tables) if s.table == "window_counts" and s.action == "optimize"]
    assert step.where == "(window_date = DATE'2026-11-22' AND window_hour IN (23))"


def test_no_vacuum_of_a_table_younger_than_the_retention() -> None:
    """A table created less than the retention ago has nothing VACUUM may delete (every file it removed is
    younger): the plan skips it, and says so; an older one, never vacuumed, is vacuumed."""
    config = make_config(Path("/tmp/kdq-unused"))
    now = 1_000 * HOUR_MS
    young = TableState(last_data_commit_ms=now - HOUR_MS, created_ms=now - 167 * HOUR_MS)
    old = TableState(last_data_commit_ms=now - HOUR_MS, created_ms=now - 168 * HOUR_MS)
    assert not vacuum_needed(young, 168, now) and vacuum_needed(old, 168, now)
    assert vacuum_needed(young, 168)  # no instant given: ages unknown
    steps = maintenance_plan(config, TODAY, 30, tables=_tables(window_counts=young, raw_archive=old), now_ms=now)
    vacuums = {s.table: s for s in steps if s.action == "vacuum"}
    assert vacuums["window_counts"].skipped == "the table is younger than the 168 hours retention: nothing it removed can go yet"
    assert vacuums["raw_archive"].skipped is None
