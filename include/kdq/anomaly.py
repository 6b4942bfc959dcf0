"""Volume and invalid-ratio anomalies of a topic against its own usual level (the anomaly expectation).

Pure numpy (no Spark): the caller reads a topic's per-minute counts from ``window_counts`` (records and invalid
records per minute of event time, oldest first, one array element per minute) and asks, for the minutes to
test, whether each is far outside what that topic usually does at that time of the week.

What the field does and where it hurts (Elementary: ``(value - mean) / stddev`` per weekday bucket, the tested
point inside its own baseline, noisy on low-volume tables; Monte Carlo: 6 weeks of training; Datadog: 3 weeks
for weekly seasonality), and the choices made here instead:

* **Same-slot baseline, neighbours pooled.** The baseline of minute ``t`` is the same minute of the week in
  each of the last ``weeks`` weeks, each with its ``pool_minutes`` neighbours on either side (default 2 weeks x
  31 minutes = 62 samples), so two weeks of history already give a weekly-seasonal baseline, and the tested
  minute is never part of its own baseline.
* **Robust, and clean.** Median and MAD, not mean and standard deviation; minutes that were anomalous or inside
  an incident (``excluded``) are left out of every later baseline, so an outage does not teach the baseline that
  silence is normal.
* **Counts by their own distribution.** A minute's record count is tested with a negative binomial of mean =
  the baseline median and variance = max(median, (1.4826 MAD)^2): a Poisson where the topic is as regular as
  random arrivals, wider where it is burstier. Both tails (a spike, a drop). A quiet topic with 0.3 records a
  minute is judged by the probability of its count, not by a z-score of 0.3 +- 0.5.
* **The invalid ratio as k of n.** A minute's invalid records are tested as k of its n records against a
  beta-binomial fitted to the baseline's invalid share and its spread (method of moments), upper tail only: a
  minute with 3 records, 1 of them invalid, is not "33 % invalid" news.
* **Practical significance too.** A busy topic's count is statistically significant at +40 %, which is
  nobody's incident: a spike must also be ``min_ratio`` times the usual level, a drop at most its
  ``1/min_ratio``, an invalid share ``min_ratio`` times the usual one and ``min_share_rise`` above it.
* **Persistence, and a false-alarm budget.** An anomaly opens when ``m`` of the last ``n`` minutes are
  significant (default 3 of 5) and closes after ``clear_minutes`` quiet minutes. The per-test level comes from a
  budget of false incidents per topic per week (:func:`alpha_for_budget`): with ``k`` tests per minute, by
  chance ``C(n, m) alpha^m`` per minute and test, times 10,080 minutes a week, must stay within the budget.

Approximations: the tails are summed exactly up to :data:`EXACT_LIMIT`; beyond it a normal approximation with a
continuity correction is used (counts that high are far in the normal regime of both distributions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MINUTES_PER_WEEK = 7 * 24 * 60
MAD_SCALE = 1.4826  # MAD of a normal distribution = 0.6745 sigma
EXACT_LIMIT = 1000  # above this mean (or n), tails by a normal approximation


@dataclass(frozen=True)
class AnomalySettings:
    weeks: int = 2  # weeks of history each baseline looks back
    pool_minutes: int = 15  # neighbouring minutes pooled on either side of the slot
    min_samples: int = 20  # fewer clean samples: no verdict (not enough history)
    persist_m: int = 3  # an anomaly opens when m of the last n minutes are significant
    persist_n: int = 5
    clear_minutes: int = 10  # and closes after this many quiet minutes
    false_per_week: float = 0.5  # budget of false incidents per topic per week, over all its tests
    tests_per_minute: int = 3  # spike, drop, invalid ratio
    min_records_for_ratio: int = 10  # the ratio test needs this many records in the minute
    # Practical significance beside the statistical one: a busy topic's count is "significant" at +40 %, which
    # is nobody's incident. A spike is at least min_ratio x the usual level (and min_extra records more), a
    # drop at most 1/min_ratio of it, an invalid share at least min_ratio x the usual share and min_share_rise
    # above it.
    min_ratio: float = 1.5
    min_extra: int = 5
    min_share_rise: float = 0.02


def alpha_for_budget(settings: AnomalySettings) -> float:
    """The per-test significance level that keeps chance openings within the weekly budget (independent tests:
    P(m of n significant) ~ C(n, m) alpha^m per minute and test)."""
    ways = math.comb(settings.persist_n, settings.persist_m)
    per_minute = settings.false_per_week / (MINUTES_PER_WEEK * settings.tests_per_minute * ways)
    return per_minute ** (1.0 / settings.persist_m)


# -- tails ---------------------------------------------------------------------------------------------------


def _normal_upper(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _nb_params(mean: float, variance: float) -> tuple[float | None, float]:
    """(r, q) of a negative binomial with ``mean`` and ``variance``; r None for a Poisson (variance <= mean)."""
    if variance <= mean * (1 + 1e-9):
        return None, 0.0
    r = mean * mean / (variance - mean)
    return r, mean / (r + mean)


def _log_pmf(j: int, mean: float, r: float | None, q: float) -> float:
    if r is None:
        return -mean + j * math.log(mean) - math.lgamma(j + 1)
    return math.lgamma(j + r) - math.lgamma(r) - math.lgamma(j + 1) + r * math.log1p(-q) + j * math.log(q)


def _ratio(j: int, mean: float, r: float | None, q: float) -> float:
    """P(j + 1) / P(j)."""
    return mean / (j + 1) if r is None else (j + r) / (j + 1) * q


def nb_tails(k: int, mean: float, variance: float) -> tuple[float, float]:
    """(P(X >= k), P(X <= k)) for X negative binomial with ``mean`` and ``variance`` (Poisson when variance <=
    mean). Only small tails matter to the tests: a tail on the side of the mean is returned as 1.0."""
    mean = max(mean, 1e-9)
    variance = max(variance, mean)
    if mean > EXACT_LIMIT:
        sd = math.sqrt(variance)
        return _normal_upper((k - 0.5 - mean) / sd), _normal_upper((mean - k - 0.5) / sd)
    r, q = _nb_params(mean, variance)
    upper = lower = 1.0
    if k > mean:  # sum P(k), P(k+1), ... until the terms vanish (they fall geometrically past the mode)
        term = math.exp(_log_pmf(k, mean, r, q))
        upper, j = 0.0, k
        while term > 1e-17 * max(upper, 1e-300) and j < k + 100 * EXACT_LIMIT:
            upper += term
            term *= _ratio(j, mean, r, q)
            j += 1
    elif k < mean:  # sum P(k), P(k-1), ..., P(0)
        lower, term = 0.0, math.exp(_log_pmf(k, mean, r, q))
        for j in range(k, -1, -1):
            lower += term
            if j:
                term /= _ratio(j - 1, mean, r, q)
    return min(1.0, upper), min(1.0, lower)


def betabinom_upper(k: int, n: int, a: float, b: float) -> float:
    """P(K >= k) for K beta-binomial(n, a, b); 1.0 when k is at or below the mean (only a small tail matters)."""
    if k <= 0 or k <= n * a / (a + b):
        return 1.0
    if k > n:
        return 0.0
    if n > EXACT_LIMIT:
        mean = n * a / (a + b)
        variance = n * a * b * (a + b + n) / ((a + b) ** 2 * (a + b + 1))
        return _normal_upper((k - 0.5 - mean) / math.sqrt(max(variance, 1e-12)))
    const = math.lgamma(n + 1) - math.lgamma(n + a + b) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    term = math.exp(const - math.lgamma(k + 1) - math.lgamma(n - k + 1) + math.lgamma(k + a) + math.lgamma(n - k + b))
    total = 0.0
    for j in range(k, n + 1):  # past the mean the terms fall: stop once they no longer matter
        total += term
        if term < 1e-17 * total or j == n:
            break
        term *= (n - j) / (j + 1) * (j + a) / (n - j - 1 + b)
    return min(1.0, total)


# -- baselines -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Baseline:
    median: float
    variance: float  # of the count, for the negative binomial
    share: float  # invalid share of the pooled records
    a: float  # beta prior of the invalid share (method of moments over the samples)
    b: float
    samples: int


def slot_indices(t: int, settings: AnomalySettings) -> np.ndarray:
    """Indices of minute ``t``'s baseline samples: the same minute 1..weeks weeks back, +- pool_minutes."""
    offsets = np.arange(-settings.pool_minutes, settings.pool_minutes + 1)
    weeks = np.arange(1, settings.weeks + 1) * MINUTES_PER_WEEK
    return (t - weeks[:, None] + offsets[None, :]).ravel()


def baseline(records: np.ndarray, invalid: np.ndarray, excluded: np.ndarray, t: int, settings: AnomalySettings) -> Baseline | None:
    """Minute ``t``'s baseline from the clean samples of its slot; None without enough history."""
    idx = slot_indices(t, settings)
    idx = idx[(idx >= 0) & (idx < len(records))]
    idx = idx[~excluded[idx]]
    if len(idx) < settings.min_samples:
        return None
    counts = records[idx].astype(float)
    median = float(np.median(counts))
    mad = float(np.median(np.abs(counts - median))) * MAD_SCALE
    total = float(counts.sum())
    bad = float(invalid[idx].sum())
    share = (bad + 0.5) / (total + 1.0)  # a little prior: a topic never invalid so far is not at exactly 0
    # Spread of the per-minute share beyond binomial noise: method of moments on minutes with records.
    with_records = counts > 0
    rho = 0.0
    if with_records.sum() >= 5:
        n = counts[with_records]
        shares = invalid[idx][with_records] / n
        observed = float(np.var(shares))
        binomial = float(np.mean(share * (1 - share) / n))
        mean_n = float(np.mean(n))
        if observed > binomial and mean_n > 1:
            rho = min(0.5, (observed - binomial) / (share * (1 - share) * (1 - 1 / mean_n)))
    rho = max(rho, 1e-4)
    concentration = (1 - rho) / rho  # a + b
    return Baseline(median, max(median, mad * mad), share, share * concentration, (1 - share) * concentration, len(idx))


# -- detection -----------------------------------------------------------------------------------------------


@dataclass
class Anomaly:
    kind: str  # spike | drop | invalid_ratio
    first_minute: int
    last_minute: int
    worst_p: float


def significant_kinds(n: int, k: int, base: Baseline, alpha: float, settings: AnomalySettings) -> dict[str, float]:
    """The tests minute (n records, k invalid) fails at level ``alpha``, with their p-values."""
    found: dict[str, float] = {}
    upper, lower = nb_tails(n, base.median, base.variance)
    if upper < alpha and n >= max(base.median * settings.min_ratio, base.median + settings.min_extra):
        found["spike"] = upper
    if lower < alpha and n * settings.min_ratio <= base.median:
        found["drop"] = lower
    share = k / n if n else 0.0
    if (
        n >= settings.min_records_for_ratio
        and share >= max(base.share * settings.min_ratio, base.share + settings.min_share_rise)
    ):
        p = betabinom_upper(k, n, base.a, base.b)
        if p < alpha:
            found["invalid_ratio"] = p
    return found


def detect(
    records: np.ndarray, invalid: np.ndarray, start: int, settings: AnomalySettings = AnomalySettings(),
    excluded: np.ndarray | None = None,
) -> list[Anomaly]:
    """Anomalies of the minutes ``start..len(records)-1``, each kind with m-of-n persistence. Minutes inside an
    anomaly are added to ``excluded`` (a copy) so that later baselines do not learn from them."""
    records = np.asarray(records)
    invalid = np.asarray(invalid)
    excluded = np.zeros(len(records), dtype=bool) if excluded is None else np.array(excluded, dtype=bool)
    alpha = alpha_for_budget(settings)
    recent: dict[str, list[int]] = {"spike": [], "drop": [], "invalid_ratio": []}
    open_: dict[str, Anomaly] = {}
    quiet: dict[str, int] = {}
    done: list[Anomaly] = []
    for t in range(start, len(records)):
        base = baseline(records, invalid, excluded, t, settings)
        hits = {} if base is None else significant_kinds(int(records[t]), int(invalid[t]), base, alpha, settings)
        for kind, window in recent.items():
            window.append(1 if kind in hits else 0)
            del window[: -settings.persist_n]
            anomaly = open_.get(kind)
            if anomaly is None and sum(window) >= settings.persist_m:
                first = t - len(window) + 1 + window.index(1)
                open_[kind] = anomaly = Anomaly(kind, first, t, hits.get(kind, 1.0))
                excluded[first : t + 1] = True
            elif anomaly is not None:
                if kind in hits:
                    anomaly.last_minute, quiet[kind] = t, 0
                    anomaly.worst_p = min(anomaly.worst_p, hits[kind])
                else:
                    quiet[kind] = quiet.get(kind, 0) + 1
                    if quiet[kind] >= settings.clear_minutes:
                        done.append(open_.pop(kind))
                        quiet[kind] = 0
            if kind in open_:
                excluded[t] = True
    return sorted(done + list(open_.values()), key=lambda a: (a.first_minute, a.kind))
