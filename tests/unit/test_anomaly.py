"""The anomaly expectation's statistics (kdq.anomaly) on a generated history with planted anomalies.

Four weeks of per-minute counts for three topics of very different volume (600, 20 and 0.4 records a minute),
with a daily cycle, quieter weekends, overdispersed arrivals and a noisy invalid share; the last two weeks are
tested against baselines of the two weeks before each minute. Planted in those two weeks: a spike and a drop of
the busy topic, an invalid-ratio jump and a silence of the medium one, a burst of the quiet one. Each must be
found as its kind, and the false anomalies (overlapping nothing planted) must stay within one per topic per
week (the budget is half that).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kdq.anomaly import MINUTES_PER_WEEK, AnomalySettings, alpha_for_budget, betabinom_upper, detect, nb_tails

WEEKS = 4
MINUTES = WEEKS * MINUTES_PER_WEEK
START = 2 * MINUTES_PER_WEEK  # the tested minutes: the last two weeks


def _history(rng: np.random.Generator, mean: float, invalid_share: float) -> tuple[np.ndarray, np.ndarray]:
    minute = np.arange(MINUTES)
    day = (minute % 1440) / 1440
    weekday = (minute // 1440) % 7
    level = mean * (0.35 + 0.65 * np.sin(np.pi * day) ** 2) * np.where(weekday >= 5, 0.6, 1.0)
    # Negative binomial arrivals: Poisson with a gamma-distributed rate (shape 50: a little burstier than Poisson).
    rate = rng.gamma(50.0, level / 50.0)
    records = rng.poisson(rate)
    share = rng.beta(invalid_share * 400, (1 - invalid_share) * 400, MINUTES)
    invalid = rng.binomial(records, share)
    return records, invalid


# (topic, kind, first minute, minutes, how)
PLANTED = [
    ("busy", "spike", START + 3 * 1440 + 600, 20, lambda r, i, s: (r[s] * 3, i[s] * 3)),
    ("busy", "drop", START + 9 * 1440 + 800, 30, lambda r, i, s: (r[s] // 10, i[s] // 10)),
    ("medium", "invalid_ratio", START + 5 * 1440 + 700, 15, lambda r, i, s: (r[s], (r[s] * 0.3).astype(int))),
    ("medium", "drop", START + 11 * 1440 + 720, 20, lambda r, i, s: (r[s] * 0, i[s] * 0)),
    ("quiet", "spike", START + 7 * 1440 + 660, 10, lambda r, i, s: (r[s] + 15, i[s])),
]
TOPICS = {"busy": (600.0, 0.02), "medium": (20.0, 0.01), "quiet": (0.4, 0.01)}


@pytest.fixture(scope="module")
def found() -> dict[str, list]:
    rng = np.random.default_rng(20261127)
    result = {}
    for topic, (mean, share) in TOPICS.items():
        records, invalid = _history(rng, mean, share)
        for name, _, first, length, how in PLANTED:
            if name == topic:
                s = slice(first, first + length)
                records[s], invalid[s] = how(records, invalid, s)
        result[topic] = detect(records, invalid, START)
    return result


def test_every_planted_anomaly_is_found_as_its_kind(found) -> None:
    for topic, kind, first, length, _ in PLANTED:
        hits = [a for a in found[topic] if a.kind == kind and a.first_minute < first + length and a.last_minute >= first]
        assert hits, f"{topic} {kind} at minute {first} not found: {found[topic]}"
        assert hits[0].first_minute - first <= AnomalySettings().persist_n, "opened within m-of-n minutes"


def test_false_anomalies_stay_within_the_budget(found) -> None:
    for topic, anomalies in found.items():
        planted = [(first, first + length) for name, _, first, length, _ in PLANTED if name == topic]
        false = [a for a in anomalies if not any(a.first_minute < e and a.last_minute >= s for s, e in planted)]
        assert len(false) <= 2, f"{topic}: {len(false)} false anomalies in two weeks: {false}"


def test_a_minute_with_three_records_does_not_make_a_ratio_or_a_drop() -> None:
    """The quiet topic: 1 invalid of 3 records is below the ratio test's minimum, and 0 records is likely."""
    upper, lower = nb_tails(0, 0.4, 0.4)
    assert lower == pytest.approx(math.exp(-0.4)) and upper == 1.0
    assert lower > alpha_for_budget(AnomalySettings())
    assert betabinom_upper(1, 3, 1.0, 99.0) > 0.02


def test_tails_match_their_definitions() -> None:
    assert nb_tails(8, 3.0, 3.0)[0] == pytest.approx(1 - sum(math.exp(-3) * 3**j / math.factorial(j) for j in range(8)))
    r, q = 5.0, 10.0 / 15.0  # mean 10, variance 30
    pmf = [math.exp(math.lgamma(j + r) - math.lgamma(r) - math.lgamma(j + 1) + r * math.log1p(-q) + j * math.log(q))
           for j in range(400)]
    assert nb_tails(30, 10.0, 30.0)[0] == pytest.approx(sum(pmf[30:]), rel=1e-9)
    assert nb_tails(1, 10.0, 30.0)[1] == pytest.approx(pmf[0] + pmf[1], rel=1e-9)
    a, b, n = 1.0, 99.0, 50

    def bb(j: int) -> float:
        return math.exp(math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) + math.lgamma(j + a)
                        + math.lgamma(n - j + b) - math.lgamma(n + a + b) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b))

    assert betabinom_upper(10, n, a, b) == pytest.approx(sum(bb(j) for j in range(10, n + 1)), rel=1e-9)


def test_the_level_follows_the_budget() -> None:
    settings = AnomalySettings()
    alpha = alpha_for_budget(settings)
    chance_per_week = math.comb(5, 3) * alpha**3 * MINUTES_PER_WEEK * settings.tests_per_minute
    assert chance_per_week == pytest.approx(settings.false_per_week)
