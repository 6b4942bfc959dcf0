"""The data-quality page's numbers, kept ready: queried in the background when the tables change.

A page load must not wait for the SQL endpoint: under ``make run`` the endpoint shares two cores with the
stream and the daily jobs, and one round of the page's statements takes from under a second to several.
So the API server keeps the last answer (:class:`PageNumbers`) and one background thread asks again when it
is out of date. Out of date means its *generation* changed: a cheap fingerprint of everything that changes
what the statements return, read from files without Spark (see ``quality_app._generation``: each local
table's ``_delta_log`` folder, which every commit touches, or on object storage the stream's progress log
and the writers journal; the endpoint's address and whether its process lives), or the minute moved (the
page's ranges slide; handled here, not in the fingerprint).
Numbers are *fresh* when they hold every commit made up to ``fresh_seconds`` ago: either nothing changed
since their question began (same generation), or no change came before the last time the fingerprint was seen
unchanged and that was at most ``fresh_seconds`` ago (fingerprints only move forward, so "seen unchanged at
u" means "no commit between the question and u"; the thread looks every ``poll_seconds`` while a page is
open, and at least the question's own start counts). That is what a busy stream needs: it commits every few
seconds, often while a question runs, so "no change since" would almost never hold while a page is open,
and a question per commit would keep the endpoint busy; so after a change the thread asks again at most
every ``min_interval_seconds``, and the answer before stays fresh until the first commit it misses is
``fresh_seconds`` old (benchmarks.local_run: counting only from the question's start made a page wait for
the next round once in every few stream batches). The thread
also renews an answer when the minute moves (the page's ranges slide; an answer of the previous minute stays
fresh meanwhile: its counts are current, its ranges are as of its own instant, which the page shows) and
ahead of ``max_age_seconds``. A page shows the answer at once, fresh or not, says how old it is, and its
script asks again within half a second until it is fresh.

Not every statement is asked every time: the counts are the page's numbers and are asked in every round, while
a *slow statement* (``slow_statements``: the day's top reasons with their samples, which reads the raw archive,
and the recent corrections) is asked again only once its own answer is ``slow_statements[name]`` seconds old; a
round keeps the rows of the others from the answer before. Asking all three in every round after each of the
stream's commits kept the endpoint a third busy with the page alone, and a BI tool's query beside it waited
(benchmarks.local_run). Kept rows may predate the counts beside them: :meth:`PageNumbers.lagging` names those
statements (the page says so and shows their own "as of"), and a lagging statement is due once its keep time is
over even when the tables stay quiet, so a page left open agrees with itself within that time.

The thread asks only while someone looks: it sleeps once no page was requested for ``idle_seconds``, so an
API server with no viewer adds no load to the endpoint. Failures (the endpoint down or slow) are answers too,
kept like numbers, and asked again after ``retry_seconds`` even when nothing else changed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kdq.quality_page import MINUTE_MS, PageRange

log = logging.getLogger(__name__)

Rows = Mapping[str, Sequence[Mapping[str, Any]]]


@dataclass(frozen=True)
class PageNumbers:
    """One answer of the page's statements (or why there is none), for one generation of the tables."""

    page: PageRange  # the ranges the statements covered (their "as of" is page.now_ms)
    generation: Hashable  # the tables' fingerprint read just before the statements ran
    rows: Rows | None
    error: str | None = None
    source: str | None = None  # the endpoint's address
    seconds: float | None = None  # how long the statements took
    computed_ms: int = 0  # when the answer arrived
    asked_ms: int = 0  # when the question began: the answer holds every commit made before then
    statements_asked_ms: Mapping[str, int] = field(default_factory=dict)  # per statement, when its rows were asked
    # per statement, the generation its rows were asked at (a kept slow statement's may be older than ``generation``)
    statements_generation: Mapping[str, Hashable] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.rows is None

    @property
    def lagging(self) -> tuple[str, ...]:
        """The statements whose rows were kept from an older generation than the rest of this answer: they may
        miss commits the counts beside them hold."""
        return tuple(sorted(
            name for name, generation in self.statements_generation.items() if generation != self.generation
        ))


# The question: the page's statements for a range, only the named ones (None: every one) -> (rows by statement,
# error, source, seconds), as quality_app._rows.
Fetch = Callable[[PageRange, frozenset[str] | None], tuple[Rows | None, str | None, str | None, float | None]]


class NumbersCache:
    """The last :class:`PageNumbers` and the thread that renews it (started on the first :meth:`get`)."""

    def __init__(
        self,
        fetch: Fetch,
        generation: Callable[[], Hashable],
        *,
        poll_seconds: float = 0.25,
        retry_seconds: float = 2.0,
        fresh_seconds: float = 10.0,
        min_interval_seconds: float = 3.0,
        max_age_seconds: float = 60.0,
        idle_seconds: float = 600.0,
        slow_statements: Mapping[str, float] | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        """``generation()``: the fingerprint of the tables' state (the minute is not part of it: :meth:`_due`
        looks at the answer's own minute);
        ``poll_seconds``: how often the thread looks at it while a page is open; ``max_age_seconds``: an
        answer is renewed at least this often, for changes the fingerprint cannot see; ``slow_statements``:
        statement name -> seconds its rows are kept before it is asked again (the others: every round)."""
        self._fetch = fetch
        self._generation = generation
        self._poll = poll_seconds
        self._retry_ms = int(retry_seconds * 1000)
        self._fresh_ms = int(fresh_seconds * 1000)
        self._min_interval_ms = int(min_interval_seconds * 1000)
        self._max_age_ms = int(max_age_seconds * 1000)
        self._idle_ms = int(idle_seconds * 1000)
        self._clock_ms = clock_ms
        self._slow_ms = {name: int(seconds * 1000) for name, seconds in (slow_statements or {}).items()}
        self._latest: PageNumbers | None = None
        # The last instant the fingerprint was seen equal to the generation of ``_latest`` (see _fresh).
        self._unchanged_ms = 0
        self._demanded_ms = 0
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._warm = False  # one question even with nobody looking (see warm)

    # -- what the page asks ------------------------------------------------------------------------------

    def get(self) -> tuple[PageNumbers | None, bool]:
        """(the latest answer or None, whether it is fresh) at once; wakes the thread when it is not."""
        now = self._clock_ms()
        current = self._generation()
        with self._changed:
            self._demanded_ms = now
            latest = self._latest
            self._observe(current, now)
            fresh = latest is not None and self._fresh(latest, current, now)
            if latest is None or self._due(latest, current, now):
                self._changed.notify_all()
        self._ensure_thread()
        return latest, fresh

    def warm(self) -> None:
        """A question soon even though no page was asked for yet, and renewals for ``idle_seconds`` as if a
        page had been: someone opened the Airflow UI (or ``make run`` started), so the first page finds current
        numbers (and the Spark Connect client imported and connected, the endpoint's code paths warm: the first
        rounds of a process take seconds; benchmarks.local_run saw 3-9 s for the first page after a start when
        only one question was asked before it)."""
        with self._changed:
            self._demanded_ms = max(self._demanded_ms, self._clock_ms())
            self._warm = True
            self._changed.notify_all()
        self._ensure_thread()

    def wait_fresh(self, timeout: float) -> tuple[PageNumbers | None, bool]:
        """:meth:`get`, waiting up to ``timeout`` seconds for a fresh answer (the first page after a start)."""
        deadline = time.monotonic() + timeout
        latest, fresh = self.get()
        while not fresh and time.monotonic() < deadline:
            with self._changed:
                self._changed.wait(min(self._poll, max(0.0, deadline - time.monotonic())))
            latest, fresh = self.get()
        return latest, fresh

    # -- the renewal -------------------------------------------------------------------------------------

    def _fresh(self, latest: PageNumbers, current: Hashable, now: int) -> bool:
        """Whether ``latest`` holds every commit made up to ``fresh_seconds`` ago (a failure: whether it is
        recent enough not to be retried yet)."""
        if latest.failed:
            return latest.generation == current and now - latest.computed_ms < self._retry_ms
        if latest.generation == current:
            return now - latest.computed_ms < self._max_age_ms
        # Every commit it misses came after the fingerprint was last seen unchanged (at the latest, its question).
        unchanged_ms = max(latest.asked_ms, self._unchanged_ms if latest is self._latest else 0)
        return now - unchanged_ms < self._fresh_ms

    def _observe(self, current: Hashable, now: int) -> None:
        """Note that the fingerprint read at ``now`` (or later) still equals the latest answer's (under the lock)."""
        latest = self._latest
        if latest is not None and not latest.failed and current == latest.generation:
            self._unchanged_ms = max(self._unchanged_ms, now)

    def _due(self, latest: PageNumbers, current: Hashable, now: int) -> bool:
        """Whether ``latest`` must be asked again: the tables changed (at most every ``min_interval_seconds``
        after the last answer), a failure's retry time came, the page's ranges moved to another minute, or
        half its life is gone (renewed ahead, so an answer never stops being fresh for age alone), or a slow
        statement kept from an older generation has reached its keep time (the tables may have gone quiet since)."""
        if latest.failed:
            return not self._fresh(latest, current, now)
        if latest.generation != current:
            return now - latest.computed_ms >= self._min_interval_ms or not self._fresh(latest, current, now)
        if any(now - latest.statements_asked_ms.get(name, 0) >= self._slow_ms.get(name, 0) for name in latest.lagging):
            return True
        return minute_of(latest.page.now_ms) != minute_of(now) or now - latest.computed_ms >= self._max_age_ms // 2

    def renew_once(self) -> PageNumbers | None:
        """Ask again when the latest answer is due (one round, in the caller's thread); returns the new one.

        The generation is read *before* the statements run: a commit during them leaves the answer due, so
        a change is never hidden behind an answer that may predate it. When slow statements are due too, the
        others (the counts) are asked and published first and the slow ones after, as part of the same
        question (same instant and generation: their rows hold at least every commit made before it), so the
        page's numbers never wait for the day's reasons (benchmarks.local_run saw pages wait 12-15 s for rounds
        that read the raw archive)."""
        now = self._clock_ms()
        current = self._generation()
        with self._changed:
            latest = self._latest
            self._observe(current, now)
        if latest is not None and not self._due(latest, current, now):
            return None
        page = PageRange(now)  # the question begins now: the answer holds every commit made before
        kept = self._kept_statements(latest, now)
        slow_due = set() if latest is None or latest.failed else {
            name for name in self._slow_ms if name in latest.rows and name not in kept  # type: ignore[operator]
        }
        fast = set() if latest is None or latest.failed else set(latest.rows) - set(self._slow_ms)  # type: ignore[arg-type]
        if slow_due and fast:
            answer = self._publish(self._round(page, now, current, latest, kept | slow_due))  # type: ignore[arg-type]
            if answer.failed:
                return answer
            kept = set(answer.rows) - slow_due  # type: ignore[arg-type]
            rest = self._round(page, now, current, answer, kept)
            if rest.seconds is not None and answer.seconds is not None:  # the page shows the whole round's time
                rest = replace(rest, seconds=answer.seconds + rest.seconds)
            return self._publish(rest)
        return self._publish(self._round(page, now, current, latest, kept))

    def _round(
        self, page: PageRange, now: int, current: Hashable, base: PageNumbers | None, kept: set[str]
    ) -> PageNumbers:
        """The statements not in ``kept`` asked now, the ``kept`` ones' rows taken from ``base``."""
        names = None if not kept else frozenset(n for n in base.rows if n not in kept)  # type: ignore[union-attr]
        try:
            rows, error, source, seconds = self._fetch(page, names)
        except Exception as exc:  # the thread must survive anything the endpoint or its client throws
            log.warning("data-quality page: asking for the numbers failed", exc_info=True)
            rows, error, source, seconds = None, f"asking the SQL endpoint failed: {exc}", None, None
        asked = {name: now for name in (rows or {})}
        generations = {name: current for name in (rows or {})}
        if rows is not None and kept:
            rows = {**{name: base.rows[name] for name in kept}, **rows}  # type: ignore[union-attr]
            asked = {**{name: base.statements_asked_ms[name] for name in kept}, **asked}  # type: ignore[union-attr]
            generations = {
                **{name: base.statements_generation.get(name, base.generation) for name in kept},  # type: ignore[union-attr]
                **generations,
            }
        return PageNumbers(page, current, rows, error, source, seconds, self._clock_ms(), asked_ms=now,
                           statements_asked_ms=asked, statements_generation=generations)

    def _publish(self, answer: PageNumbers) -> PageNumbers:
        with self._changed:
            previous = self._latest
            same = previous is not None and not previous.failed and previous.generation == answer.generation
            # The generation was read at the question's start; seen unchanged since then still holds for it.
            self._unchanged_ms = max(self._unchanged_ms, answer.asked_ms) if same else answer.asked_ms
            self._latest = answer
            self._changed.notify_all()
        return answer

    def _kept_statements(self, latest: PageNumbers | None, now: int) -> set[str]:
        """The slow statements whose rows ``latest`` has and that are not due yet (kept, not asked)."""
        if latest is None or latest.failed:
            return set()
        return {
            name for name, keep_ms in self._slow_ms.items()
            if name in latest.rows and now - latest.statements_asked_ms.get(name, 0) < keep_ms  # type: ignore[operator]
        }

    def _run(self) -> None:
        while True:
            with self._changed:
                if self._stop:
                    return
                idle = self._clock_ms() - self._demanded_ms > self._idle_ms and not self._warm
                self._changed.wait(self._poll if not idle else 5.0)
                if self._stop:
                    return
                if self._clock_ms() - self._demanded_ms > self._idle_ms and not self._warm:
                    continue  # nobody looks: no load on the endpoint
                self._warm = False
            try:
                self.renew_once()
            except Exception:  # a broken fingerprint read: try again at the next poll
                log.warning("data-quality page: renewing the numbers failed", exc_info=True)

    def _ensure_thread(self) -> None:
        with self._changed:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop = False
            self._thread = threading.Thread(target=self._run, name="kdq-quality-numbers", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._changed:
            self._stop = True
            self._changed.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)


def minute_of(now_ms: int) -> int:
    """The page's ranges move once a minute."""
    return now_ms // MINUTE_MS
