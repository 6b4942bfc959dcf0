"""The JSON report every kdq Spark job ends with: its schema, one class per job.

Every ``spark_jobs/<job>.py`` returns one of these from ``run(spark, config, args)``;
:func:`kdq.jobs.run_main` prints it as a single JSON object on its own line of stdout
(the job's last such line) and exits 1 when ``ok`` is false. Airflow's
``KdqSparkJobOperator`` keeps that line and returns it as the task's XCom (the
``return_value`` shown in the UI); a downstream operator reads it back with
``<Report>.from_dict(xcom)`` instead of picking keys out of a dict, so the keys
below are the contract, and ``docs/operations.md`` (Job reports) describes them
for operators.

Rules of the schema:

* every report has ``ok`` (false: the job failed in a way the task should show;
  Delta is consistent anyway, see each job) and ``seconds`` (wall time of the run);
* counts are plain integers; times are ISO-8601 UTC strings unless the name ends
  in ``_ms`` (epoch millis); lists of examples (``changes``, ``mismatches``,
  ``problems``) hold at most the first 100 entries, the count beside them is the total;
* a part that did not run is ``null`` (``push`` of a run with ``--skip-push``);
* the streaming summaries' side of a report is spelled ``summaries``: a nested part ``summaries`` where
  a job reports several of their fields (the recompute's, named like the counts' own), else the counts'
  field name behind ``summaries_`` (``summaries_push``, ``summaries_corrections``); a push object is
  :meth:`kdq.spark.outputs.CountsPush.to_dict` for the counts, :meth:`kdq.spark.summaries.SummariesPush.to_dict`
  for the summaries;
* readers ignore keys they do not know, so a job can gain a field without breaking
  an older reader; a job never renames or drops one without changing its readers.

``report["key"]`` reads the JSON form (what the job printed), so code and tests that
hold the printed object and the report itself read them the same way.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self


def _json_name(f: dataclasses.Field) -> str:
    """A field's key in the JSON (``from_`` is ``from``: a Python keyword)."""
    return f.metadata.get("json", f.name)


@dataclass(kw_only=True)
class JobReport:
    """What every job reports. ``ok``: the run did everything it should (see each job for what false means);
    ``seconds``: its wall time."""

    ok: bool = True
    seconds: float = 0.0

    #: nested report parts by field name, turned back into their class by :meth:`from_dict`
    _parts: ClassVar[dict[str, type]] = {}

    def to_dict(self) -> dict[str, Any]:
        """The JSON object the job prints (nested parts as objects)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[_json_name(f)] = value.to_dict() if hasattr(value, "to_dict") else value
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Read a printed report back (an XCom); unknown keys are ignored, missing ones take their default."""
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            key = _json_name(f)
            if key not in data:
                continue
            value = data[key]
            part = cls._parts.get(f.name)
            kwargs[f.name] = part.from_dict(value) if part is not None and isinstance(value, Mapping) else value
        return cls(**kwargs)

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]


@dataclass(kw_only=True)
class SummariesRecomputeReport(JobReport):
    """The streaming summaries' part of the hourly recompute (``summaries`` of :class:`RecomputeReport`).

    ``late_windows``: (summary, topic, window)s the stream left to the batch layer for the interval;
    ``corrections``: groups whose state this run changed (``changes``: the first 100, KEY and old/new count);
    ``retired_windows_kept``: late windows whose archive hours retention deleted (stored state kept);
    ``push``: what was sent (``summary_messages``, ``influx_ok``, ``influx_error``: a ``SummariesPush``), null
    without a push.
    ``ok`` is false when InfluxDB refused the push. ``seconds`` is not measured for the part (0).
    """

    late_windows: int = 0
    corrections: int = 0
    changes: list[dict] | None = None
    retired_windows_kept: int | None = None
    push: dict[str, Any] | None = None


@dataclass(kw_only=True)
class RecomputeReport(JobReport):
    """``batch_recompute``: the hourly recompute of one ingest-time interval.

    ``late_windows``: (topic, window)s with archive rows ingested in the interval the stream did not count;
    ``corrections``: (topic, window, status) whose count changed (``changes``: the first 100 with ``old``
    and ``new``); ``reason_corrections``: invalid-reason rows corrected; ``stream_caught_up``: whether every
    micro-batch ingested before the end had committed (null: no stream ledger); ``archive_total`` /
    ``scanned_late_rows`` / ``scanned_recompute``: files and bytes of the archive and of what the run read;
    ``push``: the metrics-topic and InfluxDB push (null with ``--skip-push``); ``summaries``: the streaming
    summaries' part; ``compacted``: the closed hours compacted afterwards, per table (kdq.spark.maintenance.
    compact_closed_hours). ``ok`` is false when InfluxDB refused a push (recorded for the catch-up).
    """

    run_id: str = ""
    interval_start: str = ""
    interval_end: str = ""
    stream_caught_up: bool | None = None
    late_windows: int = 0
    archive_total: dict[str, int] = field(default_factory=dict)
    scanned_late_rows: dict[str, int] = field(default_factory=dict)
    scanned_recompute: dict[str, int] = field(default_factory=lambda: {"files": 0, "bytes": 0})
    corrections: int = 0
    reason_corrections: int = 0
    changes: list[dict] = field(default_factory=list)
    push: dict[str, Any] | None = None
    summaries: SummariesRecomputeReport = field(default_factory=SummariesRecomputeReport)
    compacted: dict[str, Any] = field(default_factory=dict)

    _parts: ClassVar[dict[str, type]] = {"summaries": SummariesRecomputeReport}

    @property
    def found_late_windows(self) -> bool:
        """Whether the interval had any late window (counts or summaries): only then can it have corrections
        to push (see ``PushCorrectionsOperator``)."""
        return self.late_windows > 0 or self.summaries.late_windows > 0


@dataclass(kw_only=True)
class PushReport(JobReport):
    """``push_corrections``: every correction ever recorded for the interval, pushed again.

    ``corrected_keys``: (topic, window, status) pushed; ``push``: ``metrics_sent``, ``influx_points``,
    ``influx_ok``, ``influx_error``; ``corrected_summary_groups`` / ``summaries_push`` (``summary_messages``,
    ``influx_ok``, ``influx_error``): the same for the streaming summaries (null when none). ``ok`` is false
    when InfluxDB refused a push.
    """

    interval_start: str = ""
    interval_end: str = ""
    corrected_keys: int = 0
    push: dict[str, Any] = field(default_factory=dict)
    corrected_summary_groups: int = 0
    summaries_push: dict[str, Any] | None = None


@dataclass(kw_only=True)
class RebuildReport(JobReport):
    """``rebuild``: re-classification of the archived records of a window range.

    ``archive_rows``: rows re-judged; ``windows``: windows recomputed; ``corrections`` (``rule_change`` of
    them because the rules changed; ``changes``: the first 100); ``version_only``: rows whose count stayed
    but whose rules version moved; ``archive_rows_updated``: archive rows whose classification changed
    (null with ``--keep-archive``); ``summaries_corrections`` (groups whose summary state changed, one
    ``summary_corrections`` row each) / ``summaries_push``: the streaming summaries' part (null without
    summaries); ``rules_version``: the rules applied. ``ok`` is false when InfluxDB refused a push.
    """

    run_id: str = ""
    from_: str = field(default="", metadata={"json": "from"})
    to: str = ""
    topics: list[str] | str = "all"
    archive_rows: int = 0
    windows: int = 0
    corrections: int = 0
    rule_change: int = 0
    version_only: int = 0
    reason_corrections: int = 0
    changes: list[dict] = field(default_factory=list)
    summaries_corrections: int | None = None
    archive_rows_updated: int | None = None
    push: dict[str, Any] | None = None
    summaries_push: dict[str, Any] | None = None
    rules_version: str = ""


@dataclass(kw_only=True)
class ArchiveReport(JobReport):
    """``archive_from_kafka``: raw records of an offset or time range loaded into the archive.

    ``rows_read`` / ``rows_loaded`` / ``rows_skipped_already_archived``; ``ingest_time_ms``: the ingest
    time given to the loaded rows (recompute the interval holding it); ``partitions``: the resolved offset
    range per partition, with ``held_back_for_stream`` (offsets left to the stream, which has not passed
    them yet); ``missing_in_kafka``: ranges Kafka no longer had. ``ok`` is false when anything
    was missing.
    """

    run_id: str = ""
    topics: list[str] = field(default_factory=list)
    ingest_time_ms: int = 0
    rows_read: int = 0
    rows_loaded: int = 0
    rows_skipped_already_archived: int = 0
    missing_in_kafka: list[dict] = field(default_factory=list)
    partitions: list[dict] = field(default_factory=list)


@dataclass(kw_only=True)
class ReconcileReport(JobReport):
    """``reconcile``: the archive against Kafka's offsets, window_counts against the archive.

    Per partition (``partitions``; ``problems``: those with gaps or duplicates): ``first_offset``,
    ``end_offset``, ``expected``, ``archived``, ``duplicates``, ``missing``, ``gaps`` ([from, to]
    inclusive) and ``holes_without_records`` (offsets no read_committed reader sees). Totals:
    ``partitions_checked``, ``partitions_with_gaps``, ``missing_offsets``, ``duplicate_offsets``;
    ``count_mismatches`` with the first 100 in ``mismatches``. ``ok`` is false on any gap, duplicate or
    mismatch. With ``after_recompute`` (the hourly DAG's check), ``pending_rows`` archive rows of the range
    were left out because a later interval's recompute counts them, and ``late_windows_checked`` windows
    outside the range that the interval's late rows touched were checked too.
    """

    from_: str | None = field(default=None, metadata={"json": "from"})
    to: str | None = None
    topics: list[str] = field(default_factory=list)
    partitions_checked: int = 0
    partitions_with_gaps: int = 0
    missing_offsets: int = 0
    duplicate_offsets: int = 0
    count_mismatches: int = 0
    mismatches: list[dict] = field(default_factory=list)
    after_recompute: bool = False
    pending_rows: int = 0
    late_windows_checked: int = 0
    problems: list[dict] = field(default_factory=list)
    partitions: list[dict] = field(default_factory=list)


@dataclass(kw_only=True)
class CatchUpReport(JobReport):
    """``influx_catch_up``: windows updated since the stream's first failed InfluxDB push, pushed again.

    ``since_ms``: the lower bound used; ``pending_since_ms``: the pending state found; ``points`` /
    ``summary_points``: points written (null without summaries); ``cleared``: the pending state was
    cleared; ``skipped``: why nothing was done (null when it ran); ``skipped_newer``: windows not written
    because InfluxDB already held a newer version of them (:mod:`kdq.push_order`). A refused write fails the
    job (raises).
    """

    since_ms: int | None = None
    pending_since_ms: int | None = None
    points: int = 0
    skipped_newer: int = 0
    cleared: bool = False
    skipped: str | None = None
    summary_points: int | None = None


@dataclass(kw_only=True)
class MaintenanceReport(JobReport):
    """``maintenance``: ``today`` (UTC date of the run), ``steps`` planned, ``skipped``: how many of them had
    nothing to do, and ``results`` by step description: OPTIMIZE's compacted ``partitions`` and
    ``files_removed``/``files_added``, VACUUM's ``vacuumed`` mode (LITE or FULL), the retention's
    retired/deleted counts, each with the ``seconds`` it took, or ``{"skipped": why}`` (no closed partition with
    new files, no archive partition before the cutoff, nothing removed since a VACUUM, a table younger than the
    VACUUM's retention, the stream behind the retirement instant)."""

    today: str = ""
    steps: int = 0
    skipped: int = 0
    results: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class StreamReport(JobReport):
    """``stream_counts`` when the speed layer stops: its ``app_id`` and ``checkpoint``; ``error``: why the
    query died (null after a requested stop). ``ok`` is false when it died (the batch it was in is
    recorded in ``batch_failure.json`` for the supervisor)."""

    app_id: str = ""
    checkpoint: str = ""
    error: str | None = None


@dataclass(kw_only=True)
class EndpointReport(JobReport):
    """``sql_endpoint`` after SIGTERM: both servers stopped."""


@dataclass(kw_only=True)
class ExpectationsReport(JobReport):
    """``spark_jobs/evaluate_expectations.py``: one evaluation of the expectations.

    ``first_minute``/``last_minute``: the minutes judged (ISO UTC); ``counts_version``: the ``window_counts``
    version read; ``incidents_changed``: rows written to ``kdq.incidents``; ``notifications``: the first 100 the
    run produced (id, event, topic, expectation, status, worst_value), ``notifications_total`` all of them
    (a re-run on the same counts produces none); ``delivery``: what the notifier did (``null`` without
    ``--deliver``): per channel sent / failed / skipped_already_sent, and ``errors`` (first 20). A failing
    channel does not make ``ok`` false: the evaluation is committed and the next run delivers again.
    ``step_seconds``: wall seconds per step (read, judge, sample, write, deliver), summed over a run's evaluations.
    ``skipped_unchanged``: a repeating run's looks that found its inputs as the last evaluation left them.
    ``evaluated_at_once``: a repeating run's evaluations started ahead of its regular looks because a micro-batch's
    own counts put a topic over its invalid_ratio threshold (:func:`kdq.expectation_run.batches_breaching`).
    """

    now_ms: int = 0
    first_minute: str = ""
    last_minute: str = ""
    counts_version: int | None = None
    verdicts: int = 0
    violated: int = 0
    incidents_changed: int = 0
    open_incidents: int | None = None
    notifications_total: int = 0
    notifications: list[dict] = field(default_factory=list)
    delivery: dict[str, Any] | None = None
    evaluations: int = 1
    skipped_unchanged: int = 0
    evaluated_at_once: int = 0
    step_seconds: dict[str, float] = field(default_factory=dict)

    @classmethod
    def combined(cls, reports: Sequence[ExpectationsReport]) -> ExpectationsReport:
        """Several evaluations of one run (``--every``) as one report: the last one's window, version and open
        incidents; the changes, notifications and deliveries of all of them."""
        last = reports[-1]
        return dataclasses.replace(
            last,
            ok=all(r.ok for r in reports),
            seconds=sum(r.seconds for r in reports),
            verdicts=sum(r.verdicts for r in reports),
            violated=sum(r.violated for r in reports),
            incidents_changed=sum(r.incidents_changed for r in reports),
            notifications_total=sum(r.notifications_total for r in reports),
            notifications=[n for r in reports for n in r.notifications][:100],
            delivery=_summed([r.delivery for r in reports if r.delivery is not None]),
            evaluations=sum(r.evaluations for r in reports),
            skipped_unchanged=sum(r.skipped_unchanged for r in reports),
            evaluated_at_once=sum(r.evaluated_at_once for r in reports),
            step_seconds={step: round(sum(r.step_seconds.get(step, 0.0) for r in reports), 3)
                          for step in dict.fromkeys(step for r in reports for step in r.step_seconds)},
        )


def _summed(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Dicts of counts added key by key (nested dicts too), lists joined (at most 20), anything else the last."""
    if not parts:
        return None
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            have = out.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float, list, dict)) or have is None:
                out[key] = value if not isinstance(value, dict) else _summed([value])
            elif isinstance(value, dict):
                out[key] = _summed([have, value])
            elif isinstance(value, list):
                out[key] = list(dict.fromkeys([*have, *value]))[:20] if key == "channels" else [*have, *value][:20]
            else:
                out[key] = have + value
    return out
