"""The data-quality page's pure part: time ranges, shaping, stream health, HTML; and its SQL run on local
Spark + Delta tables whose rows the test inserted itself (the expected numbers are counted here)."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kdq.quality_health import StreamHealth, TopicHealth, read_progress_log, stream_health
from kdq.quality_html import chart_svg, render_page
from kdq.quality_page import (
    MINUTE_MS,
    DagRunLink,
    PageRange,
    build_model,
    dag_run_url,
    page_queries,
    rows_as_dicts,
    shape_counts,
)
from kdq.windows import HOUR_MS
from tests.conftest import make_config

NOW = 1_700_003_723_456  # 2023-11-14 23:15:23.456 UTC


def test_page_ranges_are_whole_minutes_and_hours_ending_with_the_current_one() -> None:
    page = PageRange(NOW)
    minute, hour = NOW // MINUTE_MS * MINUTE_MS, NOW // HOUR_MS * HOUR_MS
    assert page.hour_to_ms == minute + MINUTE_MS and page.hour_from_ms == minute - 59 * MINUTE_MS
    assert page.day_to_ms == hour + HOUR_MS and page.day_from_ms == hour - 23 * HOUR_MS
    assert len(page.buckets("hour")) == 60 and len(page.buckets("day")) == 24
    assert page.buckets("hour")[-1] == minute and page.buckets("day")[-1] == hour
    with pytest.raises(ValueError, match="unknown scale"):
        page.buckets("week")


def test_shape_counts_fills_every_bucket_and_sums_per_topic() -> None:
    page = PageRange(NOW)
    minute = NOW // MINUTE_MS * MINUTE_MS
    hour = NOW // HOUR_MS * HOUR_MS
    rows = [
        {"scale": "hour", "topic": "orders", "bucket_ms": minute, "valid": 5, "invalid": 1},
        {"scale": "hour", "topic": "orders", "bucket_ms": minute - MINUTE_MS, "valid": 0, "invalid": 3},
        {"scale": "day", "topic": "orders", "bucket_ms": hour, "valid": 5, "invalid": 4},
        {"scale": "day", "topic": "orders", "bucket_ms": hour - 5 * HOUR_MS, "valid": 10, "invalid": None},
    ]
    shaped = shape_counts(rows, page)
    hour_series, day_series = shaped["orders"]["hour"], shaped["orders"]["day"]
    assert len(hour_series.buckets) == 60 and len(day_series.buckets) == 24
    assert (hour_series.valid, hour_series.invalid) == (5, 4)
    assert hour_series.ratio == pytest.approx(4 / 9)
    assert (day_series.valid, day_series.invalid) == (15, 4)
    assert hour_series.buckets[0].ratio is None  # nothing counted: no ratio, not 0 %
    assert shape_counts([], page) == {}


def test_stream_health_from_state_files(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    folder = tmp_path / "stream"
    folder.mkdir()

    def iso(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")

    records = [
        {"batch_id": 1, "timestamp": iso(NOW - 2 * HOUR_MS), "late_rows": {"orders": 7}},
        {"batch_id": 2, "timestamp": iso(NOW - 30 * MINUTE_MS), "late_rows": {"orders": 2, "payments": 1}},
        {
            "batch_id": 3,
            "timestamp": iso(NOW - 1000),
            "late_rows": {"orders": 1},
            "input_rows": 42,
            "consumer_lag": {"orders": 12, "payments": 0},
            "event_time_lag_ms": {"orders": 1500},
            "end_to_end_latency_ms": {"oldest": 2400, "newest": 900},
        },
    ]
    (folder / "progress.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n{torn")
    assert [r["batch_id"] for r in read_progress_log(config)] == [1, 2, 3]
    status = {
        "heartbeat": {"state": "running", "time_ms": NOW - 3000},
        "progress": records[-1],
        "influx_push": {"pending_since_ms": None},
        "batch_failure": None,
    }
    health = stream_health(status, read_progress_log(config), NOW)
    assert health.state == "running" and health.last_batch_id == 3 and health.last_batch_rows == 42
    assert health.heartbeat_age_s == pytest.approx(3.0)
    assert (health.latency_oldest_ms, health.latency_newest_ms) == (2400, 900)
    orders = health.topics["orders"]
    assert (orders.consumer_lag, orders.event_time_lag_ms, orders.late_rows_last_batch, orders.late_rows_hour) == (
        12,
        1500,
        1,
        3,
    )  # the batch two hours ago is not in the last hour
    assert health.topics["payments"].late_rows_hour == 1

    stale = stream_health({**status, "heartbeat": {"state": "running", "time_ms": NOW - 600_000}}, [], NOW)
    assert stale.state == "no heartbeat for 600 s"
    assert stream_health({}, [], NOW).state == "never started"
    failing = stream_health({**status, "batch_failure": {"batch_id": 9, "attempts": 3, "error": "boom"}}, [], NOW)
    assert failing.failure == "batch 9 failed 3 time(s): boom"


class _Cells(HTMLParser):
    """(data-topic, data-row, data-field) → texts; the test's own reading of the rendered page."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[dict] = []
        self.cells: dict[tuple, list[str]] = {}
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        attrs = dict(attrs)
        parent = self.stack[-1] if self.stack else {}
        ctx = {
            "topic": attrs.get("data-topic", parent.get("topic")),
            "row": attrs.get("data-row", parent.get("row")),
            "field": attrs.get("data-field"),
            "text": [],
        }
        if tag == "a":
            self.links.append(attrs.get("href", ""))
        if tag not in ("br", "meta", "rect", "line", "circle", "polyline"):
            self.stack.append(ctx)

    def handle_endtag(self, tag) -> None:
        if tag in ("br", "meta", "rect", "line", "circle", "polyline") or not self.stack:
            return
        ctx = self.stack.pop()
        if ctx["field"]:
            self.cells.setdefault((ctx["topic"], ctx["row"], ctx["field"]), []).append("".join(ctx["text"]))
        if self.stack:
            self.stack[-1]["text"].extend(ctx["text"])

    def handle_data(self, data) -> None:
        if self.stack:
            self.stack[-1]["text"].append(data)


def test_page_shows_numbers_escapes_data_and_links_runs() -> None:
    page = PageRange(NOW)
    minute = NOW // MINUTE_MS * MINUTE_MS
    evil = "<script>alert(1)</script>"
    rows = {
        "counts": [
            {"scale": "hour", "topic": evil, "bucket_ms": minute, "valid": 3, "invalid": 1},
            {"scale": "day", "topic": evil, "bucket_ms": NOW // HOUR_MS * HOUR_MS, "valid": 3, "invalid": 1},
        ],
        "reasons": [
            {
                "topic": evil,
                "reason": "not_json",
                "count": 1,
                "partition": 2,
                "offset": 17,
                "value_preview": "</code><img src=x onerror=alert(1)>",
                "value_bytes": 35,
            }
        ],
        "corrections": [
            {
                "topic": evil,
                "window_ms": minute,
                "status": "valid",
                "old_count": 5,
                "new_count": 6,
                "reason": "late_data",
                "run_id": "manual__2023",
                "corrected_ms": NOW,
            }
        ],
    }
    runs = [
        DagRunLink(
            "kdq_hourly_recompute", "manual__2023", "success", NOW, dag_run_url("kdq_hourly_recompute", "manual__2023")
        )
    ]
    model = build_model(
        page,
        rows,
        StreamHealth(state="running", latency_oldest_ms=2400, latency_newest_ms=900),
        runs,
        sql_source="sc://127.0.0.1:1",
        dag_ids=("kdq_hourly_recompute",),
    )
    html = render_page(model)
    # The page's one script is its own self-refresh (in the head); the data's markup is escaped.
    assert evil not in html and html.count("<script>") == 1 and "<img" not in html
    assert html.index("<script>") < html.index("</head>")
    parser = _Cells()
    parser.feed(html)
    cells = parser.cells
    assert cells[(evil, "overview", "hour-valid")] == ["3"]
    assert cells[(evil, "overview", "hour-invalid")] == ["1"]
    assert cells[(evil, "overview", "hour-ratio")] == ["25.00 %"]
    assert cells[(evil, "reason", "reason-count")] == ["1"]
    assert cells[(evil, "reason", "sample-position")] == ["partition 2, offset 17"]
    assert cells[(evil, "reason", "sample-value")] == ["</code><img src=x onerror=alert(1)>"]
    assert cells[(evil, "correction", "old-count")] == ["5"] and cells[(evil, "correction", "new-count")] == ["6"]
    assert "/dags/kdq_hourly_recompute/runs/manual__2023" in parser.links
    assert cells[(None, None, "latency-oldest")] == ["2.4 s"]
    assert len(re.findall(r"<svg ", html)) == 2


def test_page_without_the_endpoint_says_why_and_still_shows_stream_health() -> None:
    model = build_model(
        PageRange(NOW),
        None,
        StreamHealth(state="running", last_batch_id=4),
        sql_error="the SQL endpoint is not running",
    )
    html = render_page(model)
    parser = _Cells()
    parser.feed(html)
    assert parser.cells[(None, None, "sql-error")][0].startswith("Counts, reasons and corrections are not available")
    assert parser.cells[(None, None, "last-batch-id")] == ["4"]
    # Unknown counts read "—", never 0; no chart pretends there was no traffic.
    model = build_model(
        PageRange(NOW), None, StreamHealth(state="running", topics={"orders": TopicHealth(3)}), sql_error="down"
    )
    parser = _Cells()
    parser.feed(render_page(model))
    assert parser.cells[("orders", "overview", "hour-valid")] == ["—"]
    assert parser.cells[("orders", "totals-values", "day-invalid")] == ["—"]
    assert parser.cells[("orders", "health", "consumer-lag")] == ["3"]
    assert "<svg" not in render_page(model)


def test_incidents_open_first_with_their_windows_values_and_samples_escaped() -> None:
    minute = NOW // MINUTE_MS * MINUTE_MS
    sample = json.dumps([{"partition": 2, "offset": 17, "reason": "not_json", "value": "<script>x</script>"}])
    row = {"incident_key": "orders|invalid_ratio|1", "topic": "orders", "expectation": "invalid_ratio",
           "status": "open", "first_ms": minute - 3 * MINUTE_MS, "last_ms": minute - MINUTE_MS,
           "window_start_ms": minute - 3 * MINUTE_MS, "window_end_ms": minute, "worst_value": 0.625,
           "threshold": 0.3, "level": 1, "final": False, "resolved_ms": None, "opened_ms": minute - 2 * MINUTE_MS,
           "updated_ms": minute, "version": 3, "sample": sample}
    stream = {**row, "incident_key": "(stream)|batch_failing|1", "topic": "(stream)", "expectation": "batch_failing",
              "status": "resolved", "worst_value": 3.0, "threshold": 0.0, "final": True, "resolved_ms": minute,
              "sample": "not json"}
    counts = [{"scale": "hour", "topic": "orders", "bucket_ms": minute, "valid": 1, "invalid": 0}]
    model = build_model(PageRange(NOW), {"counts": counts, "incidents": [row, stream]}, StreamHealth(state="running"))
    assert [(i.topic, i.status) for i in model.incidents] == [("orders", "open"), ("(stream)", "resolved")]
    assert model.incidents[1].sample == ()  # a malformed sample shows as none, never breaks the page
    html = render_page(model)
    parser = _Cells()
    parser.feed(html)
    assert parser.cells[("orders", "incident", "incident-status")] == ["open (provisional)"]
    assert parser.cells[("orders", "incident", "worst")] == ["62.50 %"]
    assert parser.cells[("orders", "incident", "threshold")] == ["30.00 %"]
    assert parser.cells[("(stream)", "incident", "worst")] == ["3"]
    assert "#topic-orders" in parser.links  # the topic's own section, with its charts and reasons
    assert "partition 2 offset 17" in html and "&lt;script&gt;" in html and "<script>x" not in html
    empty = render_page(build_model(PageRange(NOW), {"counts": counts}, StreamHealth(state="running")))
    assert 'data-field="no-incidents"' in empty


def test_chart_has_one_bar_group_per_bucket_and_a_ratio_line() -> None:
    page = PageRange(NOW)
    minute = NOW // MINUTE_MS * MINUTE_MS
    series = shape_counts(
        [
            {"scale": "hour", "topic": "t", "bucket_ms": b, "valid": 2, "invalid": 1}
            for b in (minute, minute - MINUTE_MS)
        ],
        page,
    )["t"]["hour"]
    svg = chart_svg(series, "t")
    assert svg.count("<title>") == 60 and svg.count("<polyline") == 1
    assert "2 valid, 1 invalid, invalid ratio 33.33 %" in svg


def test_the_ratio_line_breaks_at_minutes_without_records() -> None:
    """A minute with no records has no invalid ratio; a line drawn across empty minutes showed one (from
    the last minute with data to the next). Runs of counted minutes get a line each, a lone minute a dot."""
    page = PageRange(NOW)
    minute = NOW // MINUTE_MS * MINUTE_MS
    counted = [minute, minute - MINUTE_MS, minute - 10 * MINUTE_MS, minute - 11 * MINUTE_MS, minute - 30 * MINUTE_MS]
    series = shape_counts(
        [{"scale": "hour", "topic": "t", "bucket_ms": b, "valid": 1, "invalid": 1} for b in counted], page
    )["t"]["hour"]
    svg = chart_svg(series, "t")
    assert svg.count("<polyline") == 2 and svg.count("<circle") == 1
    # Nothing at all: no line, no dot.
    empty = shape_counts([{"scale": "hour", "topic": "t", "bucket_ms": minute, "valid": 0, "invalid": 0}], page)["t"]["hour"]
    assert "<polyline" not in chart_svg(empty, "t") and "<circle" not in chart_svg(empty, "t")


def test_page_sql_on_delta_tables(spark, spark_config) -> None:
    """The page's statements against the real tables and views, rows inserted here with known counts."""
    from kdq.spark.tables import register_tables

    register_tables(spark, spark_config)
    db = spark_config.spark.database
    topic = f"qp-{uuid.uuid4().hex[:8]}"
    now = int(datetime.now(UTC).timestamp() * 1000)
    page = PageRange(now)
    minute = now // MINUTE_MS * MINUTE_MS
    old = page.day_from_ms + 30 * MINUTE_MS  # in the day, not in the hour
    outside = page.day_from_ms - MINUTE_MS  # in neither

    def ts(ms: int) -> str:
        return f"timestamp_millis({ms})"

    counts = [
        (minute, "valid", 5),
        (minute, "invalid", 1),
        (minute - 2 * MINUTE_MS + 1000, "invalid", 2),
        (old, "valid", 7),
        (outside, "valid", 100),
    ]
    spark.sql(
        f"INSERT INTO {db}.window_counts VALUES "
        + ", ".join(
            f"('{topic}', {ts(w)}, {ts(w + 1000)}, '{s}', {n}, current_timestamp(), 'stream', 'r1', to_date({ts(w)}), "
            f"hour({ts(w)}))"
            for w, s, n in counts
        )
    )
    spark.sql(
        f"INSERT INTO {db}.invalid_reasons VALUES ('{topic}', {ts(minute)}, 'not_json', 2, 0, "
        f"current_timestamp()), ('{topic}', {ts(minute)}, 'not_json', 1, 1, current_timestamp()), "
        f"('{topic}', {ts(minute)}, 'schema:/required', 1, 1, current_timestamp()), "
        f"('{topic}', {ts(minute)}, 'not_utf8', 1, 1, current_timestamp())"
    )
    hour = datetime.fromtimestamp(minute / 1000, tz=UTC).strftime("%Y-%m-%d-%H")
    spark.sql(
        f"INSERT INTO {db}.raw_archive VALUES "
        f"('{topic}', 1, 40, {ts(minute)}, {ts(minute)}, {ts(minute)}, NULL, CAST('nope' AS BINARY), "
        f"current_timestamp(), false, 'not_json', true, 'r1', 0, 'stream', '{hour}'), "
        f"('{topic}', 0, 41, {ts(minute)}, {ts(minute)}, {ts(minute)}, NULL, CAST('nope2' AS BINARY), "
        f"current_timestamp(), false, 'not_json', true, 'r1', 0, 'stream', '{hour}'), "
        f"('{topic}', 2, 7, {ts(minute)}, {ts(minute)}, {ts(minute)}, NULL, unhex('FFFE41'), "
        f"current_timestamp(), false, 'not_utf8', true, 'r1', 0, 'stream', '{hour}')"
    )
    spark.sql(
        f"INSERT INTO {db}.corrections VALUES ('{topic}', {ts(minute)}, 'valid', 4, 5, {ts(minute)}, "
        f"{ts(minute + HOUR_MS)}, 'manual__x', 'late_data', current_timestamp())"
    )

    sample = json.dumps([{"partition": 1, "offset": 40, "reason": "not_json", "value": "nope"}])

    def incident(key: str, status: str, updated_ms: int, worst: float) -> str:
        resolved = "NULL" if status == "open" else ts(minute)
        return (f"('{topic}|{key}', '{topic}', '{key}', '{status}', {ts(minute - 5 * MINUTE_MS)}, {ts(minute)}, "
                f"{ts(minute - MINUTE_MS)}, {ts(minute)}, {worst}, 0.3, 1, false, {resolved}, "
                f"{ts(minute - MINUTE_MS)}, {ts(updated_ms)}, {ts(updated_ms)}, 2, '{sample}')")

    spark.sql(f"INSERT INTO {db}.incidents VALUES " + ", ".join([
        incident("invalid_ratio", "open", now - MINUTE_MS, 0.75),
        incident("silence", "resolved", now - 2 * MINUTE_MS, 0.0),
        incident("reason_count:not_json", "resolved", now - 30 * HOUR_MS, 300.0),  # older than a day: not shown
    ]))

    rows = {name: rows_as_dicts(spark.sql(sql).collect()) for name, sql in page_queries(db, page).items()}
    model = build_model(page, rows, StreamHealth(state="running"))
    mine = [i for i in model.incidents if i.topic == topic]
    assert [(i.expectation, i.status) for i in mine] == [("invalid_ratio", "open"), ("silence", "resolved")]
    assert (mine[0].worst_value, mine[0].threshold, mine[0].level, mine[0].first_ms) == (0.75, 0.3, 1,
                                                                                         minute - MINUTE_MS)
    assert [(r.partition, r.offset, r.value) for r in mine[0].sample] == [(1, 40, "nope")]
    html = render_page(model)
    assert f'data-key="{topic}|invalid_ratio" data-status="open"' in html and "75.00 %" in html
    [view] = [t for t in model.topics if t.topic == topic]
    assert (view.hour.valid, view.hour.invalid) == (5, 3)
    assert (view.day.valid, view.day.invalid) == (12, 3)
    assert [(r.reason, r.count) for r in view.reasons] == [("not_json", 3), ("not_utf8", 1), ("schema:/required", 1)]
    top, broken, unsampled = view.reasons
    assert (top.sample_partition, top.sample_offset, top.sample_preview, top.sample_bytes) == (0, 41, "nope2", 5)
    # Invalid UTF-8 reaches the client repaired (Spark Connect could not decode it otherwise).
    assert (broken.sample_offset, broken.sample_bytes) == (7, 3) and broken.sample_preview.endswith("A")
    assert "\ufffd" in broken.sample_preview
    assert unsampled.sample_offset is None  # no archived record with that reason
    [correction] = view.corrections
    assert (correction.old_count, correction.new_count, correction.run_id, correction.window_ms) == (
        4,
        5,
        "manual__x",
        minute,
    )
