"""`kdq demo --burst N`: N invalid records now, to orders unless --topics says, then exit (what opens
an invalid_ratio incident from `make run`'s demo)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdq.cli import BURST_RATE, _demo_spec, build_parser
from kdq.traffic.generator import TrafficGenerator
from tests.conftest import make_config


def _spec(tmp_path: Path, *argv: str):
    return _demo_spec(make_config(tmp_path), build_parser().parse_args(["demo", *argv]))


def test_a_burst_is_only_invalid_records_of_now(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "--burst", "300", "--seed", "7")
    assert (spec.topics, spec.count, spec.invalid_ratio, spec.out_of_order, spec.late) == (
        (("orders", "orders"),), 300, 1.0, 0.0, 0.0)
    assert spec.rate == BURST_RATE and spec.duration_seconds is None
    records = TrafficGenerator(spec).records(300, now_ms=1_700_000_000_000)
    assert len(records) == 300 and not any(r.valid for r in records)
    assert {r.topic for r in records} == {"orders"}
    # Every record's event time is now: no out-of-order or late one lands in a past minute.
    assert {r.timestamp_ms for r in records} == {1_700_000_000_000}
    other = _spec(tmp_path, "--burst", "5", "--topics", "payments", "--rate", "2000")
    assert other.topics == (("payments", "payments"),) and other.rate == 2000


@pytest.mark.parametrize("argv", [["--burst", "0"], ["--burst", "5", "--detach"], ["--burst", "5", "--count", "3"],
                                  ["--burst", "5", "--duration", "10"]])
def test_a_burst_refuses_what_it_cannot_do(tmp_path: Path, argv: list[str]) -> None:
    with pytest.raises(ValueError, match="--burst"):
        _spec(tmp_path, *argv)
