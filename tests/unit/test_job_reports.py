"""The job report schema (kdq.job_reports): what jobs print is what operators read back."""

from __future__ import annotations

import json

from kdq.job_reports import (
    JobReport,
    RebuildReport,
    RecomputeReport,
    ReconcileReport,
    SummariesRecomputeReport,
)


def test_a_report_prints_one_json_object_and_reads_back_the_same() -> None:
    report = RecomputeReport(
        run_id="r1", interval_start="2026-11-24T03:00:00Z", interval_end="2026-11-24T04:00:00Z", late_windows=2,
        corrections=1, changes=[{"topic": "t", "window_start_ms": 1, "status": "valid", "old": 1, "new": 2}],
        summaries=SummariesRecomputeReport(late_windows=1, push={"summary_messages": 3, "influx_ok": True}),
    )
    printed = json.loads(report.to_json())
    assert printed["late_windows"] == 2 and printed["ok"] is True and printed["push"] is None
    assert printed["summaries"]["late_windows"] == 1 and printed["summaries"]["push"]["summary_messages"] == 3
    again = RecomputeReport.from_dict(printed)
    assert again == report and isinstance(again.summaries, SummariesRecomputeReport)
    # report["key"] reads the printed form, so callers holding either read them alike.
    assert report["summaries"] == printed["summaries"] and report["corrections"] == 1


def test_readers_ignore_unknown_keys_and_default_missing_ones() -> None:
    report = RecomputeReport.from_dict({"late_windows": 0, "added_by_a_newer_job": 1})
    assert report.late_windows == 0 and report.summaries == SummariesRecomputeReport() and report.ok


def test_found_late_windows_covers_counts_and_summaries() -> None:
    assert not RecomputeReport().found_late_windows
    assert RecomputeReport(late_windows=1).found_late_windows
    assert RecomputeReport(summaries=SummariesRecomputeReport(late_windows=1)).found_late_windows
    # A report printed before streaming summaries existed (or without any) reads as "none".
    assert not RecomputeReport.from_dict({"late_windows": 0, "summaries": {"late_windows": 0, "corrections": 0}}).found_late_windows


def test_a_keyword_key_is_spelled_as_in_the_json() -> None:
    assert json.loads(RebuildReport(from_="a", to="b").to_json())["from"] == "a"
    assert ReconcileReport.from_dict({"from": "x", "to": None}).from_ == "x"


def test_the_summaries_side_of_a_report_is_spelled_summaries() -> None:
    from kdq.job_reports import PushReport

    assert {"summaries_corrections", "summaries_push"} <= set(json.loads(RebuildReport().to_json()))
    assert "summaries_push" in json.loads(PushReport().to_json())
    assert "push" in json.loads(RecomputeReport().to_json())["summaries"]


def test_every_report_has_ok_and_seconds() -> None:
    for cls in JobReport.__subclasses__():
        printed = json.loads(cls().to_json())
        assert printed["ok"] is True and printed["seconds"] == 0.0, cls


def test_evaluations_of_one_run_combine_into_one_report() -> None:
    from kdq.job_reports import ExpectationsReport

    first = ExpectationsReport(now_ms=1, counts_version=4, incidents_changed=1, notifications_total=1,
                               notifications=[{"id": "a#v1:open"}], open_incidents=1,
                               step_seconds={"read": 1.5, "judge": 0.25, "deliver": 0.5},
                               delivery={"channels": ["hook"], "sent": {"hook": 1}, "failed": {}, "errors": ["x"],
                                         "skipped_already_sent": 0})
    quiet = ExpectationsReport(now_ms=2, counts_version=5, open_incidents=1, step_seconds={"read": 2.0, "judge": 0.5},
                               delivery={"channels": ["hook"], "sent": {}, "failed": {"hook": 1}, "errors": [],
                                         "skipped_already_sent": 1})
    last = ExpectationsReport(now_ms=3, counts_version=6, incidents_changed=1, notifications_total=1,
                              notifications=[{"id": "a#v2:resolve"}], open_incidents=0,
                              delivery={"channels": ["hook"], "sent": {"hook": 1}, "failed": {}, "errors": ["y"],
                                        "skipped_already_sent": 0})
    both = ExpectationsReport.combined([first, quiet, last])
    assert (both.now_ms, both.counts_version, both.open_incidents, both.evaluations) == (3, 6, 0, 3)
    assert (both.incidents_changed, both.notifications_total) == (2, 2)
    assert [n["id"] for n in both.notifications] == ["a#v1:open", "a#v2:resolve"]
    assert both.delivery == {"channels": ["hook"], "sent": {"hook": 2}, "failed": {"hook": 1}, "errors": ["x", "y"],
                             "skipped_already_sent": 1}
    assert both.step_seconds == {"read": 3.5, "judge": 0.75, "deliver": 0.5}  # where a run's time went
    assert both.ok and not ExpectationsReport.combined([first, ExpectationsReport(ok=False)]).ok
    assert ExpectationsReport.combined([quiet]).delivery == quiet.delivery
