"""Streaming summaries: the transforms both layers share (the same code for the stream's increments and
the batch layer's recomputation, so both compute the same thing by construction).

* :func:`summary_values` — classified rows (topic, window_start, valid,
  value) → one row per (record, summary whose topic it is on): the summary
  window, the group, the value as a double and its bucket, or the reason it
  is rejected, and (stream only) whether its window is already closed;
* :func:`summary_states` — those rows → the mergeable state per (summary,
  topic, window, group): count, sum, sum of squares, min, max, histogram
  (explode → group by bucket → ``map_from_entries``) and rejections;
* :func:`with_summary_entries` + :func:`summary_states_metric` — the same states as one aggregate of the
  records' entries (the JVM's ``SummaryStates``), which the speed layer observes in its archive pass.

Lateness is judged per (summary, topic, window) against the topic's watermark
(see :mod:`kdq.spark.summaries`), with the summary's own window and allowed lateness.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq.config import Config, SummaryConfig
from kdq.rules import RuleSet
from kdq.spark.classifier import MAX_NESTING_DEPTH
from kdq.summaries import SummaryState, step_decimal

KEY = ("summary", "topic", "window_start_ms", "group_key")

# The column of each record's summary entries (with_summary_entries) and the JVM aggregate over it.
ENTRIES_COLUMN = "__summary_entries"
SUMMARY_STATES_FUNCTION = "kdq_summary_states"


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


def summary_fields_config(summaries: Sequence[SummaryConfig], rules: RuleSet | None = None) -> str:
    """The summaries as the JSON document ``io.kdq.spark.summary.SummaryValues`` compiles (same summaries, same text);
    with ``rules`` that have registry-backed topics, also their topic matchers in precedence order
    (``io.kdq.spark.summary.RegistrySummaryValues`` reads those topics from the decoded record)."""
    entries = []
    for s in summaries:
        mantissa, exponent = step_decimal(s.step) if s.step is not None else (None, None)
        entries.append(
            {
                "value": s.value.split("."),
                "group_by": [path.split(".") for path in s.group_by],
                "digits": s.significant_digits,
                "step": s.step,
                "step_mantissa": mantissa,
                "step_exponent": exponent,
            }
        )
    document: dict = {"max_nesting_depth": MAX_NESTING_DEPTH, "summaries": entries}
    if rules is not None and any(r.registry for r in rules.rules):
        document["rules"] = [{"match": r.match, "is_pattern": r.is_pattern, "registry": r.registry} for r in rules.rules]
    return json.dumps(document, separators=(",", ":"))


def summary_fields(
    spark: SparkSession, summaries: Sequence[SummaryConfig], rules: RuleSet | None = None
) -> Callable[[Column, Column], Column]:
    """``f(topic, value)`` → one struct per summary (x, bucket, reject, groups): the JVM function, registered once
    per session.

    One streaming pass over the value's bytes in the JVM (``io.kdq.spark.summary.SummaryValues``, in the
    classifier's module) instead of Spark's VARIANT parse and a SQL bucket expression per summary
    (benchmarks/PERF_NOTES.md, "the summaries' fields in the JVM"). When ``rules`` have registry-backed topics,
    ``io.kdq.spark.summary.RegistrySummaryValues``: those topics' values are read from the record the registry's
    schema decodes (Avro, Protobuf, JSON Schema), the others as JSON.
    """
    config_json = summary_fields_config(summaries, rules)
    name = "kdq_summary_values_" + hashlib.sha256(config_json.encode("utf-8")).hexdigest()[:16]
    by_topic = '"rules":' in config_json
    if not spark.catalog.functionExists(name):
        jvm = spark.sparkContext._jvm
        functions = jvm.io.kdq.spark.summary.RegistrySummaryValues if by_topic else jvm.io.kdq.spark.summary.SummaryValues
        functions.check(config_json)
        spark._jsparkSession.udf().register(name, functions(config_json), jvm.io.kdq.spark.summary.SummaryValues.returnType())
    if by_topic:
        return lambda topic, value: F.call_function(name, topic, value)
    return lambda topic, value: F.call_function(name, value)


def _summary_entry(summary: SummaryConfig, index: int, watermarks: Mapping[str, int] | None) -> Column:
    """One struct per (record, summary) when the record's topic is the summary's, else null.

    ``__f`` is the record's :func:`summary_fields` result; its entry ``index`` is this summary's.
    """
    size_ms = summary.window_seconds * 1000
    fields = F.col("__f")[index]
    groups = [fields["groups"][i] for i in range(len(summary.group_by))]
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
    return F.when(
        topic_condition(F.col("topic"), summary),
        F.struct(
            F.lit(summary.name).alias("summary"),
            window_ms.cast("bigint").alias("window_start_ms"),
            group_key.alias("group_key"),
            group_map.alias("groups"),
            fields["x"].alias("x"),
            fields["bucket"].alias("bucket"),
            fields["reject"].alias("reject"),
            late.alias("late"),
        ),
    )


def summary_values(
    rows: DataFrame,
    summaries: Sequence[SummaryConfig],
    watermarks: Mapping[str, int] | None = None,
    rules: RuleSet | None = None,
) -> DataFrame:
    """Classified rows → (summary, topic, window_start_ms, group_key, groups, x, bucket, reject, late).

    ``rows`` needs topic, window_start (the count window the classifier
    assigned; a summary window is a whole number of them), valid and value.
    Only valid records count: an invalid one is already counted as invalid in
    the window counts. The value is parsed once per record, whatever the
    number of summaries on its topic. ``watermarks`` (topic → max event time
    before the batch, from the ledger) sets ``late``; without it nothing is late. ``rules``: the topics'
    rules, for registry-backed topics (see :func:`summary_fields`).
    """
    missing = [c for c in ("topic", "window_start", "valid", "value") if c not in rows.columns]
    if missing:
        raise ValueError(f"summary_values: input lacks {missing}; expected topic, window_start, valid, value, got {rows.columns}")
    if not summaries:
        raise ValueError("summary_values: no summaries given")
    fields = summary_fields(rows.sparkSession, summaries, rules)
    parsed = rows.where(_counted(summaries)).select(
        "topic",
        F.unix_millis("window_start").alias("__window_ms"),
        fields(F.col("topic"), F.col("value").cast("binary")).alias("__f"),
    )
    exploded = parsed.select("topic", F.explode(_entries(summaries, watermarks)).alias("e")).where(F.col("e").isNotNull())
    return exploded.select(
        F.col("e.summary").alias("summary"),
        "topic",
        F.col("e.window_start_ms").alias("window_start_ms"),
        F.col("e.group_key").alias("group_key"),
        F.col("e.groups").alias("groups"),
        F.col("e.x").alias("x"),
        F.col("e.bucket").alias("bucket"),
        F.col("e.reject").alias("reject"),
        F.col("e.late").alias("late"),
    )


def _counted(summaries: Sequence[SummaryConfig]) -> Column:
    """The records the summaries count: valid ones on a summary's topic."""
    on_topic = None
    for summary in summaries:
        cond = topic_condition(F.col("topic"), summary)
        on_topic = cond if on_topic is None else on_topic | cond
    return F.col("valid") & on_topic


def _entries(summaries: Sequence[SummaryConfig], watermarks: Mapping[str, int] | None) -> Column:
    """The record's entries, one per summary (null where the summary is on another topic): from ``__f``,
    ``__window_ms`` and ``topic``."""
    return F.array(*[_summary_entry(s, i, watermarks) for i, s in enumerate(summaries)])


def with_summary_entries(
    rows: DataFrame,
    summaries: Sequence[SummaryConfig],
    watermarks: Mapping[str, int] | None = None,
    rules: RuleSet | None = None,
) -> DataFrame:
    """``rows`` (as :func:`summary_values` takes them) plus :data:`ENTRIES_COLUMN`: each record's entries, the rows
    :func:`summary_values` would explode it into, or null when no summary counts the record; the value is parsed
    once, in the same projection. The input of :func:`summary_states_metric`."""
    if not summaries:
        raise ValueError("with_summary_entries: no summaries given")
    fields = summary_fields(rows.sparkSession, summaries, rules)
    counted = _counted(summaries)
    parsed = rows.withColumn("__f", F.when(counted, fields(F.col("topic"), F.col("value").cast("binary")))).withColumn(
        "__window_ms", F.unix_millis("window_start"))
    return parsed.withColumn(ENTRIES_COLUMN, F.when(counted, _entries(summaries, watermarks))).drop("__f", "__window_ms")


def summary_states_metric(rows: DataFrame) -> Column:
    """:func:`summary_states` of the rows' entries (:func:`with_summary_entries`) as one aggregate value: a JSON
    array of the same rows, computed by the JVM aggregate ``io.kdq.spark.summary.SummaryStates``.

    Why: the speed layer computes it as an observed metric of the pass that writes the micro-batch's records to
    the raw archive, beside the counts (:func:`kdq.spark.transforms.batch_counts_metric`): the batch's 1 KB rows
    are then neither cached nor read twice (benchmarks/PERF_NOTES.md, "the summaries in the archive's pass").
    Parse the result with :func:`summary_states_rows`. Registered once per session."""
    spark = rows.sparkSession
    if not spark.catalog.functionExists(SUMMARY_STATES_FUNCTION):
        spark._jsparkSession.udf().register(
            SUMMARY_STATES_FUNCTION, spark._jvm.io.kdq.spark.summary.SummaryStates.udaf())
    return F.call_function(SUMMARY_STATES_FUNCTION, F.col("topic"), F.col(ENTRIES_COLUMN))


def with_summary_states_metric(
    rows: DataFrame,
    summaries: Sequence[SummaryConfig],
    watermarks: Mapping[str, int] | None = None,
    rules: RuleSet | None = None,
) -> tuple[DataFrame, Column]:
    """The frame to observe and the metric: :func:`summary_states` of ``rows`` (as :func:`summary_values` takes them)
    as one aggregate value, the JSON array :func:`summary_states_rows` parses. The speed layer observes it in the
    pass that writes the micro-batch's records to the raw archive.

    Records of JSON topics go straight into the JVM aggregate ``io.kdq.spark.summary.SummaryRecordStates``: it reads
    each counted value once and adds it to its states, with no per-record entries built as Spark columns (those cost
    a catch-up ~13 core-µs per record; benchmarks/PERF_NOTES.md, twenty-first pass). With registry-backed topics in
    ``rules`` the entries are built (:func:`with_summary_entries`, whose fields read decoded records) and
    aggregated by :func:`summary_states_metric`. A test compares both with :func:`summary_states`."""
    if not summaries:
        raise ValueError("with_summary_states_metric: no summaries given")
    if rules is not None and any(r.registry for r in rules.rules):
        entries = with_summary_entries(rows, summaries, watermarks, rules)
        return entries, summary_states_metric(entries)
    config_json = json.dumps(
        {
            "fields": json.loads(summary_fields_config(summaries)),
            "summaries": [
                {
                    "name": s.name,
                    "topic": s.topic_match if s.is_pattern else s.topic,
                    "is_pattern": s.is_pattern,
                    "window_ms": s.window_seconds * 1000,
                    "allowed_lateness_ms": s.allowed_lateness_seconds * 1000,
                    "group_by": list(s.group_by),
                }
                for s in summaries
            ],
        },
        separators=(",", ":"),
    )
    name = "kdq_summary_record_states_" + hashlib.sha256(config_json.encode("utf-8")).hexdigest()[:16]
    spark = rows.sparkSession
    if not spark.catalog.functionExists(name):
        spark._jsparkSession.udf().register(name, spark._jvm.io.kdq.spark.summary.SummaryRecordStates.udaf(config_json))
    if watermarks:
        marks = F.create_map(*[c for t, ms in sorted(watermarks.items()) for c in (F.lit(t), F.lit(int(ms)))])
        watermark = F.when(F.col("valid"), F.element_at(marks, F.col("topic")).cast("bigint"))
    else:
        watermark = F.lit(None).cast("bigint")
    metric = F.call_function(
        name, F.col("topic"), F.unix_millis("window_start"), F.col("valid"), F.col("value").cast("binary"), watermark)
    return rows, metric


def summary_states_rows(value: str | None) -> list[dict]:
    """The rows of :func:`summary_states` (as ``Row.asDict``) from the value of :func:`summary_states_metric`."""
    rows = json.loads(value) if value else []
    for row in rows:
        row["hist"] = {float(bucket): n for bucket, n in row["hist"].items()}
    return rows


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
