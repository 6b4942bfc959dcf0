"""Expectations on real Delta tables, incidents in ``kdq.incidents``, notifications by real SMTP and HTTP.

Counts are committed with the stream's own writer (:func:`kdq.spark.writers.merge_window_increments`), the
evaluation job runs in-process (``spark_jobs/evaluate_expectations.run``, its time pinned with ``--now``), and
its notifications go to a real SMTP server (aiosmtpd) and an HTTP webhook receiver started here. A burst of invalid records
opens one incident and one message per channel; more worsen it; normal traffic resolves it; a re-run with the
same inputs writes and sends nothing; a late correction that pushes a past window over the threshold opens one
incident for that window, once; a channel that fails once is retried, a dead one never fails the run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from spark_jobs import evaluate_expectations

import kdq.spark.expectations
from kdq.notify import CHANNELS_ENV, WebhookChannel
from kdq.procs import free_port
from kdq.spark.notify import deliver_pending
from kdq.spark.tables import ensure_tables, table_path
from kdq.spark.writers import append_archive, delta_snapshot, merge_window_increments
from kdq.stream.state import PROGRESS_LOG, state_dir
from kdq.tables import INCIDENT_DELIVERIES, INCIDENTS, RAW_ARCHIVE
from kdq.windows import event_hour
from tests.conftest import make_config

pytestmark = pytest.mark.integration

BASE_MS = int(dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC).timestamp() * 1000)  # minute 0 of the traffic
MINUTE_MS = 60_000
TOPICS_TOML = """
[expectations]
clear_after_minutes = 10
invalid_ratio = { above = 0.05, over_minutes = 5, min_records = 20, worsen_at = [0.3] }
"""


class SmtpReceiver:
    """A real SMTP server (aiosmtpd, aio-libs') on a free loopback port that keeps every message it receives."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[str] = []
        self.controller = Controller(self, hostname="127.0.0.1", port=free_port())
        self.server_address = ("127.0.0.1", self.controller.port)

    async def handle_DATA(self, server, session, envelope) -> str:  # noqa: N802 (aiosmtpd's handler hook)
        self.messages.append(envelope.content.decode("utf-8", "replace"))
        return "250 Message accepted for delivery"

    def start(self) -> None:
        self.controller.start()

    def stop(self) -> None:
        self.controller.stop()


class WebhookReceiver(ThreadingHTTPServer):
    def __init__(self, fail_first: int = 0) -> None:
        self.bodies: list[dict] = []
        self.keys: list[str] = []
        self.fail_first = fail_first
        super().__init__(("127.0.0.1", 0), _WebhookHandler)


class _WebhookHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        server: WebhookReceiver = self.server  # type: ignore[assignment]
        if server.fail_first > 0:
            server.fail_first -= 1
            self.send_response(503)
        else:
            server.bodies.append(json.loads(body))
            server.keys.append(self.headers["Idempotency-Key"])
            self.send_response(204)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def receivers():
    smtp, hook = SmtpReceiver(), WebhookReceiver(fail_first=1)
    smtp.start()
    serving = threading.Thread(target=hook.serve_forever, daemon=True)
    serving.start()
    try:
        yield smtp, hook
    finally:
        smtp.stop()
        hook.shutdown()
        hook.server_close()


class Traffic:
    """The stream's MERGE of per-minute counts (one window per minute, at its first second)."""

    def __init__(self, spark, config) -> None:
        self.spark, self.config, self.version = spark, config, 0

    def add(self, minutes: range | list[int], valid: int = 100, invalid: int = 0, by: str = "stream") -> None:
        rows = [{"topic": "orders", "window_start_ms": BASE_MS + m * MINUTE_MS, "status": status, "count": n,
                 "rules_version": "r1"} for m in minutes for status, n in (("valid", valid), ("invalid", invalid)) if n]
        self.version += 1
        merge_window_increments(self.spark, rows, self.config, "test-expectations", self.version, updated_by=by)


    def archive_invalid(self, minute: int, values: list[bytes], first_offset: int) -> None:
        """Archive rows of invalid records (where an incident's sample comes from)."""
        at = dt.datetime.fromtimestamp((BASE_MS + minute * MINUTE_MS) / 1000, tz=dt.UTC)
        rows = [("orders", 0, first_offset + i, at, at, at, None, v, at, False, "not_json", True, "r1", None, None,
                 event_hour(BASE_MS + minute * MINUTE_MS)) for i, v in enumerate(values)]
        self.version += 1
        df = self.spark.createDataFrame(rows, RAW_ARCHIVE.ddl_columns)
        append_archive(df, self.config, "test-expectations-archive", self.version, 0, "stream")


def burst_a_minute_ago(spark, config, app_id: str, now_ms: int | None = None) -> None:
    """Ten minutes of 100 valid records, then 400 invalid ones in the last whole minute of the wall clock."""
    now_minute = (now_ms or int(dt.datetime.now(dt.UTC).timestamp() * 1000)) // MINUTE_MS
    rows = [{"topic": "orders", "window_start_ms": (now_minute - back) * MINUTE_MS, "status": "valid", "count": 100,
             "rules_version": "r1"} for back in range(2, 12)]
    rows.append({"topic": "orders", "window_start_ms": (now_minute - 1) * MINUTE_MS, "status": "invalid",
                 "count": 400, "rules_version": "r1"})
    merge_window_increments(spark, rows, config, app_id, 1)


def evaluate(spark, config, after_minute: int) -> dict:
    """The job at just after ``after_minute`` ended, delivering; its printed report."""
    now = BASE_MS + (after_minute + 1) * MINUTE_MS + 1000
    args = argparse.Namespace(now_ms=now, horizon_minutes=180, deliver=True)
    report = evaluate_expectations.run(spark, config, args).to_dict()
    assert report["ok"], report
    return report


def incidents(spark, config) -> list:
    return spark.read.format("delta").load(table_path(config, INCIDENTS)).orderBy("incident_key").collect()


def test_incidents_open_worsen_resolve_and_notify_once(spark, tmp_path: Path, receivers, monkeypatch) -> None:
    smtp, hook = receivers
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "topics.toml").write_text(TOPICS_TOML)
    config = make_config(tmp_path, paths={"rules_dir": str(rules)}, spark={"master": "local[2]", "shuffle_partitions": 2})
    monkeypatch.setenv(CHANNELS_ENV, json.dumps([
        {"name": "mail", "kind": "smtp", "host": "127.0.0.1", "port": smtp.server_address[1], "from": "kdq@test",
         "to": ["team@test"], "ssl": False, "starttls": False},
        {"name": "hook", "kind": "webhook", "url": f"http://127.0.0.1:{hook.server_address[1]}/kdq"},
    ]))
    ensure_tables(spark, config)
    traffic = Traffic(spark, config)

    traffic.add(range(0, 20))
    quiet = evaluate(spark, config, 19)
    assert quiet["notifications_total"] == 0 and incidents(spark, config) == []

    # A burst: 60 invalid of 560 records over minutes 16..20 (> 5 %): one incident, one message per channel.
    traffic.add([20], invalid=60)
    traffic.archive_invalid(20, [b"{a fourth one"], first_offset=3000)
    traffic.archive_invalid(20, [b"{not json", b"\xff\xfe", b"{also not json"], first_offset=2000)
    opened = evaluate(spark, config, 20)
    assert [n["event"] for n in opened["notifications"]] == ["open"], opened
    key = "orders|invalid_ratio|2026-11-20T10:20Z"
    assert opened["notifications"][0]["id"].startswith(key)
    assert opened["delivery"]["sent"] == {"mail": 1, "hook": 1}, opened["delivery"]
    assert len(opened["delivery"]["errors"]) == 1 and "HTTP 503" in opened["delivery"]["errors"][0]  # retried
    (row,) = incidents(spark, config)
    assert (row["incident_key"], row["status"], row["level"], row["version"]) == (key, "open", 0, 1)
    sample = json.loads(row["sample"])  # the first three invalid records by (partition, offset)
    assert [(s["offset"], s["reason"]) for s in sample] == [(2000, "not_json"), (2001, "not_json"), (2002, "not_json")]
    assert sample[0]["value"] == "{not json"
    assert len(smtp.messages) == 1 and "Subject: [kdq] open: orders invalid_ratio (open)" in smtp.messages[0]
    assert [b["event"] for b in hook.bodies] == ["open"] and hook.keys == [opened["notifications"][0]["id"]]

    # The same inputs again: no row version, no outbox row, no message.
    incidents_version = delta_snapshot(spark, table_path(config, INCIDENTS)).version()
    again = evaluate(spark, config, 20)
    assert again["notifications_total"] == 0 and again["incidents_changed"] == 0, again
    assert delta_snapshot(spark, table_path(config, INCIDENTS)).version() == incidents_version
    assert len(smtp.messages) == 1 and len(hook.bodies) == 1

    # More invalid records: past the 30 % level, worsened (one more message each).
    traffic.add([21])
    traffic.add([22], invalid=400)
    worse = evaluate(spark, config, 22)
    assert [n["event"] for n in worse["notifications"]] == ["worsen"], worse
    assert (incidents(spark, config)[0]["level"], len(smtp.messages), len(hook.bodies)) == (1, 2, 2)
    assert incidents(spark, config)[0]["sample"] == row["sample"]  # kept by later versions

    # Normal traffic: the condition is clear from minute 27 on, resolved by the final clear minute 36.
    traffic.add(range(23, 41))
    resolved = evaluate(spark, config, 40)
    assert [n["event"] for n in resolved["notifications"]] == ["resolve"], resolved
    (row,) = incidents(spark, config)
    assert (row["status"], row["final"], row["last_window"]) == ("resolved", True, dt.datetime(2026, 11, 20, 10, 26))
    assert [b["event"] for b in hook.bodies] == ["open", "worsen", "resolve"] and len(smtp.messages) == 3
    assert evaluate(spark, config, 40)["notifications_total"] == 0

    # A late correction (the batch layer) pushes minute 5, long final, over the threshold: one past incident.
    traffic.add([5], valid=0, invalid=80, by="batch")
    late = evaluate(spark, config, 41)
    assert [n["event"] for n in late["notifications"]] == ["open", "resolve"], late
    assert {n["id"].split("#")[0] for n in late["notifications"]} == {"orders|invalid_ratio|2026-11-20T10:05Z"}
    for _ in range(2):
        assert evaluate(spark, config, 41)["notifications_total"] == 0
    assert [r["status"] for r in incidents(spark, config)] == ["resolved", "resolved"]
    assert len(smtp.messages) == len(hook.bodies) == 5 and len(set(hook.keys)) == 5
    deliveries = spark.read.format("delta").load(table_path(config, INCIDENT_DELIVERIES))
    assert deliveries.count() == 10 and deliveries.groupBy("notification_id", "channel").count().where(
        F.col("count") > 1).count() == 0

    # A dead channel next to a live one: given up for the run, reported, the live one still has nothing due.
    dead = WebhookChannel("dead", "http://127.0.0.1:9/none", timeout=1)
    report = deliver_pending(spark, config, BASE_MS + 42 * MINUTE_MS, channels=[dead], backoff_seconds=0.01)
    assert report["failed"] == {"dead": 1} and report["deferred"] == {"dead": 4}, report
    assert "127.0.0.1:9" not in json.dumps(report)  # a webhook's URL (its token) stays out of the report
    assert len(hook.bodies) == 5 and len(smtp.messages) == 5


def test_the_dags_operator_gives_the_job_its_airflow_connections(spark, tmp_path: Path, receivers, monkeypatch) -> None:
    """The kdq_expectations DAG's task as Airflow runs it (the operator, spark-submit through the Spark provider):
    the webhook channel comes from an Airflow connection, reaches the job in its environment, and gets the
    incident of a burst one minute old; the task's return value (XCom) is the job's report."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "plugins"))
    from kdq_airflow.operators import ExpectationsOperator

    _, hook = receivers
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "topics.toml").write_text(TOPICS_TOML)
    for key, value in {"KDQ_PATHS__DATA_DIR": str(tmp_path), "KDQ_PATHS__RULES_DIR": str(rules)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    monkeypatch.setenv("AIRFLOW_CONN_KDQ_WEBHOOK", json.dumps(
        {"conn_type": "http", "host": f"http://127.0.0.1:{hook.server_address[1]}", "extra": {"endpoint": "/kdq"}}))
    config = make_config(tmp_path, paths={"rules_dir": str(rules)})
    ensure_tables(spark, config)
    burst_a_minute_ago(spark, config, "test-expectations-operator")

    task = ExpectationsOperator(task_id="evaluate_and_notify", channel_conn_ids=["kdq_smtp", "kdq_webhook"])
    report = task.execute({})
    assert report["ok"] and [n["event"] for n in report["notifications"]] == ["open"], report
    assert report["delivery"]["channels"] == ["kdq_webhook"] and report["delivery"]["sent"] == {"kdq_webhook": 1}
    assert [b["event"] for b in hook.bodies] == ["open"] and hook.bodies[0]["topic"] == "orders"


@pytest.mark.slow  # three spark-submit runs, ~4 min on the 2-core machine: `make test-slow`
def test_a_run_killed_between_its_writes_then_two_runs_at_once_notify_each_event_once(spark, tmp_path: Path,
                                                                                     receivers) -> None:
    """Overlap (the scheduled run beside a manual one) and a kill, with the job as spark-submit runs it: a run
    killed after it filled the outbox but before it stored the incident; then two runs started together while
    a third party holds the evaluation lease, both waiting, both let go at once. One incident row, one outbox
    row, one message per channel. Without the lease both runs would find the open notification undelivered and
    send it twice."""
    import subprocess

    from kdq.spark.expectations import FAULT_ENV, evaluation_lease
    from kdq.spark.stream_process import child_env
    from kdq.spark.submit import submit_command
    from kdq.tables import INCIDENT_NOTIFICATIONS
    from tests.integration.helpers import wait_for, write_config_file

    smtp, hook = receivers
    hook.fail_first = 0
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "topics.toml").write_text(TOPICS_TOML)
    config = write_config_file(
        make_config(tmp_path, paths={"rules_dir": str(rules)}, spark={"master": "local[1]", "shuffle_partitions": 2}),
        tmp_path / "kdq.toml")
    ensure_tables(spark, config)
    traffic = Traffic(spark, config)
    traffic.add(range(0, 20))
    traffic.add([20], invalid=60)
    channels = json.dumps([
        {"name": "mail", "kind": "smtp", "host": "127.0.0.1", "port": smtp.server_address[1], "from": "kdq@test",
         "to": ["team@test"], "ssl": False, "starttls": False},
        {"name": "hook", "kind": "webhook", "url": f"http://127.0.0.1:{hook.server_address[1]}/kdq"},
    ])
    now = str(BASE_MS + 21 * MINUTE_MS + 1000)
    command = submit_command(config, "evaluate_expectations", ["--now", now, "--deliver"])
    env = {**child_env(config, {CHANNELS_ENV: channels})}

    def start(name: str, extra: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"{name}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(command, env={**env, **(extra or {})}, cwd=config.base_dir, stdout=out,
                                    stderr=subprocess.STDOUT, text=True)
        return proc, log

    killed, killed_log = start("killed", {FAULT_ENV: "after_outbox"})
    assert killed.wait(timeout=300) == 137, killed_log.read_text()[-3000:]
    outbox = spark.read.format("delta").load(table_path(config, INCIDENT_NOTIFICATIONS))
    assert [r["event"] for r in outbox.collect()] == ["open"] and incidents(spark, config) == []
    assert smtp.messages == [] and hook.bodies == []

    held = evaluation_lease(config)
    held.acquire()  # a run in progress, as far as the two below can tell: renewed, as a run renews it
    held.keep_renewed(lambda reason: None)
    runs = [start("first"), start("second")]
    try:
        wait_for(lambda: all("waiting for it" in log.read_text() for _, log in runs), 240,
                 "both runs waiting for the evaluation lease", interval=2)
    finally:
        held.release()
    deadline = time.monotonic() + 300
    for proc, log in runs:
        assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, log.read_text()[-3000:]
    reports = [json.loads([line for line in log.read_text().splitlines() if line.startswith('{"')][-1])
               for _, log in runs]
    assert sorted(r["notifications_total"] for r in reports) == [0, 1], reports  # the killed run's, derived again
    assert sum(r["delivery"]["sent"].get("hook", 0) for r in reports) == 1, reports

    (row,) = incidents(spark, config)
    assert (row["incident_key"], row["status"], row["version"]) == ("orders|invalid_ratio|2026-11-20T10:20Z", "open", 1)
    assert outbox.count() == 1
    assert len(smtp.messages) == 1 and [b["event"] for b in hook.bodies] == ["open"]
    assert spark.read.format("delta").load(table_path(config, INCIDENT_DELIVERIES)).count() == 2


def test_one_run_evaluates_on_the_clock_and_notifies_once(spark, tmp_path: Path, monkeypatch) -> None:
    """``--every 1 --for-seconds 20`` (the DAG's task has 15 and 3540): one session looks every second; the burst
    of the last minute opens its incident in the first evaluation, the second (the incidents' version moved)
    changes nothing, and the looks after it find the inputs unchanged and skip the evaluation. (No rest after
    an evaluation here: on a busy machine two evaluations and their rests could fill the 20 s.)"""
    monkeypatch.setattr(evaluate_expectations, "REST_FACTOR", 0.0)
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "topics.toml").write_text(TOPICS_TOML)
    config = make_config(tmp_path, paths={"rules_dir": str(rules)})
    ensure_tables(spark, config)
    # The wall clock held still: a run that crosses a minute's end would otherwise evaluate a new horizon (a
    # silent minute more, the incident's last-seen moved) and change a row the test counts.
    frozen_ms = int(time.time() * 1000)
    monkeypatch.setattr(evaluate_expectations, "wall_clock_ms", lambda: frozen_ms)
    burst_a_minute_ago(spark, config, "test-expectations-every", frozen_ms)
    # After the first evaluation the stream counts a micro-batch that is 80 % invalid on payments (no incident
    # open there): the run evaluates for it at once, ahead of its regular looks.
    real_evaluation, evaluations = kdq.spark.expectations.evaluate_expectations, []

    def evaluating_then_a_bad_batch(*args, **kwargs):
        report = real_evaluation(*args, **kwargs)
        evaluations.append(report)
        if len(evaluations) == 1:
            state_dir(config).mkdir(parents=True, exist_ok=True)
            with open(state_dir(config) / PROGRESS_LOG, "a") as log:
                log.write(json.dumps({"batch_id": 1, "input_rows_by_topic": {"payments": 100},
                                      "invalid_rows_by_topic": {"payments": 80}}) + "\n")
        return report

    monkeypatch.setattr(kdq.spark.expectations, "evaluate_expectations", evaluating_then_a_bad_batch)
    args = argparse.Namespace(now_ms=None, horizon_minutes=180, deliver=False, every_seconds=1.0, for_seconds=20.0)
    report = evaluate_expectations.run(spark, config, args).to_dict()
    assert report["ok"] and report["evaluations"] >= 2 and report["skipped_unchanged"] >= 1, (
        report["evaluations"], report["skipped_unchanged"], report["step_seconds"])
    assert report["evaluated_at_once"] == 1, report  # the bad batch, once: later looks know it was evaluated
    assert [n["event"] for n in report["notifications"]] == ["open"] and report["incidents_changed"] == 1, report
    # Where the evaluations' time went, step by step (no --deliver: no delivery step).
    assert list(report["step_seconds"]) == ["read", "judge", "sample", "write"], report
    assert all(seconds >= 0 for seconds in report["step_seconds"].values()) and report["step_seconds"]["read"] > 0
    assert [r["status"] for r in incidents(spark, config)] == ["open"]
