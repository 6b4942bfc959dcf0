from __future__ import annotations

from kdq.stream.micro_batch import idle_ms_before_next_trigger, increments_of, merge_maxima

W0 = 1_700_000_000_000


def row(topic, window, valid, reason, counted, count, max_ms=None, version="v1"):
    return {
        "topic": topic,
        "window_start_ms": window,
        "valid": valid,
        "reason": reason,
        "counted": counted,
        "count": count,
        "max_event_ms": max_ms,
        "rules_version": version,
    }


def test_increments_of_splits_counted_late_and_reasons() -> None:
    rows = [
        row("orders", W0, True, None, True, 5, W0 + 900),
        row("orders", W0, False, "not_json", True, 1, W0 + 40),
        row("orders", W0 + 1000, False, "schema:/required/0", True, 2, W0 + 1500),
        row("orders", W0 + 1000, False, "not_json", True, 1, W0 + 1200),
        row("orders", W0 - 120_000, True, None, False, 3, W0 - 119_000),  # too late: archived only
        row("clock", W0, False, "future_timestamp", True, 4, None),  # never moves the watermark
    ]
    increments = increments_of(rows, reasons_window_seconds=60)
    assert increments.input_rows == 16
    assert increments.input_rows_by_topic == {"orders": 12, "clock": 4}
    assert increments.late_rows == {"orders": 3}
    assert increments.invalid_rows == 8
    assert increments.invalid_rows_by_topic == {"orders": 4, "clock": 4}  # the late invalid ones not among them
    assert increments.max_event_ms == {"orders": W0 + 1500}
    assert increments.window_increments == [
        {"topic": "clock", "window_start_ms": W0, "status": "invalid", "count": 4, "rules_version": "v1"},
        {"topic": "orders", "window_start_ms": W0, "status": "invalid", "count": 1, "rules_version": "v1"},
        {"topic": "orders", "window_start_ms": W0, "status": "valid", "count": 5, "rules_version": "v1"},
        {"topic": "orders", "window_start_ms": W0 + 1000, "status": "invalid", "count": 3, "rules_version": "v1"},
    ]
    minute = W0 // 60_000 * 60_000
    assert increments.reason_increments == [
        {"topic": "clock", "window_start_ms": minute, "reason": "future_timestamp", "count": 4},
        {"topic": "orders", "window_start_ms": minute, "reason": "not_json", "count": 2},
        {"topic": "orders", "window_start_ms": minute, "reason": "schema:/required/0", "count": 2},
    ]


def test_watermarks_only_move_forward() -> None:
    assert merge_maxima({"a": 10, "b": 5}, {"a": 7, "c": 1}) == {"a": 10, "b": 5, "c": 1}


def test_increments_of_keeps_the_kafka_timestamp_range_for_the_latency() -> None:
    rows = [
        {**row("orders", W0, True, None, True, 5, W0), "oldest_kafka_ms": W0 + 10, "newest_kafka_ms": W0 + 900},
        {**row("orders", W0 - 120_000, True, None, False, 1, W0), "oldest_kafka_ms": W0 + 5, "newest_kafka_ms": W0 + 5},
        {**row("pay", W0, False, "not_json", True, 2, None), "oldest_kafka_ms": W0 + 50, "newest_kafka_ms": W0 + 1200},
    ]
    increments = increments_of(rows, reasons_window_seconds=60)
    # The too-late record (not counted by the stream) is left out: W0 + 5 is its timestamp.
    assert (increments.oldest_kafka_ms, increments.newest_kafka_ms) == (W0 + 10, W0 + 1200)
    assert increments_of([row("orders", W0, True, None, True, 1)], 60).oldest_kafka_ms is None


def test_idle_time_before_the_next_processing_time_trigger() -> None:
    # Triggers at the multiples of the interval: a batch that started at 10.2 s and ends at 12.0 s waits 3 s.
    assert idle_ms_before_next_trigger(10_200, 12_000, 5_000) == 3_000
    # One that outlasted its trigger (started 10.2 s, ended 16.0 s) is followed at once by the next.
    assert idle_ms_before_next_trigger(10_200, 16_000, 5_000) == 0
    # A batch started exactly on a trigger waits for the following one.
    assert idle_ms_before_next_trigger(15_000, 15_400, 5_000) == 4_600
    # Back to back (availableNow, or a zero interval): never idle.
    assert idle_ms_before_next_trigger(10_200, 10_300, 0) == 0
