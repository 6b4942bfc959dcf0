"""The InfluxDB push state under concurrent writers.

The stream records failed pushes while the batch jobs record theirs and the catch-up clears them, each
in its own process: every read-modify-write of ``influx_push_state.json`` must hold a lock, and a catch-up
clears only the failures recorded before it started.
"""

from __future__ import annotations

import multiprocessing
import time

from kdq.stream.state import InfluxPushState
from tests.conftest import make_config

PROCESSES = 4
RECORDS = 60


def _record_many(data_dir: str, offset: int) -> None:
    state = InfluxPushState(make_config(data_dir))
    for i in range(RECORDS):
        state.record_failure(1_000 + offset * RECORDS + i, f"p{offset} #{i}")


def test_concurrent_record_failure_loses_no_update(tmp_path) -> None:
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_record_many, args=(str(tmp_path), n)) for n in range(PROCESSES)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    state = InfluxPushState(make_config(tmp_path)).read()
    assert state["failures"] == PROCESSES * RECORDS
    assert state["pending_since_ms"] == 1_000


def test_a_failure_recorded_while_the_catch_up_ran_survives_its_clear(tmp_path) -> None:
    state = InfluxPushState(make_config(tmp_path))
    state.record_failure(1_000, "InfluxDB down")
    time.sleep(0.01)
    started = int(time.time() * 1000)  # the catch-up starts, reads every row updated since 1000 ...
    time.sleep(0.01)
    # ... while the stream fails again for a batch whose rows the catch-up's read may not hold
    state.record_failure(started - 5, "InfluxDB down again")
    state.clear(started)
    assert state.read()["pending_since_ms"] == started - 5

    # the next catch-up covers it
    time.sleep(0.01)
    assert state.clear(int(time.time() * 1000), covered_from_ms=started - 5) is True
    assert state.read()["pending_since_ms"] is None


def test_a_catch_up_from_a_later_time_keeps_the_earlier_failure(tmp_path) -> None:
    state = InfluxPushState(make_config(tmp_path))
    state.record_failure(1_000, "down", now_ms=2_000)
    state.record_failure(5_000, "down", now_ms=6_000)
    assert state.clear(10_000, covered_from_ms=3_000) is False  # `--since` after the first failure
    assert state.read()["pending_since_ms"] == 1_000
    assert state.clear(11_000, covered_from_ms=1_000) is True


def test_many_failures_stay_bounded_and_conservative(tmp_path) -> None:
    state = InfluxPushState(make_config(tmp_path))
    for i in range(200):
        state.record_failure(10_000 - i, "down", now_ms=1_000 + i)
    read = state.read()
    assert len(read["open"]) == InfluxPushState.MAX_OPEN
    assert read["pending_since_ms"] == 10_000 - 199
    # a clear that started before the last failure keeps the earliest window pending (merged, conservative)
    assert state.clear(1_150) is False
    assert state.read()["pending_since_ms"] <= 10_000 - 150


def test_a_state_file_from_before_the_open_list_is_cleared_as_before(tmp_path) -> None:
    from kdq.stream.state import atomic_write_json

    state = InfluxPushState(make_config(tmp_path))
    atomic_write_json(state.path, {"pending_since_ms": 1_000, "failures": 3})
    assert state.clear(5_000) is True
    assert state.read()["pending_since_ms"] is None
