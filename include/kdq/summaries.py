"""Streaming summaries, the pure part: buckets, mergeable state, statistics, percentiles, output formats.

A summary keeps, per (summary, topic, window, group), a **mergeable state**:
count, sum, sum of squares, min, max, a histogram ``{bucket: count}`` and the
rejected records per reason. Two states of the same key merge by adding
counts, sums and histograms and taking min/max, so a micro-batch's increment,
a late record and a recomputation from the archive all combine exactly.
Everything users see (mean, standard deviation, percentiles) is derived from
the state by :func:`statistics`; the Spark side derives the same numbers with
the SQL of :mod:`kdq.spark.summaries` (the unit tests check both agree).

**Buckets.** A value's bucket is its decimal value (the shortest decimal that
reads back as the same double, i.e. what the producer's JSON says and what
Python's ``repr`` prints) *truncated toward zero* to ``significant_digits``
digits, e.g. with 3 digits 9.995 → 9.99, -12.345 → -12.3, 0.29 → 0.29 and
1e-300 → 1e-300; or, with a ``step``, *floored* to a multiple of the step's
decimal value (step 0.5: 1.7 → 1.5, -1.2 → -1.5). Both layers compute it
without formatting doubles as text (Java 17's ``Double.toString`` is not
always the shortest form): the bucket is the largest decimal with that many
digits (the largest multiple of the step) whose nearest double is ≤ the
value; an estimate from ``log10`` is corrected by comparing candidates parsed
from text, and parsing decimal text is correctly rounded in Java and Python
alike. Because every decimal of at most 15 significant digits is a distinct
double (at most 15 significant digits; a step of at most 3 digits and values
below 1e12 steps), this equals the truncation of the shortest decimal
(:func:`reference_bucket`, a textbook implementation used by the tests).
Magnitudes below 1e-300 fall in bucket 0.

**Percentiles** (nearest rank): for ``q`` in (0, 100] and ``n`` values, the
percentile is the smallest bucket whose cumulative count is ≥ ``ceil(q/100 ·
n)`` (at least 1), computed with integer arithmetic. This is numpy's
``np.percentile(truncated_values, q, method="inverted_cdf")``: an actual
(truncated) value, exact to the bucket precision, never an interpolation.
Because truncation preserves order, it is also the bucket of the exact
nearest-rank percentile of the raw values.

**Standard deviation** is the population standard deviation (numpy's
``np.std`` with ``ddof=0``): ``sqrt(max(0, sum_sq/count - mean²))``, null
without values. It is computed from sums, so for data whose spread is below
about 1e-7 of its mean it loses precision (clamped at 0, never negative).

**Accepted values.** A record counts in a summary when it is valid for its
topic's rules and the field is a JSON number (integers of any size become
doubles) with magnitude ≤ 1e150 (:data:`MAX_ABS`). Otherwise it is counted in
the state's ``rejected`` map, by reason: ``missing`` (absent or JSON null),
``not_numeric`` (a string, even ``"NaN"`` or ``"12.5"``, a boolean, an object
or an array) or ``out_of_range`` (larger than 1e150, including numbers JSON
parsing turns into infinity such as 1e400; in step mode also values of
1e12 steps or more). The 1e150 bound keeps the sum of squares finite: 1e150²
is 1e300, so it overflows only after 1.8e8 extreme values in one window and
group. (``NaN`` and ``Infinity`` literals are not JSON: such records are
invalid ``not_json`` for the topic and never reach a summary.)
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_DOWN, ROUND_FLOOR, Decimal
from fractions import Fraction
from typing import Any

from kdq.config import SummaryConfig
from kdq.influx import Point

MAX_ABS = 1e150
TINY = 1e-300  # magnitudes below fall in bucket 0
MAX_STEPS = 10**12  # step mode: |value| / step must stay below this (buckets stay 15-digit decimals)

MISSING = "missing"
NOT_NUMERIC = "not_numeric"
OUT_OF_RANGE = "out_of_range"
REJECT_REASONS = (MISSING, NOT_NUMERIC, OUT_OF_RANGE)


class SummaryLimitError(RuntimeError):
    """A summary's state would exceed its configured size limit: the job stops instead of dropping data."""


# -- precision and buckets ---------------------------------------------------------------------------


def step_decimal(step: float) -> tuple[int, int]:
    """A step's decimal value as (mantissa, exponent): 0.5 → (5, -1), 250.0 → (25, 1)."""
    sign, digits, exponent = Decimal(repr(float(step))).normalize().as_tuple()
    mantissa = int("".join(map(str, digits)))
    return (-mantissa if sign else mantissa), int(exponent)


def precision_label(summary: SummaryConfig) -> str:
    """How the histogram's buckets were cut (stored with every row: a bucket means nothing without it)."""
    if summary.step is not None:
        return f"step {summary.step!r}"
    return f"{summary.significant_digits} significant digits"


def _parse(mantissa: int, exponent: int) -> float:
    # Decimal text → nearest double: correctly rounded in CPython and in Java's Double.parseDouble.
    return float(f"{mantissa}e{exponent}")


def _digits_bucket(a: float, digits: int) -> float:
    """Largest decimal with ``digits`` significant digits whose nearest double is ≤ a (a > 0, finite)."""
    e = math.floor(math.log10(a))
    if _parse(1, e) > a:
        e -= 1
    elif _parse(1, e + 1) <= a:
        e += 1
    k = e - digits + 1
    # An estimate within ±1 (the comparisons below make the result exact); scaled by 1e50 so that
    # neither factor leaves the normal double range for magnitudes in [1e-300, 1e150].
    m = math.floor((a * 1e50) / _parse(1, k + 50))
    if _parse(m + 1, k) <= a:
        m += 1
    elif _parse(m, k) > a:
        m -= 1
    m = min(max(m, 10 ** (digits - 1)), 10**digits - 1)
    return _parse(m, k)


def _step_bucket(x: float, mantissa: int, exponent: int) -> float:
    """Largest multiple k·step (as the nearest double of its decimal value) that is ≤ x."""
    k = math.floor(x / _parse(mantissa, exponent))
    if _parse((k + 1) * mantissa, exponent) <= x:
        k += 1
    elif _parse(k * mantissa, exponent) > x:
        k -= 1
    return _parse(k * mantissa, exponent)


def reject_reason(value: Any, summary: SummaryConfig | None = None) -> str | None:
    """Why a parsed JSON value does not count in a summary (None: it counts)."""
    if value is None:
        return MISSING
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return NOT_NUMERIC
    try:
        x = float(value)
    except OverflowError:  # an integer beyond the double range
        return OUT_OF_RANGE
    if not math.isfinite(x) or abs(x) > MAX_ABS:
        return OUT_OF_RANGE
    if summary is not None and summary.step is not None and abs(x) / summary.step >= MAX_STEPS:
        return OUT_OF_RANGE
    return None


def bucket(x: float, summary: SummaryConfig) -> float:
    """The histogram bucket of an accepted value (see the module doc)."""
    x = float(x)
    if summary.step is not None:
        return _step_bucket(x, *step_decimal(summary.step))
    a = abs(x)
    if a < TINY:
        return 0.0
    b = _digits_bucket(a, int(summary.significant_digits or 3))
    return -b if x < 0 else b


def reference_bucket(x: float, summary: SummaryConfig) -> float:
    """Textbook definition of :func:`bucket` through Python's decimal arithmetic on ``repr(x)``.

    Independent of the implementation above; the tests compare the two.
    """
    d = Decimal(repr(float(x)))
    if summary.step is not None:
        step = Decimal(repr(float(summary.step)))
        return float((d / step).to_integral_value(rounding=ROUND_FLOOR) * step)
    if abs(d) < Decimal(repr(TINY)) or d == 0:
        return 0.0
    digits = int(summary.significant_digits or 3)
    quantum = Decimal(1).scaleb(d.adjusted() - digits + 1)
    return float(d.quantize(quantum, rounding=ROUND_DOWN))


# -- mergeable state -------------------------------------------------------------------------------------


@dataclass
class SummaryState:
    """The mergeable state of one (summary, topic, window, group)."""

    count: int = 0
    sum: float = 0.0
    sum_sq: float = 0.0
    min: float | None = None
    max: float | None = None
    hist: dict[float, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> SummaryState:
        return cls(
            count=int(row.get("count") or 0),
            sum=float(row.get("sum") or 0.0),
            sum_sq=float(row.get("sum_sq") or 0.0),
            min=None if row.get("min") is None else float(row["min"]),
            max=None if row.get("max") is None else float(row["max"]),
            hist={float(k): int(v) for k, v in (row.get("hist") or {}).items()},
            rejected={str(k): int(v) for k, v in (row.get("rejected") or {}).items()},
        )

    @classmethod
    def of_values(cls, values: Iterable[Any], summary: SummaryConfig) -> SummaryState:
        """The state of raw parsed JSON values, one at a time (the reference the tests use)."""
        state = cls()
        for value in values:
            reason = reject_reason(value, summary)
            if reason is not None:
                state.rejected[reason] = state.rejected.get(reason, 0) + 1
                continue
            x = float(value)
            b = bucket(x, summary)
            state.count += 1
            state.sum += x
            state.sum_sq += x * x
            state.min = x if state.min is None else min(state.min, x)
            state.max = x if state.max is None else max(state.max, x)
            state.hist[b] = state.hist.get(b, 0) + 1
        return state

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    @property
    def empty(self) -> bool:
        return self.count == 0 and not self.rejected_total


def _add_maps(a: Mapping, b: Mapping) -> dict:
    out = dict(a)
    for key, n in b.items():
        out[key] = out.get(key, 0) + n
    return out


def _least(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _greatest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def merge(target: SummaryState, increment: SummaryState) -> SummaryState:
    """target ⊕ increment, operation for operation what the Delta MERGE computes (t.sum + s.sum, ...)."""
    return SummaryState(
        count=target.count + increment.count,
        sum=target.sum + increment.sum,
        sum_sq=target.sum_sq + increment.sum_sq,
        min=_least(target.min, increment.min),
        max=_greatest(target.max, increment.max),
        hist=_add_maps(target.hist, increment.hist),
        rejected=_add_maps(target.rejected, increment.rejected),
    )


# -- statistics ------------------------------------------------------------------------------------------


def percentile_fraction(q: float) -> tuple[int, int]:
    """q as an exact fraction (numerator, denominator) of its decimal value: 99.9 → (999, 10)."""
    f = Fraction(Decimal(repr(float(q))))
    return f.numerator, f.denominator


def percentile_name(q: float) -> str:
    """Field name of a percentile: 50 → p50, 99.9 → p99.9."""
    return f"p{float(q):g}"


def percentile_rank(q: float, n: int) -> int:
    """ceil(q/100 · n), at least 1, in integer arithmetic (no float rounding near whole ranks)."""
    num, den = percentile_fraction(q)
    return max(1, (num * n + den * 100 - 1) // (den * 100))


def percentile(hist: Mapping[float, int], q: float) -> float | None:
    """Nearest-rank percentile of a histogram: the smallest bucket whose cumulative count ≥ the rank."""
    n = sum(hist.values())
    if n <= 0:
        return None
    rank = percentile_rank(q, n)
    cumulative = 0
    for b in sorted(hist):
        cumulative += hist[b]
        if cumulative >= rank:
            return b
    return None  # unreachable: the last bucket's cumulative count is n


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def statistics(state: SummaryState, percentiles: Sequence[float]) -> dict[str, Any]:
    """Everything published for a state, in a fixed order; None where undefined (no values)."""
    n = state.count
    mean = state.sum / n if n else None
    stddev = math.sqrt(max(0.0, state.sum_sq / n - mean * mean)) if n else None
    stats: dict[str, Any] = {
        "count": n,
        "sum": _finite(state.sum) if n else None,
        "min": state.min,
        "max": state.max,
        "mean": _finite(mean),
        "stddev": _finite(stddev),
    }
    for q in percentiles:
        stats[percentile_name(q)] = percentile(state.hist, q)
    stats["rejected"] = state.rejected_total
    return stats


def sums_agree(a: float, b: float, count: int, magnitude: float) -> bool:
    """Whether two sums of the same values differ only by float rounding (the summation order differs
    between a micro-batch's increments and a recomputation): relative 1e-9 of count × max |value|."""
    return a == b or abs(a - b) <= 1e-9 * max(count, 1) * max(magnitude, 1e-300)


def same_state(a: SummaryState, b: SummaryState) -> bool:
    """Equal counts, extremes, histogram and rejections, and sums equal up to rounding."""
    if (a.count, a.min, a.max, a.hist, a.rejected) != (b.count, b.min, b.max, b.hist, b.rejected):
        return False
    magnitude = max(abs(a.min or 0.0), abs(a.max or 0.0))
    return sums_agree(a.sum, b.sum, a.count, magnitude) and sums_agree(a.sum_sq, b.sum_sq, a.count, magnitude * magnitude)


# -- outputs ---------------------------------------------------------------------------------------------


def group_values(summary: SummaryConfig, groups: Mapping[str, str | None] | None) -> dict[str, str | None]:
    """The group's values in the configured order (the order of keys and tags everywhere)."""
    groups = groups or {}
    return {path: groups.get(path) for path in summary.group_by}


def metric_key(summary: SummaryConfig, topic: str, window_ms: int, groups: Mapping[str, str | None] | None) -> str:
    """Metrics-topic key of a summary: ``{"summary":"db_wait","topic":"ops","window":1700000000000,"group":{...}}``.

    The ``summary`` field tells these keys apart from window-count keys
    (``{"topic","window","status"}``) on the same compacted topic.
    """
    return json.dumps(
        {"summary": summary.name, "topic": topic, "window": int(window_ms), "group": group_values(summary, groups)},
        separators=(",", ":"),
    )


def metric_value(stats: Mapping[str, Any]) -> str:
    return json.dumps(dict(stats), separators=(",", ":"))


def summary_point(summary: SummaryConfig, topic: str, window_ms: int, groups: Mapping[str, str | None] | None, stats: Mapping[str, Any]) -> Point:
    """InfluxDB point: measurement = summary name, tags = topic and group values, fields = the statistics.

    ``count`` and ``rejected`` are integers, the rest floats; an undefined
    statistic (no values) is left out of the point. A missing group value is
    an absent tag (InfluxDB has no null tags).
    """
    fields: dict[str, int | float] = {"count": int(stats["count"]), "rejected": int(stats["rejected"])}
    for name, value in stats.items():
        if name not in fields and value is not None:
            fields[name] = float(value)
    tags = {"topic": topic, **{k: v for k, v in group_values(summary, groups).items() if v is not None}}
    return Point(summary.name, int(window_ms), fields, tags)


# -- demo traffic ----------------------------------------------------------------------------------------

DEMO_TOPIC = "ops.metrics"  # kdq.traffic.kinds.MeasurementsKind produces it; kdq.toml's ops_metrics summarises it
