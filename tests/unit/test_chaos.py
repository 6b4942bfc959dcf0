"""The chaos run's pure logic (benchmarks/chaos_logic.py): its traffic and ground truth, the fault plan,
the comparison of outputs with the truth, and what the report says after each fault.

The expected verdicts of the generated records are checked here with ``jsonschema`` and the rule files
(the generator never sees a rule), so a record stamped "valid" that its rule rejects fails this test.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import jsonschema
import pytest
from benchmarks import chaos_logic as cl

from tests.conftest import PROJECT_ROOT

NOW = 1_795_370_000_123
RULES = {
    cl.ORDERS: json.loads((PROJECT_ROOT / "config" / "rules" / "orders.schema.json").read_text()),
    cl.PAYMENTS: json.loads((PROJECT_ROOT / "config" / "rules" / "payments.schema.json").read_text()),
    cl.EVENTS: cl.EVENTS_SCHEMA,
}
EVENTS_WITHOUT_PATTERN = {
    **cl.EVENTS_SCHEMA,
    "properties": {**cl.EVENTS_SCHEMA["properties"], "s": {"type": "string"}},
}


def _no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicate key")
    return dict(pairs)


def _reject_constant(name):
    raise ValueError(name)


def parse(value: bytes | None):
    """UTF-8 JSON the way the README defines it: no duplicate keys, no NaN, no lone surrogates."""
    text = value.decode("utf-8")
    document = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant)
    text.encode("utf-8")  # lone surrogate escapes come back as unencodable code points
    json.dumps(document, ensure_ascii=False).encode("utf-8")
    return document


def expected_by_rule(record: cl.ChaosRecord) -> str:
    """What the README's rules say about a record, judged independently of the generator's stamp."""
    if record.value is None or len(record.value) > 256 * 1024:
        return cl.INVALID
    try:
        document = parse(record.value)
    except (UnicodeError, ValueError, RecursionError):
        return cl.INVALID
    try:
        jsonschema.validate(document, RULES[record.topic] if record.topic != cl.EVENTS else EVENTS_WITHOUT_PATTERN)
    except jsonschema.ValidationError:
        return cl.INVALID
    if record.topic == cl.EVENTS:
        s = document.get("s") if isinstance(document, dict) else None
        # `^(.*a){20}$` without Python's exponential backtracking: 20 a's, the last one at the end.
        if isinstance(s, str) and not (s.endswith("a") and s.count("a") >= 20):
            return cl.INVALID
        ts = document.get("ts")
        if isinstance(ts, bool) or not isinstance(ts, (int, str)):
            return cl.INVALID
        if isinstance(ts, int) and not 0 <= ts <= 253_402_300_799_999:
            return cl.INVALID
        if isinstance(ts, str):
            try:
                from datetime import datetime

                moment = datetime.fromisoformat(ts.replace("Z", "+00:00"))
            except ValueError:
                return cl.INVALID
            if moment.year < 1970:
                return cl.INVALID
    return cl.VALID


@pytest.fixture(scope="module")
def records() -> list[cl.ChaosRecord]:
    traffic = cl.ChaosTraffic(seed=11)
    return [traffic.record(NOW + 7 * i) for i in range(12_000)]


def test_every_topic_kind_and_timing_occurs(records) -> None:
    assert {r.topic for r in records} == set(cl.TOPICS)
    assert {r.kind for r in records} == {"valid", "invalid", "poison"}
    assert {r.timing for r in records} == {"on_time", "out_of_order", "late"}
    for r in records:
        assert 0 <= r.partition < cl.TOPICS[r.topic][1]


def test_the_stamped_status_is_what_the_rules_say(records) -> None:
    wrong = [
        (r.topic, r.kind, r.detail, (r.value or b"")[:80]) for r in records
        if r.detail not in ("ts_year_10000", "ts_missing") and expected_by_rule(r) != r.status
    ]
    assert wrong == []


def test_every_poison_of_the_issue_is_there_with_its_verdict(records) -> None:
    poison = Counter(r.detail for r in records if r.kind == "poison")
    assert set(poison) == set(cl.POISON_BY_NAME)
    assert {p.name for p in cl.POISONS if p.status == cl.VALID} == {
        "integer_beyond_64_bits", "ts_iso_with_offset", "nesting_100", "unicode_id",
    }
    values = {r.detail: r.value for r in records if r.kind == "poison"}
    assert values["ts_epoch_nanoseconds"] and b"ts" in values["ts_epoch_nanoseconds"]
    assert values["tombstone"] is None and values["empty_value"] == b""
    assert len(values["too_large"]) > 256 * 1024 > len(values["deep_nesting"])
    assert values["deep_nesting"].startswith(b"[" * 1000)
    assert b"\\ud800" in values["lone_surrogate_escape"]
    with pytest.raises(UnicodeDecodeError):
        values["encoded_surrogate"].decode("utf-8")


def test_windows_follow_the_event_time_of_each_topic(records) -> None:
    for r in records:
        if r.topic != cl.EVENTS:
            # Event time = the Kafka timestamp.
            assert r.window_ms == r.timestamp_ms // 1000 * 1000
            continue
        assert r.timestamp_ms // 1000 * 1000 <= NOW + 7 * 12_000  # Kafka timestamp: when produced
        try:
            ts = parse(r.value).get("ts")
        except (AttributeError, UnicodeError, ValueError, RecursionError):
            ts = None
        if r.kind == "poison" or ts is None:
            # Unreadable values and poison: the window of the Kafka timestamp.
            assert r.window_ms == r.timestamp_ms // 1000 * 1000, r
        elif isinstance(ts, int) and r.kind != "poison":
            assert r.window_ms == ts // 1000 * 1000, r


def test_late_records_are_beyond_the_allowed_lateness(records) -> None:
    lateness = cl.TrafficMix().allowed_lateness_seconds * 1000
    for r in records:
        if r.timing == "late":
            produced = r.timestamp_ms if r.topic == cl.EVENTS else None
            if produced is not None:
                assert r.window_ms + 1000 <= produced - lateness
        if r.timing == "out_of_order" and r.topic == cl.EVENTS:
            assert r.timestamp_ms - lateness < r.window_ms <= r.timestamp_ms


def test_the_same_seed_and_clock_give_the_same_records() -> None:
    a, b = cl.ChaosTraffic(seed=5), cl.ChaosTraffic(seed=5)
    assert [a.record(NOW + i) for i in range(500)] == [b.record(NOW + i) for i in range(500)]
    c = cl.ChaosTraffic(seed=6)
    assert [a.record(NOW + i) for i in range(50)] != [c.record(NOW + i) for i in range(50)]


def test_headers_carry_the_truth_and_the_tally_reads_them() -> None:
    record = cl.ChaosRecord(cl.ORDERS, 2, None, b"{}", NOW, cl.INVALID, 1_795_370_000_000, "invalid", "late", "x")
    truth = cl.Truth()
    truth.add(cl.ORDERS, 2, 10, record.headers())
    truth.add(cl.ORDERS, 2, 11, record.headers())
    truth.add(cl.ORDERS, 1, 0, record.headers("abort"))  # read_committed never shows these; counted apart
    truth.add(cl.ORDERS, 0, 3, [])
    assert truth.counts == Counter({(cl.ORDERS, 1_795_370_000_000, cl.INVALID): 2})
    assert truth.records == Counter({(cl.ORDERS, "invalid", "late", "x"): 2})
    assert truth.offsets == {(cl.ORDERS, 2, 10), (cl.ORDERS, 2, 11), (cl.ORDERS, 1, 0), (cl.ORDERS, 0, 3)}
    assert (truth.unstamped, truth.meant_to_abort) == (1, 1)
    summary = truth.summary()
    assert summary["records"] == 2 and summary["by_status"] == {cl.INVALID: 2} and summary["windows"] == 1


def test_the_truth_summarises_valid_records_by_the_documented_definitions() -> None:
    window = 1_795_369_980_000  # a minute boundary
    truth = cl.Truth()

    def add(offset, topic, status, second, value) -> None:
        record = cl.ChaosRecord(topic, 0, None, value, NOW, status, window + second * 1000, status, "on_time")
        truth.add(topic, 0, offset, record.headers(), value)

    add(1, cl.EVENTS, cl.VALID, 3, b'{"id":"a","ts":1,"n":5}')
    add(2, cl.EVENTS, cl.VALID, 59, b'{"id":"b","ts":1,"n":' + b"9" * 40 + b"}")  # read as a double, 1e40
    add(3, cl.EVENTS, cl.VALID, 60, b'{"id":"c","ts":1}')  # the next minute; no n: missing
    add(4, cl.EVENTS, cl.INVALID, 4, b'{"id":"d","ts":1,"n":-1}')  # never summarised
    add(5, cl.ORDERS, cl.VALID, 1, b'{"amount":12.5,"currency":"EUR"}')
    add(6, cl.ORDERS, cl.VALID, 2, b'{"amount":0.25,"currency":"EUR"}')
    add(7, cl.ORDERS, cl.VALID, 2, b'{"amount":"7","channel":"web"}')  # no currency: the null group
    add(8, cl.PAYMENTS, cl.VALID, 2, b'{"amount":1}')  # no summary on payments
    states = {}
    for raw in (b'{"n":1e999999999}', b'{"n":true}', b'{"n":-1e151}', b'{"n":-1e150}', b'{"n":null}'):
        cl.add_to_summaries(states, cl.EVENTS, window, raw)
    by_key = {k: (v.count, v.sum, v.min, v.max, dict(v.rejected)) for k, v in truth.summaries.items()}
    assert by_key == {
        ("chaos_event_n", cl.EVENTS, window, ()): (2, 5 + 1e40, 5.0, 1e40, {}),
        ("chaos_event_n", cl.EVENTS, window + 60_000, ()): (0, 0.0, None, None, {"missing": 1}),
        ("chaos_order_amount", cl.ORDERS, window, ("EUR",)): (2, 12.75, 0.25, 12.5, {}),
        ("chaos_order_amount", cl.ORDERS, window, (None,)): (0, 0.0, None, None, {"not_numeric": 1}),
    }
    (state,) = states.values()
    assert (state.count, state.min, dict(state.rejected)) == (
        1, -1e150, {"out_of_range": 2, "not_numeric": 1, "missing": 1})


def test_summaries_compare_by_value_and_name_what_is_lost_or_doubled() -> None:
    window = 1_795_369_980_000
    truth = cl.Truth()
    for offset, amount in enumerate((1.1, 2.2, 3.3)):
        value = json.dumps({"amount": amount, "currency": "USD"}).encode()
        record = cl.ChaosRecord(cl.ORDERS, 0, None, value, NOW, cl.VALID, window, cl.VALID, "on_time")
        truth.add(cl.ORDERS, 0, offset, record.headers(), value)
    row = ("chaos_order_amount", cl.ORDERS, window, {"currency": "USD"}, 3, 6.6000000000000005, 1.1, 3.3, {"missing": 0})
    got, duplicates = cl.summaries_from_rows([row])
    assert duplicates == [] and cl.compare_summaries(truth.summaries, got)["equal"]
    doubled, _ = cl.summaries_from_rows([(*row[:4], 4, 7.7, 1.1, 3.3, {})])
    result = cl.compare_summaries(truth.summaries, doubled)
    assert (result["equal"], result["lost"], result["counted_twice"], result["differing_keys"]) == (False, 0, 1, 1)
    lost = cl.compare_summaries(truth.summaries, {})
    assert (lost["lost"], lost["expected_records"], lost["counted_records"]) == (3, 3, 0)
    wrong_max, _ = cl.summaries_from_rows([(*row[:7], 3.4, {})])
    assert not cl.compare_summaries(truth.summaries, wrong_max)["equal"]
    _, duplicates = cl.summaries_from_rows([row, row])
    assert len(duplicates) == 1


def test_fault_plan_is_seeded_complete_and_spread() -> None:
    plan = cl.plan_faults(random.Random(3), 1200)
    assert plan == cl.plan_faults(random.Random(3), 1200)
    assert Counter(f.kind for f in plan) == {cl.BROKER_RESTART: 2, cl.INFLUX_OUTAGE: 1, cl.SCHEDULER_RESTART: 1}
    for seed in range(20):
        hows = [f.how for f in cl.plan_faults(random.Random(seed), 1200) if f.kind == cl.BROKER_RESTART]
        assert sorted(hows) == ["graceful", "sigkill"]
    assert all(60 <= f.at_s and f.at_s + f.down_s <= 0.9 * 1200 for f in plan)
    outage = next(f for f in plan if f.kind == cl.INFLUX_OUTAGE)
    assert outage.down_s == 120
    spans = [(f.at_s, f.at_s + f.down_s + 45) for f in plan]
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), "faults do not overlap"
    # A window too short to keep them apart still gets every fault.
    short = cl.plan_faults(random.Random(3), 180)
    assert len(short) == 4 and all(9 <= f.at_s <= 162 for f in short)


def test_job_plan_puts_every_job_beside_the_traffic() -> None:
    """The second edition's jobs: two rebuilds apart from each other, a maintenance, a recompute backfill
    after the first intervals ran, an archive backfill; all while the traffic runs, seeded."""
    plan = cl.plan_jobs(random.Random(5), 1200)
    assert plan == cl.plan_jobs(random.Random(5), 1200)
    assert Counter(j.kind for j in plan) == {cl.REBUILD: 2, cl.MAINTENANCE: 1, cl.BACKFILL: 1, cl.ARCHIVE_BACKFILL: 1}
    assert [j.at_s for j in plan] == sorted(j.at_s for j in plan)
    for seed in range(30):
        plan = cl.plan_jobs(random.Random(seed), 1200)
        assert all(120 <= j.at_s <= 900 for j in plan), plan
        first, second = sorted(j.at_s for j in plan if j.kind == cl.REBUILD)
        assert second - first >= 0.2 * 1200 or second == 900
        assert next(j.at_s for j in plan if j.kind == cl.BACKFILL) >= 400
    assert cl.plan_jobs(random.Random(1), 600, rebuilds=0, maintenance=0, backfills=0, archive_backfills=0) == []


def test_kills_spread_over_a_batch_and_leave_room_for_progress() -> None:
    rng = random.Random(1)
    plans = [cl.plan_kill(rng, remaining_s=1000, kills_left=8, recovery_s=60, batch_s=30) for _ in range(1000)]
    delays = [d for _, d in plans]
    assert all(1 <= d <= 36 for d in delays) and min(delays) < 3 and max(delays) > 33
    modes = Counter(m for m, _ in plans)
    assert 400 < modes[cl.AFTER_COMMIT] < 600 and modes[cl.AFTER_COMMIT] + modes[cl.REPLAY] == 1000
    # Behind schedule: no time to wait for a commit, replay kills only.
    tight = [cl.plan_kill(rng, remaining_s=300, kills_left=5, recovery_s=65, batch_s=30) for _ in range(200)]
    assert {m for m, _ in tight} == {cl.REPLAY}
    assert cl.kills_wanted(20) == 15 and cl.kills_wanted(5) == 4 and cl.kills_wanted(0.1) == 1
    assert Counter(cl.kill_target(random.Random(i)) for i in range(300)).keys() == {t for t, _ in cl.KILL_TARGETS}


def test_compare_counts_reports_lost_and_doubled_records() -> None:
    truth = {("t", 0, "valid"): 5, ("t", 0, "invalid"): 1, ("t", 1000, "valid"): 2}
    assert cl.compare_counts(truth, dict(truth))["equal"]
    # A status with no row/message/field reads as 0.
    assert cl.compare_counts(truth, {**truth, ("t", 1000, "invalid"): 0})["equal"]
    got = {("t", 0, "valid"): 6, ("t", 0, "invalid"): 1, ("t", 2000, "valid"): 1}
    c = cl.compare_counts(truth, got)
    assert not c["equal"]
    assert (c["lost"], c["counted_twice"], c["differing_keys"]) == (2, 2, 3)
    assert (c["expected_records"], c["counted_records"], c["windows"]) == (8, 8, 3)
    assert [(d["window_start_ms"], d["expected"], d["got"]) for d in c["differences"]] == [(0, 5, 6), (1000, 2, 0), (2000, 0, 1)]


def test_each_output_is_read_into_the_same_keys() -> None:
    counts, duplicates = cl.counts_from_rows([("t", 0, "valid", 3), ("t", 0, "invalid", 1), ("t", 0, "valid", 2)])
    assert counts == {("t", 0, "valid"): 5, ("t", 0, "invalid"): 1} and duplicates == [("t", 0, "valid")]
    assert cl.counts_from_points({"t": {0: (5, None), 1000: (0, 2)}}) == {
        ("t", 0, "valid"): 5, ("t", 0, "invalid"): 0, ("t", 1000, "valid"): 0, ("t", 1000, "invalid"): 2,
    }
    key = b'{"topic":"t","window":0,"status":"valid"}'
    latest, unreadable = cl.last_values([
        (key, b"4"), (b'{"summary":"s","topic":"t","window":0,"group":{}}', b"{}"), (key, b"5"), (b"junk", b"1"),
    ])
    assert latest == {("t", 0, "valid"): 5} and unreadable == 1


def test_compare_archive_finds_missing_duplicated_and_unexpected_offsets() -> None:
    expected = {("t", 0, 0), ("t", 0, 1), ("t", 1, 0)}
    assert cl.compare_archive(expected, dict.fromkeys(expected, 1))["equal"]
    c = cl.compare_archive(expected, {("t", 0, 0): 2, ("t", 1, 0): 1, ("t", 1, 5): 1})
    assert (c["missing"], c["duplicated"], c["unexpected"], c["archived_rows"]) == (1, 1, 1, 4)
    assert c["examples"]["missing"] == [["t", 0, 1]] and c["examples"]["duplicated"] == [["t", 0, 0, 2]]


def test_records_behind_compares_the_stream_with_kafka() -> None:
    ends = {("a", 0): 10, ("a", 1): 5, ("b", 0): 3}
    assert cl.records_behind({"a": {"0": 10, "1": 5}, "b": {"0": 3}}, ends) == 0
    assert cl.records_behind({"a": {"0": 8}}, ends) == 2 + 5 + 3


def test_fault_outcomes_from_the_monitor_events() -> None:
    events = [
        {"t": 10.0, "kind": "stream_gone"},
        {"t": 31.0, "kind": "stream_started"},
        {"t": 31.5, "kind": "supervisor_restart", "restarts": 1},
        {"t": 70.0, "kind": "batch_committed"},
        {"t": 200.0, "kind": "influx_pending"},
        {"t": 230.0, "kind": "batch_committed"},
        {"t": 400.0, "kind": "stream_gone"},
        {"t": 420.0, "kind": "batch_failure"},
        {"t": 450.0, "kind": "stream_started"},
        {"t": 480.0, "kind": "batch_committed"},
    ]
    events += [{"t": 250.0, "kind": "stream_gone"}, {"t": 262.0, "kind": "stream_started"}]  # killed at 249
    faults = [
        {"t": 10.0, "kind": cl.STREAM_KILL, "end_t": 10.0},
        {"t": 190.0, "kind": cl.INFLUX_OUTAGE, "end_t": 310.0},
        {"t": 249.0, "kind": cl.STREAM_KILL, "end_t": 249.0},
        {"t": 395.0, "kind": cl.BROKER_RESTART, "end_t": 410.0},
    ]
    kill, outage, _, broker = cl.fault_outcomes(faults, events)
    assert (kill["stream_back_s"], kill["by_supervisor"], kill["supervisor_restarts_in_a_row"], kill["first_batch_after_s"]) == (
        21.0, True, 1, 60.0,
    )
    assert outage["stream_survived"] and outage["influx_push_failure_recorded"] and outage["next_batch_after_s"] == 170.0
    assert not broker["stream_survived"] and broker["stream_back_s"] == 50.0 and broker["batch_failures_recorded"] == 1


def test_the_report_names_the_verdict_every_fault_and_every_output() -> None:
    comparison = {
        "delta window_counts": cl.compare_counts({("t", 0, "valid"): 1}, {("t", 0, "valid"): 1}),
        "raw_archive": cl.compare_archive({("t", 0, 0)}, {("t", 0, 0): 1}),
    }
    result = {
        "command": "python -m benchmarks.chaos --minutes 1", "seed": 42, "started_at": "2026-11-24T00:00:00Z",
        "duration_seconds": 600, "fault_phase_seconds": 60,
        "parameters": {"rate": 50, "topics": {"t": 2}, "invalid_ratio": 0.1, "out_of_order": 0.05, "late": 0.02,
                       "poison_ratio": 0.1, "transaction_seconds": 1, "abort_ratio": 0.03,
                       "allowed_lateness_seconds": 60, "trigger_seconds": 5, "supervisor_seconds": 30},
        "verdict": "every output equals the ground truth",
        "comparison": comparison,
        "truth": {"records": 1, "windows": 1, "by_kind": {"valid": 1}, "by_timing": {"on_time": 1}, "by_status": {"valid": 1}, "poison": {}},
        "faults": cl.fault_outcomes([{"t": 5.0, "kind": cl.STREAM_KILL, "end_t": 5.0, "target": "driver_jvm", "pid": 7}],
                                    [{"t": 20.0, "kind": "stream_started"}]),
    }
    result["parameters"]["recompute_minutes"] = 5
    result["jobs"] = [
        {"t": 130.0, "kind": cl.REBUILD, "what": "kdq_rebuild run r1", "state": "success", "seconds": 95.5},
        {"t": 300.0, "kind": cl.ARCHIVE_BACKFILL, "what": "archive_from_kafka", "state": "exit 1", "seconds": 40.0,
         "detail": "read 10, loaded 0"},
    ]
    result["writers"] = ["rebuild r1: ran beside the stream, waited 2 s for a conflict"]
    md = cl.markdown(result)
    assert "| 1 | 130.0 | rebuild | kdq_rebuild run r1 | success after 95.5 s |" in md
    assert "| 2 | 300.0 | archive_from_kafka | archive_from_kafka | exit 1 after 40.0 s; read 10, loaded 0 |" in md
    assert "every 5 min" in md and "rebuild r1: ran beside the stream" in md
    assert "beside the stream 1 rebuild, 1 archive backfill" in cl.summary_line(result)
    assert "seed **42**" in md and "every output equals the ground truth" in md
    assert "| delta window_counts | 1 | 1 | 0 | 0 | 0 |" in md and "raw archive" in md
    assert "SIGKILL driver_jvm (pid 7)" in md and "back after 15.0 s" in md
    json.dumps(cl.as_jsonable(result))


def test_a_component_killed_from_outside_is_reported_apart_from_the_faults() -> None:
    faults = [
        {"t": 5.0, "kind": cl.STREAM_KILL, "end_t": 5.0, "target": "driver_jvm", "pid": 7},
        {"t": 50.0, "kind": cl.UNPLANNED, "component": "airflow", "restarted_after_s": 40.0, "end_t": 90.0},
    ]
    rows = cl.fault_outcomes(faults, [{"t": 20.0, "kind": "stream_started"}])
    assert rows[1] == faults[1]
    md = cl.markdown({
        "command": "c", "seed": 1, "started_at": "2026-11-24T00:00:00Z", "verdict": "v",
        "parameters": {"rate": 50, "topics": {"t": 2}, "invalid_ratio": 0.1, "out_of_order": 0.05, "late": 0.02,
                       "poison_ratio": 0.1, "transaction_seconds": 1, "abort_ratio": 0.03,
                       "allowed_lateness_seconds": 60, "trigger_seconds": 5, "supervisor_seconds": 30},
        "faults": rows,
    })
    assert "airflow found dead, stopped by nothing in this run" in md and "started again by the chaos driver in 40.0 s" in md
    assert "1 unplanned_death: a component killed from outside the run" in md
