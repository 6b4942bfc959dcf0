"""The page's numbers kept ready (kdq.quality_cache): asked again exactly when the tables' fingerprint moves,
never hidden behind an answer that may predate a change, failures retried, no asking while nobody looks;
and the page's rendering of each state (fresh, stale, none)."""

from __future__ import annotations

import threading
import time

from kdq.quality_cache import NumbersCache
from kdq.quality_health import StreamHealth, TopicHealth
from kdq.quality_html import render_page
from kdq.quality_page import MINUTE_MS, PageRange, build_model

NOW = 1_700_003_723_456


class Tables:
    """A fake of what the page reads: a fingerprint that moves on every commit, and a query of the counts."""

    def __init__(self) -> None:
        self.commits = 0
        self.valid = 0
        self.asked: list[int] = []
        self.names: list[frozenset[str] | None] = []
        self.fail: Exception | None = None
        self.during_fetch = None  # called inside the fetch (a commit racing the statements)
        self.now = NOW

    def clock(self) -> int:
        return self.now

    def generation(self) -> int:
        return self.commits

    def fetch(self, page: PageRange, names: frozenset[str] | None = None):
        self.asked.append(page.now_ms)
        self.names.append(names)
        if self.during_fetch is not None:
            self.during_fetch()
        if self.fail is not None:
            raise self.fail
        rows = {"counts": [{"scale": "hour", "topic": "t", "bucket_ms": page.now_ms // MINUTE_MS * MINUTE_MS,
                            "valid": self.valid, "invalid": 0}],
                "reasons": [{"topic": "t", "reason": "not_json", "count": self.commits}]}
        return {k: v for k, v in rows.items() if names is None or k in names}, None, "sc://endpoint", 0.1

    def commit(self, valid: int) -> None:
        self.valid = valid
        self.commits += 1


def cache_of(tables: Tables, **kwargs) -> NumbersCache:
    return NumbersCache(tables.fetch, tables.generation, clock_ms=tables.clock, **kwargs)


def test_an_answer_is_asked_for_once_per_change_at_most_every_min_interval() -> None:
    tables = Tables()
    cache = cache_of(tables, min_interval_seconds=3, fresh_seconds=10)
    first = cache.renew_once()
    assert first is not None and first.rows["counts"][0]["valid"] == 0 and tables.asked == [NOW]
    assert cache.renew_once() is None, "nothing changed: no second question"
    tables.commit(7)
    tables.now += 1000
    assert cache.renew_once() is None, "a change within min_interval of the last answer waits"
    assert cache._fresh(first, tables.generation(), tables.now), "it holds every commit up to 1 s ago"
    tables.now += 2000
    second = cache.renew_once()
    assert second is not None and second.rows["counts"][0]["valid"] == 7 and second.page.now_ms == NOW + 3000
    # The minute moves the page's ranges: asked again without any commit; the last answer stays fresh meanwhile
    # (every count in it is current; its ranges are as of its own instant).
    tables.now = (NOW // MINUTE_MS + 1) * MINUTE_MS
    assert cache._fresh(second, tables.generation(), tables.now)
    assert cache._due(second, tables.generation(), tables.now)
    assert cache.renew_once() is not None and len(tables.asked) == 3


def test_a_commit_during_the_question_leaves_the_answer_due() -> None:
    tables = Tables()
    cache = cache_of(tables, min_interval_seconds=3, fresh_seconds=10)
    tables.during_fetch = lambda: tables.commit(5)  # the stream commits while the statements run
    answer = cache.renew_once()
    assert answer is not None and answer.generation == 0 and answer.asked_ms == NOW
    tables.during_fetch = None
    tables.now += 3000
    assert cache.renew_once() is not None, "the answer may predate the commit: asked again"
    tables.now += 3000
    assert cache.renew_once() is None


def test_an_answer_stays_fresh_until_the_first_commit_it_misses_is_fresh_seconds_old() -> None:
    """A quiet spell longer than fresh_seconds, then a commit: the answer from before the spell misses only that
    commit, so it is fresh until the commit is 10 s old (the thread saw the fingerprint unchanged up to it); a
    commit while the statements ran is dated from the question's start, the earliest it can be."""
    tables = Tables()
    cache = cache_of(tables, min_interval_seconds=3, fresh_seconds=10)
    answer = cache.renew_once()
    for _ in range(12):  # 12 quiet seconds, looked at every second (as the thread does while a page is open)
        tables.now += 1000
        assert cache.renew_once() is None
    tables.commit(3)
    tables.now += 500
    assert cache._fresh(answer, tables.generation(), tables.now), "it misses a commit 0.5 s old only"
    tables.now += 9000
    assert cache._fresh(answer, tables.generation(), tables.now), "the commit it misses is 9.5 s old"
    tables.now += 1000
    assert not cache._fresh(answer, tables.generation(), tables.now), "the commit it misses is over 10 s old"
    # Renewed: the commit is in the new answer, fresh again at once.
    renewed = cache.renew_once()
    assert renewed is not None and renewed.rows["counts"][0]["valid"] == 3
    assert cache._fresh(renewed, tables.generation(), tables.now)

    # A commit during the statements is never seen "unchanged" after the question: dated from its start.
    tables.during_fetch = lambda: tables.commit(4)
    tables.now += 60_000
    racing = cache.renew_once()
    tables.during_fetch = None
    assert racing is not None and racing.generation != tables.generation()
    tables.now += 9_000
    assert cache._fresh(racing, tables.generation(), tables.now)
    tables.now += 1_000
    assert not cache._fresh(racing, tables.generation(), tables.now), "10 s after its question began: stale"
    # An answer other than the latest is judged from its own question only.
    tables.now = renewed.asked_ms + 10_000
    assert not cache._fresh(renewed, tables.generation(), tables.now)


def test_a_busy_stream_keeps_the_numbers_fresh_with_bounded_questions() -> None:
    """Commits every second and questions of 2 s: "no change since" never holds, yet every page finds numbers
    holding every commit up to 10 s ago, and the endpoint gets a question at most every 3 s + its length."""
    tables = Tables()
    cache = cache_of(tables, min_interval_seconds=3, fresh_seconds=10)

    def slow_question() -> None:
        tables.now += 2000
        tables.commit(tables.valid + 1)

    tables.during_fetch = slow_question
    fresh_seen, questions = [], 0
    for _ in range(120):  # two minutes, a look every second
        tables.now += 1000
        tables.commit(tables.valid + 1)
        if cache.renew_once() is not None:
            questions += 1
        latest = cache._latest
        fresh_seen.append(latest is not None and cache._fresh(latest, tables.generation(), tables.now))
    assert all(fresh_seen[1:]), fresh_seen
    elapsed_s = (tables.now - NOW) / 1000
    assert questions <= elapsed_s / 5 + 1, (questions, elapsed_s)  # one per (3 s apart + 2 s long) at most


def test_failures_are_answers_retried_after_a_pause_and_on_any_change() -> None:
    tables = Tables()
    cache = cache_of(tables, retry_seconds=5)
    tables.fail = ConnectionError("endpoint down")
    failed = cache.renew_once()
    assert failed is not None and failed.failed and "endpoint down" in failed.error
    tables.now += 4_000
    assert cache.renew_once() is None, "retried only after retry_seconds"
    tables.now += 1_000
    tables.fail = None
    recovered = cache.renew_once()
    assert recovered is not None and not recovered.failed


def test_an_answer_is_renewed_after_max_age_even_without_a_visible_change() -> None:
    tables = Tables()
    cache = cache_of(tables, max_age_seconds=30)
    tables.now = NOW // MINUTE_MS * MINUTE_MS  # the start of a minute: the minute does not move below
    first = cache.renew_once()
    tables.now += 14_000
    assert cache.renew_once() is None
    tables.now += 1_000  # half its life: renewed ahead, still fresh meanwhile
    assert cache._fresh(first, tables.generation(), tables.now)
    second = cache.renew_once()
    assert second is not None
    tables.now += 30_000  # a whole life without renewal (nobody looked): no longer fresh
    assert not cache._fresh(second, tables.generation(), tables.now)


def test_get_answers_at_once_and_the_thread_renews_in_the_background() -> None:
    tables = Tables()
    tables.now = int(time.time() * 1000)
    tables.clock = lambda: int(time.time() * 1000)  # the thread runs in real time
    slow = threading.Event()

    def fetch(page: PageRange, names: frozenset[str] | None):
        slow.wait(5)  # a slow endpoint: get() must not wait for it
        return Tables.fetch(tables, page, names)

    cache = NumbersCache(
        fetch, tables.generation, clock_ms=tables.clock, poll_seconds=0.02, fresh_seconds=0, min_interval_seconds=0
    )
    try:
        started = time.monotonic()
        latest, fresh = cache.get()
        assert (latest, fresh) == (None, False) and time.monotonic() - started < 1
        slow.set()
        latest, fresh = cache.wait_fresh(10)
        assert fresh and latest is not None and latest.rows["counts"][0]["valid"] == 0
        slow.clear()  # the next question hangs until set
        tables.commit(3)
        latest, fresh = cache.get()
        assert not fresh and latest.rows["counts"][0]["valid"] == 0, "the old answer at once, marked stale"
        slow.set()
        latest, fresh = cache.wait_fresh(10)
        assert fresh and latest.rows["counts"][0]["valid"] == 3
    finally:
        cache.stop()


def test_nobody_looking_means_no_questions() -> None:
    tables = Tables()
    tables.clock = lambda: int(time.time() * 1000)
    cache = NumbersCache(
        tables.fetch, tables.generation, clock_ms=tables.clock, poll_seconds=0.02, idle_seconds=0.2,
        fresh_seconds=0, min_interval_seconds=0,
    )
    try:
        cache.wait_fresh(10)
        asked = len(tables.asked)
        assert asked == 1
        time.sleep(0.4)  # idle now
        tables.commit(1)
        time.sleep(0.4)
        assert len(tables.asked) == asked, "a commit while nobody looks is not asked about"
        latest, fresh = cache.wait_fresh(10)  # someone looks again
        assert fresh and latest.rows["counts"][0]["valid"] == 1
    finally:
        cache.stop()


def test_warm_asks_at_once_and_renews_for_idle_seconds_as_a_look_would() -> None:
    tables = Tables()
    tables.clock = lambda: int(time.time() * 1000)
    cache = NumbersCache(
        tables.fetch, tables.generation, clock_ms=tables.clock, poll_seconds=0.02, idle_seconds=1.0,
        fresh_seconds=0, min_interval_seconds=0,
    )

    def asked(n: int) -> bool:
        deadline = time.monotonic() + 10
        while len(tables.asked) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        return len(tables.asked) >= n

    try:
        warmed = time.monotonic()
        cache.warm()
        assert asked(1), "the warm-up asked at once"
        tables.commit(2)
        assert asked(2), "a commit within idle_seconds of the warm-up is asked for, as after a look"
        time.sleep(max(0.0, 1.2 - (time.monotonic() - warmed)))
        before = len(tables.asked)
        tables.commit(3)
        time.sleep(0.3)
        assert len(tables.asked) == before, "nobody looked since: no more questions"
        latest, fresh = cache.get()
        assert latest is not None and not fresh and latest.rows["counts"][0]["valid"] == 2
    finally:
        cache.stop()


def test_the_page_says_how_current_its_numbers_are() -> None:
    page = PageRange(NOW)
    stream = StreamHealth("running", topics={"orders": TopicHealth(consumer_lag=0)})
    rows = {"counts": [{"scale": "hour", "topic": "orders", "bucket_ms": NOW // MINUTE_MS * MINUTE_MS,
                        "valid": 4, "invalid": 1}]}

    none = render_page(build_model(page, None, stream, numbers="none"))
    assert '<body data-numbers="none" data-lagging="">' in none and 'data-field="sql-pending"' in none
    assert 'data-field="hour-valid">—<' in none, "unknown, not 0"
    assert 'data-topic="orders"' in none, "the topic list comes from the stream's health at once"

    stale = render_page(build_model(page, rows, stream, numbers="stale", numbers_ms=NOW, now_ms=NOW + 4_000))
    assert '<body data-numbers="stale" data-lagging="">' in stale and 'data-field="hour-valid">4<' in stale
    assert "Numbers updating: read 4 s ago." in stale

    fresh = render_page(build_model(page, rows, stream, numbers="fresh", numbers_ms=NOW, now_ms=NOW))
    assert '<body data-numbers="fresh" data-lagging="">' in fresh and "Numbers current" in fresh
    assert f'data-field="page-ms" data-now-ms="{NOW}"' in fresh


def test_a_slow_statement_is_asked_only_once_its_rows_are_old_enough() -> None:
    """The counts are asked in every round; the reasons (slow: 30 s) keep their rows from the answer before
    until those are 30 s old, then are asked again; a failure forgets nothing and the next answer asks all."""
    tables = Tables()
    cache = cache_of(tables, min_interval_seconds=3, slow_statements={"reasons": 30})
    first = cache.renew_once()
    assert tables.names == [None] and first.rows["reasons"][0]["count"] == 0
    tables.commit(5)
    tables.now += 4000
    second = cache.renew_once()
    assert tables.names[-1] == frozenset({"counts"})
    assert second.rows["counts"][0]["valid"] == 5 and second.rows["reasons"] == first.rows["reasons"]  # kept
    assert second.statements_asked_ms == {"counts": NOW + 4000, "reasons": NOW}
    tables.commit(6)
    tables.now = NOW + 30_000
    third = cache.renew_once()
    # Both due: the counts asked and published first, then the reasons, as one question (same instant).
    assert tables.names[-2:] == [frozenset({"counts"}), frozenset({"reasons"})]
    assert third.rows["reasons"][0]["count"] == 2 and third.rows["counts"][0]["valid"] == 6
    assert third.statements_asked_ms == {"counts": NOW + 30_000, "reasons": NOW + 30_000}
    tables.fail = RuntimeError("endpoint down")
    tables.commit(7)
    tables.now += 4000
    assert cache.renew_once().failed
    tables.fail = None
    tables.now += 3000
    assert cache.renew_once().rows["reasons"][0]["count"] == 3 and tables.names[-1] is None


def test_the_counts_are_published_before_a_slow_statement_is_asked() -> None:
    """A round with the reasons due: while the reasons' statement runs, a page already gets the new counts
    (fresh), and the reasons arrive after as part of the same question; a failure of the slow part is the
    round's answer, as a failed round always was."""
    tables = Tables()
    cache = cache_of(tables, min_interval_seconds=3, slow_statements={"reasons": 30})
    cache.renew_once()
    tables.commit(5)
    tables.now = NOW + 30_000
    seen: list = []

    def during() -> None:
        if tables.names[-1] == frozenset({"reasons"}):
            latest = cache._latest
            seen.append((latest.rows["counts"][0]["valid"], cache._fresh(latest, tables.generation(), tables.now)))

    tables.during_fetch = during
    answer = cache.renew_once()
    assert seen == [(5, True)], "the counts were published (and fresh) before the reasons were asked"
    assert answer.rows["reasons"][0]["count"] == 1 and answer.asked_ms == NOW + 30_000
    assert answer.statements_asked_ms == {"counts": NOW + 30_000, "reasons": NOW + 30_000} and answer.lagging == ()
    assert answer.seconds == 0.2, "the round's time is both parts' (0.1 s each in this fake)"

    def fail_reasons() -> None:
        tables.fail = RuntimeError("archive scan failed") if tables.names[-1] == frozenset({"reasons"}) else None

    tables.during_fetch = fail_reasons
    tables.commit(6)
    tables.now = NOW + 60_000
    assert cache.renew_once().failed


def test_kept_rows_older_than_the_counts_are_named_and_caught_up_when_the_tables_go_quiet() -> None:
    """Reasons kept from before a commit may miss what the counts beside them hold: the answer names them
    (the page shows their own instant), and once their keep time is over they are asked again although the
    tables did not change since (a page left open agrees with itself; CI caught a page whose reasons said 6
    where the counts and Delta said 7)."""
    tables = Tables()
    cache = cache_of(tables, min_interval_seconds=3, slow_statements={"reasons": 30})
    first = cache.renew_once()
    assert first.lagging == ()
    tables.commit(5)  # the last commit: the tables stay quiet from here
    tables.now += 4000
    second = cache.renew_once()
    assert second.lagging == ("reasons",) and second.rows["reasons"][0]["count"] == 0
    tables.now = NOW + 29_000
    assert cache.renew_once() is None  # quiet, the reasons not 30 s old yet: nothing to ask
    tables.now = NOW + 30_000
    third = cache.renew_once()
    assert third is not None and tables.names[-2:] == [frozenset({"counts"}), frozenset({"reasons"})]  # due although nothing changed
    assert third.lagging == () and third.rows["reasons"][0]["count"] == 1
    tables.now += 5000
    assert cache.renew_once() is None  # caught up: quiet again


def test_the_page_shows_the_instant_of_a_lagging_section() -> None:
    page = PageRange(NOW)
    rows = {"counts": [], "reasons": [{"topic": "t", "reason": "not_json", "count": 3, "sample": "x"}]}
    stream = StreamHealth("running", topics={"t": TopicHealth(consumer_lag=0)})
    html = render_page(build_model(page, rows, stream, numbers="fresh", numbers_ms=NOW, now_ms=NOW,
                                   lagging={"reasons": NOW - 20_000}))
    assert '<body data-numbers="fresh" data-lagging="reasons">' in html
    assert f'data-field="reasons-as-of" data-asked-ms="{NOW - 20_000}"' in html
    assert 'data-field="corrections-as-of"' not in html
