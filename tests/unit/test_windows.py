from __future__ import annotations

import pytest

from kdq.windows import event_hour, is_late, subscribe_pattern, topic_selected, window_end_ms, window_start_ms

W0 = 1_700_000_000_000


@pytest.mark.parametrize(
    ("event", "size", "start"),
    [(W0, 1, W0), (W0 + 999, 1, W0), (W0 + 1000, 1, W0 + 1000), (W0 + 59_999, 60, W0 + 40_000), (W0, 60, W0 - 20_000), (0, 10, 0), (-1, 1, -1000)],
)
def test_window_start_is_epoch_aligned(event, size, start) -> None:
    assert window_start_ms(event, size) == start
    assert window_start_ms(event, size) % (size * 1000) == 0
    assert window_end_ms(event, size) - window_start_ms(event, size) == size * 1000


def test_lateness_is_judged_against_the_topic_maximum() -> None:
    assert not is_late(W0, 1, None, 10)
    # Window [W0, W0+1s) closes for the stream once its end is 10 s behind the topic's maximum.
    assert not is_late(W0, 1, W0 + 10_999, 10)
    assert is_late(W0, 1, W0 + 11_000, 10)
    assert is_late(W0, 1, W0 + 3_600_000, 10)
    assert not is_late(W0, 1, W0 + 3_600_000, 3_600)


def test_subscribe_pattern_excludes_internal_and_own_topics() -> None:
    include, exclude = ".*", r"_.*|kdq\..*"
    assert topic_selected("orders", include, exclude)
    assert not topic_selected("__consumer_offsets", include, exclude)
    assert not topic_selected("_schemas", include, exclude)
    assert not topic_selected("kdq.metrics", include, exclude)
    assert not topic_selected("my-metrics", include, "", always_excluded=("my-metrics",))
    assert topic_selected("my-metrics-2", include, "", always_excluded=("my-metrics",))
    assert topic_selected("orders_kdq.x", include, exclude)  # exclusion is a full match, not a prefix
    assert not topic_selected("payments", "orders.*", exclude)
    assert subscribe_pattern(".*", "") == "^(?:.*)$"
    # Spark finds the pattern anywhere in the name: "dq.metrics" inside "kdq.metrics" must not count.
    assert not topic_selected("kdq.metrics", include, exclude)
    assert not topic_selected("xorders", "orders", "")


def test_event_hour_partition_value() -> None:
    assert event_hour(W0) == "2023-11-14-22"
