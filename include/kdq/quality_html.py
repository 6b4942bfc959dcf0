"""The data-quality page as one self-contained HTML document: inline CSS and SVG charts, no script, nothing
fetched from elsewhere (the machine may have no internet, and the page lives in an iframe of the Airflow UI).

Every number a test or a user may want to read back carries a ``data-field`` attribute inside an element
with ``data-topic``, so the browser test reads exactly what is displayed. Every text from the data (topic
names, reasons, sample values, run ids) is HTML-escaped: sample values are by definition untrusted input.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from html import escape

from kdq.quality_health import StreamHealth
from kdq.quality_page import MINUTE_MS, PREVIEW_CHARS, DagRunLink, PageModel, Series, TopicView, dag_url

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:16px;color:#1f2933;background:#fff}
h1{font-size:20px;margin:0 0 4px} h2{font-size:17px;margin:24px 0 8px;border-bottom:1px solid #d9dee3}
h3{font-size:14px;margin:14px 0 6px} .muted{color:#66727f;font-size:12px}
table{border-collapse:collapse;font-size:13px;margin:4px 0 8px} td,th{border:1px solid #d9dee3;padding:3px 8px}
th{background:#f3f5f7;text-align:left} td.n{text-align:right;font-variant-numeric:tabular-nums}
.alert{border:1px solid #e0b4b4;background:#fff6f6;color:#9f3a38;padding:8px 12px;margin:8px 0}
.ok{color:#1e7b34} .bad{color:#b42318} .charts{display:flex;flex-wrap:wrap;gap:16px}
code{background:#f3f5f7;padding:0 3px;word-break:break-all} .topic{margin-bottom:28px}
.legend span{display:inline-block;width:10px;height:10px;margin:0 4px 0 10px}
"""

VALID_COLOR, INVALID_COLOR, RATIO_COLOR = "#3b8a4f", "#d1453b", "#2f5fa7"


def _iso(ms: int | None) -> str:
    if ms is None:
        return "—"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pct(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio * 100:.2f} %"


def _num(value: int | None) -> str:
    return "—" if value is None else f"{value}"


def chart_svg(series: Series, title: str, width: int = 560, height: int = 170) -> str:
    """Stacked bars (valid below, invalid above) per bucket and the invalid ratio as a line on its own 0-100 %
    axis; a <title> per bar is the tooltip with the bucket's numbers."""
    left, right, top, bottom = 44, 40, 8, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    buckets = series.buckets
    peak = max((b.total for b in buckets), default=0) or 1
    step = plot_w / max(len(buckets), 1)
    bar_w = max(step * 0.8, 1.0)
    label_fmt = "%H:%M" if series.scale == "hour" else "%d %H:00"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="{escape(title)}" data-chart="{series.scale}">',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#9aa5b1"/>',
        f'<text x="{left - 4}" y="{top + 10}" font-size="10" text-anchor="end">{peak}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" font-size="10" text-anchor="end">0</text>',
        f'<text x="{left + plot_w + 4}" y="{top + 10}" font-size="10" fill="{RATIO_COLOR}">100%</text>',
        f'<text x="{left + plot_w + 4}" y="{top + plot_h}" font-size="10" fill="{RATIO_COLOR}">0%</text>',
    ]
    # The ratio line is drawn per run of buckets that counted something: a minute with no records has no ratio,
    # and a line across it would draw one (from the last minute with data to the next).
    segments: list[list[str]] = [[]]
    for i, b in enumerate(buckets):
        x = left + i * step + (step - bar_w) / 2
        valid_h = plot_h * b.valid / peak
        invalid_h = plot_h * b.invalid / peak
        when = datetime.fromtimestamp(b.start_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M")
        tip = f"{when} UTC: {b.valid} valid, {b.invalid} invalid, invalid ratio {_pct(b.ratio)}"
        parts.append(f"<g><title>{escape(tip)}</title>")
        if b.valid:
            parts.append(
                f'<rect x="{x:.1f}" y="{top + plot_h - valid_h:.1f}" width="{bar_w:.1f}" height="{valid_h:.1f}" '
                f'fill="{VALID_COLOR}"/>'
            )
        if b.invalid:
            parts.append(
                f'<rect x="{x:.1f}" y="{top + plot_h - valid_h - invalid_h:.1f}" width="{bar_w:.1f}" '
                f'height="{invalid_h:.1f}" fill="{INVALID_COLOR}"/>'
            )
        parts.append("</g>")
        if b.ratio is not None:
            segments[-1].append(f"{x + bar_w / 2:.1f},{top + plot_h * (1 - b.ratio):.1f}")
        elif segments[-1]:
            segments.append([])
    for points in segments:
        if len(points) > 1:
            parts.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="{RATIO_COLOR}" stroke-width="1.5"/>')
        elif points:  # a lone minute with data between empty ones: a dot
            x, y = points[0].split(",")
            parts.append(f'<circle cx="{x}" cy="{y}" r="2.5" fill="{RATIO_COLOR}"/>')
    for i in (0, len(buckets) // 2, len(buckets) - 1) if buckets else ():
        label = datetime.fromtimestamp(buckets[i].start_ms / 1000, tz=UTC).strftime(label_fmt)
        x = left + i * step + step / 2
        parts.append(f'<text x="{x:.1f}" y="{height - 6}" font-size="10" text-anchor="middle">{label}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _totals_row(topic: TopicView, counted: bool) -> str:
    """``counted``: the counts were read (without the SQL endpoint they are unknown: "—", never 0)."""
    cells = []
    for scale, series in (("hour", topic.hour), ("day", topic.day)):
        cells += [
            f'<td class="n" data-field="{scale}-valid">{series.valid if counted else "—"}</td>',
            f'<td class="n" data-field="{scale}-invalid">{series.invalid if counted else "—"}</td>',
            f'<td class="n" data-field="{scale}-ratio">{_pct(series.ratio if counted else None)}</td>',
        ]
    return "".join(cells)


def _overview(model: PageModel) -> str:
    if not model.topics:
        return '<p class="muted">No topic has counts, reasons, corrections or stream progress yet.</p>'
    rows = []
    for topic in model.topics:
        name = escape(topic.topic)
        rows.append(
            f'<tr data-topic="{name}" data-row="overview"><td><a href="#topic-{name}">{name}</a></td>'
            f"{_totals_row(topic, _counted(model))}"
            f'<td class="n" data-field="consumer-lag">{_num(topic.health.consumer_lag)}</td>'
            f'<td class="n" data-field="late-rows-hour">{topic.health.late_rows_hour}</td></tr>'
        )
    return (
        "<table><tr><th rowspan=2>topic</th><th colspan=3>last hour</th><th colspan=3>last day</th>"
        "<th rowspan=2>consumer lag</th><th rowspan=2>late rows (last hour)</th></tr>"
        "<tr><th>valid</th><th>invalid</th><th>invalid ratio</th><th>valid</th><th>invalid</th>"
        f"<th>invalid ratio</th></tr>{''.join(rows)}</table>"
    )


def _reasons(topic: TopicView) -> str:
    if not topic.reasons:
        return '<p class="muted">No invalid messages in the last day.</p>'
    rows = []
    for rank, r in enumerate(topic.reasons, start=1):
        if r.sample_offset is None:
            sample = '<span class="muted">no sample (raw rows deleted by the retention)</span>'
        else:
            sample = (
                f'<span data-field="sample-position">partition {r.sample_partition}, offset {r.sample_offset}</span>'
                f' <span class="muted">({_num(r.sample_bytes)} bytes)</span><br>'
                f'<code data-field="sample-value">{escape(r.sample_preview or "")}</code>'
            )
        rows.append(
            f'<tr data-topic="{escape(topic.topic)}" data-row="reason" data-rank="{rank}">'
            f'<td data-field="reason"><code>{escape(r.reason)}</code></td>'
            f'<td class="n" data-field="reason-count">{r.count}</td><td>{sample}</td></tr>'
        )
    return f"<table><tr><th>reason</th><th>invalid messages (last day)</th><th>sample</th></tr>{''.join(rows)}</table>"


def _corrections(topic: TopicView) -> str:
    if not topic.corrections:
        return '<p class="muted">No corrections by the batch layer.</p>'
    rows = []
    for c in topic.corrections:
        run = escape(c.run_id or "—")
        if c.run_url:
            run = f'<a href="{escape(c.run_url)}" target="_top" data-field="run-link">{run}</a>'
        rows.append(
            f'<tr data-topic="{escape(topic.topic)}" data-row="correction">'
            f'<td data-field="window">{_iso(c.window_ms)}</td><td data-field="status">{escape(c.status)}</td>'
            f'<td class="n"><span data-field="old-count">{c.old_count}</span> → '
            f'<span data-field="new-count">{c.new_count}</span></td>'
            f'<td data-field="why">{escape(c.reason)}</td><td>{run}</td><td>{_iso(c.corrected_ms)}</td></tr>'
        )
    return (
        "<table><tr><th>window</th><th>status</th><th>old → new</th><th>why</th><th>run</th><th>corrected at</th>"
        f"</tr>{''.join(rows)}</table>"
    )


def _as_of(lagging: Mapping[str, int], statement: str) -> str:
    """Beside a section whose rows are older than the counts (asked less often): their own instant."""
    if statement not in lagging:
        return ""
    return (
        f' <span class="muted" data-field="{statement}-as-of" data-asked-ms="{lagging[statement]}">as of '
        f"{_iso(lagging[statement])} (asked less often than the counts while the stream commits)</span>"
    )


def _topic_section(topic: TopicView, counted: bool, lagging: Mapping[str, int] | None = None) -> str:
    name = escape(topic.topic)
    h = topic.health
    health = (
        f'<p data-topic="{name}" data-row="health">consumer lag <b data-field="consumer-lag">{_num(h.consumer_lag)}'
        f"</b> messages · event-time lag <b>{'—' if h.event_time_lag_ms is None else f'{h.event_time_lag_ms / 1000:.1f} s'}"
        f"</b> · late rows: last batch <b>{_num(h.late_rows_last_batch)}</b>, last hour "
        f'<b data-field="late-rows-hour">{h.late_rows_hour}</b> (left to the hourly batch layer)</p>'
    )
    totals = (
        f'<table><tr data-topic="{name}" data-row="totals"><th>last hour: valid</th><th>invalid</th><th>ratio</th>'
        f"<th>last day: valid</th><th>invalid</th><th>ratio</th></tr>"
        f'<tr data-topic="{name}" data-row="totals-values">{_totals_row(topic, counted)}</tr></table>'
    )
    if not counted:
        unavailable = '<p class="muted">Not available yet (see above).</p>'
        return (
            f'<section class="topic" id="topic-{name}" data-topic="{name}"><h2>{name}</h2>{totals}'
            f"<h3>Stream health</h3>{health}<h3>Top invalid reasons</h3>{unavailable}"
            f"<h3>Recent corrections</h3>{unavailable}</section>"
        )
    return (
        f'<section class="topic" id="topic-{name}" data-topic="{name}"><h2>{name}</h2>{totals}'
        '<div class="legend muted">'
        f'<span style="background:{VALID_COLOR}"></span>valid<span style="background:{INVALID_COLOR}"></span>invalid'
        f'<span style="background:{RATIO_COLOR};height:2px"></span>invalid ratio</div>'
        '<div class="charts"><div><h3>Last hour, per minute</h3>'
        f"{chart_svg(topic.hour, f'{topic.topic}: last hour per minute')}</div>"
        "<div><h3>Last day, per hour</h3>"
        f"{chart_svg(topic.day, f'{topic.topic}: last day per hour')}</div></div>"
        f"<h3>Stream health</h3>{health}"
        f"<h3>Top invalid reasons{_as_of(lagging or {}, 'reasons')}</h3>{_reasons(topic)}"
        f"<h3>Recent corrections{_as_of(lagging or {}, 'corrections')}</h3>{_corrections(topic)}</section>"
    )


def _value(expectation: str, value: float) -> str:
    """An incident's value as its check measures it: a share as a percentage, a p-value as is, else a number."""
    if expectation == "invalid_ratio" or expectation.startswith("reason_share:") or expectation == "anomaly:invalid_ratio":
        return _pct(value)
    if expectation.startswith("anomaly:"):
        return f"p={value:.2g}"
    return f"{value:g}"


def _incidents(model: PageModel) -> str:
    """kdq.incidents as the expectations run keeps them: open first (links to the topic's section, its windows
    and a sample of the invalid records by partition and offset), then the recently resolved or retracted."""
    if not model.incidents:
        if not _counted(model):
            return '<p class="muted">Not available yet (see above).</p>'
        return ('<p class="muted" data-field="no-incidents">No open incident, none in the last 24 h '
                "(expectations: config/rules/topics.toml, [expectations]).</p>")
    topics = {t.topic for t in model.topics}
    rows = []
    for i in model.incidents:
        name = escape(i.topic)
        topic = f'<a href="#topic-{name}">{name}</a>' if i.topic in topics else name
        sample = "".join(
            f'<div class="sample" data-field="sample">partition {s.partition} offset {s.offset}: '
            f"{escape(s.reason)} <code>{escape(s.value[:PREVIEW_CHARS])}</code></div>"
            for s in i.sample
        )
        state = escape(i.status) + ("" if i.final or i.status != "open" else " (provisional)")
        rows.append(
            f'<tr data-row="incident" data-key="{escape(i.key)}" data-status="{escape(i.status)}" '
            f'data-topic="{name}"><td data-field="incident-status" class="{"bad" if i.status == "open" else "ok"}">'
            f'{state}</td><td>{topic}</td><td data-field="expectation">{escape(i.expectation)}</td>'
            f'<td data-field="windows">{_iso(i.first_ms)} – {_iso(i.last_ms + MINUTE_MS)}'
            f'<br><span class="muted">counts of {_iso(i.window_start_ms)} – {_iso(i.window_end_ms)}</span></td>'
            f'<td class="n" data-field="worst">{_value(i.expectation, i.worst_value)}</td>'
            f'<td class="n" data-field="threshold">{_value(i.expectation, i.threshold)}</td>'
            f'<td class="n" data-field="level">{i.level}</td><td>{_iso(i.opened_ms)}</td>'
            f"<td>{_iso(i.resolved_ms) if i.resolved_ms is not None else '—'}</td><td>{sample or '—'}</td></tr>"
        )
    return (
        "<table><tr><th>status</th><th>topic</th><th>expectation</th><th>violated minutes (UTC)</th>"
        "<th>worst</th><th>threshold</th><th>level</th><th>opened</th><th>resolved at</th>"
        f"<th>sample of invalid records</th></tr>{''.join(rows)}</table>"
    )


def _seconds(ms: int | None) -> str:
    return "—" if ms is None else f"{ms / 1000:.1f} s"


def _stream(stream: StreamHealth) -> str:
    state_class = "ok" if stream.state == "running" else "bad"
    parts = [
        f'<p>Speed layer: <b class="{state_class}" data-field="stream-state">{escape(stream.state)}</b>',
        f" · heartbeat {'—' if stream.heartbeat_age_s is None else f'{stream.heartbeat_age_s:.0f} s ago'}",
        f' · last batch <b data-field="last-batch-id">{_num(stream.last_batch_id)}</b>'
        f" at {_iso(stream.last_batch_ms)} ({_num(stream.last_batch_rows)} rows)",
        f' · end-to-end latency (produce → counted) <b data-field="latency-oldest">{_seconds(stream.latency_oldest_ms)}</b>'
        f" for its oldest record, {_seconds(stream.latency_newest_ms)} for its newest</p>",
    ]
    if stream.failure:
        parts.append(
            f'<div class="alert">A micro-batch keeps failing: {escape(stream.failure)} '
            "(<code>kdq stream-failure</code> shows the way out)</div>"
        )
    if stream.influx_pending_since_ms:
        parts.append(
            f'<p class="bad">InfluxDB is missing windows since {_iso(stream.influx_pending_since_ms)} '
            "(the hourly DAG's catch-up re-pushes them).</p>"
        )
    parts.append(_writers(stream))
    return "".join(parts)


def _writers(stream: StreamHealth) -> str:
    """The batch jobs that wrote kdq's tables in the last 24 h (the writers journal), one row per job."""
    if not stream.writers:
        return '<p class="muted" data-field="writers-none">Writers (last 24 h): no batch job wrote kdq\'s tables.</p>'
    waited = sum(w.waited for w in stream.writers)
    head = (
        f'<p data-field="writers-summary">Writers beside the stream (last 24 h): '
        f'<b data-field="writers-runs">{sum(w.runs for w in stream.writers)}</b> run(s), '
        f'<b data-field="writers-beside">{sum(w.beside_stream for w in stream.writers)}</b> beside the stream, '
        f'<b class="{"bad" if waited else "ok"}" data-field="writers-waited">{waited}</b> waited for another writer</p>'
    )
    rows = []
    for w in stream.writers:
        job = escape(w.job)
        outcome = escape(w.last_outcome or "—")
        open_runs = f" ({w.running} running)" if w.running else ""
        open_runs += f" ({w.lost} without an end)" if w.lost else ""
        title = f' title="{escape(w.last_error)}"' if w.last_error else ""
        rows.append(
            f'<tr data-row="writer" data-job="{job}"><td>{job}</td>'
            f'<td class="n" data-field="runs">{w.runs}{open_runs}</td>'
            f'<td class="n" data-field="beside-stream">{w.beside_stream}</td>'
            f'<td class="n" data-field="waited">{w.waited}</td>'
            f'<td class="n" data-field="wait-seconds">{w.wait_seconds:.0f}</td>'
            f'<td class="n" data-field="retries">{w.conflict_retries} / {w.stale_read_retries}</td>'
            f'<td class="n" data-field="behind">{w.behind}</td>'
            f'<td data-field="last-outcome"{title} class="{"bad" if w.last_outcome == "failed" else "ok"}">'
            f"{outcome}</td><td>{_iso(w.last_end_ms)}</td></tr>"
        )
    return (
        f"{head}<table data-field=\"writers\"><tr><th>job</th><th>runs</th><th>beside stream</th><th>waited</th>"
        "<th>waited s</th><th>conflict / stale-read retries</th><th>stream behind</th><th>last outcome</th>"
        f"<th>last end</th></tr>{''.join(rows)}</table>"
    )


def _dag_runs(runs: tuple[DagRunLink, ...], dag_ids: tuple[str, ...]) -> str:
    links = " · ".join(f'<a href="{escape(dag_url(d))}" target="_top">{escape(d)}</a>' for d in dag_ids)
    if not runs:
        return f'<p>DAGs: {links}</p><p class="muted">No DAG runs yet.</p>'
    rows = "".join(
        f'<tr data-row="dag-run" data-dag="{escape(r.dag_id)}"><td>{escape(r.dag_id)}</td>'
        f'<td><a href="{escape(r.url)}" target="_top" data-field="run-link">{escape(r.run_id)}</a></td>'
        f"<td>{escape(r.state or '—')}</td><td>{_iso(r.run_after_ms)}</td></tr>"
        for r in runs
    )
    return f"<p>DAGs: {links}</p><table><tr><th>DAG</th><th>run</th><th>state</th><th>run after</th></tr>{rows}</table>"


REFRESH_SECONDS = 5.0
CATCH_UP_SECONDS = 0.5  # the next look while the numbers shown are not fresh yet


def _counted(model: PageModel) -> bool:
    """Whether the counts were read: without an answer they are unknown ("—"), never 0."""
    return not model.sql_error and model.numbers != "none"


def _refresh_script(seconds: float, catch_up_seconds: float = CATCH_UP_SECONDS) -> str:
    """The page refreshes itself in place: it fetches itself and swaps its body (no reload of the Airflow UI's
    frame, the scroll position kept), one request at a time, ``seconds`` after the previous one finished, or
    ``catch_up_seconds`` while the body says its numbers are not fresh (``data-numbers``: the server answers
    at once with what it has and renews it in the background). ``window.kdqNumbersAt``: milliseconds from the
    page's navigation to its first fresh numbers (the browser test reads it). The script sits in the head, so the swap
    leaves it running; a failed fetch keeps the numbers shown (their "as of" says how old they are) and
    tries again."""
    body = (
        "function fresh(){return !!document.body&&document.body.dataset.numbers==='fresh';}"
        "function next(){if(fresh()&&window.kdqNumbersAt===undefined){window.kdqNumbersAt=performance.now();}"
        "return fresh()?every:soon;}"
        "async function refresh(){try{"
        "const r=await fetch(location.href,{cache:'no-store',credentials:'same-origin'});"
        "if(r.ok){const doc=new DOMParser().parseFromString(await r.text(),'text/html');"
        "if(doc.querySelector('[data-field=\"as-of\"]')){const y=window.scrollY;document.body.replaceWith(doc.body);"
        "window.scrollTo(0,y);}}}catch(e){}setTimeout(refresh,next());}"
        "document.addEventListener('DOMContentLoaded',function(){"
        "const n=document.querySelector('[data-field=\"numbers-state\"]');"
        "window.kdqFirstNumbers=[document.body.dataset.numbers,n?n.textContent:null];setTimeout(refresh,next());});"
    )
    return f"(function(){{const every={int(seconds * 1000)},soon={int(catch_up_seconds * 1000)};{body}}})();"


def _numbers_note(model: PageModel) -> str:
    """How current the numbers are: the page shows what the server has at once and renews it."""
    if model.numbers == "none":
        return ' <span data-field="numbers-state">Asking the SQL endpoint for the numbers…</span>'
    age = ""
    if model.numbers_ms is not None and model.now_ms is not None:
        age = f" {max(0.0, (model.now_ms - model.numbers_ms) / 1000):.0f} s ago"
    word = "current" if model.numbers == "fresh" else "updating"
    return f' <span data-field="numbers-state">Numbers {word}: read{age}.</span>'


def render_page(model: PageModel, refresh_seconds: float = REFRESH_SECONDS) -> str:
    page = model.page
    if model.sql_error:
        source = (
            f'<div class="alert" data-field="sql-error"><b>Counts, reasons and corrections are not available:</b> '
            f"{escape(model.sql_error)}<br>The page reads them through kdq's SQL endpoint (Spark Connect), "
            "which <code>make run</code> and <code>kdq up</code> start; <code>kdq status</code> shows it. "
            "Stream health below is read from the stream's own state files.</div>"
        )
    elif model.numbers == "none":
        source = f'<p class="muted" data-field="sql-pending">{_numbers_note(model)}</p>'
    else:
        took = "" if model.query_seconds is None else f" in {model.query_seconds:.1f} s"
        source = (
            f'<p class="muted" data-field="sql-source">Counts from the Delta tables through the SQL endpoint '
            f"{escape(model.sql_source or '')}{took}.{_numbers_note(model)}</p>"
        )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>kdq data quality</title>'
        f"<style>{CSS}</style><script>{_refresh_script(refresh_seconds)}</script></head>"
        f'<body data-numbers="{model.numbers}" data-lagging="{escape(" ".join(sorted(model.lagging)))}">'
        "<h1>kdq: data quality per topic</h1>"
        f'<p class="muted" data-field="as-of" data-now-ms="{page.now_ms}">As of {_iso(page.now_ms)}; '
        f"last hour = windows from {_iso(page.hour_from_ms)}, last day = windows from {_iso(page.day_from_ms)} "
        f"(event time, window start). The page refreshes itself every {refresh_seconds:g} s; "
        f'stream health as of <span data-field="page-ms" data-now-ms="{model.now_ms}">{_iso(model.now_ms)}</span>.</p>'
        f"{source}<h2>Incidents{_as_of(model.lagging, 'incidents')}</h2>{_incidents(model)}"
        f"<h2>Topics</h2>{_overview(model)}<h2>Stream</h2>{_stream(model.stream)}"
        f"<h2>DAG runs</h2>{_dag_runs(model.dag_runs, model.dag_ids)}"
        f"{''.join(_topic_section(t, _counted(model), model.lagging) for t in model.topics)}</body></html>"
    )
