"""Streaming summaries: the transforms both layers share (the same code for the stream's increments and
the batch layer's recomputation, so both compute the same thing by construction).

* :func:`summary_values` — classified rows (topic, window_start, valid,
  value) → one row per (record, summary whose topic it is on): the summary
  window, the group, the value as a double and its bucket, or the reason it
  is rejected, and (stream only) whether its window is already closed;
* :func:`summary_states` — those rows → the mergeable state per (summary,
  topic, window, group): count, sum, sum of squares, min, max, histogram
  (explode → group by bucket → ``map_from_entries``) and rejections.

Lateness is judged per (summary, topic, window) against the topic's watermark
(see :mod:`kdq.spark.summaries`), with the summary's own window and allowed lateness.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kdq.config import Config, SummaryConfig
from kdq.rules import variant_path
from kdq.summaries import MAX_ABS, MAX_STEPS, MISSING, NOT_NUMERIC, OUT_OF_RANGE, TINY, SummaryState, step_decimal

KEY = ("summary", "topic", "window_start_ms", "group_key")
_NUMERIC_TYPES = ("BIGINT", "INT", "SMALLINT", "TINYINT", "DOUBLE", "FLOAT")


def key_of(row: Mapping) -> tuple:
    """The row's (summary, topic, window_start_ms, group_key): how every state is addressed."""
    return tuple(row[k] for k in KEY)


def state_entry(row: Mapping) -> dict:
    """A state row (KEY, groups and the state's columns, from :func:`summary_states` or the table) →
    ``{KEY..., "groups", "state": SummaryState}``, the form the writers, the limits check and the outputs take."""
    return {**{k: row[k] for k in KEY}, "groups": row["groups"] or {}, "state": SummaryState.from_row(row)}


def active_summaries(config: Config, topics: Iterable[str]) -> list[SummaryConfig]:
    """The configured summaries on any of ``topics``."""
    topics = list(topics)
    return [s for s in config.summaries if any(s.matches(t) for t in topics)]


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
