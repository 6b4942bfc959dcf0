"""The typed result of a counts push reads and writes exactly the ``push`` object the job reports have always
held (:func:`kdq.push_order.push_ordered`'s keys; ``influx_error`` only when InfluxDB refused); that of a
summaries push the ``summaries_push`` object (``summary_messages``, ``influx_ok``, ``influx_error``)."""

from __future__ import annotations

from kdq.spark.outputs import CountsPush
from kdq.spark.summaries import SummariesPush, push_summary_corrections
from kdq.step_clock import StepClock


def test_a_counts_push_keeps_the_report_keys() -> None:
    assert CountsPush().to_dict() == {"metrics_sent": 0, "influx_points": 0, "influx_skipped": 0, "influx_ok": True}
    ok = {"metrics_sent": 3, "influx_points": 1, "influx_skipped": 1, "influx_ok": True}
    refused = {"metrics_sent": 3, "influx_points": 0, "influx_skipped": 0, "influx_ok": False, "influx_error": "down"}
    for pushed in (ok, refused):
        assert CountsPush.from_dict(pushed).to_dict() == pushed
        assert list(CountsPush.from_dict(pushed).to_dict()) == list(pushed)
    assert not CountsPush.from_dict(refused).influx_ok and CountsPush.from_dict(refused).influx_error == "down"


def test_a_summaries_push_keeps_the_report_keys() -> None:
    assert SummariesPush().to_dict() == {"summary_messages": 0, "influx_ok": True}
    refused = {"summary_messages": 2, "influx_ok": False, "influx_error": "down"}
    for pushed in ({"summary_messages": 2, "influx_ok": True}, refused):
        assert SummariesPush.from_dict(pushed).to_dict() == pushed
        assert list(SummariesPush.from_dict(pushed).to_dict()) == list(pushed)
    assert not SummariesPush.from_dict(refused).influx_ok and SummariesPush.from_dict(refused).influx_error == "down"
    # No corrected group: nothing is read or sent (no Spark session, no config needed).
    assert push_summary_corrections(None, None, []) == SummariesPush()


def test_a_step_clock_in_milliseconds_keeps_whole_milliseconds_per_step() -> None:
    into: dict[str, int] = {"earlier": 5}
    clock = StepClock(into, millis=True)
    clock.lap("read")
    clock.lap("write")
    assert list(into) == ["earlier", "read", "write"] and all(isinstance(v, int) and v >= 0 for v in into.values())
    seconds = StepClock()
    seconds.lap("judge")
    assert isinstance(seconds.durations["judge"], float) and str(seconds).startswith("judge ")
