"""Streaming summaries on Spark: per (summary, topic, window, group) count, sum, min, max, mean, stddev and
percentiles from mergeable histograms, kept by the speed layer and corrected by the batch layer.

The package, from the bottom up (each module imports only those above it):

* :mod:`~kdq.spark.summaries.transforms` — the two transforms both layers share
  (:func:`summary_values`, :func:`summary_states`), so a window recomputed from
  the raw archive equals what the stream accumulated, by construction;
* :mod:`~kdq.spark.summaries.store` — the ``summaries`` table: MERGE of increments
  (stream) and of absolute states (batch), both with the derived statistics in
  SQL (:func:`derived_sql`), reads of stored states, and the size limits;
* :mod:`~kdq.spark.summaries.outputs` — statistics to the metrics topic and InfluxDB, and the push
  of corrected groups (:func:`push_summary_corrections`, typed :class:`SummariesPush`);
* :mod:`~kdq.spark.summaries.stream` — one call per micro-batch (:func:`stream_summaries`);
* :mod:`~kdq.spark.summaries.batch` — the hourly recompute (:func:`recompute_summaries`)
  and the rebuild (:func:`rebuild_summaries`).

**Lateness** is judged per (summary, topic, window) against the topic's
watermark from the micro-batch ledger, like the counts (same replay guarantee), but
with the summary's own window and allowed lateness. Records too late are left
out by the stream and their windows recorded in ``summary_late_windows`` for
the batch layer. Since a topic's watermark only moves forward, a window
recorded there is never touched by the stream again, so the batch layer can
set its absolute state without racing a micro-batch. The topic is part of
every summary key for that reason: a window is closed topic by topic.

**State size.** Nothing is kept in Spark between batches. The table holds one
row per (summary, topic, window, group): about 200 bytes plus the group values
plus 16 bytes per histogram bucket. A micro-batch holds on the driver the rows
of the groups it touched (same size). Buckets per row are bounded by the
precision (at most 9·10^(d-1) per decade of magnitude and sign with ``d``
significant digits; ``(max - min) / step`` with a step), groups per window by
the data. ``max_buckets`` and ``max_groups`` cap both.

The names below are the package's public interface (callers import them from
``kdq.spark.summaries``); the pure half (states, buckets, statistics) is :mod:`kdq.summaries`.
"""

from kdq.spark.summaries.batch import (
    apply_summary_corrections,
    diff_states,
    interval_summary_corrections,
    late_summary_windows,
    rebuild_summaries,
    recompute_states,
    recompute_summaries,
)
from kdq.spark.summaries.outputs import (
    SummariesPush,
    outputs_of,
    publish,
    push_summary_corrections,
    push_updated_to_influx,
)
from kdq.spark.summaries.store import check_limits, derived_sql, merge_absolute, merge_increments, read_states
from kdq.spark.summaries.stream import append_late_windows, stream_summaries
from kdq.spark.summaries.transforms import (
    KEY,
    active_summaries,
    key_of,
    state_entry,
    summary_fields,
    summary_states,
    summary_states_metric,
    summary_states_rows,
    summary_values,
    topic_condition,
    with_summary_entries,
    with_summary_states_metric,
)

__all__ = [
    "KEY",
    "SummariesPush",
    "active_summaries",
    "append_late_windows",
    "apply_summary_corrections",
    "check_limits",
    "derived_sql",
    "diff_states",
    "interval_summary_corrections",
    "key_of",
    "late_summary_windows",
    "merge_absolute",
    "merge_increments",
    "outputs_of",
    "publish",
    "push_summary_corrections",
    "push_updated_to_influx",
    "read_states",
    "rebuild_summaries",
    "recompute_states",
    "recompute_summaries",
    "state_entry",
    "stream_summaries",
    "summary_fields",
    "summary_states",
    "summary_states_metric",
    "summary_states_rows",
    "summary_values",
    "topic_condition",
    "with_summary_entries",
    "with_summary_states_metric",
]
