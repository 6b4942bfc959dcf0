"""The ``summaries`` table: MERGE sources with the derived statistics, the stream's increment MERGE, the
batch layer's absolute MERGE, reads of stored states, and the size limits checked before any write.

Both MERGEs run under Delta's idempotent-write guard (:func:`kdq.spark.writers.idempotent_write`):
the stream's with its app id and the batch id, the batch layer's with the correction protocol's
version (:mod:`kdq.spark.corrections`), so a replay is skipped by Delta itself. The statistics users
read (mean, stddev, percentiles) are recomputed from the merged state in the same MERGE
(:func:`derived_sql`), operation for operation like :func:`kdq.summaries.statistics`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq.config import Config, SummaryConfig
from kdq.spark.summaries.transforms import key_of, state_entry
from kdq.spark.tables import table_path
from kdq.spark.transforms import window_partition_columns
from kdq.spark.writers import STALE_READ, idempotent_write, retry_on_conflict
from kdq.sql_literals import date_literal, timestamp_literal
from kdq.summaries import SummaryLimitError, SummaryState, percentile_fraction, percentile_name, precision_label
from kdq.tables import SUMMARIES


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


def _source(
    spark: SparkSession, config: Config, rows: Sequence[Mapping], updated_by: str, stored: bool = False
) -> DataFrame:
    """Python rows (KEY, groups, and a SummaryState under "state") → a MERGE source with the derived columns.
    ``stored``: also the group as its job read it (``old_count``, ``old_updated_us``; null: no row), for
    :func:`merge_absolute`'s compare-and-set."""
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
                *((r["old_state"].count, r["old_updated_us"]) if stored else ()),
            )
        )
    derived = derived_sql("count", "sum", "sum_sq", "hist", "pct_num", "pct_den", "pct_names")
    schema = _SOURCE_SCHEMA + (", old_count BIGINT, old_updated_us BIGINT" if stored else "")
    return spark.createDataFrame(data, schema).select(
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
        *window_partition_columns("window_start_ms"),
        "pct_names",
        "pct_num",
        "pct_den",
        *(("old_count", "old_updated_us") if stored else ()),
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
    """Set absolute states (deleting groups whose state became empty) once per (app id, version).

    A compare-and-set, like the window counts' (:func:`kdq.spark.batch_layer._merge_absolute`): each row carries
    the stored group its job read (``old_state``, ``old_updated_us``: :func:`diff_states`), and the group must
    still be that one (same ``updated_at``, same count; no row when none was read). Otherwise another writer (a
    stream micro-batch's increments, another batch job) changed it in between and writing would lose that change:
    the MERGE fails with :data:`kdq.spark.writers.STALE_READ`, commits nothing, and the job reads again.
    """
    if not rows:
        return
    from delta.tables import DeltaTable

    source = _source(spark, config, rows, updated_by, stored=True).withColumn(
        "__empty", (F.col("count") == 0) & (F.size("rejected") == 0)
    )
    stale = (
        f"raise_error(concat('{STALE_READ}: summaries ', s.summary, ' ', s.topic, ' ', CAST(s.window_start AS STRING), "
        "' ', s.group_key, ' changed since it was read (another writer); read again'))"
    )
    same = "unix_micros(t.updated_at) <=> s.old_updated_us AND t.`count` = s.old_count"
    keys = ("summary", "topic", "window_start", "group_key", "window_date", "window_hour")
    update = {name: f"s.`{name}`" for name in SUMMARIES.column_names if name not in keys}
    update["count"] = f"CASE WHEN {same} THEN s.`count` ELSE {stale} END"
    insert = {**_insert_values(), "count": f"CASE WHEN s.old_updated_us IS NULL THEN s.`count` ELSE {stale} END"}
    target = DeltaTable.forPath(spark, table_path(config, SUMMARIES)).alias("t")
    with idempotent_write(spark, app_id, version):
        (
            target.merge(source.alias("s"), _merge_condition(rows))
            .whenMatchedDelete(condition=f"s.__empty AND {same}")
            .whenMatchedUpdate(set=update)  # an empty state whose row changed meanwhile comes here, and fails
            .whenNotMatchedInsert(condition="NOT s.__empty", values=insert)
            .execute()
        )


def read_states(
    spark: SparkSession, config: Config, windows: Iterable[tuple[str, str, int]], version: int | None = None
) -> dict[tuple, dict]:
    """Every stored group of the given (summary, topic, window_start_ms): KEY → {groups, state, updated_us} (the
    row's ``updated_at`` in microseconds, what :func:`merge_absolute`'s compare-and-set checks). ``version``: the
    table's version to read (a rebuild's cut, :mod:`kdq.spark.stream_cut`); else the latest.

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
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", int(version))
    table = (
        reader.load(table_path(config, SUMMARIES))
        .where(f"window_date IN ({', '.join(dates)}) AND window_start IN ({', '.join(starts)})")
        .where(F.col("summary").isin(names) & F.col("topic").isin(topics))
        .select(
            "summary", "topic", F.unix_millis("window_start").alias("window_start_ms"), "group_key", "groups",
            "count", "sum", "sum_sq", "min", "max", "hist", "rejected", F.unix_micros("updated_at").alias("updated_us"),
        )
    )
    out: dict[tuple, dict] = {}
    for row in table.collect():
        r = row.asDict()
        if (r["summary"], r["topic"], r["window_start_ms"]) in wanted:
            out[key_of(r)] = {**state_entry(r), "updated_us": r["updated_us"]}
    return out


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
            raise _limit_error(
                config, s, f"{buckets} histogram buckets for topic {topic!r}, window {window_ms}, group {group_key}",
                "max_buckets", f"coarsen the precision ({precision_label(s)})",
            )
    for (summary, topic, window_ms), n in groups.items():
        s = config.summary(summary)
        if n > s.max_groups:
            raise _limit_error(
                config, s, f"{n} groups for topic {topic!r}, window {window_ms}",
                "max_groups", f"group by fewer or lower-cardinality fields than {list(s.group_by)}",
            )


def _limit_error(config: Config, s: SummaryConfig, found: str, setting: str, instead: str) -> SummaryLimitError:
    """``summary 'x': <found> exceed summaries[i].<setting> = <value>; raise it, or <instead>``."""
    return SummaryLimitError(
        f"summary {s.name!r}: {found} exceed summaries[{config.summaries.index(s)}].{setting} = "
        f"{getattr(s, setting)}; raise it, or {instead}"
    )
