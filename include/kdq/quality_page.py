"""The data-quality page of the Airflow UI, the pure part: its SQL, the shaping of the rows, stream health.

The page (``plugins/kdq_airflow/quality_app.py``, rendered by :mod:`kdq.quality_html`) shows per topic the
valid and invalid counts and the invalid ratio over the last hour (per minute) and the last day (per hour),
the top invalid reasons of the day with one sample each, recent corrections and the stream's health.

**Where the numbers come from.** Counts, reasons, samples and corrections are Delta tables; the page reads
them through the always-on SQL endpoint (Spark Connect), never with a Spark driver of its own: a JVM per
request in the API server would take a minute and a gigabyte; the API server keeps the last answer and asks
again when the tables changed (:mod:`kdq.quality_cache`), so a page load never waits for it. Everything here builds SQL text and shapes
the rows it returns, so the plugin only runs four statements (:data:`QUERIES`) and renders the model;
unit tests feed rows without any endpoint. Stream health comes from the stream's state files
(:mod:`kdq.stream.state`), which the API server reads on the same machine, and so do the batch jobs that
wrote beside it in the last day (the writers journal, :mod:`kdq.writers_journal`): :mod:`kdq.quality_health`.

**Time ranges.** One instant ``now`` per page: the hour is the 60 minutes ``[m - 59 min, m + 1 min)`` with
``m`` the start of the current minute, the day the 24 hours ``[h - 23 h, h + 1 h)`` with ``h`` the start of
the current hour (UTC, by window start, i.e. event time). The totals of a topic are the sums of its
chart's buckets, so what the table says is exactly what the bars add up to. Only instants kdq computed
become SQL text (:mod:`kdq.sql_literals`); topic names never do (they are only read back).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from kdq.quality_health import StreamHealth, TopicHealth
from kdq.sql_literals import date_literal, timestamp_literal
from kdq.windows import HOUR_MS, event_hour

MINUTE_MS = 60_000
TOP_REASONS = 5  # per topic
CORRECTIONS_PER_TOPIC = 10
INCIDENTS_SHOWN = 50  # open ones first
INCIDENTS_RECENT_HOURS = 24  # resolved and retracted incidents updated this recently are shown too
PREVIEW_CHARS = 200  # of the sample's 512-character preview


@dataclass(frozen=True)
class PageRange:
    """The page's two time ranges, from one instant (epoch millis)."""

    now_ms: int

    @property
    def hour_from_ms(self) -> int:
        return self.now_ms // MINUTE_MS * MINUTE_MS - 59 * MINUTE_MS

    @property
    def hour_to_ms(self) -> int:
        return self.now_ms // MINUTE_MS * MINUTE_MS + MINUTE_MS

    @property
    def day_from_ms(self) -> int:
        return self.now_ms // HOUR_MS * HOUR_MS - 23 * HOUR_MS

    @property
    def day_to_ms(self) -> int:
        return self.now_ms // HOUR_MS * HOUR_MS + HOUR_MS

    def buckets(self, scale: str) -> list[int]:
        """Every bucket start of a scale (``hour``: 60 minutes, ``day``: 24 hours), oldest first."""
        if scale == "hour":
            return list(range(self.hour_from_ms, self.hour_to_ms, MINUTE_MS))
        if scale == "day":
            return list(range(self.day_from_ms, self.day_to_ms, HOUR_MS))
        raise ValueError(f"unknown scale {scale!r}: expected 'hour' or 'day'")


# -- SQL ---------------------------------------------------------------------------------------------------


def counts_sql(db: str, page: PageRange) -> str:
    """Valid/invalid sums per (scale, topic, bucket): minutes of the last hour and hours of the last day.

    The ``window_date`` predicates let Delta prune the table's partitions (the day spans two dates at most).
    A status with no row in a window counts 0 (window_counts has no zero rows).
    """

    def part(scale: str, unit: str, start: int, end: int) -> str:
        return (
            f"SELECT '{scale}' AS scale, topic, unix_millis(date_trunc('{unit}', window_start)) AS bucket_ms, "
            "SUM(CASE WHEN status = 'valid' THEN count ELSE 0 END) AS valid, "
            "SUM(CASE WHEN status = 'invalid' THEN count ELSE 0 END) AS invalid "
            f"FROM {db}.window_counts WHERE window_date >= {date_literal(start)} "
            f"AND window_date <= {date_literal(end - 1)} "
            f"AND window_start >= {timestamp_literal(start)} AND window_start < {timestamp_literal(end)} "
            "GROUP BY topic, date_trunc('" + unit + "', window_start)"
        )

    return (
        part("hour", "MINUTE", page.hour_from_ms, page.hour_to_ms)
        + " UNION ALL "
        + part("day", "HOUR", page.day_from_ms, page.day_to_ms)
    )


def reasons_sql(db: str, page: PageRange, top: int = TOP_REASONS) -> str:
    """The ``top`` reasons of the day per topic (invalid_reason_counts), each with its most recent sample.

    Samples come from the invalid_samples view over the raw archive; its ``event_hour`` filter prunes the
    archive to the day's partitions. A reason whose raw rows the retention deleted has no sample (NULLs).
    """
    start, end = timestamp_literal(page.day_from_ms), timestamp_literal(page.day_to_ms)
    return (
        "WITH reasons AS ("
        f"SELECT topic, reason, SUM(count) AS n FROM {db}.invalid_reason_counts "
        f"WHERE window_start >= {start} AND window_start < {end} GROUP BY topic, reason HAVING SUM(count) <> 0), "
        "ranked AS (SELECT topic, reason, n, row_number() OVER (PARTITION BY topic ORDER BY n DESC, reason) AS r "
        "FROM reasons), "
        # The preview is CAST(value AS STRING) of raw bytes: invalid UTF-8 (reason not_utf8) would break the
        # client's decoding (Spark Connect ships strings as Arrow UTF-8), so it is repaired with U+FFFD here.
        "samples AS (SELECT topic, reason, partition, offset, make_valid_utf8(value_preview) AS value_preview, "
        "value_bytes, "
        "row_number() OVER (PARTITION BY topic, reason ORDER BY window_start DESC, partition, offset) AS s "
        f"FROM {db}.invalid_samples WHERE event_hour >= '{event_hour(page.day_from_ms)}' "
        f"AND event_hour <= '{event_hour(page.day_to_ms - 1)}' "
        f"AND window_start >= {start} AND window_start < {end}) "
        "SELECT ranked.topic, ranked.reason, ranked.n AS count, samples.partition, samples.offset, "
        "samples.value_preview, samples.value_bytes FROM ranked LEFT JOIN samples "
        "ON samples.topic = ranked.topic AND samples.reason = ranked.reason AND samples.s = 1 "
        f"WHERE ranked.r <= {int(top)} ORDER BY ranked.topic, ranked.r"
    )


def corrections_sql(db: str, per_topic: int = CORRECTIONS_PER_TOPIC) -> str:
    """The most recent corrections per topic (any time: corrections are rare and worth seeing)."""
    return (
        "SELECT topic, window_ms, status, old_count, new_count, reason, run_id, corrected_ms FROM ("
        "SELECT topic, unix_millis(window_start) AS window_ms, status, old_count, new_count, reason, run_id, "
        "unix_millis(corrected_at) AS corrected_ms, row_number() OVER (PARTITION BY topic "
        "ORDER BY corrected_at DESC, window_start DESC, status) AS r "
        f"FROM {db}.corrections) WHERE r <= {int(per_topic)} ORDER BY topic, r"
    )


def incidents_sql(db: str, recent_hours: int = INCIDENTS_RECENT_HOURS, limit: int = INCIDENTS_SHOWN) -> str:
    """The open incidents and those updated in the last ``recent_hours`` (resolved, retracted), open first,
    then the most recently updated (kdq.incidents, written by the expectations run)."""
    return (
        "SELECT incident_key, topic, expectation, status, unix_millis(first_window) AS first_ms, "
        "unix_millis(last_window) AS last_ms, unix_millis(window_start) AS window_start_ms, "
        "unix_millis(window_end) AS window_end_ms, worst_value, threshold, level, final, "
        "unix_millis(resolved_window) AS resolved_ms, unix_millis(opened_at) AS opened_ms, "
        "unix_millis(updated_at) AS updated_ms, version, sample "
        f"FROM {db}.incidents WHERE status = 'open' "
        f"OR updated_at >= current_timestamp() - make_interval(0, 0, 0, 0, {int(recent_hours)}) "
        f"ORDER BY CASE WHEN status = 'open' THEN 0 ELSE 1 END, updated_at DESC, incident_key LIMIT {int(limit)}"
    )


def page_queries(db: str, page: PageRange) -> dict[str, str]:
    """Every statement the page runs, by the name :func:`build_model` expects its rows under."""
    return {"counts": counts_sql(db, page), "reasons": reasons_sql(db, page), "corrections": corrections_sql(db),
            "incidents": incidents_sql(db)}


QUERIES = ("counts", "reasons", "corrections", "incidents")
NUMBERS_STATES = ("fresh", "stale", "none")


# -- the model the page renders ----------------------------------------------------------------------------


class _Counted:
    """Total and invalid ratio of anything with ``valid`` and ``invalid`` counts (a bucket, a whole chart)."""

    @property
    def total(self) -> int:
        return self.valid + self.invalid

    @property
    def ratio(self) -> float | None:
        """None when nothing was counted: no data is not "all valid"."""
        return self.invalid / self.total if self.total else None


@dataclass(frozen=True)
class Bucket(_Counted):
    start_ms: int
    valid: int
    invalid: int


@dataclass(frozen=True)
class Series(_Counted):
    """One chart: every bucket of a scale (zeros where nothing was counted) and their sums."""

    scale: str
    buckets: tuple[Bucket, ...]

    @property
    def valid(self) -> int:
        return sum(b.valid for b in self.buckets)

    @property
    def invalid(self) -> int:
        return sum(b.invalid for b in self.buckets)


@dataclass(frozen=True)
class Reason:
    reason: str
    count: int
    sample_partition: int | None = None
    sample_offset: int | None = None
    sample_preview: str | None = None
    sample_bytes: int | None = None


@dataclass(frozen=True)
class Correction:
    window_ms: int
    status: str
    old_count: int
    new_count: int
    reason: str
    run_id: str | None
    corrected_ms: int
    run_url: str | None = None  # the Airflow DAG run that made it, when Airflow knows the run id


@dataclass(frozen=True)
class SampleRecord:
    """One invalid record of an incident's windows (its sample): where it is and why."""

    partition: int
    offset: int
    reason: str
    value: str


@dataclass(frozen=True)
class IncidentView:
    key: str
    topic: str
    expectation: str
    status: str  # open | resolved | retracted
    first_ms: int  # first and last violated minute
    last_ms: int
    window_start_ms: int  # the windows whose counts are behind it
    window_end_ms: int
    worst_value: float
    threshold: float
    level: int
    final: bool
    resolved_ms: int | None
    opened_ms: int
    updated_ms: int
    version: int
    sample: tuple[SampleRecord, ...] = ()


@dataclass(frozen=True)
class TopicView:
    topic: str
    hour: Series
    day: Series
    reasons: tuple[Reason, ...] = ()
    corrections: tuple[Correction, ...] = ()
    health: TopicHealth = field(default_factory=TopicHealth)


@dataclass(frozen=True)
class DagRunLink:
    dag_id: str
    run_id: str
    state: str | None
    run_after_ms: int | None
    url: str


@dataclass(frozen=True)
class PageModel:
    page: PageRange
    topics: tuple[TopicView, ...]
    stream: StreamHealth
    dag_runs: tuple[DagRunLink, ...] = ()
    sql_error: str | None = None  # why counts, reasons and corrections are missing (the endpoint is down)
    sql_source: str | None = None  # where they came from (the endpoint's address)
    query_seconds: float | None = None
    dag_ids: tuple[str, ...] = ()  # kdq's DAGs, linked from the page
    # The numbers (counts, reasons, corrections) against the tables: "fresh" (asked since their last change),
    # "stale" (an older answer, being renewed) or "none" (no answer yet: the layout and the stream's health
    # only). See kdq.quality_cache.
    numbers: str = "fresh"
    numbers_ms: int | None = None  # when the answer arrived
    now_ms: int | None = None  # when the page was made (``page.now_ms`` is the numbers' instant)
    # statements whose rows are older than the counts ("reasons", "corrections": asked less often, see
    # kdq.quality_cache) -> when their rows were asked; the page shows that instant beside them
    lagging: Mapping[str, int] = field(default_factory=dict)
    # kdq.incidents: the open ones first, then those updated in the last INCIDENTS_RECENT_HOURS
    incidents: tuple[IncidentView, ...] = ()


def dag_run_url(dag_id: str, run_id: str) -> str:
    """The Airflow 3 UI's page of one DAG run (relative to the API server's root)."""
    return f"/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def dag_url(dag_id: str) -> str:
    return f"/dags/{quote(dag_id, safe='')}/runs"


def _int(value: Any) -> int:
    return int(value or 0)


def shape_counts(rows: Iterable[Mapping[str, Any]], page: PageRange) -> dict[str, dict[str, Series]]:
    """Rows of :func:`counts_sql` → topic → {"hour": Series, "day": Series}, every bucket present."""
    sums: dict[tuple[str, str, int], tuple[int, int]] = {}
    for row in rows:
        key = (row["topic"], row["scale"], int(row["bucket_ms"]))
        valid, invalid = sums.get(key, (0, 0))
        sums[key] = (valid + _int(row["valid"]), invalid + _int(row["invalid"]))
    topics = sorted({topic for topic, _, _ in sums})
    out: dict[str, dict[str, Series]] = {}
    for topic in topics:
        out[topic] = {
            scale: Series(scale, tuple(Bucket(b, *sums.get((topic, scale, b), (0, 0))) for b in page.buckets(scale)))
            for scale in ("hour", "day")
        }
    return out


def shape_reasons(rows: Iterable[Mapping[str, Any]]) -> dict[str, tuple[Reason, ...]]:
    out: dict[str, list[Reason]] = {}
    for row in rows:
        preview = row.get("value_preview")
        out.setdefault(row["topic"], []).append(
            Reason(
                reason=row["reason"],
                count=_int(row["count"]),
                sample_partition=None if row.get("partition") is None else int(row["partition"]),
                sample_offset=None if row.get("offset") is None else int(row["offset"]),
                sample_preview=None if preview is None else str(preview)[:PREVIEW_CHARS],
                sample_bytes=None if row.get("value_bytes") is None else int(row["value_bytes"]),
            )
        )
    return {topic: tuple(reasons) for topic, reasons in out.items()}


def shape_corrections(
    rows: Iterable[Mapping[str, Any]], run_urls: Mapping[str, str] | None = None
) -> dict[str, tuple[Correction, ...]]:
    """Rows of :func:`corrections_sql` → topic → corrections, newest first; ``run_urls``: run id → DAG run page."""
    run_urls = run_urls or {}
    out: dict[str, list[Correction]] = {}
    for row in rows:
        run_id = row.get("run_id")
        out.setdefault(row["topic"], []).append(
            Correction(
                window_ms=int(row["window_ms"]),
                status=row["status"],
                old_count=_int(row["old_count"]),
                new_count=_int(row["new_count"]),
                reason=row.get("reason") or "",
                run_id=run_id,
                corrected_ms=int(row["corrected_ms"]),
                run_url=run_urls.get(run_id) if run_id else None,
            )
        )
    return {topic: tuple(corrections) for topic, corrections in out.items()}


def _sample(text: Any) -> tuple[SampleRecord, ...]:
    """An incident's ``sample`` column (JSON ``[{partition, offset, reason, value}]``); a malformed one is
    shown as no sample, never an error of the page."""
    if not text:
        return ()
    try:
        items = json.loads(text)
        return tuple(SampleRecord(int(i["partition"]), int(i["offset"]), str(i.get("reason") or ""),
                                  str(i.get("value") or "")) for i in items)
    except (ValueError, TypeError, KeyError):
        return ()


def shape_incidents(rows: Iterable[Mapping[str, Any]]) -> tuple[IncidentView, ...]:
    """Rows of :func:`incidents_sql` → the page's incidents, in the statement's order (open first)."""
    out = []
    for row in rows:
        resolved = row.get("resolved_ms")
        out.append(IncidentView(
            key=str(row["incident_key"]), topic=str(row["topic"]), expectation=str(row["expectation"]),
            status=str(row["status"]), first_ms=int(row["first_ms"]), last_ms=int(row["last_ms"]),
            window_start_ms=int(row["window_start_ms"]), window_end_ms=int(row["window_end_ms"]),
            worst_value=float(row["worst_value"]), threshold=float(row["threshold"]), level=_int(row.get("level")),
            final=bool(row.get("final")), resolved_ms=None if resolved is None else int(resolved),
            opened_ms=int(row["opened_ms"]), updated_ms=int(row["updated_ms"]), version=_int(row.get("version")),
            sample=_sample(row.get("sample")),
        ))
    return tuple(out)


def correction_run_ids(rows: Iterable[Mapping[str, Any]]) -> set[str]:
    return {row["run_id"] for row in rows if row.get("run_id")}


def build_model(
    page: PageRange,
    rows: Mapping[str, Sequence[Mapping[str, Any]]] | None,
    stream: StreamHealth,
    dag_runs: Sequence[DagRunLink] = (),
    sql_error: str | None = None,
    sql_source: str | None = None,
    query_seconds: float | None = None,
    dag_ids: Sequence[str] = (),
    numbers: str = "fresh",
    numbers_ms: int | None = None,
    now_ms: int | None = None,
    lagging: Mapping[str, int] | None = None,
) -> PageModel:
    """Everything the page shows. ``rows``: the rows of each of :data:`QUERIES` (None when the endpoint could
    not be asked: the topics then come from the stream's health alone). ``numbers``: see :class:`PageModel`."""
    if numbers not in NUMBERS_STATES:
        raise ValueError(f"numbers must be one of {NUMBERS_STATES}, not {numbers!r}")
    rows = rows or {}
    run_urls = {link.run_id: link.url for link in dag_runs}
    counts = shape_counts(rows.get("counts", ()), page)
    reasons = shape_reasons(rows.get("reasons", ()))
    corrections = shape_corrections(rows.get("corrections", ()), run_urls)
    empty = {scale: Series(scale, tuple(Bucket(b, 0, 0) for b in page.buckets(scale))) for scale in ("hour", "day")}
    names = sorted({*counts, *reasons, *corrections, *stream.topics})
    topics = tuple(
        TopicView(
            topic=name,
            hour=counts.get(name, empty)["hour"],
            day=counts.get(name, empty)["day"],
            reasons=reasons.get(name, ()),
            corrections=corrections.get(name, ()),
            health=stream.topics.get(name, TopicHealth()),
        )
        for name in names
    )
    return PageModel(
        page,
        topics,
        stream,
        tuple(dag_runs),
        sql_error,
        sql_source,
        query_seconds,
        tuple(dag_ids),
        numbers,
        numbers_ms,
        page.now_ms if now_ms is None else now_ms,
        dict(lagging or {}),
        shape_incidents(rows.get("incidents", ())),
    )


def rows_as_dicts(rows: Iterable[Any]) -> list[dict[str, Any]]:
    """Spark Rows (anything with ``asDict``) or mappings → plain dicts."""
    return [row.asDict() if hasattr(row, "asDict") else dict(row) for row in rows]
