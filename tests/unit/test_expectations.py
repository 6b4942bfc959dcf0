"""Expectations evaluated on per-minute counts, and the incidents they open, worsen, resolve, amend or retract.

A "live" run evaluates, at the end of each minute n, the minutes n-2..n with the counts known so far, as the
stream would: minute n is provisional (within the 60 s allowed lateness), n-1 is final.
"""

from __future__ import annotations

import numpy as np
import pytest

from kdq.expectations import (
    MINUTE_MS,
    STREAM_TOPIC,
    MinuteCounts,
    StreamFigures,
    TopicMinutes,
    evaluate,
    violations,
)
from kdq.expectations_config import ExpectationSet, parse_expectations
from kdq.incidents import OPEN, RESOLVED, RETRACTED, IncidentState, Notification, apply, incident_row, prune
from kdq.tables import INCIDENTS

M0 = 28_400_000  # an epoch minute (2023-12-31T05:20Z): incidents' keys carry it as a UTC time
LATENESS = 60

RATIO = parse_expectations(
    {
        "clear_after_minutes": 10,
        "invalid_ratio": {"above": 0.05, "over_minutes": 5, "min_records": 20, "worsen_at": [0.3]},
    }
)


def normal(valid: int = 100) -> MinuteCounts:
    return MinuteCounts(valid=valid)


def now_after(minute: int) -> int:
    """Just after minute ``minute`` ended (relative to M0)."""
    return (M0 + minute + 1) * MINUTE_MS + 1000


def live_step(state: IncidentState, expectations: ExpectationSet, counts: dict[int, MinuteCounts], n: int,
              topic: str = "orders") -> tuple[IncidentState, list[Notification]]:
    known = {M0 + m: c for m, c in counts.items() if m <= n}
    now = now_after(n)
    verdicts = evaluate(expectations, [TopicMinutes(topic, known, max_event_ms=now)], M0 + n - 2, M0 + n,
                        now_ms=now, allowed_lateness_seconds=LATENESS)
    return apply(state, verdicts, now)


def live_run(expectations: ExpectationSet, counts: dict[int, MinuteCounts], minutes: range,
             topic: str = "orders") -> tuple[IncidentState, list[Notification]]:
    state, notes = IncidentState(), []
    for n in minutes:
        state, new = live_step(state, expectations, counts, n, topic)
        notes.extend(new)
    return state, notes


def burst_traffic() -> dict[int, MinuteCounts]:
    counts = {m: normal() for m in range(0, 60)}
    counts[20] = MinuteCounts(valid=100, invalid=60)  # 60 / 560 over 16..20: above 5 %
    counts[22] = MinuteCounts(valid=100, invalid=400)  # (60 + 400) / 960 over 18..22: above the 30 % level
    return counts


def test_a_burst_opens_one_incident_more_worsens_it_normal_traffic_resolves_it() -> None:
    state, notes = live_run(RATIO, burst_traffic(), range(5, 60))
    assert [(n.event, n.incident.key) for n in notes] == [
        ("open", "orders|invalid_ratio|2023-12-31T05:40Z"),
        ("worsen", "orders|invalid_ratio|2023-12-31T05:40Z"),
        ("resolve", "orders|invalid_ratio|2023-12-31T05:40Z"),
    ]
    opened, worsened, resolved = (n.incident for n in notes)
    assert (opened.first_minute, opened.level, opened.final) == (M0 + 20, 0, False)  # told while provisional
    assert abs(opened.worst_value - 60 / 560) < 1e-12
    assert worsened.level == 1 and abs(worsened.worst_value - 460 / 960) < 1e-12
    # The 400 invalid records of minute 22 stay in the 5-minute period until minute 26; clear from 27 on,
    # resolved by the final clear verdict 10 minutes after the last violated one.
    assert (resolved.status, resolved.last_minute, resolved.resolved_minute) == (RESOLVED, M0 + 26, M0 + 36)
    assert resolved.final and resolved.window_start_ms == (M0 + 16) * MINUTE_MS
    assert len(state.incidents) == 1 and state.open_incidents() == []
    # Versions count every change (each minute that extended it), notifications only what people must hear.
    assert opened.version < worsened.version < resolved.version
    assert len({n.id for n in notes}) == 3


def test_the_same_inputs_twice_change_nothing_and_a_replay_gives_the_same_incidents() -> None:
    counts = burst_traffic()
    state, notes = live_run(RATIO, counts, range(5, 30))
    twice = IncidentState()
    for n in range(5, 30):  # each evaluation applied twice in a row: the second changes nothing
        twice, first = live_step(twice, RATIO, counts, n)
        twice, second = live_step(twice, RATIO, counts, n)
        assert second == []
    assert twice.incidents == state.incidents
    for n in range(5, 30):  # every evaluation applied again, in any order (replayed batches, a restart)
        again, repeated = live_step(state, RATIO, counts, n)
        assert repeated == [] and again.incidents == state.incidents
    replay_state, replay_notes = live_run(RATIO, counts, range(5, 30))
    assert replay_state.incidents == state.incidents
    assert [n.id for n in replay_notes] == [n.id for n in notes]


def test_a_minute_with_three_records_does_not_trip_the_ratio() -> None:
    per_minute = parse_expectations({"invalid_ratio": {"above": 0.05, "over_minutes": 1, "min_records": 20}})
    counts = {M0: MinuteCounts(valid=1, invalid=2), M0 + 1: MinuteCounts(valid=20, invalid=10)}
    verdicts = evaluate(per_minute, [TopicMinutes("orders", counts)], M0, M0 + 1,
                        now_ms=now_after(10), allowed_lateness_seconds=LATENESS)
    by_minute = {v.minute: v for v in verdicts}
    assert (by_minute[M0].violated, by_minute[M0].value) == (False, None)  # 67 % of 3 records: no verdict against it
    assert by_minute[M0 + 1].violated and by_minute[M0 + 1].final
    state, notes = apply(IncidentState(), verdicts, now_after(10))
    assert [(n.event, n.incident.first_minute) for n in notes] == [("open", M0 + 1)]


def test_a_silent_topic_opens_a_silence_incident() -> None:
    silence = parse_expectations({"silence": {"below": 1, "over_minutes": 5}})
    traffic = {m: normal(10) for m in range(0, 10)}  # then nothing
    state, notes = live_run(silence, traffic, range(5, 25))
    assert [(n.event, n.incident.expectation, n.incident.first_minute) for n in notes] == [("open", "silence", M0 + 14)]
    assert state.open_incidents()[0].worst_value == 0.0
    # A topic that never had records is not "silent": there is nothing it usually does.
    _, never = live_run(silence, {}, range(5, 25), topic="new-topic")
    assert never == []
    # Traffic again: resolves once clear for clear_after (default 10 minutes).
    traffic.update({m: normal(10) for m in range(25, 60)})
    for n in range(25, 60):
        state, new = live_step(state, silence, traffic, n)
        notes.extend(new)
    assert [n.event for n in notes] == ["open", "resolve"]


def test_a_late_correction_over_the_threshold_opens_one_incident_for_that_past_window_once() -> None:
    counts = {m: normal() for m in range(0, 40)}
    state, notes = live_run(RATIO, counts, range(5, 40))
    assert notes == []
    # The hourly batch layer finds 80 invalid records of minute 12 that the stream never saw; it re-evaluates
    # the windows the correction touched (and the sliding periods that include them).
    counts[12] = MinuteCounts(valid=100, invalid=80)
    now = now_after(70)
    corrected = {M0 + m: c for m, c in counts.items()}
    for _ in range(2):  # the re-evaluation is replayed: still one incident, told once
        verdicts = evaluate(RATIO, [TopicMinutes("orders", corrected, max_event_ms=now)], M0 + 12, M0 + 16,
                            now_ms=now, allowed_lateness_seconds=LATENESS)
        state, new = apply(state, verdicts, now)
        notes.extend(new)
    assert [n.event for n in notes] == ["open", "resolve"]  # a past window: opened, and already resolved
    (incident,) = state.incidents.values()
    assert (incident.first_minute, incident.last_minute, incident.final) == (M0 + 12, M0 + 16, True)
    assert incident.key == "orders|invalid_ratio|2023-12-31T05:32Z"


def test_late_valid_records_that_clear_the_only_violated_minutes_retract_the_incident() -> None:
    per_minute = parse_expectations({"invalid_ratio": {"above": 0.05, "over_minutes": 1, "min_records": 20}})
    counts = {m: normal() for m in range(0, 12)}
    counts[10] = MinuteCounts(valid=20, invalid=5)
    state, notes = live_run(per_minute, counts, range(5, 11))
    assert [n.event for n in notes] == ["open"] and not notes[0].incident.final
    counts[10] = MinuteCounts(valid=200, invalid=5)  # the rest of minute 10 arrives late, within its lateness
    state, new = live_step(state, per_minute, counts, 11)
    assert [n.event for n in new] == ["retract"]
    assert next(iter(state.incidents.values())).status == RETRACTED


def test_late_data_before_an_open_incident_amends_it_under_the_same_key() -> None:
    per_minute = parse_expectations({"invalid_ratio": {"above": 0.05, "over_minutes": 1, "min_records": 20}})
    bad = MinuteCounts(valid=50, invalid=50)
    verdicts = evaluate(per_minute, [TopicMinutes("orders", {M0 + 10: bad})], M0 + 10, M0 + 10,
                        now_ms=now_after(10), allowed_lateness_seconds=LATENESS)
    state, notes = apply(IncidentState(), verdicts, now_after(10))
    key = notes[0].incident.key
    verdicts = evaluate(per_minute, [TopicMinutes("orders", {M0 + 9: bad, M0 + 10: bad})], M0 + 9, M0 + 10,
                        now_ms=now_after(10), allowed_lateness_seconds=LATENESS)
    state, notes = apply(state, verdicts, now_after(10))
    assert [(n.event, n.incident.key, n.incident.first_minute) for n in notes] == [("amend", key, M0 + 9)]


def test_reason_count_covers_the_reasons_under_it() -> None:
    expectations = parse_expectations({"reason": [{"reason": "schema:/properties/amount", "count_above": 100}]})
    reasons = {"schema:/properties/amount/minimum": 70, "schema:/properties/amount/type": 40,
               "schema:/properties/amounts": 500, "not_json": 500}
    counts = {M0: MinuteCounts(valid=10, invalid=1110, reasons=reasons)}
    (verdict,) = evaluate(expectations, [TopicMinutes("payments", counts)], M0, M0,
                          now_ms=now_after(5), allowed_lateness_seconds=LATENESS)
    assert (verdict.expectation, verdict.value, verdict.violated) == ("reason_count:schema:/properties/amount", 110, True)


def test_a_reason_check_stays_provisional_while_the_streams_reasons_may_be_pending() -> None:
    """The stream appends its reasons up to reasons_lag_seconds after its counts (kdq.spark.reasons_flush): a
    reason check's minute is final that much later than the counts' checks, so a clear verdict from reasons not
    appended yet cannot resolve an incident."""
    expectations = parse_expectations({"invalid_ratio": {"above": 0.5},
                                       "reason": [{"reason": "not_json", "count_above": 100}]})
    counts = {M0: MinuteCounts(valid=10, invalid=10, reasons={"not_json": 10})}
    # The topic's clock 90 s past the minute's end: beyond the 60 s lateness, within lateness + 90 s of lag.
    topic = TopicMinutes("payments", counts, max_event_ms=(M0 + 1) * MINUTE_MS + 90_000)
    final = {v.expectation: v.final for v in evaluate(expectations, [topic], M0, M0, now_ms=now_after(2),
                                                      allowed_lateness_seconds=LATENESS, reasons_lag_seconds=90)}
    assert final == {"invalid_ratio": True, "reason_count:not_json": False}
    without_lag = evaluate(expectations, [topic], M0, M0, now_ms=now_after(2), allowed_lateness_seconds=LATENESS)
    assert all(v.final for v in without_lag)


def test_stream_latency_and_unruled_topics_are_judged_now() -> None:
    expectations = parse_expectations({"latency": {"above_seconds": 120}, "lag": {"above_records": 1000},
                                       "unruled_topic": True, "topic": [{"match": "re:scratch-.*", "unruled_topic": False}]})
    now = now_after(30)
    verdicts = evaluate(expectations, [], M0, M0 + 30, now_ms=now, allowed_lateness_seconds=LATENESS,
                        stream=[StreamFigures(M0 + 31, latency_seconds=300.0, lag_records=10)],
                        monitored_topics=["orders", "clicks", "scratch-1"],
                        has_rule={"orders": True, "clicks": False, "scratch-1": False})
    found = [(v.topic, v.expectation, v.worst_value) for v in violations(verdicts)]
    assert found == [(STREAM_TOPIC, "latency", 300.0), ("clicks", "unruled_topic", 1.0)]
    assert all(v.final for v in verdicts)


def test_volume_anomaly_is_wired_to_kdq_anomaly() -> None:
    settings = {"weeks": 1, "pool_minutes": 10, "min_samples": 10}
    expectations = parse_expectations({"anomaly": settings})
    week = 7 * 24 * 60
    rng = np.random.default_rng(7)
    counts = {M0 + m: MinuteCounts(valid=int(n)) for m, n in enumerate(rng.poisson(100, week + 60))}
    for m in range(week + 30, week + 36):
        counts[M0 + m] = MinuteCounts(valid=1000)  # a spike of six minutes
    verdicts = evaluate(expectations, [TopicMinutes("orders", counts)], M0 + week + 20, M0 + week + 59,
                        now_ms=now_after(week + 70), allowed_lateness_seconds=LATENESS)
    found = violations(verdicts)
    assert [(v.expectation, v.first_minute) for v in found] == [("anomaly:spike", M0 + week + 30)]
    assert expectations.lookback_minutes() >= week


def test_prune_keeps_open_incidents_rederivable_and_settled_ones_untouched() -> None:
    state, _ = live_run(RATIO, burst_traffic(), range(5, 60))
    pruned = prune(state, M0 + 58)
    assert pruned.incidents == state.incidents and pruned.floors[("orders", "invalid_ratio")] == M0 + 58
    # Re-applying old verdicts of the settled past neither retracts nor reopens anything.
    again, notes = live_step(pruned, RATIO, burst_traffic(), 25)
    assert notes == [] and again.incidents == state.incidents


def test_incident_rows_have_the_incidents_table_columns() -> None:
    state, _ = live_run(RATIO, burst_traffic(), range(5, 60))
    (incident,) = state.incidents.values()
    row = incident_row(incident)
    assert tuple(row) == INCIDENTS.column_names
    assert row["status"] == RESOLVED and row["version"] == incident.version
    assert OPEN != RESOLVED


def test_the_job_repeats_only_on_the_clock() -> None:
    from spark_jobs.evaluate_expectations import parse_args

    args = parse_args(["--deliver", "--every", "15", "--for-seconds", "40"])
    assert (args.every_seconds, args.for_seconds, args.deliver) == (15.0, 40.0, True)
    assert parse_args([]).every_seconds == 0.0
    for wrong in (["--for-seconds", "40"], ["--every", "15", "--now", "2026-11-27T09:00:00Z"], ["--every", "-1"]):
        with pytest.raises(SystemExit):
            parse_args(wrong)
