"""Streaming summaries on Spark: shared transforms, the speed layer's per-batch MERGE, the batch layer's recompute.

The same two transforms serve both layers, so a window recomputed from the
raw archive equals what the stream accumulated, by construction:

* :func:`summary_values` — classified rows (topic, window_start, valid,
  value) → one row per (record, summary whose topic it is on): the summary
  window, the group, the value as a double and its bucket, or the reason it
  is rejected, and (stream only) whether its window is already closed;
* :func:`summary_states` — those rows → the mergeable state per (summary,
  topic, window, group): count, sum, sum of squares, min, max, histogram
  (explode → group by bucket → ``map_from_entries``) and rejections.

**Speed layer** (:func:`stream_summaries`, one call per micro-batch after the
window-count MERGE): the batch's states are increments. Like the counts, they
are MERGEd into the ``summaries`` table under Delta's idempotent-write guard
(txnAppId = the stream's app id, txnVersion = the batch id: Delta keeps one
version per app id *per table*, so the guard is independent of the other
tables'), adding counts, sums and histograms (``map_zip_with``) and taking
least/greatest for min/max. The statistics users read (mean, stddev,
percentiles) are recomputed from the merged state in the same MERGE
(:func:`derived_sql`). Before writing, the current rows of the touched windows
are read: the merged state is checked against the size limits (a violation
stops the batch, naming the summary, window, group and setting, before
anything is written) and is what the metrics topic and InfluxDB receive.
When Delta's log shows the batch already applied (a replay after a crash) the
MERGE is skipped and the rows read *are* the absolute state, so the outputs
are re-sent unchanged.

**Lateness** is judged per (summary, topic, window) against the topic's
watermark from the batch ledger, like the counts (same replay guarantee), but
with the summary's own window and allowed lateness. Records too late are left
out and their windows recorded in ``summary_late_windows`` for the batch
layer. Since a topic's watermark only moves forward, a window recorded there
is never touched by the stream again, so the batch layer can set its absolute
state without racing a micro-batch. The topic is part of every summary key
for that reason: a window is closed topic by topic.

**Batch layer** (:func:`recompute_summaries`, :func:`rebuild_summaries`):
recomputes the absolute state of whole (summary, topic, window)s from every
archived row of the window, compares with the table (counts, extremes,
histograms and rejections exactly, sums up to rounding: the summation order
differs), and for each changed group appends a ``summary_corrections`` row and
MERGEs the new state (a group that no longer has records is deleted), with
the corrections-then-MERGE protocol of :mod:`kdq.spark.batch_layer` on the two
summary tables.

**State size.** Nothing is kept in Spark between batches. The table holds one
row per (summary, topic, window, group): about 200 bytes plus the group values
plus 16 bytes per histogram bucket. A micro-batch holds on the driver the rows
of the groups it touched (same size). Buckets per row are bounded by the
precision (at most 9·10^(d-1) per decade of magnitude and sign with ``d``
significant digits; ``(max - min) / step`` with a step), groups per window by
the data. ``max_buckets`` and ``max_groups`` cap both.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq.config import Config, SummaryConfig
from kdq.rules import variant_path
from kdq.spark.corrections import latest_attempt, record_then_apply
from kdq.spark.tables import table_path
from kdq.spark.writers import idempotent_write, retry_on_conflict, txn_version
from kdq.sql_literals import date_literal, timestamp_literal
from kdq.summaries import (
    MAX_ABS,
    MAX_STEPS,
    MISSING,
    NOT_NUMERIC,
    OUT_OF_RANGE,
    TINY,
    SummaryLimitError,
    SummaryState,
    merge,
    metric_key,
    metric_value,
    percentile_fraction,
    percentile_name,
    precision_label,
    same_state,
    statistics,
    step_decimal,
    summary_point,
)
from kdq.tables import SUMMARIES, SUMMARY_CORRECTIONS, SUMMARY_LATE_WINDOWS

log = logging.getLogger("kdq.summaries")

KEY = ("summary", "topic", "window_start_ms", "group_key")
_NUMERIC_TYPES = ("BIGINT", "INT", "SMALLINT", "TINYINT", "DOUBLE", "FLOAT")


# -- shared transforms ---------------------------------------------------------------------------------


def topic_condition(topic: Column, summary: SummaryConfig) -> Column:
    """The summary's topic: equality, or a whole-name RLIKE (Java regex) for ``re:`` topics."""
    if summary.is_pattern:
        return topic.rlike(f"^(?:{summary.topic_match})\\z")
    return topic == F.lit(summary.topic)


def _summary_entry(summary: SummaryConfig, watermarks: Mapping[str, int] | None) -> Column:
    """One struct per (record, summary) when the record's topic is the summary's, else null."""
    size_ms = summary.window_seconds * 1000
    # Paths from the config reach Spark as values (Column API), never as SQL text.
    value_path = variant_path(summary.value)
    kind = F.schema_of_variant(F.variant_get(F.col("__p"), value_path, "variant"))
    is_number = kind.isin(*_NUMERIC_TYPES) | kind.startswith("DECIMAL")
    x = F.when(is_number, F.try_variant_get(F.col("__p"), value_path, "double"))
    out_of_range = ~(F.abs(x) <= F.lit(MAX_ABS))  # also true for infinities and NaN
    if summary.step is not None:
        out_of_range = out_of_range | (F.abs(x) / F.lit(float(summary.step)) >= F.lit(float(MAX_STEPS)))
    reject = (
        F.when(kind.isNull() | (kind == "VOID"), F.lit(MISSING))
        .when(~is_number, F.lit(NOT_NUMERIC))
        .when(out_of_range, F.lit(OUT_OF_RANGE))
    )
    groups = [F.try_variant_get(F.col("__p"), variant_path(path), "string") for path in summary.group_by]
    if summary.group_by:
        group_key = F.to_json(
            F.struct(*[g.alias(path) for path, g in zip(summary.group_by, groups, strict=True)]),
            {"ignoreNullFields": "false"},
        )
        group_map = F.create_map(*[c for path, g in zip(summary.group_by, groups, strict=True) for c in (F.lit(path), g)])
    else:
        group_key = F.lit("{}")
        group_map = F.create_map().cast("map<string,string>")
    window_ms = F.floor(F.col("__window_ms") / size_ms) * size_ms
    if watermarks:
        marks = F.create_map(*[c for t, ms in sorted(watermarks.items()) for c in (F.lit(t), F.lit(int(ms)))])
        limit = F.element_at(marks, F.col("topic")) - F.lit(summary.allowed_lateness_seconds * 1000)
        late = F.coalesce(window_ms + size_ms <= limit, F.lit(False))
    else:
        late = F.lit(False)
    mantissa, exponent = step_decimal(summary.step) if summary.step is not None else (None, None)
    return F.when(
        topic_condition(F.col("topic"), summary),
        F.struct(
            F.lit(summary.name).alias("summary"),
            window_ms.cast("bigint").alias("window_start_ms"),
            group_key.alias("group_key"),
            group_map.alias("groups"),
            F.when(reject.isNull(), x).alias("x"),
            reject.alias("reject"),
            late.alias("late"),
            F.lit(summary.significant_digits).cast("int").alias("digits"),
            F.lit(mantissa).cast("bigint").alias("step_m"),
            F.lit(exponent).cast("int").alias("step_e"),
        ),
    )


def _dec(mantissa: str, exponent: str) -> str:
    """SQL: the nearest double of the decimal ``<mantissa>e<exponent>`` (Java's parse is correctly rounded)."""
    return f"CAST(concat(CAST({mantissa} AS STRING), 'e', CAST({exponent} AS STRING)) AS DOUBLE)"


def bucket_column(x: str = "x", digits: str = "digits", step_m: str = "step_m", step_e: str = "step_e") -> Column:
    """The bucket of column ``x`` (see :mod:`kdq.summaries`), as native Spark SQL.

    The same algorithm as :func:`kdq.summaries.bucket`: an estimate from
    ``log10`` and a division, corrected by comparing with candidates parsed
    from decimal text, so the result does not depend on how the JVM rounds
    ``log10`` or formats doubles. Higher-order functions bind the
    intermediate values (``transform(array(v), name -> ...)[0]`` is a let).
    """
    a = f"abs({x})"
    exponent = (
        f"transform(array(CAST(floor(log10({a})) AS BIGINT)), e0 -> "
        f"CASE WHEN {_dec('1', 'e0')} > {a} THEN e0 - 1 WHEN {_dec('1', 'e0 + 1')} <= {a} THEN e0 + 1 ELSE e0 END)[0]"
    )
    corrected = f"CASE WHEN {_dec('m0 + 1', 'k')} <= {a} THEN m0 + 1 WHEN {_dec('m0', 'k')} > {a} THEN m0 - 1 ELSE m0 END"
    clamped = f"least(greatest({corrected}, CAST(pow(10, {digits} - 1) AS BIGINT)), CAST(pow(10, {digits}) AS BIGINT) - 1)"
    sign = f"CASE WHEN {x} < 0 THEN -1.0D ELSE 1.0D END"
    digits_bucket = (
        f"transform(array({exponent} - {digits} + 1), k -> "
        f"transform(array(CAST(floor(({a} * 1e50D) / {_dec('1', 'k + 50')}) AS BIGINT)), m0 -> "
        f"{sign} * {_dec(clamped, 'k')})[0])[0]"
    )
    up = _dec(f"(k0 + 1) * {step_m}", step_e)
    here = _dec(f"k0 * {step_m}", step_e)
    k = f"(CASE WHEN {up} <= {x} THEN k0 + 1 WHEN {here} > {x} THEN k0 - 1 ELSE k0 END)"
    step_bucket = (
        f"transform(array(CAST(floor({x} / {_dec(step_m, step_e)}) AS BIGINT)), k0 -> {_dec(f'{k} * {step_m}', step_e)})[0]"
    )
    return F.expr(
        f"CASE WHEN {x} IS NULL THEN NULL "
        f"WHEN {step_m} IS NOT NULL THEN {step_bucket} "
        f"WHEN {a} < {TINY!r}D THEN 0.0D "
        f"ELSE {digits_bucket} END"
    )


def summary_values(
    rows: DataFrame, summaries: Sequence[SummaryConfig], watermarks: Mapping[str, int] | None = None
) -> DataFrame:
    """Classified rows → (summary, topic, window_start_ms, group_key, groups, x, bucket, reject, late).

    ``rows`` needs topic, window_start (the count window the classifier
    assigned; a summary window is a whole number of them), valid and value.
    Only valid records count: an invalid one is already counted as invalid in
    the window counts. The value is parsed once per record, whatever the
    number of summaries on its topic. ``watermarks`` (topic → max event time
    before the batch, from the ledger) sets ``late``; without it nothing is late.
    """
    missing = [c for c in ("topic", "window_start", "valid", "value") if c not in rows.columns]
    if missing:
        raise ValueError(f"summary_values: input lacks {missing}; expected topic, window_start, valid, value, got {rows.columns}")
    if not summaries:
        raise ValueError("summary_values: no summaries given")
    on_topic = None
    for summary in summaries:
        cond = topic_condition(F.col("topic"), summary)
        on_topic = cond if on_topic is None else on_topic | cond
    parsed = rows.where(F.col("valid") & on_topic).select(
        "topic",
        F.unix_millis("window_start").alias("__window_ms"),
        F.try_parse_json(F.col("value").cast("string")).alias("__p"),
    )
    entries = F.array(*[_summary_entry(s, watermarks) for s in summaries])
    exploded = parsed.select("topic", F.explode(entries).alias("e")).where(F.col("e").isNotNull())
    return exploded.select(
        F.col("e.summary").alias("summary"),
        "topic",
        F.col("e.window_start_ms").alias("window_start_ms"),
        F.col("e.group_key").alias("group_key"),
        F.col("e.groups").alias("groups"),
        F.col("e.x").alias("x"),
        bucket_column("e.x", "e.digits", "e.step_m", "e.step_e").alias("bucket"),
        F.col("e.reject").alias("reject"),
        F.col("e.late").alias("late"),
    )


def summary_states(values: DataFrame) -> DataFrame:
    """:func:`summary_values` rows → one mergeable state per (summary, topic, window_start_ms, group_key, late).

    Two aggregations: per bucket (and rejection reason), then per key, where
    the buckets become the histogram map. Sums of no values are 0, min/max null.
    """
    keys = [*KEY, "late"]
    per_bucket = values.groupBy(*keys, "bucket", "reject").agg(
        F.first("groups").alias("groups"),
        F.count(F.lit(1)).alias("n"),
        F.sum("x").alias("s1"),
        F.sum(F.col("x") * F.col("x")).alias("s2"),
        F.min("x").alias("lo"),
        F.max("x").alias("hi"),
    )
    return per_bucket.groupBy(*keys).agg(
        F.first("groups").alias("groups"),
        F.coalesce(F.sum(F.when(F.col("bucket").isNotNull(), F.col("n"))), F.lit(0)).cast("bigint").alias("count"),
        F.coalesce(F.sum("s1"), F.lit(0.0)).alias("sum"),
        F.coalesce(F.sum("s2"), F.lit(0.0)).alias("sum_sq"),
        F.min("lo").alias("min"),
        F.max("hi").alias("max"),
        F.map_from_entries(F.collect_list(F.when(F.col("bucket").isNotNull(), F.struct("bucket", "n")))).alias("hist"),
        F.map_from_entries(F.collect_list(F.when(F.col("reject").isNotNull(), F.struct("reject", "n")))).alias("rejected"),
        F.sum("n").cast("bigint").alias("rows"),
    )


# -- statistics in SQL -----------------------------------------------------------------------------------


def derived_sql(count: str, sum_: str, sum_sq: str, hist: str, pct_num: str, pct_den: str, pct_names: str) -> dict[str, str]:
    """SQL of mean, stddev and the percentile map from a state's columns (any SQL expressions).

    Operation for operation :func:`kdq.summaries.statistics`: the same IEEE
    divisions and square root, the same integer nearest rank, so the table's
    statistics equal what the metrics topic and InfluxDB receive.
    """
    mean = f"({sum_}) / ({count})"
    var = f"({sum_sq}) / ({count}) - {mean} * {mean}"
    finite = "CASE WHEN isnan(v) OR abs(v) = double('Infinity') THEN NULL ELSE v END"
    stddev = f"transform(array(sqrt(greatest(0.0D, {var}))), v -> {finite})[0]"
    rank = f"greatest(1L, (num * ({count}) + den * 100 - 1) div (den * 100))"
    pick = (
        f"aggregate(array_sort(map_entries({hist})), named_struct('c', 0L, 'r', CAST(NULL AS DOUBLE)), "
        f"(acc, e) -> named_struct('c', acc.c + e.value, 'r', CASE WHEN acc.r IS NULL AND acc.c + e.value >= {rank} "
        f"THEN e.key ELSE acc.r END), acc -> acc.r)"
    )
    pcts = (
        f"map_from_arrays({pct_names}, transform({pct_num}, (num, i) -> "
        f"transform(array(CAST(element_at({pct_den}, i + 1) AS BIGINT)), den -> {pick})[0]))"
    )
    return {
        "mean": f"CASE WHEN ({count}) > 0 THEN transform(array({mean}), v -> {finite})[0] END",
        "stddev": f"CASE WHEN ({count}) > 0 THEN {stddev} END",
        "percentiles": f"CASE WHEN ({count}) > 0 THEN {pcts} ELSE map_from_arrays({pct_names}, transform({pct_names}, n -> CAST(NULL AS DOUBLE))) END",
    }


_SOURCE_SCHEMA = (
    "summary STRING, topic STRING, window_start_ms BIGINT, window_end_ms BIGINT, group_key STRING, "
    "groups MAP<STRING, STRING>, count BIGINT, sum DOUBLE, sum_sq DOUBLE, min DOUBLE, max DOUBLE, "
    "hist MAP<DOUBLE, BIGINT>, rejected MAP<STRING, BIGINT>, pct_names ARRAY<STRING>, pct_num ARRAY<BIGINT>, "
    "pct_den ARRAY<BIGINT>, precision STRING"
)


def _source(spark: SparkSession, config: Config, rows: Sequence[Mapping], updated_by: str) -> DataFrame:
    """Python rows (KEY, groups, and a SummaryState under "state") → a MERGE source with the derived columns."""
    data = []
    for r in rows:
        s = config.summary(r["summary"])
        state: SummaryState = r["state"]
        fractions = [percentile_fraction(q) for q in s.percentiles]
        data.append(
            (
                r["summary"], r["topic"], int(r["window_start_ms"]), int(r["window_start_ms"]) + s.window_seconds * 1000,
                r["group_key"], dict(r["groups"] or {}), state.count, state.sum, state.sum_sq, state.min, state.max,
                dict(state.hist), dict(state.rejected), [percentile_name(q) for q in s.percentiles],
                [n for n, _ in fractions], [d for _, d in fractions], precision_label(s),
            )
        )
    derived = derived_sql("count", "sum", "sum_sq", "hist", "pct_num", "pct_den", "pct_names")
    return spark.createDataFrame(data, _SOURCE_SCHEMA).select(
        "summary",
        "topic",
        F.timestamp_millis("window_start_ms").alias("window_start"),
        F.timestamp_millis("window_end_ms").alias("window_end"),
        "group_key",
        "groups",
        "count",
        "sum",
        "sum_sq",
        "min",
        "max",
        "hist",
        "rejected",
        F.expr(derived["mean"]).alias("mean"),
        F.expr(derived["stddev"]).alias("stddev"),
        F.expr(derived["percentiles"]).alias("percentiles"),
        "precision",
        F.current_timestamp().alias("updated_at"),
        F.lit(updated_by).alias("updated_by"),
        F.to_date(F.timestamp_millis("window_start_ms")).alias("window_date"),
        "pct_names",
        "pct_num",
        "pct_den",
    )


def _merge_condition(rows: Sequence[Mapping]) -> str:
    dates = sorted({date_literal(int(r["window_start_ms"])) for r in rows})
    lo = min(int(r["window_start_ms"]) for r in rows)
    hi = max(int(r["window_start_ms"]) for r in rows)
    return (
        f"t.window_date IN ({', '.join(dates)}) AND t.window_start BETWEEN {timestamp_literal(lo)} AND {timestamp_literal(hi)} "
        "AND t.summary = s.summary AND t.topic = s.topic AND t.window_start = s.window_start AND t.group_key = s.group_key"
    )


def _insert_values() -> dict[str, str]:
    return {name: f"s.`{name}`" for name in SUMMARIES.column_names}


def merge_increments(
    spark: SparkSession, config: Config, rows: Sequence[Mapping], app_id: str, version: int, updated_by: str = "stream"
) -> None:
    """Add per-(summary, topic, window, group) increments once per (app id, version)."""
    if not rows:
        return
    from delta.tables import DeltaTable

    source = _source(spark, config, rows, updated_by)
    add = "(k, a, b) -> coalesce(a, 0L) + coalesce(b, 0L)"
    merged = {
        "count": "t.`count` + s.`count`",
        "sum": "t.`sum` + s.`sum`",
        "sum_sq": "t.`sum_sq` + s.`sum_sq`",
        "hist": f"map_zip_with(t.hist, s.hist, {add})",
    }
    derived = derived_sql(merged["count"], merged["sum"], merged["sum_sq"], merged["hist"], "s.pct_num", "s.pct_den", "s.pct_names")
    update = {
        **merged,
        "min": "least(t.`min`, s.`min`)",
        "max": "greatest(t.`max`, s.`max`)",
        "rejected": f"map_zip_with(t.rejected, s.rejected, {add})",
        **derived,
        "precision": "s.precision",
        "updated_at": "s.updated_at",
        "updated_by": "s.updated_by",
    }

    def run() -> None:
        target = DeltaTable.forPath(spark, table_path(config, SUMMARIES)).alias("t")
        with idempotent_write(spark, app_id, version):
            (
                target.merge(source.alias("s"), _merge_condition(rows))
                .whenMatchedUpdate(set=update)
                .whenNotMatchedInsert(values=_insert_values())
                .execute()
            )

    retry_on_conflict(run, "summary MERGE")


def merge_absolute(
    spark: SparkSession, config: Config, rows: Sequence[Mapping], app_id: str, version: int, updated_by: str = "batch"
) -> None:
    """Set absolute states (deleting groups whose state became empty) once per (app id, version)."""
    if not rows:
        return
    from delta.tables import DeltaTable

    source = _source(spark, config, rows, updated_by).withColumn(
        "__empty", (F.col("count") == 0) & (F.size("rejected") == 0)
    )
    update = {name: f"s.`{name}`" for name in SUMMARIES.column_names if name not in ("summary", "topic", "window_start", "group_key", "window_date")}
    target = DeltaTable.forPath(spark, table_path(config, SUMMARIES)).alias("t")
    with idempotent_write(spark, app_id, version):
        (
            target.merge(source.alias("s"), _merge_condition(rows))
            .whenMatchedDelete(condition="s.__empty")
            .whenMatchedUpdate(set=update)
            .whenNotMatchedInsert(condition="NOT s.__empty", values=_insert_values())
            .execute()
        )


def read_states(spark: SparkSession, config: Config, windows: Iterable[tuple[str, str, int]]) -> dict[tuple, dict]:
    """Every stored group of the given (summary, topic, window_start_ms): KEY → {groups, state}.

    Literal predicates (partition dates, window starts, names) rather than a
    join: Delta prunes partitions and files with them, and the few rows a
    superset filter lets through are dropped here.
    """
    wanted = set((s, t, int(w)) for s, t, w in windows)
    if not wanted:
        return {}
    dates = sorted({date_literal(w) for _, _, w in wanted})
    starts = sorted({timestamp_literal(w) for _, _, w in wanted})
    names = sorted({s for s, _, _ in wanted})
    topics = sorted({t for _, t, _ in wanted})
    table = (
        spark.read.format("delta")
        .load(table_path(config, SUMMARIES))
        .where(f"window_date IN ({', '.join(dates)}) AND window_start IN ({', '.join(starts)})")
        .where(F.col("summary").isin(names) & F.col("topic").isin(topics))
        .select(
            "summary", "topic", F.unix_millis("window_start").alias("window_start_ms"), "group_key", "groups",
            "count", "sum", "sum_sq", "min", "max", "hist", "rejected",
        )
    )
    out: dict[tuple, dict] = {}
    for row in table.collect():
        r = row.asDict()
        if (r["summary"], r["topic"], r["window_start_ms"]) in wanted:
            out[tuple(r[k] for k in KEY)] = {**{k: r[k] for k in KEY}, "groups": r["groups"] or {}, "state": SummaryState.from_row(r)}
    return out


# -- outputs ---------------------------------------------------------------------------------------------


def outputs_of(config: Config, rows: Iterable[Mapping]) -> tuple[list[tuple[str, str]], list]:
    """Rows with KEY, groups and state → (metrics-topic messages, InfluxDB points) of their statistics."""
    messages, points = [], []
    for r in rows:
        s = config.summary(r["summary"])
        stats = statistics(r["state"], s.percentiles)
        w = int(r["window_start_ms"])
        messages.append((metric_key(s, r["topic"], w, r["groups"]), metric_value(stats)))
        points.append(summary_point(s, r["topic"], w, r["groups"], stats))
    return messages, points


def publish(config: Config, rows: Sequence[Mapping], producer: Any = None) -> tuple[int, Exception | None]:
    """Send rows' statistics to the metrics topic (raises on failure) and InfluxDB (failure returned)."""
    from kdq.influx import InfluxSink
    from kdq.metrics_topic import produce_messages

    messages, points = outputs_of(config, rows)
    if not messages:
        return 0, None
    produce_messages(config, messages, producer=producer)
    if not config.influxdb.enabled:
        return len(messages), None
    try:
        InfluxSink(config).write(points)
    except Exception as exc:  # InfluxWriteError, or a config error naming the missing URL
        return len(messages), exc
    return len(messages), None


# -- limits ----------------------------------------------------------------------------------------------


def check_limits(config: Config, states: Mapping[tuple, Mapping]) -> None:
    """Raise :class:`SummaryLimitError` when a state exceeds its summary's max_buckets or max_groups.

    Refusing loudly is the point: silently dropping groups or merging buckets
    would publish wrong percentiles. The message says which setting to raise
    (or which precision to coarsen, or which group field has too many values).
    """
    groups: dict[tuple[str, str, int], int] = defaultdict(int)
    for key, entry in states.items():
        summary, topic, window_ms, group_key = key
        s = config.summary(summary)
        groups[(summary, topic, window_ms)] += 1
        buckets = len(entry["state"].hist)
        if buckets > s.max_buckets:
            index = config.summaries.index(s)
            raise SummaryLimitError(
                f"summary {summary!r}: {buckets} histogram buckets for topic {topic!r}, window {window_ms}, "
                f"group {group_key} exceed summaries[{index}].max_buckets = {s.max_buckets}; raise it, or coarsen "
                f"the precision ({precision_label(s)})"
            )
    for (summary, topic, window_ms), n in groups.items():
        s = config.summary(summary)
        if n > s.max_groups:
            index = config.summaries.index(s)
            raise SummaryLimitError(
                f"summary {summary!r}: {n} groups for topic {topic!r}, window {window_ms} exceed "
                f"summaries[{index}].max_groups = {s.max_groups}; raise it, or group by fewer or "
                f"lower-cardinality fields than {list(s.group_by)}"
            )


# -- the speed layer -------------------------------------------------------------------------------------


def append_late_windows(
    spark: SparkSession, config: Config, rows: Sequence[Mapping], app_id: str, batch_id: int, ingest_ms: int
) -> None:
    """Record the (summary, topic, window)s this batch left to the batch layer, once per (app id, batch)."""
    if not rows:
        return
    df = spark.createDataFrame(
        [(r["summary"], r["topic"], int(r["window_start_ms"]), int(r["rows"])) for r in rows],
        "summary STRING, topic STRING, window_start_ms BIGINT, rows BIGINT",
    )
    (
        df.groupBy("summary", "topic", "window_start_ms")
        .agg(F.sum("rows").alias("rows"))
        .select(
            "summary",
            "topic",
            F.timestamp_millis("window_start_ms").alias("window_start"),
            "rows",
            F.timestamp_millis(F.lit(int(ingest_ms))).alias("ingest_time"),
            F.lit(int(batch_id)).cast("bigint").alias("batch_id"),
        )
        .write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", batch_id)
        .save(table_path(config, SUMMARY_LATE_WINDOWS))
    )


def active_summaries(config: Config, topics: Iterable[str]) -> list[SummaryConfig]:
    topics = list(topics)
    return [s for s in config.summaries if any(s.matches(t) for t in topics)]


def stream_summaries(
    spark: SparkSession,
    config: Config,
    classified: DataFrame,
    watermarks: Mapping[str, int],
    app_id: str,
    batch_id: int,
    ingest_ms: int,
    topics: Iterable[str],
    producer: Any = None,
    on_influx_failure: Callable[[int, str], None] | None = None,
    replayed: bool = True,
) -> dict[str, int]:
    """One micro-batch of every summary on the batch's topics (see the module doc); returns counts for the report.

    ``watermarks`` are the per-topic maximum event times *before* the batch
    (the ledger's ``max_event_ms_before``), ``topics`` the batch's topics:
    a batch without a summary topic costs nothing. ``replayed`` False (the
    batch's ledger entry was written by this attempt) skips the look into
    Delta's log: a first attempt cannot have been applied.
    """
    summaries = active_summaries(config, topics)
    report = {"summary_groups": 0, "summary_late_rows": 0}
    if not summaries:
        return report
    values = summary_values(classified.select("topic", "window_start", "valid", "value"), summaries, watermarks)
    rows = [r.asDict() for r in summary_states(values).collect()]
    late = [r for r in rows if r["late"]]
    increments = [
        {**{k: r[k] for k in KEY}, "groups": r["groups"] or {}, "state": SummaryState.from_row(r)} for r in rows if not r["late"]
    ]
    report["summary_late_rows"] = sum(int(r["rows"]) for r in late)
    absolute: dict[tuple, dict] = {}
    if increments:
        existing = read_states(spark, config, {(r["summary"], r["topic"], r["window_start_ms"]) for r in increments})
        applied = replayed and txn_version(spark, table_path(config, SUMMARIES), app_id) >= batch_id
        if applied:
            # Delta already holds this batch: what was read is the absolute state.
            absolute = dict(existing)
        else:
            absolute = dict(existing)
            for r in increments:
                key = tuple(r[k] for k in KEY)
                before = existing.get(key, {}).get("state", SummaryState())
                absolute[key] = {**r, "state": merge(before, r["state"])}
            check_limits(config, absolute)
            merge_increments(spark, config, increments, app_id, batch_id)
    append_late_windows(spark, config, late, app_id, batch_id, ingest_ms)
    changed = [absolute[tuple(r[k] for k in KEY)] for r in increments if tuple(r[k] for k in KEY) in absolute]
    report["summary_groups"] = len(changed)
    _, influx_error = publish(config, changed, producer=producer)
    if influx_error is not None:
        log.error("InfluxDB push of %d summary groups failed for batch %d: %s", len(changed), batch_id, influx_error)
        if on_influx_failure is not None:
            on_influx_failure(ingest_ms, str(influx_error)[:500])
    return report


# -- the batch layer -------------------------------------------------------------------------------------


def _window_hours(config: Config, windows: Iterable[tuple[str, str, int]]) -> list[str]:
    """``event_hour`` partitions of every count window inside the given summary windows."""
    from kdq.intervals import HOUR_MS
    from kdq.windows import event_hour

    hours = set()
    for summary, _, w in windows:
        size = config.summary(summary).window_seconds * 1000
        hours.update(event_hour(ms) for ms in range(w // HOUR_MS * HOUR_MS, w + size, HOUR_MS))
    return sorted(hours)


def _without_retired_hours(
    spark: SparkSession, config: Config, windows: Sequence[tuple[str, str, int]]
) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]:
    """(windows whose archive hours are all whole, windows with an hour archive retention retired)."""
    from kdq.spark.retention import read_retired, retired_hours

    if not windows:
        return list(windows), []
    retired = set(retired_hours(read_retired(spark, config), _window_hours(config, windows)))
    if not retired:
        return list(windows), []
    whole, kept = [], []
    for window in windows:
        (kept if retired.intersection(_window_hours(config, [window])) else whole).append(window)
    return whole, kept


def _wanted(spark: SparkSession, windows: Iterable[tuple[str, str, int]]) -> DataFrame:
    return spark.createDataFrame(sorted(set(windows)), "summary STRING, topic STRING, window_start_ms BIGINT")


def _collect_states(states: DataFrame) -> dict[tuple, dict]:
    out = {}
    for row in states.collect():
        r = row.asDict()
        out[tuple(r[k] for k in KEY)] = {**{k: r[k] for k in KEY}, "groups": r["groups"] or {}, "state": SummaryState.from_row(r)}
    return out


def late_summary_windows(spark: SparkSession, config: Config, interval: tuple[int, int]) -> list[tuple[str, str, int]]:
    """(summary, topic, window_start_ms) the stream left to the batch layer, for records ingested in [start, end).

    The windows ``summary_late_windows`` recorded, plus the summary windows of
    archive rows another job loaded (``source <> 'stream'``): the stream never
    saw those. Summaries no longer configured are skipped.
    """
    from kdq.tables import RAW_ARCHIVE

    start_ms, end_ms = interval
    in_interval = (F.col("ingest_time") >= F.timestamp_millis(F.lit(start_ms))) & (
        F.col("ingest_time") < F.timestamp_millis(F.lit(end_ms))
    )
    names = {s.name for s in config.summaries}
    marked = (
        spark.read.format("delta")
        .load(table_path(config, SUMMARY_LATE_WINDOWS))
        .where(in_interval)
        .select("summary", "topic", F.unix_millis("window_start").alias("w"))
        .distinct()
        .collect()
    )
    windows = {(r["summary"], r["topic"], int(r["w"])) for r in marked if r["summary"] in names}
    loaded = (
        spark.read.format("delta")
        .load(table_path(config, RAW_ARCHIVE))
        .where(in_interval & (F.coalesce(F.col("source"), F.lit("")) != "stream"))
        .select("topic", F.unix_millis("window_start").alias("w"))
        .distinct()
        .collect()
    )
    for row in loaded:
        for s in config.summaries:
            if s.matches(row["topic"]):
                size = s.window_seconds * 1000
                windows.add((s.name, row["topic"], int(row["w"]) // size * size))
    return sorted(windows)


def recompute_states(spark: SparkSession, config: Config, archive: DataFrame, windows: Sequence[tuple[str, str, int]]) -> dict[tuple, dict]:
    """Absolute states of whole (summary, topic, window)s from every archived row of them.

    Reads only the ``event_hour`` partitions the windows span; uses the
    archived classification (``valid``) and the stream's own transforms.
    """
    if not windows:
        return {}
    summaries = [config.summary(name) for name in sorted({s for s, _, _ in windows})]
    topics = sorted({t for _, t, _ in windows})
    rows = archive.where(F.col("event_hour").isin(_window_hours(config, windows)) & F.col("topic").isin(topics))
    return _states_of(spark, rows.select("topic", "window_start", "valid", "value"), summaries, windows)


def _states_of(spark: SparkSession, rows: DataFrame, summaries: Sequence[SummaryConfig], windows) -> dict[tuple, dict]:
    values = summary_values(rows, summaries).join(
        F.broadcast(_wanted(spark, windows)), ["summary", "topic", "window_start_ms"], "left_semi"
    )
    return _collect_states(summary_states(values))


def diff_states(
    windows: Iterable[tuple[str, str, int]], new: Mapping[tuple, dict], stored: Mapping[tuple, dict]
) -> list[dict]:
    """Groups of the given windows whose recomputed state differs from the stored one (see same_state).

    A stored group the recomputation no longer has changes to the empty state
    (its row is deleted).
    """
    wanted = set(windows)
    changes = []
    for key in sorted(set(new) | set(stored), key=lambda k: (k[0], k[1], k[2], k[3])):
        if key[:3] not in wanted:
            continue
        old = stored[key]["state"] if key in stored else SummaryState()
        entry = new.get(key) or {**stored[key], "state": SummaryState()}
        if not same_state(old, entry["state"]):
            changes.append({**entry, "old_state": old})
    return changes


_ORDER_SENSITIVE = ("sum", "mean", "stddev")  # float sums: their last digits depend on the summation order


def _stats_json(config: Config, summary: str, state: SummaryState) -> str:
    return json.dumps(statistics(state, config.summary(summary).percentiles), separators=(",", ":"))


def _attempt_key(r: Mapping) -> tuple:
    exact = {k: v for k, v in json.loads(r["new_stats"]).items() if k not in _ORDER_SENSITIVE}
    return (r["summary"], r["topic"], int(r["window_start_ms"]), r["group_key"], int(r["old_count"]), int(r["new_count"]), json.dumps(exact, sort_keys=True))


def _correction_rows(config: Config, changes: Sequence[dict]) -> list[dict]:
    return [
        {
            **{k: c[k] for k in KEY},
            "old_count": c["old_state"].count,
            "new_count": c["state"].count,
            "old_stats": _stats_json(config, c["summary"], c["old_state"]),
            "new_stats": _stats_json(config, c["summary"], c["state"]),
        }
        for c in changes
    ]


def _recorded_attempt(spark: SparkSession, config: Config, interval: tuple[int, int], reasons: Sequence[str] | None = None) -> set[tuple]:
    """The correction rows of the latest attempt for this interval (see kdq.spark.corrections)."""
    table = spark.read.format("delta").load(table_path(config, SUMMARY_CORRECTIONS)).where(
        (F.col("interval_start") == F.timestamp_millis(F.lit(interval[0])))
        & (F.col("interval_end") == F.timestamp_millis(F.lit(interval[1])))
    )
    if reasons:
        table = table.where(F.col("reason").isin(list(reasons)))
    rows = table.select(
        "summary", "topic", F.unix_millis("window_start").alias("window_start_ms"), "group_key", "old_count",
        "new_count", "new_stats", "corrected_at",
    )
    return latest_attempt(rows, _attempt_key)


def _append_corrections(
    spark: SparkSession, config: Config, rows: Sequence[dict], run_id: str, interval: tuple[int, int], reason: str,
    app_id: str, version: int,
) -> None:
    df = spark.createDataFrame(
        [(r["summary"], r["topic"], int(r["window_start_ms"]), r["group_key"], r["old_count"], r["new_count"],
          r["old_stats"], r["new_stats"]) for r in rows],
        "summary STRING, topic STRING, window_start_ms BIGINT, group_key STRING, old_count BIGINT, new_count BIGINT, "
        "old_stats STRING, new_stats STRING",
    )
    (
        df.select(
            "summary", "topic", F.timestamp_millis("window_start_ms").alias("window_start"), "group_key",
            "old_count", "new_count", "old_stats", "new_stats",
            F.timestamp_millis(F.lit(interval[0])).alias("interval_start"),
            F.timestamp_millis(F.lit(interval[1])).alias("interval_end"),
            F.lit(run_id).alias("run_id"), F.lit(reason).alias("reason"), F.current_timestamp().alias("corrected_at"),
        )
        .write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", version)
        .save(table_path(config, SUMMARY_CORRECTIONS))
    )


def apply_summary_corrections(
    spark: SparkSession, config: Config, changes: Sequence[dict], run_id: str, interval: tuple[int, int], reason: str, app_id: str
) -> list[dict]:
    """Record ``changes`` in summary_corrections, then MERGE the new absolute states, once per version.

    The protocol of :func:`kdq.spark.batch_layer.apply_corrections` on the two
    summary tables (their own idempotent-write versions for ``app_id``): an
    attempt that recorded its corrections and died before the MERGE is
    completed with the same version when the recomputation still gives the
    same changes (compared without the float sums, whose last digits depend on
    the summation order), else recorded again under a new version.
    """
    if not changes:
        return []
    rows = _correction_rows(config, changes)

    retry_on_conflict(
        lambda: record_then_apply(
            spark,
            table_path(config, SUMMARY_CORRECTIONS),
            table_path(config, SUMMARIES),
            app_id,
            (_attempt_key(r) for r in rows),
            lambda: _recorded_attempt(spark, config, interval, [reason]),
            lambda v: _append_corrections(spark, config, rows, run_id, interval, reason, app_id, v),
            lambda v: merge_absolute(spark, config, changes, app_id, v),
            "summary correction",
        ),
        "summary corrections",
    )
    return rows


def interval_summary_corrections(spark: SparkSession, config: Config, interval: tuple[int, int]) -> list[tuple]:
    """KEY of every summary correction ever recorded for this interval."""
    rows = (
        spark.read.format("delta")
        .load(table_path(config, SUMMARY_CORRECTIONS))
        .where(
            (F.col("interval_start") == F.timestamp_millis(F.lit(interval[0])))
            & (F.col("interval_end") == F.timestamp_millis(F.lit(interval[1])))
        )
        .select("summary", "topic", F.unix_millis("window_start").alias("w"), "group_key")
        .distinct()
        .collect()
    )
    names = {s.name for s in config.summaries}
    return sorted((r["summary"], r["topic"], int(r["w"]), r["group_key"]) for r in rows if r["summary"] in names)


def push_summary_corrections(spark: SparkSession, config: Config, keys: Iterable[tuple], producer: Any = None) -> dict[str, Any]:
    """Current statistics of corrected groups to the metrics topic and InfluxDB (a deleted group as empty)."""
    keys = sorted(set(keys))
    result: dict[str, Any] = {"summary_messages": 0, "influx_ok": True}
    if not keys:
        return result
    from kdq.metrics_topic import ensure_metrics_topic

    current = read_states(spark, config, {k[:3] for k in keys})
    rows = [
        current.get(k) or {**dict(zip(KEY, k, strict=True)), "groups": json.loads(k[3]), "state": SummaryState()}
        for k in keys
    ]
    ensure_metrics_topic(config)
    sent, error = publish(config, rows, producer=producer)
    result["summary_messages"] = sent
    if error is not None:
        log.error("InfluxDB push of %d corrected summary groups failed: %s", len(rows), error)
        result["influx_ok"] = False
        result["influx_error"] = str(error)[:500]
    return result


def recompute_summaries(
    spark: SparkSession,
    config: Config,
    interval: tuple[int, int],
    run_id: str,
    reason: str = "late_data",
    push: bool = True,
) -> dict[str, Any]:
    """The summaries' part of the hourly recompute for one ingest-time interval; returns a summary dict.

    Idempotent: re-running an interval finds the states equal and writes
    nothing; the push re-sends every group this interval ever corrected.
    """
    from kdq.intervals import batch_app_id
    from kdq.spark.tables import ensure_tables
    from kdq.tables import RAW_ARCHIVE

    result: dict[str, Any] = {"late_windows": 0, "corrections": 0, "ok": True}
    if not config.summaries:
        return result
    ensure_tables(spark, config)
    windows = late_summary_windows(spark, config, interval)
    result["late_windows"] = len(windows)
    windows, kept = _without_retired_hours(spark, config, windows)
    if kept:
        # Summary states are not retired with the archive (kdq.spark.retention): recomputing these
        # from what is left would replace a full state with a partial one, so the stored one stays.
        log.warning(
            "%d summary window(s) got late records after archive retention deleted their hours; "
            "their stored states are kept (not recomputed): %s", len(kept), kept[:10],
        )
        result["retired_windows_kept"] = len(kept)
    if windows:
        archive = spark.read.format("delta").load(table_path(config, RAW_ARCHIVE))
        new = recompute_states(spark, config, archive, windows)
        changes = diff_states(windows, new, read_states(spark, config, windows))
        check_limits(config, {c_key: c for c_key, c in new.items()})
        rows = apply_summary_corrections(spark, config, changes, run_id, interval, reason, batch_app_id(interval[0]))
        result["corrections"] = len(rows)
        result["changes"] = [{k: r[k] for k in (*KEY, "old_count", "new_count")} for r in rows[:100]]
    if push:
        pushed = push_summary_corrections(spark, config, interval_summary_corrections(spark, config, interval))
        result["push"] = pushed
        result["ok"] = bool(pushed["influx_ok"])
    return result


def rebuild_summaries(
    spark: SparkSession,
    config: Config,
    archive: DataFrame,
    selected: DataFrame,
    reclassified: DataFrame,
    from_ms: int,
    to_ms: int,
    topics: Sequence[str] | None,
    run_id: str,
    app_id: str,
) -> list[dict]:
    """Recompute every summary window with records in [from, to) after reclassification (see kdq.spark.rebuild).

    Records of the range count with their new classification (and possibly
    new window); records of the same summary windows outside the range with
    their archived one. Stored windows overlapping the range are recomputed
    too, so a state the archive no longer supports is corrected.
    Corrections have reason ``rebuild`` and interval (from, to).
    """
    if not config.summaries or (topics and not active_summaries(config, topics)):
        return []  # no summary on the rebuilt topics: nothing to read
    found = set()
    moved = selected.select("topic", "window_start").union(reclassified.select("topic", "window_start")).distinct()
    for row in moved.select("topic", F.unix_millis("window_start").alias("w")).collect():
        for s in config.summaries:
            if s.matches(row["topic"]):
                size = s.window_seconds * 1000
                found.add((s.name, row["topic"], int(row["w"]) // size * size))
    names = {s.name for s in config.summaries}
    max_size = max(s.window_seconds for s in config.summaries) * 1000
    stored = (
        spark.read.format("delta")
        .load(table_path(config, SUMMARIES))
        .where((F.col("window_start") < F.timestamp_millis(F.lit(to_ms))) & (F.col("window_end") > F.timestamp_millis(F.lit(from_ms))))
        .where(F.col("window_start") >= F.timestamp_millis(F.lit(from_ms - max_size)))
        .where(F.lit(True) if not topics else F.col("topic").isin(list(topics)))
        .select("summary", "topic", F.unix_millis("window_start").alias("w"))
        .distinct()
        .collect()
    )
    found.update((r["summary"], r["topic"], int(r["w"])) for r in stored if r["summary"] in names)
    windows = sorted(found)
    if not windows:
        return []
    in_range = (F.col("window_start") >= F.timestamp_millis(F.lit(from_ms))) & (F.col("window_start") < F.timestamp_millis(F.lit(to_ms)))
    topic_list = sorted({t for _, t, _ in windows})
    outside = archive.where(F.col("event_hour").isin(_window_hours(config, windows)) & F.col("topic").isin(topic_list) & ~in_range)
    columns = ("topic", "window_start", "valid", "value")
    rows = reclassified.select(*columns).unionByName(outside.select(*columns))
    summaries = [config.summary(name) for name in sorted({s for s, _, _ in windows})]
    new = _states_of(spark, rows, summaries, windows)
    changes = diff_states(windows, new, read_states(spark, config, windows))
    return apply_summary_corrections(spark, config, changes, run_id, (int(from_ms), int(to_ms)), "rebuild", app_id)


def influx_catch_up(spark: SparkSession, config: Config, since_ms: int, chunk: int = 5000) -> int:
    """Re-push every summary row updated at or after ``since_ms`` to InfluxDB; returns the points written."""
    from kdq.influx import InfluxSink

    if not config.summaries:
        return 0
    names = [s.name for s in config.summaries]
    rows = (
        spark.read.format("delta")
        .load(table_path(config, SUMMARIES))
        .where((F.col("updated_at") >= F.timestamp_millis(F.lit(int(since_ms)))) & F.col("summary").isin(names))
        .select("summary", "topic", F.unix_millis("window_start").alias("window_start_ms"), "group_key", "groups",
                "count", "sum", "sum_sq", "min", "max", "hist", "rejected")
    )
    sink = InfluxSink(config)
    written, batch = 0, []
    for row in rows.toLocalIterator():
        r = row.asDict()
        batch.append({**r, "groups": r["groups"] or {}, "state": SummaryState.from_row(r)})
        if len(batch) >= chunk:
            written += sink.write(outputs_of(config, batch)[1])
            batch = []
    if batch:
        written += sink.write(outputs_of(config, batch)[1])
    return written
