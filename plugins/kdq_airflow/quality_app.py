"""The data-quality page's web app, served by Airflow's API server (registered by ``plugins/kdq_quality_page.py``).

A FastAPI app mounted at ``/kdq``; ``/kdq/quality`` is the page, framed by the Airflow UI under
``/plugin/kdq-data-quality`` (an external view in the navigation). It is behind Airflow's own login: the
JWT the UI keeps in its ``_token`` cookie (or an ``Authorization: Bearer`` header) is checked by the
configured auth manager, a request without one is sent to Airflow's login page, and the user needs access
to the Airflow website (every role has it).

Thin on purpose: the SQL and the shaping are :mod:`kdq.quality_page`, the HTML :mod:`kdq.quality_html`,
the numbers kept ready :mod:`kdq.quality_cache`. Counts come from the always-on SQL endpoint over Spark
Connect (a gRPC client in this process, no JVM), asked by one background thread when the tables changed
(:func:`_generation`), never by a page load: a load answers at once with the last answer and says how
current it is, and its script looks again until it is. When the endpoint is not running or does not answer
within ``KDQ_QUALITY_PAGE_TIMEOUT_SECONDS`` (default 60), the page says so and still shows what it has
without it (stream health, DAG runs). One question at a time: the endpoint shares the machine with the stream.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from kdq.tables import WINDOW_COUNTS

log = logging.getLogger(__name__)
# Where the page finds the SQL endpoint in a deployment (compose: sc://sql-endpoint:15002); unset locally.
ENDPOINT_URL_ENV = "KDQ_SQL_ENDPOINT_URL"

URL_PREFIX = "/kdq"
PAGE_PATH = "/quality"
URL_ROUTE = "kdq-data-quality"  # the Airflow UI's own route of the framed page: /plugin/kdq-data-quality
TIMEOUT_ENV = "KDQ_QUALITY_PAGE_TIMEOUT_SECONDS"
RECENT_DAG_RUNS = 15

ICON_SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" fill="none" stroke="currentColor" '
    'stroke-width="2"><path d="M4 20V10M10 20V4M16 20v-7M22 20H2"/></svg>'
)

# One worker: a page's queries never compete with another page's on the endpoint, and a hung query
# holds one thread, not one per request.
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kdq-quality-sql")
_sessions: dict[str, Any] = {}
_sessions_lock = threading.Lock()


def _timeout() -> float:
    try:
        return float(os.environ.get(TIMEOUT_ENV) or 60)
    except ValueError:
        return 60.0


async def _user(request: Request) -> Any | None:
    """The logged-in Airflow user, or None (no token, expired or invalid)."""
    from airflow.api_fastapi.core_api.security import resolve_user_from_token
    from fastapi import HTTPException

    header = request.headers.get("authorization", "")
    token = header[7:] if header.lower().startswith("bearer ") else request.cookies.get("_token")
    try:
        return await resolve_user_from_token(token)
    except HTTPException:
        return None


def _session(url: str) -> Any:
    from kdq.sql_client import connect_session

    with _sessions_lock:
        session = _sessions.get(url)
        if session is None:
            # Logged in with KDQ_SQL_PASSWORD from this process's environment, when the endpoint requires it.
            session = _sessions[url] = connect_session(url)
        return session


def _forget(url: str) -> None:
    with _sessions_lock:
        session = _sessions.pop(url, None)
    if session is not None:
        try:
            session.interruptAll()
            session.stop()
        except Exception:  # the endpoint is gone: nothing to release on its side
            log.debug("closing the Spark Connect session to %s", url, exc_info=True)


def _query(url: str, queries: dict[str, str]) -> dict[str, list[dict]]:
    from kdq.quality_page import rows_as_dicts

    session = _session(url)
    return {name: rows_as_dicts(session.sql(sql).collect()) for name, sql in queries.items()}


def _rows(
    config: Any, page: Any, names: frozenset[str] | None = None
) -> tuple[dict[str, list[dict]] | None, str | None, str | None, float | None]:
    """(rows per query, error, source, seconds): the page's statements (``names``: only these; None: all) over
    Spark Connect, with a deadline."""
    from kdq.quality_page import page_queries
    from kdq.stack.sql_endpoint import running_endpoint

    # A deployment names its endpoint (compose: sc://sql-endpoint:15002); locally the stack state says where it runs.
    configured = os.environ.get(ENDPOINT_URL_ENV, "").strip()
    endpoint = None if configured else running_endpoint(config)
    if not configured and endpoint is None:
        return (
            None,
            (
                "the SQL endpoint is not running (no endpoint recorded in the stack state "
                f"{config.state_file}, or its ports do not answer)"
            ),
            None,
            None,
        )
    url = configured or endpoint.connect_url
    if configured and not _listening(configured):
        # Spark Connect's client retries a refused connection far beyond the page's deadline, holding the
        # page's one query worker: a configured endpoint that does not listen is reported before asking.
        return None, f"the SQL endpoint {url} does not accept connections", url, None
    started = time.monotonic()
    queries = {name: sql for name, sql in page_queries(config.spark.database, page).items()
               if names is None or name in names}
    # A session kept from before may belong to an endpoint that restarted since (it forgets its sessions): when
    # a kept one fails, one more try on a new session, within the same deadline.
    with _sessions_lock:
        tries = 2 if url in _sessions else 1
    for attempt in range(1, tries + 1):
        future = _executor.submit(_query, url, queries)
        try:
            rows = future.result(timeout=max(1.0, _timeout() - (time.monotonic() - started)))
        except FutureTimeout:
            _forget(url)  # interrupts the running query, so the worker thread is free again
            return None, f"the SQL endpoint {url} did not answer within {_timeout():.0f} s", url, None
        except Exception as exc:
            _forget(url)
            log.warning("data-quality page: query through %s failed (try %d of %d)", url, attempt, tries, exc_info=True)
            if attempt < tries:
                continue
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            return None, f"the query through the SQL endpoint {url} failed: {first}", url, None
        return rows, None, url, time.monotonic() - started
    raise AssertionError("unreachable: every try returns")


def _listening(url: str) -> bool:
    """Whether something accepts TCP connections at a ``sc://host:port`` URL."""
    from urllib.parse import urlparse

    from kdq.procs import port_open

    parsed = urlparse(url)
    return bool(parsed.hostname) and port_open(parsed.port or 15002, host=parsed.hostname, timeout=2.0)


def _dag_runs(user: Any, run_ids: set[str]) -> list[Any]:
    """kdq's recent DAG runs and the runs named by corrections, limited to the DAGs the user may read."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from kdq.quality_page import DagRunLink, dag_run_url
    from kdq.stack.airflow import KDQ_DAGS

    with create_session() as session:
        allowed = set(KDQ_DAGS) & get_auth_manager().get_authorized_dag_ids(user=user, session=session)
        if not allowed:
            return []
        columns = (DagRun.dag_id, DagRun.run_id, DagRun.state, DagRun.run_after)
        recent = session.execute(
            select(*columns).where(DagRun.dag_id.in_(allowed)).order_by(DagRun.run_after.desc()).limit(RECENT_DAG_RUNS)
        ).all()
        named = (
            session.execute(
                select(*columns).where(DagRun.dag_id.in_(allowed), DagRun.run_id.in_(sorted(run_ids)))
            ).all()
            if run_ids
            else []
        )
    links = {}
    for dag_id, run_id, state, run_after in [*recent, *named]:
        links[(dag_id, run_id)] = DagRunLink(
            dag_id,
            run_id,
            str(state) if state is not None else None,
            int(run_after.timestamp() * 1000) if run_after else None,
            dag_run_url(dag_id, run_id),
        )
    return sorted(links.values(), key=lambda link: -(link.run_after_ms or 0))


def _health(config: Any, now_ms: int) -> Any:
    """Stream health from the stream's state folder, with the writers journal's last 24 h (no Spark)."""
    from kdq.quality_health import read_progress_log, stream_health
    from kdq.stream.state import stream_status
    from kdq.writers_journal import read_entries, summarize

    return stream_health(
        stream_status(config), read_progress_log(config), now_ms, writers=summarize(read_entries(config), now_ms)
    )


def _writers_json() -> dict:
    """The page's writers table as JSON: per batch job, its runs of the last 24 h beside the stream."""
    from kdq.config import load_config
    from kdq.quality_health import writers_json

    now_ms = int(time.time() * 1000)
    return writers_json(_health(load_config(), now_ms), now_ms)


def _generation(config: Any) -> tuple:
    """The fingerprint of what the page's statements would return (see :mod:`kdq.quality_cache`), from files.

    Tables on this machine: the modification time of the ``_delta_log`` folder of each table the counts (the
    statement of every round) read, :data:`COUNTS_TABLES`, which every commit (a new ``N.json`` renamed into it)
    moves, whoever the writer. The other tables' commits (the stream's archive, reasons and summaries, each
    micro-batch) move nothing: the slow statements that read them are asked again by age
    (:data:`SLOW_STATEMENTS`), and a round after each of those commits tripled the endpoint's page load
    (three renewals per micro-batch instead of one). Tables on object storage: the stream's
    progress log, which grows after every micro-batch, and the writers journal, which every batch job
    appends to when it ends. Both: the endpoint's address and whether its process lives (no port probe: the
    Thrift server would log every bare connection)."""
    from kdq.storage import is_remote, local_path, tables_location
    from kdq.stream.state import PROGRESS_LOG, state_dir
    from kdq.writers_journal import journal_path

    def stamp(path: Any) -> tuple[int, int] | None:
        try:
            stat = os.stat(path)
        except OSError:
            return None
        return stat.st_size, stat.st_mtime_ns

    tables = tables_location(config)
    if is_remote(tables):
        changes: tuple = (stamp(state_dir(config) / PROGRESS_LOG), stamp(journal_path(config)))
    else:
        root = local_path(tables)
        try:
            names = sorted(entry.name for entry in os.scandir(root) if entry.is_dir() and entry.name in COUNTS_TABLES)
        except OSError:
            names = []
        changes = tuple((name, stamp(root / name / "_delta_log")) for name in names)
    configured = os.environ.get(ENDPOINT_URL_ENV, "").strip()
    if configured:
        endpoint: Any = configured
    else:
        from kdq.stack.sql_endpoint import LocalSqlEndpoint

        state = config.local_state()
        ports = (int(state.get("sql_connect_port") or 0), int(state.get("sql_thrift_port") or 0))
        alive = all(ports) and LocalSqlEndpoint(config, *ports).process.running()
        endpoint = ports if alive else None
    return changes, endpoint, config.spark.database


_cache: Any = None
_cache_lock = threading.Lock()
# The tables the page's counts read (kdq.quality_page.counts_sql): their commits make a round due.
COUNTS_TABLES = frozenset({WINDOW_COUNTS.name})
# The page's statements asked less often than the counts (kdq.quality_cache): the day's top reasons with their
# latest samples (the costliest: it reads the day's raw archive), the recent corrections (rare) and the incidents
# (the expectations run updates them once a minute).
SLOW_STATEMENTS = {"reasons": 60.0, "corrections": 60.0, "incidents": 15.0}
# Renewals while a page is open: after a commit at most every RENEW_SECONDS (the stream commits every few
# seconds, so this is the endpoint's page load: one round of the counts per RENEW_SECONDS plus its own time;
# an answer stays fresh for FRESH_SECONDS after its question began, more than a renewal and two rounds on a
# busy machine). Renewals stop IDLE_SECONDS after the last page request (an open page asks every 5 s) or after
# the Airflow UI was opened: a closed page leaves the endpoint to the SQL users within two minutes.
# benchmarks.local_run saw the endpoint hold 0.67 of make run's 2 cores with 3 s and 10 minutes.
RENEW_SECONDS, FRESH_SECONDS, IDLE_SECONDS = 5.0, 10.0, 120.0
FIRST_ANSWER_SECONDS = 1.0  # a page with no answer at all yet waits this long for one, then paints without


def _numbers() -> Any:
    """The API server's one :class:`kdq.quality_cache.NumbersCache` (configuration read per question, so an
    edited kdq.toml is picked up like before)."""
    global _cache
    from kdq.config import load_config
    from kdq.quality_cache import NumbersCache

    with _cache_lock:
        if _cache is None:
            _cache = NumbersCache(
                fetch=lambda page, names: _rows(load_config(), page, names),
                generation=lambda: _generation(load_config()),
                slow_statements=SLOW_STATEMENTS,
                min_interval_seconds=RENEW_SECONDS,
                fresh_seconds=FRESH_SECONDS,
                idle_seconds=IDLE_SECONDS,
            )
        return _cache


def _render(user: Any) -> str:
    from kdq.config import load_config
    from kdq.quality_html import render_page
    from kdq.quality_page import PageRange, build_model, correction_run_ids
    from kdq.stack.airflow import KDQ_DAGS

    try:
        config = load_config()
    except Exception as exc:  # a broken kdq.toml: say so on the page instead of an opaque HTTP 500
        from html import escape

        return f"<!DOCTYPE html><html><body><h1>kdq: data quality</h1><p>kdq's configuration: {escape(str(exc))}</p>"
    now_ms = int(time.time() * 1000)
    health = _health(config, now_ms)
    cache = _numbers()
    answer, fresh = cache.get()
    if answer is None:
        answer, fresh = cache.wait_fresh(FIRST_ANSWER_SECONDS)
    rows = answer.rows if answer is not None else None
    try:
        runs = _dag_runs(user, correction_run_ids((rows or {}).get("corrections", ())))
    except Exception:  # the page must not fail because the metadata database hiccuped
        log.warning("data-quality page: could not list DAG runs", exc_info=True)
        runs = []
    if answer is None:  # still asking: the layout, the topics and the stream's health now, numbers next
        model = build_model(PageRange(now_ms), None, health, runs, None, None, None, KDQ_DAGS, numbers="none")
    else:
        model = build_model(
            answer.page,
            rows,
            health,
            runs,
            answer.error,
            answer.source,
            answer.seconds,
            KDQ_DAGS,
            numbers="fresh" if fresh else "stale",
            numbers_ms=answer.computed_ms,
            now_ms=now_ms,
            lagging={name: answer.statements_asked_ms[name] for name in answer.lagging},
        )
    return render_page(model)


def create_app() -> FastAPI:
    app = FastAPI(title="kdq data quality", docs_url=None, redoc_url=None, openapi_url=None)

    async def _allowed(request: Request) -> tuple[Any, Response | None]:
        """(the user, None) when the request may see the page, else (None, the response that says why)."""
        from airflow.api_fastapi.app import get_auth_manager
        from airflow.api_fastapi.auth.managers.models.resource_details import AccessView

        user = await _user(request)
        auth_manager = get_auth_manager()
        if user is None:
            return None, RedirectResponse(auth_manager.get_url_login(next_url=str(request.url)), status_code=303)
        if not auth_manager.is_authorized_view(access_view=AccessView.WEBSITE, user=user):
            return None, HTMLResponse("Forbidden: this user may not use the Airflow UI.", status_code=403)
        return user, None

    @app.get(PAGE_PATH, response_class=HTMLResponse)
    async def quality_page(request: Request) -> Response:
        user, refused = await _allowed(request)
        if refused is not None:
            return refused
        html = await run_in_threadpool(_render, user)
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    @app.get(PAGE_PATH + "/writers.json")
    async def writers(request: Request) -> Response:
        _, refused = await _allowed(request)
        if refused is not None:
            return refused
        payload = await run_in_threadpool(_writers_json)
        return JSONResponse(payload, headers={"Cache-Control": "no-store"})

    @app.get("/icon.svg")
    async def icon() -> Response:
        # The Airflow UI loads the navigation's icon as soon as someone opens it: the moment to get the page's
        # numbers ready (one question; the plugin is imported by every Airflow process, so not at import).
        _numbers().warm()
        return Response(ICON_SVG, media_type="image/svg+xml")

    return app
