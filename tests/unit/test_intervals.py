"""Batch intervals and the batch jobs' time arguments (pure Python)."""

from __future__ import annotations

import pytest
from spark_jobs import batch_recompute, influx_catch_up, reconcile

from kdq.intervals import iso, parse_time_ms, resolve_interval

W0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z


def test_times_are_epoch_millis_or_iso8601_utc_by_default() -> None:
    assert parse_time_ms(str(W0)) == W0
    assert parse_time_ms("2023-11-14T22:13:20Z") == W0
    assert parse_time_ms("2023-11-14T23:13:20+01:00") == W0
    assert parse_time_ms("2023-11-14T22:13:20") == W0  # no zone: UTC
    assert parse_time_ms("2023-11-14T22:13:20.5Z") == W0 + 500
    assert iso(W0) == "2023-11-14T22:13:20.000Z"
    with pytest.raises(ValueError, match="ISO-8601"):
        parse_time_ms("yesterday")


def test_default_interval_is_the_last_full_hour_and_empty_ones_are_rejected() -> None:
    hour = 3_600_000
    now = W0 + 5  # 22:13:20.005
    assert resolve_interval(None, None, now_ms=now) == (W0 // hour * hour - hour, W0 // hour * hour)
    assert resolve_interval(W0, None, now_ms=now + 2 * hour) == (W0, W0 // hour * hour + 2 * hour)
    assert resolve_interval(None, W0) == (W0 - hour, W0)
    with pytest.raises(ValueError, match="before its end"):
        resolve_interval(W0, W0)


def test_job_arguments(capsys) -> None:
    args = batch_recompute.parse_args(["--start", "2023-11-14T22:00:00Z", "--end", str(W0), "--run-id", "r1", "--skip-push"])
    assert (args.start, args.end, args.run_id, args.skip_push, args.reason) == (W0 - 800_000, W0, "r1", True, "late_data")
    with pytest.raises(SystemExit):
        batch_recompute.parse_args(["--start", str(W0), "--end", str(W0 - 1)])
    assert "before its end" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        batch_recompute.parse_args(["--start", "noon"])
    args = influx_catch_up.parse_args(["--since", "2023-11-14T22:13:20Z", "--force"])
    assert (args.since, args.force) == (W0, True)


def test_reconcile_after_recompute_needs_the_interval(capsys) -> None:
    """The hourly DAG's check: ``--after-recompute`` with the run's data interval; alone it is refused."""
    args = reconcile.parse_args(["--from", "2023-11-14T22:00:00Z", "--to", "2023-11-14T23:00:00Z", "--after-recompute"])
    assert (args.from_ms, args.to_ms, args.after_recompute) == (W0 - 800_000, W0 - 800_000 + 3_600_000, True)
    assert reconcile.parse_args([]).after_recompute is False
    with pytest.raises(SystemExit):
        reconcile.parse_args(["--after-recompute"])
    assert "--after-recompute needs --from and --to" in capsys.readouterr().err
