"""The hourly recompute and its reconcile count the same rows.

Under `make run` the hourly run for [00:00, 01:00) failed its reconcile on correct data: a window had 14
rows counted by the stream and late rows ingested at 00:59:32 and 01:00:37. The recompute (running at
01:00:01-01:01:58) counted every archived row present when it read, the 01:00:37 one included (16), while
the `--after-recompute` check leaves out rows ingested at or after 01:00, the next run's to count (15).
Both sides now leave those rows out: a failed reconcile always means a real difference.
"""

from __future__ import annotations

from kdq.spark.recompute import recompute_interval
from kdq.spark.reconcile import count_mismatches
from kdq.spark.tables import ensure_tables
from tests.conftest import make_config
from tests.unit.test_batch_layer import HOUR, W0, _archive, _counts, _insert_counts

START = W0 + 2 * HOUR  # the hourly interval [START, END) of ingest time
END = START + HOUR
WINDOW = START - 112_000  # 00:58:08 of the interval's hour before: the window the late rows belong to


def test_recompute_and_reconcile_leave_the_next_intervals_rows_to_it(spark, tmp_path) -> None:
    config = make_config(tmp_path)
    ensure_tables(spark, config)
    counted = [("ops", i, WINDOW, True, True, START - 100_000, "stream") for i in range(14)]
    late_in_interval = [("ops", 14, WINDOW, True, False, START + 10 * 60_000, "stream")]
    late_after_end = [("ops", 15, WINDOW, True, False, END + 37_000, "stream")]  # ingested while the run ran
    _archive(spark, config, counted + late_in_interval + late_after_end)
    _insert_counts(spark, config, [("ops", WINDOW, "valid", 14)])

    report = recompute_interval(spark, config, (START, END), "hourly-1", push=False)
    assert report.corrections == 1
    assert _counts(spark, config)[("ops", WINDOW, "valid")] == (15, "batch")  # 16 before: the next run's row too
    total, listed, covered = count_mismatches(spark, config, ["ops"], START, END, after_recompute=True)
    assert (total, listed) == (0, []), listed
    assert covered["late_windows_checked"] == 1  # the window lies before the interval: checked as a late one

    # The next interval's run counts the row it was left.
    report = recompute_interval(spark, config, (END, END + HOUR), "hourly-2", push=False)
    assert report.corrections == 1
    assert _counts(spark, config)[("ops", WINDOW, "valid")] == (16, "batch")
    total, listed, _ = count_mismatches(spark, config, ["ops"], END, END + HOUR, after_recompute=True)
    assert (total, listed) == (0, []), listed


def _set_count(spark, config, window_ms: int, count: int) -> None:
    """What a rebuild (or a later interval's recompute) run before the check writes: an absolute count of every
    row archived when it read, the next interval's rows included."""
    from kdq.spark.tables import table_path
    from kdq.sql_literals import timestamp_literal
    from kdq.tables import WINDOW_COUNTS

    spark.sql(
        f"UPDATE delta.`{table_path(config, WINDOW_COUNTS)}` SET count = {count}, updated_by = 'batch' "
        f"WHERE topic = 'ops' AND status = 'valid' AND window_start = {timestamp_literal(window_ms)}"
    )


def test_reconcile_accepts_the_next_intervals_rows_counted_by_another_job(spark, tmp_path) -> None:
    """The chaos run's hourly reconcile failed on correct data: a rebuild of the hour ran after the interval
    ended and counted rows ingested after it (every archived row), which the check left out. A window now
    matches when it counts its rows and none, some or all of the next intervals' rows; one more or one fewer
    than that is still a mismatch."""
    config = make_config(tmp_path)
    ensure_tables(spark, config)
    inside = START + 60_000  # a window of the interval's own event time
    rows = [("ops", i, WINDOW, True, True, START - 100_000, "stream") for i in range(14)]
    rows += [("ops", 14, WINDOW, True, False, START + 10 * 60_000, "stream")]  # late, counted by the interval's run
    rows += [("ops", 15, WINDOW, True, False, END + 37_000, "stream")]  # late, ingested after the interval
    rows += [("ops", 20 + i, inside, True, True, inside + 1_000, "stream") for i in range(5)]
    rows += [("ops", 30, inside, True, False, END + 90_000, "stream")]  # late for `inside`, after the interval
    _archive(spark, config, rows)
    # As the interval's recompute left them: WINDOW lies before the interval (checked as a late window).
    _insert_counts(spark, config, [("ops", WINDOW, "valid", 15), ("ops", inside, "valid", 5)])
    assert count_mismatches(spark, config, ["ops"], START, END, after_recompute=True)[:2] == (0, [])

    for window, archived in ((WINDOW, 15), (inside, 5)):
        _set_count(spark, config, window, archived + 1)  # counted by another job: still no mismatch
        total, listed, _ = count_mismatches(spark, config, ["ops"], START, END, after_recompute=True)
        assert (total, listed) == (0, []), listed
        for wrong in (archived - 1, archived + 2):  # a loss; a record counted twice
            _set_count(spark, config, window, wrong)
            total, listed, _ = count_mismatches(spark, config, ["ops"], START, END, after_recompute=True)
            assert total == 1 and listed[0]["window_counts"] == wrong and listed[0]["archive"] == archived, listed
        _set_count(spark, config, window, archived + 1)
