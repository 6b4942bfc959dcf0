"""The benchmark harness's pure logic: percentiles, throughput from progress records, Delta commit times,
and the workload generator's ground truth (what the validator must say about each kind of message)."""

from __future__ import annotations

import json
from pathlib import Path

import fastjsonschema
import pytest
from benchmarks.measure import catch_up, commit_times, mean_breakdown, percentile, weighted_percentiles
from benchmarks.workload import INVALID_KINDS, SCHEMA_KINDS, VALID, Generator, expected_valid

ORDERS = Path(__file__).resolve().parents[2] / "config" / "rules" / "orders.schema.json"


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4, 5], 100) == 5
    assert percentile(list(range(101)), 99) == 99


def test_weighted_percentiles_are_nearest_rank() -> None:
    pairs = [(1.0, 98), (5.0, 1), (9.0, 1)]
    assert weighted_percentiles(pairs, (50, 99, 100)) == {50: 1.0, 99: 5.0, 100: 9.0}
    assert weighted_percentiles([], (50,)) == {}


def _progress(batch_id: int, rows: int, start: str, ms: int, writer: dict | None = None) -> dict:
    return {"batch_id": batch_id, "input_rows": rows, "timestamp": start, "duration_ms": {"triggerExecution": ms}, "writer_ms": writer or {}}


def test_catch_up_runs_from_first_to_last_backlog_batch() -> None:
    records = [
        _progress(0, 0, "2024-01-01T00:00:00.000Z", 100),  # idle trigger before the data: not counted
        _progress(1, 600, "2024-01-01T00:00:01.000Z", 4000),
        _progress(2, 400, "2024-01-01T00:00:05.000Z", 1000),
        _progress(3, 50, "2024-01-01T00:00:06.000Z", 1000),  # after the backlog
    ]
    cu = catch_up(records, 1000)
    assert cu is not None
    assert (cu.rows, cu.batches, cu.seconds) == (1000, 2, 5.0)
    assert cu.msgs_per_s == 200.0 and cu.steady_msgs_per_s == 400.0 and cu.first_batch_seconds == 4.0
    assert catch_up(records, 10_000) is None


def test_mean_breakdown_skips_the_first_batch() -> None:
    records = [
        _progress(1, 10, "2024-01-01T00:00:00Z", 1, {"archive": 100}),
        _progress(2, 10, "2024-01-01T00:00:01Z", 1, {"archive": 10}),
        _progress(3, 10, "2024-01-01T00:00:02Z", 1, {"archive": 20}),
    ]
    assert mean_breakdown(records) == {"archive": 15.0}


def test_commit_times_reads_txn_actions(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    (log / "00000000000000000000.json").write_text(json.dumps({"commitInfo": {}}) + "\n")
    (log / "00000000000000000001.json").write_text(
        json.dumps({"txn": {"appId": "a", "version": 7}}) + "\n" + json.dumps({"add": {}}) + "\n"
    )
    (log / "00000000000000000002.json").write_text(json.dumps({"txn": {"appId": "other", "version": 8}}) + "\n")
    times = commit_times(log, "a")
    assert list(times) == [7]
    assert times[7] == pytest.approx((log / "00000000000000000001.json").stat().st_mtime)


@pytest.mark.parametrize("kind", (VALID, *INVALID_KINDS))
def test_generated_messages_are_what_their_kind_says(kind: str) -> None:
    """The ground truth the benchmark checks kdq against: valid JSON, schema violations, not JSON, not UTF-8."""
    validate = fastjsonschema.compile(json.loads(ORDERS.read_text()))
    gen = Generator(1024, seed=7)
    for seq in (0, 1, 99, 123_456, 10**9 + 5):
        value = gen.value(kind, seq)
        assert 700 < len(value) < 1200
        try:
            doc = json.loads(value)
        except ValueError:
            assert kind in ("not_json", "not_utf8")
            continue
        assert kind not in ("not_json", "not_utf8")
        try:
            validate(doc)
            schema_ok = True
        except fastjsonschema.JsonSchemaException:
            schema_ok = False
        assert schema_ok == expected_valid(kind, schema=True)
        assert expected_valid(kind, schema=False) == (kind in (VALID, *SCHEMA_KINDS))


def test_sampler_skips_forks_that_have_not_exec_d() -> None:
    """A fork before exec shares its parent's pages: counting its RSS would double the JVM's."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from benchmarks.measure import ProcessSampler

    child = subprocess.Popen([sys.executable, "-c", "import os, time; os.fork(); time.sleep(3)"], start_new_session=True)
    try:
        time.sleep(1.0)
        sampler = ProcessSampler(child.pid)
        assert [p.pid for p in sampler._tree()] == [child.pid]
        assert sampler.sample() > 0 and sampler.cpu_seconds() >= 0
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the child and its fork
        child.wait()


def test_sweep_table_has_a_row_per_variant_and_latency_apart() -> None:
    from benchmarks.sweep import markdown

    row = {
        "name": "shuffle_1", "change": "spark.shuffle_partitions = 1", "msgs_per_s": 7761, "steady_msgs_per_s": 9002,
        "batches": 4, "first_batch_seconds": 32.9, "writer_ms_mean": {"classify_aggregate": 8232.0, "archive": 2060.0},
        "stream_cores": 1.7, "peak_rss": 2 * 2**30, "baselines": {"plain": 43727}, "exactly_once": True,
    }
    lat = {**row, "name": "trigger_1s", "change": "trigger every 1 s", "latency_s": {"p50": 9.5, "p95": 12.0, "p99": 13.1, "p100": 14.0},
           "latency_exactly_once": True}
    text = markdown([row, lat], {"started_at": "2026-11-22T21:00:00Z", "command": "python -m benchmarks.sweep", "minutes": 40})
    lines = text.splitlines()
    assert "| shuffle_1 | spark.shuffle_partitions = 1 | 7,761 | 9,002 | 4 | 32.9 | 8,232 | 2,060 | 0 | 1.7 | 2.00 | 43,727 | True |" in lines
    assert "| trigger_1s | trigger every 1 s | 9.5 | 12.0 | 13.1 | 14.0 | True |" in lines
    assert sum(line.startswith("| trigger_1s") for line in lines) == 1  # not in the throughput table
