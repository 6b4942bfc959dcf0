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


# -- the Kafka Streams baseline (benchmarks/kstreams.py): its output, its ground-truth check, the ratio --------


def test_kstreams_result_line_is_the_last_one_among_the_logs() -> None:
    from benchmarks.kstreams import parse_output

    out = "WARN something\nKSTREAMS_RESULT {\"msgs_per_s\": 1}\n[main] INFO x\nKSTREAMS_RESULT {\"msgs_per_s\": 2.5}\n"
    assert parse_output(out) == {"msgs_per_s": 2.5}
    with pytest.raises(ValueError, match="no result line"):
        parse_output("Exception in thread main\n")


def test_kstreams_output_records_parse_like_its_serializers() -> None:
    import struct

    from benchmarks.kstreams import parse_count, parse_key

    assert parse_key("bench-s-0|1700000000000|valid") == ("bench-s-0", 1_700_000_000_000, "valid")
    assert parse_key("odd|topic|5000|invalid") == ("odd|topic", 5000, "invalid")
    assert parse_count(struct.pack(">q", 123_456_789_012)) == 123_456_789_012  # LongSerializer: big-endian


def test_kstreams_counts_checked_against_the_ground_truth() -> None:
    from benchmarks.kstreams import check_counts

    expected = {"t0": {"valid": 90, "invalid": 10}, "t1": {"valid": 50, "invalid": 0}}
    late = {"t0": {"valid": 3, "invalid": 1}}  # 4 records beyond the grace, all in t0
    classified = {"t0|valid": 90, "t0|invalid": 10, "t1|valid": 50}
    # Every on-time record counted, the 4 late ones dropped (windows 0 and 1000 of each topic).
    counts = {("t0", 0, "valid"): 40, ("t0", 1000, "valid"): 47, ("t0", 0, "invalid"): 9, ("t1", 1000, "valid"): 50}
    c = check_counts(counts, expected, late, classified, dropped=4.0)
    assert c["ok"] and c["within_ground_truth"] and c["classified_matches"] and c["counted_plus_dropped_is_messages"]
    assert c["counted"] == {"valid": 137, "invalid": 9}
    assert (c["windows"], c["late_counted"], c["late_in_workload"], c["dropped_late"]) == (4, 0, 4, 4)
    # A late record its task still accepted (stream time not past its window's grace yet): within the truth.
    counts2 = {**counts, ("t0", 0, "valid"): 41}
    c = check_counts(counts2, expected, late, classified, dropped=3)
    assert c["ok"] and c["late_counted"] == 1
    # An on-time record not counted: out of bounds, even when the dropped metric makes the sum right.
    counts3 = {**counts, ("t1", 1000, "valid"): 49}
    c = check_counts(counts3, expected, late, classified, dropped=5)
    assert not c["ok"] and not c["within_ground_truth"]
    assert c["out_of_bounds"] == [{"topic": "t1", "status": "valid", "counted": 49, "expected": 50, "on_time": 50}]
    # Counted twice (more than the workload holds), or under a status that has none.
    assert not check_counts({**counts, ("t1", 0, "valid"): 1}, expected, late)["ok"]
    assert not check_counts({**counts, ("t1", 0, "invalid"): 1}, expected, late)["ok"]
    # Verdicts that differ from the ground truth, or a dropped count that does not add up.
    assert not check_counts(counts, expected, late, {**classified, "t1|invalid": 1}, dropped=4)["ok"]
    assert not check_counts(counts, expected, late, classified, dropped=2)["ok"]


def test_kdq_over_kstreams_is_against_its_best_completed_run() -> None:
    from benchmarks.kstreams import best, ratio
    from benchmarks.report import targets

    runs = [{"threads": 1, "msgs_per_s": 50_000.0}, {"threads": 2, "msgs_per_s": 64_000.0}, {"threads": 4, "error": "boom"}]
    assert best(runs)["threads"] == 2
    assert ratio(16_000, runs) == pytest.approx(0.25)
    assert ratio(None, runs) is None and ratio(16_000, [runs[2]]) is None
    run = {"schema": True, "rule": "orders", "baselines": [{"kind": "plain", "processes": 2, "msgs_per_s": 60_000}], "kstreams": runs,
           "catch_up": {"msgs_per_s": 64_000, "steady_msgs_per_s": 70_000}}
    row = next(r for r in targets({"runs": [run]}) if "Kafka Streams" in r[0])
    assert row[1:] == ("1.00× Kafka Streams, 2 threads (64,000 msgs/s)", "yes")


def test_ground_truth_by_topic_splits_kinds_into_verdicts() -> None:
    from collections import Counter

    from benchmarks.workload import totals_by_topic

    kinds = Counter({("a", VALID): 5, ("a", "neg_amount"): 2, ("a", "not_json"): 1, ("b", "not_utf8"): 3})
    assert totals_by_topic(kinds, schema=True) == {"a": {"valid": 5, "invalid": 3}, "b": {"valid": 0, "invalid": 3}}
    assert totals_by_topic(kinds, schema=False) == {"a": {"valid": 7, "invalid": 1}, "b": {"valid": 0, "invalid": 3}}


def test_a_failed_stream_run_keeps_its_whole_log(tmp_path) -> None:
    """The work dir of a benchmark run is removed at its end; a failed run's stream log must survive it."""
    from benchmarks.speed import StreamRun

    from tests.conftest import make_config

    config = make_config(tmp_path / "data")
    stream_dir = config.data_dir / "stream"
    stream_dir.mkdir(parents=True)
    (stream_dir / "stream.log").write_text("batch 0 ok\nCaused by: java.io.IOException: the real cause\nlast line\n")
    (stream_dir / "batch_failure.json").write_text('{"batch_id": 0}')
    run = StreamRun(config, trigger_seconds=None)
    run.pid = 4242
    error = run._failed("the speed layer exited", tmp_path / "kept")
    kept = Path(str(error).rsplit("whole stream log kept in ", 1)[1])
    assert kept.parent == tmp_path / "kept"
    assert "the real cause" in kept.read_text()
    assert (tmp_path / "kept" / kept.name.replace("stream.log", "batch_failure.json")).read_text() == '{"batch_id": 0}'


# -- the 1,000-active-topics variant (benchmarks/__main__.py topics1000): its settings, its target rows ------


def test_active_topics_variant_spreads_the_main_run_over_one_partition_topics() -> None:
    from benchmarks.__main__ import ACTIVE_TOPICS, active_topics_args, parse_args

    args = parse_args(["--messages", "1000"])
    assert "topics1000" in args.rule_variants and args.active_topics == ACTIVE_TOPICS == 1000
    variant = active_topics_args(args)
    assert (variant.topics, variant.partitions, variant.latency_rate, variant.messages) == (1000, 1, [5000], 1000)
    assert (args.topics, args.partitions, args.latency_rate) == (4, 3, [5000, 20000])  # the main run's untouched
    assert active_topics_args(parse_args(["--latency-rate", "2000,8000", "--active-topics", "50"])).latency_rate == [8000]
    assert active_topics_args(parse_args(["--quick"])).latency_rate == [5000]


def _bench_run(rule: str, topics: int, partitions: int, msgs_per_s: int, phases: dict[int, tuple[float, int]]) -> dict:
    """A speed-layer run as benchmarks.__main__ records it (after analyse); phases: rate → (p99, censored)."""
    return {
        "label": rule[0], "schema": True, "rule": rule,
        "workload": {"messages": 1_000_000, "message_bytes": 1024, "topics": topics, "partitions": partitions,
                     "invalid_ratio": 0.05, "out_of_order": 0.1, "late": 0.01},
        "produce": {"msgs_per_s": 90_000},
        "stream_settings": {"trigger_seconds": 2, "max_offsets_per_trigger": 200_000, "master": "local[2]", "shuffle_partitions": 2},
        "baselines": [{"kind": "plain", "processes": 2, "msgs_per_s": 40_000, "mb_per_s": 41.0, "matches_expected": True}],
        "catch_up": {"messages": 1_000_000, "batches": 5, "seconds": 50.0, "msgs_per_s": msgs_per_s, "mb_per_s": 20.0,
                     "steady_msgs_per_s": msgs_per_s, "first_batch_seconds": 9.0, "wall_seconds_incl_startup": 70.0,
                     "writer_ms_mean": {"merge": 2000.0},
                     "cpu": {"stream_cores": 1.5, "broker_cores": 0.2, "machine_cores": 1.9}},
        "checks": {"exactly_once": True, "archive_matches_expected": True, "counted_matches": True},
        "latency_phases": [
            {"target_msgs_per_s": rate, "achieved_msgs_per_s": rate, "seconds": 60, "drained": True, "exactly_once": True,
             "latency_s": {"p50": p99 / 2, "p95": p99 * 0.9, "p99": p99, "p100": p99 * 1.2}, "records_measured": rate * 60,
             "records_censored": censored, "peak_rss": 2**31, "cpu": {"stream_cores": 1.0, "broker_cores": 0.1}}
            for rate, (p99, censored) in phases.items()
        ],
        "peak_rss": 2**31,
    }


def test_active_topics_rows_compare_with_the_four_topic_run() -> None:
    from benchmarks.report import markdown, targets

    main = _bench_run("orders", 4, 3, 20_000, {5000: (10.0, 0), 20000: (30.0, 0)})
    ok = _bench_run("topics1000", 1000, 1, 17_000, {5000: (14.0, 0)})
    rows = {t: (v, met) for t, v, met in targets({"runs": [main, ok]})}
    assert rows["1,000 active topics ≥ 80% of the 4-topic throughput (same messages and bytes)"] == (
        "85% (17,000 vs 20,000 msgs/s)", "yes")
    assert rows["1,000 active topics: p99 at 5,000 msgs/s ≤ 1.5× the 4-topic p99"] == ("1.40× (p99 14.00 s vs 10.00 s)", "yes")
    # the variant's own latency phase is not one of the main run's p99 targets
    assert sum(t.startswith("end-to-end p99 ≤ 3 s at 5,000") for t in rows) == 1

    slow = _bench_run("topics1000", 1000, 1, 15_000, {5000: (16.0, 0)})
    rows = {t: (v, met) for t, v, met in targets({"runs": [main, slow]})}
    assert rows["1,000 active topics ≥ 80% of the 4-topic throughput (same messages and bytes)"][1] == "no"
    assert rows["1,000 active topics: p99 at 5,000 msgs/s ≤ 1.5× the 4-topic p99"] == ("1.60× (p99 16.00 s vs 10.00 s)", "no")

    censored = _bench_run("topics1000", 1000, 1, 17_000, {5000: (12.0, 500)})  # p99 a lower bound: not a yes
    rows = {t: (v, met) for t, v, met in targets({"runs": [main, censored]})}
    assert rows["1,000 active topics: p99 at 5,000 msgs/s ≤ 1.5× the 4-topic p99"] == ("≥ 1.20× (p99 ≥ 12.00 s vs 10.00 s)", "no")

    no_5000 = _bench_run("orders", 4, 3, 20_000, {2000: (5.0, 0)})
    rows = {t: (v, met) for t, v, met in targets({"runs": [no_5000, ok]})}
    assert rows["1,000 active topics: p99 at 5,000 msgs/s ≤ 1.5× the 4-topic p99"] == (
        "not measured (no 5,000 msgs/s phase in the 4-topic run)", "—")

    result = {"started_at": "2026-11-24T10:00:00Z", "command": "python -m benchmarks", "duration_seconds": 600, "runs": [main, ok],
              "machine": {"cpu": "cpu", "cores": 2, "memory_gb": 8, "os": "Linux", "python": "3.11", "java": "java 17",
                          "pyspark": "4.0", "delta": "4.0", "kafka_broker": "4.0", "spark_kafka_clients": "3.9",
                          "confluent_kafka": "2.6", "librdkafka": "2.6", "load_average_at_start": [0.1, 0.1, 0.1]}}
    lines = markdown(result).splitlines()
    title = ("### Speed layer vs baselines: with the `orders` rule over 1,000 active topics × 1 partition "
             "(the same messages and bytes, every topic receiving records)")
    section = lines[lines.index(title):]
    assert any(line.startswith("| **kdq speed layer**") and "**17,000**" in line for line in section)
    assert any(line.startswith("| 60 s at 5,000 msgs/s | 5,000 | 7.00 s |") for line in section)
    assert any(line.startswith("Kafka Streams: not run on these topics") for line in section)
    assert "| 1,000 active topics ≥ 80% of the 4-topic throughput (same messages and bytes) | 85% (17,000 vs 20,000 msgs/s) | yes |" in lines
