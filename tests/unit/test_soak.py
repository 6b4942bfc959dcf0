"""The soak run's figures (benchmarks.soak): per-bucket batch costs and latency, and the flatness verdict."""

from __future__ import annotations

from datetime import UTC, datetime

from benchmarks.soak import batch_costs, bucket_figures, counted_batches, flatness, markdown

START_MS = int(datetime(2026, 11, 29, 6, 0, tzinfo=UTC).timestamp() * 1000)
MINUTE = 60_000


def record(batch_id: int, at_ms: int, rows: int, total_ms: int, classify_ms: int, **steps: int) -> dict:
    stamp = datetime.fromtimestamp(at_ms / 1000, UTC).isoformat().replace("+00:00", "Z")
    return {"batch_id": batch_id, "timestamp": stamp, "input_rows": rows,
            "duration_ms": {"triggerExecution": total_ms},
            "writer_ms": {"classify_archive": classify_ms, **steps}}


def test_a_batch_fixed_cost_is_its_duration_without_the_per_record_step():
    costs = batch_costs(record(3, START_MS, 2000, 5000, 1500, before=900, merge_counts=1600))
    assert costs["batch_s"] == 5.0
    assert costs["fixed_s"] == 3.5
    assert costs["per_record_us"] == 750.0  # 1,500 ms over 2,000 records
    assert costs["before_s"] == 0.9 and costs["merge_counts_s"] == 1.6


def test_a_batch_without_step_timings_or_records_has_no_costs():
    assert batch_costs({"batch_id": 1, "input_rows": 10, "duration_ms": {"triggerExecution": 100}}) is None
    assert batch_costs(record(1, START_MS, 0, 100, 10)) is None


def test_a_replayed_batch_counts_once_with_its_last_attempt_and_empty_batches_not_at_all():
    progress = [
        record(1, START_MS, 100, 4000, 1000),
        record(2, START_MS + 5000, 100, 9000, 1000),   # killed, replayed below
        {"batch_id": 3, "timestamp": "2026-11-29T06:00:20Z", "input_rows": 0},
        record(2, START_MS + 30000, 100, 6000, 1000),
    ]
    batches = counted_batches(progress)
    assert [b["batch_id"] for b in batches] == [1, 2]
    assert batches[1]["duration_ms"]["triggerExecution"] == 6000


def test_buckets_hold_the_batches_triggered_and_the_records_produced_in_them():
    progress = [
        record(1, START_MS + 1 * MINUTE, 1000, 4000, 1000),
        record(2, START_MS + 2 * MINUTE, 1000, 6000, 1000),
        record(3, START_MS + 11 * MINUTE, 3000, 9000, 3000),
        record(4, START_MS + 25 * MINUTE, 1000, 1000, 500),  # after the end: left out
    ]
    latencies = [(START_MS + 30_000, 2.0, 99), (START_MS + 40_000, 10.0, 1), (START_MS + 12 * MINUTE, 5.0, 10)]
    buckets = bucket_figures(progress, latencies, START_MS, START_MS + 20 * MINUTE, 10 * MINUTE,
                             recompute_runs=[(START_MS + 15 * MINUTE, START_MS + 16 * MINUTE)],
                             cores={0: {"stream": 1.4, "kafka": 0.1}}, peak_rss={1: 2_500_000_000})
    first, second = buckets
    assert (first["batches"], first["rows"], second["batches"], second["rows"]) == (2, 2000, 1, 3000)
    assert first["fixed_s_p50"] == 4.0  # fixed costs 3 s and 5 s
    assert second["fixed_s_p50"] == 6.0
    assert first["records_measured"] == 100 and second["records_measured"] == 10
    assert first["latency_s"]["p50"] == 2.0 and first["latency_s"]["p99"] == 2.0  # 99 of 100 records took 2 s
    assert second["latency_s"]["p99"] == 5.0
    assert (first["recompute_active"], second["recompute_active"]) == (False, True)
    assert first["stream_cores"] == 1.4 and second["stream_cores"] is None
    assert second["stream_peak_rss_gb"] == 2.5
    assert "| 0–10 | 2 | 2,000 |" in markdown({"buckets": buckets})


def _buckets(fixed: list[float], p99: list[float]) -> list[dict]:
    return [{"batches": 10, "fixed_s_p50": f, "latency_s": {"p99": p}} for f, p in zip(fixed, p99, strict=True)]


def test_a_run_whose_fixed_cost_and_p99_stay_level_is_flat():
    # 2 hours of 10-minute buckets; the first bucket (warm-up) is slow and left out.
    fixed = [9.0] + [3.0] * 5 + [3.1] * 6 + [3.2] * 6
    p99 = [30.0] + [8.0] * 11 + [8.5] * 6
    verdict = flatness(_buckets(fixed[:12], p99[:12]) + _buckets(fixed[12:], p99[12:]), 10)
    assert verdict["flat"] is True
    assert verdict["fixed_s_p50"] == {"first": 3.0, "last": 3.2, "ratio": 1.07}
    assert verdict["verdict"].startswith("flat")


def test_a_fixed_cost_that_creeps_is_not_flat():
    fixed = [3.0 + 0.2 * i for i in range(12)]  # +0.2 s every 10 minutes: 3.2 s at first, 5.2-6.2 s at last
    verdict = flatness(_buckets(fixed, [8.0] * 12), 10)
    assert verdict["flat"] is False
    assert verdict["fixed_s_p50"]["ratio"] > 1.2
    assert verdict["verdict"].startswith("NOT flat")


def test_a_run_too_short_to_compare_gives_no_verdict():
    assert flatness(_buckets([3.0, 3.0], [8.0, 8.0]), 10)["flat"] is None
