"""Stateless evaluation runs (kdq.expectation_run): each run starts from the stored incident rows only (through
their table row form and back), re-evaluates its horizon, and must give what the stateful state machine gives:
one incident per burst, told once per event; a re-run changes nothing; a late correction opens one past
incident, once; the stream's latency incident survives runs that only see the current minute."""

from __future__ import annotations

import json

from kdq.expectation_run import (
    batches_breaching,
    notification_row,
    run_evaluation,
    run_window,
    stream_figures,
    topic_minutes,
)
from kdq.expectations import MINUTE_MS, STREAM_TOPIC, MinuteCounts, StreamFigures, TopicMinutes
from kdq.expectations_config import parse_expectations
from kdq.incidents import OPEN, RESOLVED, Incident, IncidentState, incident_from_row, incident_row
from kdq.tables import INCIDENT_NOTIFICATIONS

M0 = 28_400_000
LATENESS = 60
RATIO = parse_expectations({
    "clear_after_minutes": 10,
    "invalid_ratio": {"above": 0.05, "over_minutes": 5, "min_records": 20, "worsen_at": [0.3]},
    "latency": {"above_seconds": 120},
})


def stored_form(rows: dict[str, Incident]) -> list[Incident]:
    """What a run reads back: each incident through its kdq.incidents row."""
    return [incident_from_row(incident_row(i)) for i in rows.values()]


class Table:
    """The incidents table and the notification outbox as the job keeps them (MERGE guarded by version,
    insert-once by notification id)."""

    def __init__(self, expectations=RATIO) -> None:
        self.expectations = expectations
        self.rows: dict[str, Incident] = {}
        self.outbox: dict[str, dict] = {}

    def run(self, counts: dict[int, MinuteCounts], n: int, *, horizon: int = 180, as_of: int = 0,
            stream: list[StreamFigures] = (), die_after_outbox: bool = False) -> list[str]:
        now = (M0 + n + 1) * MINUTE_MS + 1000
        stored = stored_form(self.rows)
        window = run_window(self.expectations, stored, now, horizon)
        known = {M0 + m: c for m, c in counts.items() if m <= n}
        result = run_evaluation(self.expectations, stored, window, [TopicMinutes("orders", known, max_event_ms=now)],
                                now_ms=now, as_of=as_of, allowed_lateness_seconds=LATENESS, stream=stream)
        new_ids = []
        for note in result.notifications:
            if note.id not in self.outbox:
                self.outbox[note.id] = notification_row(note, now)
                new_ids.append(note.id)
        if die_after_outbox:  # the job died between its two commits
            return new_ids
        for incident in result.changed:
            old = self.rows.get(incident.key)
            if old is None or incident.version > old.version:
                self.rows[incident.key] = incident
        return new_ids


def burst() -> dict[int, MinuteCounts]:
    counts = {m: MinuteCounts(valid=100) for m in range(0, 60)}
    counts[20] = MinuteCounts(valid=100, invalid=60)
    counts[22] = MinuteCounts(valid=100, invalid=400)
    return counts


def test_stateless_runs_open_worsen_resolve_once_and_a_rerun_changes_nothing() -> None:
    table, counts = Table(), burst()
    events = []
    for n in range(5, 60):
        events += table.run(counts, n)
        before = dict(table.rows)
        assert table.run(counts, n) == [] and table.rows == before  # the same inputs again: nothing
    key = "orders|invalid_ratio|2023-12-31T05:40Z"
    assert [e.split("#")[0] for e in events] == [key] * 3
    assert [e.rsplit(":", 1)[1] for e in events] == ["open", "worsen", "resolve"]
    (incident,) = table.rows.values()
    assert (incident.status, incident.first_minute, incident.last_minute, incident.resolved_minute) == (
        RESOLVED, M0 + 20, M0 + 26, M0 + 36)
    assert incident.level == 1 and abs(incident.worst_value - 460 / 960) < 1e-12


def test_a_run_that_dies_between_the_outbox_and_the_incidents_is_completed_by_the_next_without_repeats() -> None:
    table, counts = Table(), burst()
    for n in range(5, 20):
        table.run(counts, n)
    told = table.run(counts, 20, die_after_outbox=True)
    assert [e.rsplit(":", 1)[1] for e in told] == ["open"] and table.rows == {}
    assert table.run(counts, 20) == []  # the same change derived again: its notification is already out
    (incident,) = table.rows.values()
    assert incident.version == 1 and f"{incident.key}#v1:open" in table.outbox


def test_a_late_correction_inside_the_horizon_opens_one_past_incident_once() -> None:
    table, counts = Table(), {m: MinuteCounts(valid=100) for m in range(0, 80)}
    for n in range(5, 70):
        assert table.run(counts, n) == []
    counts[12] = MinuteCounts(valid=100, invalid=80)  # the batch layer's correction of a minute an hour back
    first = table.run(counts, 70)
    assert [e.rsplit(":", 1)[1] for e in first] == ["open", "resolve"]
    assert table.run(counts, 70) == [] and table.run(counts, 71) == []
    (incident,) = table.rows.values()
    assert (incident.key, incident.final) == ("orders|invalid_ratio|2023-12-31T05:32Z", True)


def test_an_open_incident_older_than_the_horizon_is_still_re_derived_whole() -> None:
    table, counts = Table(), {m: MinuteCounts(valid=100, invalid=50) for m in range(0, 40)}  # bad throughout
    for n in range(5, 40):
        table.run(counts, n, horizon=3)
    (incident,) = table.rows.values()
    assert incident.status == OPEN and incident.first_minute == M0 + 4 and incident.version > 1  # the first run's first minute
    assert len(table.outbox) == 1  # one open, never retracted or moved by the short horizon


def test_the_stream_latency_incident_persists_across_runs_that_see_one_minute() -> None:
    table, counts = Table(), {m: MinuteCounts(valid=100) for m in range(0, 60)}
    for n in range(5, 40):
        latency = 300.0 if 10 <= n < 15 else 5.0
        table.run(counts, n, stream=[StreamFigures(M0 + n, latency_seconds=latency)])
    (incident,) = [i for i in table.rows.values() if i.topic == STREAM_TOPIC]
    assert (incident.status, incident.first_minute, incident.last_minute) == (RESOLVED, M0 + 10, M0 + 14)
    assert [i.rsplit(":", 1)[1] for i in table.outbox] == ["open", "resolve"]


def test_a_failing_and_a_hung_micro_batch_open_stream_incidents_until_the_batch_completes() -> None:
    """batch_failing (attempts of a micro-batch that keeps failing, kdq.stream.failures) and batch_running (how
    long the batch in flight has run) are measured at each run's minute, like latency: one incident each while
    the condition lasts, resolved after clear_after_minutes of healthy runs, worsened past a level."""
    health = parse_expectations({"clear_after_minutes": 2, "batch_failing": {"attempts_above": 0, "worsen_at": [2]},
                                 "batch_running": {"above_seconds": 600}})
    table, counts = Table(health), {m: MinuteCounts(valid=100) for m in range(0, 60)}
    for n in range(5, 30):
        now = (M0 + n + 1) * MINUTE_MS + 1000
        failure = {"attempts": n - 9} if 10 <= n < 14 else None  # attempts 1, 2, 3, 4, then a batch completes
        running = {"seconds": 300.0 * (n - 17)} if 18 <= n < 22 else None  # 300, 600, 900, 1200 s, then done
        figures = stream_figures(None, failure, running, now_ms=now)
        table.run(counts, n, stream=figures)
    by_check = {i.expectation: i for i in table.rows.values() if i.topic == STREAM_TOPIC}
    failing = by_check["batch_failing"]
    assert (failing.status, failing.first_minute, failing.last_minute) == (RESOLVED, M0 + 10 + 1, M0 + 13 + 1)
    assert failing.worst_value == 4.0
    running = by_check["batch_running"]
    assert (running.status, running.first_minute, running.last_minute) == (RESOLVED, M0 + 20 + 1, M0 + 21 + 1)
    events = [(i.split("|")[1], i.rsplit(":", 1)[1]) for i in table.outbox]
    assert events == [("batch_failing", "open"), ("batch_failing", "worsen"), ("batch_failing", "resolve"),
                      ("batch_running", "open"), ("batch_running", "resolve")]
    healthy = stream_figures(None, None, None, now_ms=M0 * MINUTE_MS)
    assert healthy == [StreamFigures(M0, failed_attempts=0, running_seconds=0.0)]


def test_minutes_since_the_hourly_recompute_last_ended_well() -> None:
    """From kdq.writers_journal's entries: the last ok end; with runs but none ok, since the first started; not
    measured without a recompute run. Other jobs do not count."""
    from kdq.expectation_run import minutes_since_recompute

    now = 1_000 * MINUTE_MS

    def run(job: str, start_min: int, end_min: int | None = None, outcome: str = "ok") -> list[dict]:
        start = {"run": f"{job}-{start_min}", "job": job, "phase": "start", "start_ms": start_min * MINUTE_MS}
        if end_min is None:
            return [start]
        return [start, {**start, "phase": "end", "end_ms": end_min * MINUTE_MS, "outcome": outcome}]

    assert minutes_since_recompute([], now) is None
    assert minutes_since_recompute(run("maintenance", 990, 995), now) is None
    journal = run("batch_recompute", 800, 805) + run("batch_recompute", 860, 870) + run("batch_recompute", 920, 925,
                                                                                        "failed")
    assert minutes_since_recompute(journal, now) == 130.0  # the 870 end; the failed run does not count
    assert minutes_since_recompute(run("batch_recompute", 900, 901, "failed") + run("batch_recompute", 960), now) == 100
    health = parse_expectations({"recompute": {"above_minutes": 120}})
    (check,) = health.stream
    assert check.violated(130.0) and not check.violated(100.0)


def test_rows_readers_and_outbox_rows() -> None:
    state = IncidentState()
    topics = topic_minutes(
        [{"topic": "t", "minute": 5, "valid": 3, "invalid": 1, "max_window_ms": 5 * MINUTE_MS + 59_000}],
        [{"topic": "t", "minute": 5, "reason": "not_json", "count": 1}], state)
    assert topics == [TopicMinutes("t", {5: MinuteCounts(3, 1, {"not_json": 1})}, max_event_ms=5 * MINUTE_MS + 59_000)]
    figures = stream_figures({"timestamp": "2023-12-31T05:20:30.000Z", "end_to_end_latency_ms": {"oldest": 4000},
                              "consumer_lag": {"a": 3, "b": 4}})
    assert figures == [StreamFigures(M0, latency_seconds=4.0, lag_records=7)]
    assert stream_figures(None) == []
    table = Table()
    table.run(burst(), 21)
    (row,) = table.outbox.values()
    assert set(row) == set(INCIDENT_NOTIFICATIONS.column_names)
    assert json.loads(row["payload"])["status"] == "open"


def test_the_unruled_check_sees_the_clusters_topics_and_survives_a_broker_outage(monkeypatch, tmp_path) -> None:
    """A topic created a moment ago (no counts yet) is judged too: the cluster's topics the stream reads join the
    counted ones; a broker that does not answer leaves the counted ones."""
    import kdq.spark.backfill as backfill
    from kdq.spark.expectations import monitored_topics
    from tests.conftest import make_config

    config = make_config(tmp_path)
    monkeypatch.setattr(backfill, "list_topics", lambda config: ["fresh.topic", "orders"])
    assert monitored_topics(config, ["orders", "payments"]) == ["fresh.topic", "orders", "payments"]

    def down(config):
        raise RuntimeError("KafkaError{code=_TRANSPORT}")

    monkeypatch.setattr(backfill, "list_topics", down)
    assert monitored_topics(config, ["orders"]) == ["orders"]


def test_a_micro_batch_that_breaches_a_ratio_check_is_a_hint_once_per_topic_without_an_open_incident() -> None:
    """The repeating run's hint (evaluate at once): a batch after the last evaluated one whose own counts put a
    topic over its invalid_ratio threshold with at least min_records records; not for a topic already open."""
    progress = [
        {"batch_id": 7, "input_rows_by_topic": {"orders": 100}, "invalid_rows_by_topic": {"orders": 90}},
        {"batch_id": 8, "input_rows_by_topic": {"orders": 100, "payments": 50}, "invalid_rows_by_topic": {"orders": 5}},
        {"batch_id": 9, "input_rows_by_topic": {"orders": 19}, "invalid_rows_by_topic": {"orders": 19}},  # < 20 records
        {"batch_id": 10},  # a progress record of an older kdq, or of a batch with no report
    ]
    assert batches_breaching(RATIO, progress, 8, []) == set()  # 9: too few records; 7 is before the last one
    assert batches_breaching(RATIO, progress, 6, []) == {"orders"}
    assert batches_breaching(RATIO, progress, None, []) == {"orders"}
    assert batches_breaching(RATIO, progress, 7, []) == set()  # 5 of 100 is not above 0.05
    progress.append({"batch_id": 11, "input_rows_by_topic": {"orders": 30, "payments": 40},
                     "invalid_rows_by_topic": {"orders": 1, "payments": 3}})
    assert batches_breaching(RATIO, progress, 10, []) == {"payments"}  # 3/40 > 0.05 with 40 >= 20 records
    table = Table()
    table.run(burst(), 30)
    opened = stored_form(table.rows)
    assert any(i.status == OPEN and i.expectation == "invalid_ratio" and i.topic == "orders" for i in opened)
    assert batches_breaching(RATIO, progress, 6, opened) == {"payments"}  # orders is open: its regular looks update it
    assert batches_breaching(RATIO, progress, 10, opened) == {"payments"}
    assert batches_breaching(parse_expectations({}), progress, None, []) == set()  # no invalid_ratio check
