"""The typed result of a counts push reads and writes exactly the ``push`` object the job reports have always
held (:func:`kdq.push_order.push_ordered`'s keys; ``influx_error`` only when InfluxDB refused)."""

from __future__ import annotations

from kdq.spark.outputs import CountsPush
from kdq.step_clock import StepClock


def test_a_counts_push_keeps_the_report_keys() -> None:
    assert CountsPush().to_dict() == {"metrics_sent": 0, "influx_points": 0, "influx_skipped": 0, "influx_ok": True}
    ok = {"metrics_sent": 3, "influx_points": 1, "influx_skipped": 1, "influx_ok": True}
    refused = {"metrics_sent": 3, "influx_points": 0, "influx_skipped": 0, "influx_ok": False, "influx_error": "down"}
    for pushed in (ok, refused):
        assert CountsPush.from_dict(pushed).to_dict() == pushed
        assert list(CountsPush.from_dict(pushed).to_dict()) == list(pushed)
    assert not CountsPush.from_dict(refused).influx_ok and CountsPush.from_dict(refused).influx_error == "down"


def test_a_step_clock_in_milliseconds_keeps_whole_milliseconds_per_step() -> None:
    into: dict[str, int] = {"earlier": 5}
    clock = StepClock(into, millis=True)
    clock.lap("read")
    clock.lap("write")
    assert list(into) == ["earlier", "read", "write"] and all(isinstance(v, int) and v >= 0 for v in into.values())
    seconds = StepClock()
    seconds.lap("judge")
    assert isinstance(seconds.durations["judge"], float) and str(seconds).startswith("judge ")
