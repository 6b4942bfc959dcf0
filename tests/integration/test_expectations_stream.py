"""Expectations end to end on the real broker: records produced to Kafka, counted by the speed layer into Delta, judged
by the expectations run (``spark_jobs/evaluate_expectations.run``, its clock pinned with ``--now`` to the minutes the
traffic covers), incidents in ``kdq.incidents`` and their notifications delivered to an SMTP server and an HTTP
webhook receiver started here (tests/integration/test_expectations.py).

Two topics, one minute of traffic at a time, each minute counted by the stream before it is judged: a burst of
invalid records on one topic opens an ``invalid_ratio`` incident (one message per channel), more of them worsen it,
normal traffic resolves it; the other topic goes silent for a few minutes and gets a ``silence`` incident,
resolved when its traffic comes back. Every run after the last changes nothing and sends nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest
from spark_jobs import evaluate_expectations

from kdq.notify import CHANNELS_ENV
from kdq.rules import load_rules
from kdq.spark.speed_layer import SpeedLayer
from kdq.spark.tables import table_path
from kdq.tables import INCIDENTS
from tests.integration.helpers import expected_counts, isolated_config, produce, window_counts
from tests.integration.test_expectations import receivers  # noqa: F401 (the fixture: SMTP and webhook servers)
from tests.integration.test_speed_layer_example import run_available_now

pytestmark = pytest.mark.integration

MINUTE_MS = 60_000
TOPICS_TOML = """
[expectations]
clear_after_minutes = 2
invalid_ratio = { above = 0.3, over_minutes = 1, min_records = 20, worsen_at = [0.6] }
silence = { below = 1, over_minutes = 2, active_within_minutes = 60 }
"""


def test_a_burst_and_a_silence_from_kafka_open_notify_and_resolve_once(spark, local_stack, receivers,  # noqa: F811
                                                                     tmp_path: Path, monkeypatch) -> None:
    smtp, hook = receivers
    prefix = f"xs{tmp_path.name[-6:].replace('_', '')}"
    orders, clicks = f"{prefix}-orders", f"{prefix}-clicks"
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "topics.toml").write_text(TOPICS_TOML)
    config = isolated_config(local_stack, tmp_path / "data", prefix, paths={"rules_dir": str(rules)})
    for topic in (orders, clicks):
        local_stack.kafka.create_topic(topic, partitions=1)
    monkeypatch.setenv(CHANNELS_ENV, json.dumps([
        {"name": "mail", "kind": "smtp", "host": "127.0.0.1", "port": smtp.server_address[1], "from": "kdq@test",
         "to": ["team@test"], "ssl": False, "starttls": False},
        {"name": "hook", "kind": "webhook", "url": f"http://127.0.0.1:{hook.server_address[1]}/kdq"},
    ]))
    layer = SpeedLayer(spark, config, load_rules(config.rules_dir))
    # Minute 0 of the traffic: an hour ago, whole minutes, so the run's clock can be pinned after each one.
    base = (int(time.time() * 1000) - 3_600_000) // MINUTE_MS * MINUTE_MS
    sent: dict[str, list[tuple[int, bool]]] = {orders: [], clicks: []}

    def minute(m: int, topic: str, valid: int, invalid: int = 0) -> None:
        """``valid`` then ``invalid`` records over the minute's first seconds."""
        records = [(0, json.dumps({"i": i}).encode() if i < valid else b"not json", base + m * MINUTE_MS + i * 100)
                   for i in range(valid + invalid)]
        produce(config.kafka_bootstrap(), topic, records)
        sent[topic] += [(ts, i < valid) for i, (_, _, ts) in enumerate(records)]

    def evaluate(after_minute: int) -> dict:
        """The stream counts what was produced, then the run judges the minutes up to ``after_minute``."""
        run_available_now(layer)
        for topic, records in sent.items():
            assert window_counts(spark, config, topic) == expected_counts(topic, records)
        args = argparse.Namespace(now_ms=base + (after_minute + 1) * MINUTE_MS + 1000, horizon_minutes=180,
                                  deliver=True)
        report = evaluate_expectations.run(spark, config, args).to_dict()
        assert report["ok"], report
        return report

    def events(report: dict) -> list[tuple[str, str, str]]:
        return sorted((n["id"].split("|")[0], n["id"].split("|")[1], n["event"]) for n in report["notifications"])

    for m in range(5):
        minute(m, orders, 30)
        minute(m, clicks, 30)
    assert evaluate(4)["notifications_total"] == 0

    # A burst: half of the orders of minute 5 invalid (> 30 % of at least 20). The clicks stop: silence is judged
    # on the wall clock up to the run's own minute (6), whose two minutes (5 and 6) have no click.
    minute(5, orders, 30, 30)
    opened = evaluate(5)
    assert events(opened) == [(clicks, "silence", "open"), (orders, "invalid_ratio", "open")], opened
    assert opened["delivery"]["sent"] == {"mail": 2, "hook": 2}, opened["delivery"]

    # Worse: 83 % of minute 6, past the 60 % level.
    minute(6, orders, 10, 50)
    worse = evaluate(6)
    assert events(worse) == [(orders, "invalid_ratio", "worsen")], worse

    # Normal traffic again, the clicks back from minute 9; both resolve once their clear minutes are final.
    for m in range(7, 14):
        minute(m, orders, 30)
        if m >= 9:
            minute(m, clicks, 30)
    resolved = evaluate(12)
    assert events(resolved) == [(clicks, "silence", "resolve"), (orders, "invalid_ratio", "resolve")], resolved

    rows = {(r["topic"], r["expectation"]): r for r in
            spark.read.format("delta").load(table_path(config, INCIDENTS)).collect()}
    assert set(rows) == {(orders, "invalid_ratio"), (clicks, "silence")}
    ratio = rows[(orders, "invalid_ratio")]
    assert (ratio["status"], ratio["level"], ratio["final"]) == ("resolved", 1, True)
    assert ratio["worst_value"] == pytest.approx(50 / 60)
    assert [s["reason"] for s in json.loads(ratio["sample"])] == ["not_json"] * 3
    assert rows[(clicks, "silence")]["status"] == "resolved"
    # One message per channel and event, each once: open, open, worsen, resolve, resolve.
    assert sorted(b["event"] for b in hook.bodies) == ["open", "open", "resolve", "resolve", "worsen"]
    assert len(smtp.messages) == 5 and len(set(hook.keys)) == 5
    # The same counts again: nothing changes, nothing is sent.
    again = evaluate(12)
    assert again["notifications_total"] == 0 and again["incidents_changed"] == 0, again
    assert len(hook.bodies) == 5 and len(smtp.messages) == 5


@pytest.mark.slow  # ~4 min on the 2-core machine: `make test-slow`
@pytest.mark.timeout(1500)  # three starts of the stream's spark-submit on a 2-core machine
def test_a_stream_killed_in_the_middle_of_a_burst_opens_and_notifies_its_incident_once(
        spark, local_stack, receivers, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    """The speed layer as a process, killed after it MERGEd a micro-batch of a burst and before it committed it
    (its replay re-merges the same absolute counts); the expectations judged while it is down (the burst half
    counted: already over the threshold), after its restart (the whole burst), and after the traffic is normal
    again. One incident, opened once, resolved once; one message per channel for each."""
    import psutil

    from kdq.spark.stream_process import start_stream, stop_stream, stream_process
    from tests.integration.helpers import wait_for, write_config_file

    smtp, hook = receivers
    hook.fail_first = 0
    prefix = f"xk{tmp_path.name[-6:].replace('_', '')}"
    orders = f"{prefix}-orders"
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "topics.toml").write_text(
        "[expectations]\nclear_after_minutes = 2\n"
        "invalid_ratio = { above = 0.3, over_minutes = 1, min_records = 20, worsen_at = [0.6] }\n")
    config = write_config_file(isolated_config(  # 50 records per micro-batch, as the crash tests have it
        local_stack, tmp_path / "data", prefix, paths={"rules_dir": str(rules)}, kafka={"max_offsets_per_trigger": 50},
        stream={"trigger_interval_seconds": 0.5}), tmp_path / "kdq.toml")
    local_stack.kafka.create_topic(orders, partitions=1)
    monkeypatch.setenv(CHANNELS_ENV, json.dumps([
        {"name": "mail", "kind": "smtp", "host": "127.0.0.1", "port": smtp.server_address[1], "from": "kdq@test",
         "to": ["team@test"], "ssl": False, "starttls": False},
        {"name": "hook", "kind": "webhook", "url": f"http://127.0.0.1:{hook.server_address[1]}/kdq"},
    ]))
    base = (int(time.time() * 1000) - 3_600_000) // MINUTE_MS * MINUTE_MS
    sent: list[tuple[int, bool]] = []

    def minute(m: int, valid: int, invalid: int = 0) -> None:
        records = [(0, json.dumps({"i": i}).encode() if i < valid else b"not json", base + m * MINUTE_MS + i * 100)
                   for i in range(valid + invalid)]
        produce(config.kafka_bootstrap(), orders, records)
        sent.extend((ts, i < valid) for i, (_, _, ts) in enumerate(records))

    def evaluate(after_minute: int) -> list[str]:
        args = argparse.Namespace(now_ms=base + (after_minute + 1) * MINUTE_MS + 1000, horizon_minutes=180,
                                  deliver=True)
        report = evaluate_expectations.run(spark, config, args).to_dict()
        assert report["ok"], report
        return [n["event"] for n in report["notifications"]]

    # Offsets 0..149: five normal minutes; 150..209: the burst of minute 5, half of it invalid (its second half).
    for m in range(5):
        minute(m, 30)
    minute(5, 30, 30)
    try:
        # Micro-batch 3 (offsets 150..199: the burst's 30 valid and 20 of its invalid) dies after its MERGE.
        marker = tmp_path / "killed"
        pid = start_stream(config, extra_env={"KDQ_FAULT_POINT": "after_merge", "KDQ_FAULT_BATCH": "3",
                                              "KDQ_FAULT_MARKER": str(marker)})
        assert psutil.Process(pid).wait(timeout=300) == 137, stream_process(config).log_tail(40)
        assert marker.exists()
        counted = window_counts(spark, config, orders)
        assert sum(counted.values()) == 200, counted  # batch 3 merged, its offsets not committed

        assert evaluate(5) == ["open"]  # 20 of 50 over the 30 % threshold while the stream is down
        start_stream(config)
        expected = expected_counts(orders, sent)
        wait_for(lambda: window_counts(spark, config, orders) == expected, 240, "the burst counted after the replay",
                 interval=3)
        assert evaluate(5) == []  # the replayed batch re-merged the same counts: 30 of 60, the same level

        for m in range(6, 12):
            minute(m, 30)
        expected = expected_counts(orders, sent)
        wait_for(lambda: window_counts(spark, config, orders) == expected, 240, "normal traffic counted", interval=3)
        assert evaluate(11) == ["resolve"]
        assert evaluate(11) == []
    finally:
        stop_stream(config, timeout=60)

    rows = spark.read.format("delta").load(table_path(config, INCIDENTS)).collect()
    assert [(r["expectation"], r["status"]) for r in rows] == [("invalid_ratio", "resolved")]
    assert rows[0]["worst_value"] == pytest.approx(0.5)  # the whole burst, not the half seen while the stream was down
    assert sorted(b["event"] for b in hook.bodies) == ["open", "resolve"] and len(smtp.messages) == 2
