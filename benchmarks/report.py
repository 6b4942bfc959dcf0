"""The result as a Markdown table and a small PNG plot."""

from __future__ import annotations

from pathlib import Path

# Issue 24's targets (the speed layer at the peer's speed): catch-up and ratio to Kafka Streams on the orders
# rule; the other rule sets against it; p99 produce -> visible at 5,000 and 20,000 msgs/s; peak RSS; the same
# messages over 1,000 active topics: throughput against the 4-topic run's, p99 against its p99 at the same rate.
TARGETS = {
    "throughput_msgs_per_s": 60_000,
    "p99_s": {5_000: 3.0, 20_000: 5.0},
    "rss_gb": 3.0,
    "batch_growth_ratio": 1.5,
    "vs_kstreams": 1.0,
    "refs": 0.95,
    "many": 0.95,
    "summaries": 0.85,
    "topics1000": 0.80,
    "topics1000_p99_ratio": 1.5,
    "avro": 1.0,  # issue 28: the orders as Avro through the registry at least as fast as the JSON orders rule
}


def _n(x, digits: int = 0) -> str:
    if x is None:
        return "–"
    return f"{x:,.{digits}f}"


def _gb(b) -> str:
    return f"{b / 2**30:.2f} GB" if b else "–"


KSTREAMS_NAME = "Kafka Streams (exactly_once_v2, networknt, 1 s windows, RocksDB; jvm/kstreams-baseline)"


def kstreams_ratio(run: dict) -> tuple[float, dict] | None:
    """kdq's catch-up msgs/s ÷ the Kafka Streams baseline's best run of the same run, with that run."""
    from benchmarks.kstreams import best, ratio

    r = ratio((run.get("catch_up") or {}).get("msgs_per_s"), run.get("kstreams", []))
    return (r, best(run["kstreams"])) if r is not None else None


def _best(run: dict, kind: str, processes: int | None = None) -> dict | None:
    rows = [b for b in run.get("baselines", []) if b["kind"] == kind and (processes is None or b["processes"] == processes)]
    return max(rows, key=lambda b: b["msgs_per_s"]) if rows else None


RULE_TITLES = {
    "orders": "with the `orders` JSON Schema rule",
    "refs": "with the orders rule written with `$ref` + `oneOf` + `format`",
    "many": "with 1,000 topic rules, each topic its own schema",
    "summaries": "with the `orders` rule plus two streaming summaries",
    "avro": "the orders as Avro in Confluent's wire format, judged through the Schema Registry (`registry = true`)",
}


def _encoding(run: dict) -> str:
    return "Avro" if run.get("workload", {}).get("encoding") == "avro" else "JSON"


def avro_comparison(result: dict) -> dict | None:
    """The avro variant beside the JSON orders rule's run of the same result: catch-up msgs/s (the target: ratio ≥
    1.0), steady msgs/s, MB/s, classify + aggregate per batch, and the plain consumers' best (what decoding costs
    without kdq). None when either run is missing."""
    runs = [r for r in result.get("runs", []) if r.get("schema") and r.get("catch_up")]
    json_run = next((r for r in runs if (r.get("rule") or "orders") == "orders"), None)
    avro_run = next((r for r in runs if r.get("rule") == "avro"), None)
    if not json_run or not avro_run:
        return None

    def side(run: dict) -> dict:
        cu = run["catch_up"]
        plain = _best(run, "plain")
        return {
            "messages": cu.get("messages"),
            "batches": cu.get("batches"),
            "msgs_per_s": cu["msgs_per_s"],
            "steady_msgs_per_s": cu.get("steady_msgs_per_s"),
            "mb_per_s": cu.get("mb_per_s"),
            "message_bytes": round(run["baselines"][0]["bytes"] / run["baselines"][0]["messages"]) if run.get("baselines") else None,
            # The one-pass count path names the step classify_archive; earlier results classify_aggregate.
            "classify_ms": next((v for k, v in (cu.get("writer_ms_mean") or {}).items()
                                 if k in ("classify_archive", "classify_aggregate")), None),
            "plain_msgs_per_s": plain["msgs_per_s"] if plain else None,
            "plain_processes": plain["processes"] if plain else None,
            "checks_ok": all((run.get("checks") or {}).get(k, k == "reasons_match_expected") for k in (
                "exactly_once", "archive_matches_expected", "counted_matches", "reasons_match_expected")),
        }

    ratio = avro_run["catch_up"]["msgs_per_s"] / json_run["catch_up"]["msgs_per_s"]
    return {"json": side(json_run), "avro": side(avro_run), "ratio": round(ratio, 3), "target": TARGETS["avro"],
            "met": ratio >= TARGETS["avro"]}


# Below this many messages per run the Avro/JSON ratio is not a throughput comparison (one small micro-batch).
SMOKE_MESSAGES = 200_000


def _avro_section(c: dict) -> list[str]:
    j, a = c["json"], c["avro"]

    def row(name: str, f) -> str:
        return f"| {name} | {f(j)} | {f(a)} |"

    return [
        "### Avro through the Schema Registry vs the JSON orders rule (same run)",
        "",
        "| | JSON, `orders` rule | Avro, `registry = true` |",
        "|---|---:|---:|",
        row("**kdq catch-up msgs/s**", lambda s: f"**{_n(s['msgs_per_s'])}**"),
        row("steady msgs/s", lambda s: _n(s["steady_msgs_per_s"])),
        row("MB/s (message bytes)", lambda s: f"{_n(s['mb_per_s'], 1)} ({_n(s['message_bytes'])} B)"),
        row("classify (+ archive) per steady batch, ms", lambda s: _n(s["classify_ms"])),
        row("plain consumer, best (no kdq)", lambda s: f"{_n(s['plain_msgs_per_s'])} (×{s['plain_processes']})"),
        row("counts = ground truth, exactly once", lambda s: "yes" if s["checks_ok"] else "**no**"),
        "",
        f"Avro ÷ JSON: **{c['ratio']:.3f}×** (target ≥ {c['target']:.2f}×: {'met' if c['met'] else '**not met**'})"
        + (f"; backlogs under {SMOKE_MESSAGES:,} messages are mostly a micro-batch's fixed cost and JIT warm-up: a "
           "smoke check, not a comparison (use the default size)."
           if min(j["messages"] or 0, a["messages"] or 0) < SMOKE_MESSAGES else ".")
        + ("" if j["steady_msgs_per_s"] and a["steady_msgs_per_s"] else
           " No steady figure: a run of one micro-batch (--max-offsets-per-trigger below --messages gives several)."),
        "",
    ]


def _rule_title(run: dict) -> str:
    if not run.get("schema"):
        return "without a rule (valid = UTF-8 JSON)"
    if run.get("rule") == "topics1000":
        w = run["workload"]
        return (f"with the `orders` rule over {w['topics']:,} active topics × {w['partitions']} partition "
                "(the same messages and bytes, every topic receiving records)")
    return RULE_TITLES.get(run.get("rule") or "orders", str(run.get("rule")))


def targets(result: dict) -> list[tuple[str, str, str]]:
    """(target, measured, met?) rows."""
    out = []
    runs = [r for r in result.get("runs", []) if r.get("schema") and (r.get("rule") or "orders") == "orders"]
    run = runs[0] if runs else None
    if run and "catch_up" in run:
        cu = run["catch_up"]
        out.append((
            f"speed layer ≥ {_n(TARGETS['throughput_msgs_per_s'])} msgs/s (1 KB JSON, orders rule, catch-up)",
            f"{_n(cu['msgs_per_s'])} msgs/s (steady {_n(cu['steady_msgs_per_s'])})",
            "yes" if cu["msgs_per_s"] >= TARGETS["throughput_msgs_per_s"] else "no",
        ))
        plain = _best(run, "plain", max((b["processes"] for b in run["baselines"]), default=None))
        if plain:
            ratio = cu["msgs_per_s"] / plain["msgs_per_s"]
            out.append((
                "(no target) against the plain-consumer baseline (same cores)",
                f"{ratio:.2f}× plain ×{plain['processes']} ({_n(plain['msgs_per_s'])} msgs/s)",
                "—",
            ))
        ks = kstreams_ratio(run)
        if ks:
            ratio, b = ks
            out.append((
                "≥ 1.0× the Kafka Streams baseline's best (same run, same topics)",
                f"{ratio:.2f}× Kafka Streams, {b['threads']} threads ({_n(b['msgs_per_s'])} msgs/s)",
                "yes" if ratio >= TARGETS["vs_kstreams"] else "no",
            ))
    phases = [lp for lp in (run or {}).get("latency_phases", []) if lp.get("latency_s")]
    for lp in phases:
        limit = TARGETS["p99_s"].get(lp["target_msgs_per_s"])
        p99 = lp["latency_s"].get("p99")
        bound = "≥ " if lp.get("records_censored") else ""
        out.append((
            f"end-to-end p99 ≤ {limit:g} s at {_n(lp['target_msgs_per_s'])} msgs/s" if limit is not None
            else f"(no target) end-to-end p99 at {_n(lp['target_msgs_per_s'])} msgs/s",
            f"p99 {bound}{p99:.2f} s (p50 {lp['latency_s']['p50']:.2f} s)",
            "—" if limit is None else "yes" if p99 is not None and not bound and p99 <= limit else "no",
        ))
    by_rule = {r.get("rule"): r for r in result.get("runs", []) if r.get("schema") and "catch_up" in r}
    if run and "catch_up" in run:
        base = run["catch_up"]["msgs_per_s"]
        if "refs" in by_rule:
            ratio = by_rule["refs"]["catch_up"]["msgs_per_s"] / base
            out.append((
                f"a rule with `$ref` + `oneOf` + `format` ≥ {TARGETS['refs']:.0%} of the orders rule's throughput",
                f"{ratio:.0%} ({_n(by_rule['refs']['catch_up']['msgs_per_s'])} msgs/s)",
                "yes" if ratio >= TARGETS["refs"] else "no",
            ))
        if "many" in by_rule:
            ratio = by_rule["many"]["catch_up"]["msgs_per_s"] / base
            out.append((
                f"1,000 topic rules ≥ {TARGETS['many']:.0%} of the orders rule's throughput",
                f"{ratio:.0%} ({_n(by_rule['many']['catch_up']['msgs_per_s'])} msgs/s)",
                "yes" if ratio >= TARGETS["many"] else "no",
            ))
        if "summaries" in by_rule:
            ratio = by_rule["summaries"]["catch_up"]["msgs_per_s"] / base
            out.append((
                f"two streaming summaries over every record ≥ {TARGETS['summaries']:.0%} of the orders rule's throughput",
                f"{ratio:.0%} ({_n(by_rule['summaries']['catch_up']['msgs_per_s'])} msgs/s)",
                "yes" if ratio >= TARGETS["summaries"] else "no",
            ))
        if "topics1000" in by_rule:
            out += _active_topics_rows(run, by_rule["topics1000"])
        if "avro" in by_rule:
            ratio = by_rule["avro"]["catch_up"]["msgs_per_s"] / base
            out.append((
                f"the orders as Avro through the Schema Registry ≥ {TARGETS['avro']:.0%} of the JSON orders rule's throughput",
                f"{ratio:.0%} ({_n(by_rule['avro']['catch_up']['msgs_per_s'])} vs {_n(base)} msgs/s)",
                "yes" if ratio >= TARGETS["avro"] else "no",
            ))
    if run and run.get("peak_rss"):
        out.append((
            f"driver + JVM peak RSS ≤ {TARGETS['rss_gb']:g} GB",
            _gb(run["peak_rss"]),
            "yes" if run["peak_rss"] <= TARGETS["rss_gb"] * 2**30 else "no",
        ))
    if "batch" in result:
        b = result["batch"]
        out.append((
            "hourly recompute grows ≤ 1.5× when the archive grows 20×",
            f"{b['time_ratio']:.2f}× for {b['growth']:.0f}× archive",
            "yes" if b["time_ratio"] <= TARGETS["batch_growth_ratio"] else "no",
        ))
    return out


def _active_topics_rows(run: dict, variant: dict) -> list[tuple[str, str, str]]:
    """The topics1000 variant against the main orders run: catch-up msgs/s ratio; p99 ratio at the variant's
    latency rate (5,000 msgs/s), "not measured" when either run has no such phase."""
    topics = f"{variant['workload']['topics']:,} active topics"
    ratio = variant["catch_up"]["msgs_per_s"] / run["catch_up"]["msgs_per_s"]
    out = [(
        f"{topics} ≥ {TARGETS['topics1000']:.0%} of the {run['workload']['topics']}-topic throughput (same messages and bytes)",
        f"{ratio:.0%} ({_n(variant['catch_up']['msgs_per_s'])} vs {_n(run['catch_up']['msgs_per_s'])} msgs/s)",
        "yes" if ratio >= TARGETS["topics1000"] else "no",
    )]
    mine = next((lp for lp in variant.get("latency_phases", []) if lp.get("latency_s")), None)
    rate = mine["target_msgs_per_s"] if mine else 5_000
    base = next((lp for lp in run.get("latency_phases", []) if lp.get("latency_s") and lp["target_msgs_per_s"] == rate), None)
    target = (f"{topics}: p99 at {_n(rate)} msgs/s ≤ {TARGETS['topics1000_p99_ratio']:g}× the "
              f"{run['workload']['topics']}-topic p99")
    if not mine or not base or not base["latency_s"].get("p99"):
        missing = "this variant" if not mine else f"the {run['workload']['topics']}-topic run"
        out.append((target, f"not measured (no {_n(rate)} msgs/s phase in {missing})", "—"))
        return out
    p99, p99_base = mine["latency_s"]["p99"], base["latency_s"]["p99"]
    # A censored phase's p99 is a lower bound: the variant's makes the ratio one, the main run's an upper one.
    bound = "≥ " if mine.get("records_censored") else "≤ " if base.get("records_censored") else ""
    ratio = p99 / p99_base
    out.append((
        target,
        f"{bound}{ratio:.2f}× (p99 {'≥ ' if mine.get('records_censored') else ''}{p99:.2f} s vs "
        f"{'≥ ' if base.get('records_censored') else ''}{p99_base:.2f} s)",
        "yes" if ratio <= TARGETS["topics1000_p99_ratio"] and not mine.get("records_censored") else "no",
    ))
    return out


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"## kdq benchmark ({result['started_at']})",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB RAM; {m['os']}. "
        f"Python {m['python']}, {m['java']}, PySpark {m['pyspark']}, Delta {m['delta']}, Kafka broker {m['kafka_broker']} "
        f"(Spark's client {m['spark_kafka_clients']}), confluent-kafka {m['confluent_kafka']} / librdkafka {m['librdkafka']}. "
        f"Broker, Spark, generator and baselines share the machine"
        + (
            f"; **other jobs were running too** (≈ {m.get('other_load_cores', 0):.2f} cores on average, load average "
            f"{m['load_average_at_start']} at start), so treat figures as lower bounds."
            if result.get("shared_machine")
            else f" (no other load seen: {m.get('other_load_cores', 0):.2f} cores)."
        ),
        "",
        f"Command: `{result['command']}` ({result.get('duration_seconds', 0) / 60:.1f} min)." + (f" {result['note']}" if result.get("note") else ""),
        "",
    ]
    for run in result.get("runs", []):
        w = run["workload"]
        lines += [
            f"### Speed layer vs baselines: {_rule_title(run)}",
            "",
            f"Workload: {w['messages']:,} messages of ≈ {w['message_bytes']:,} B {_encoding(run)}, {w['topics']} topics × {w['partitions']} partitions, "
            f"{w['invalid_ratio']:.0%} invalid, {w['out_of_order']:.0%} out of order, {w['late']:.0%} late; produced at "
            f"{_n(run['produce']['msgs_per_s'])} msgs/s and verified before timing. Stream: trigger {run['stream_settings']['trigger_seconds']} s, "
            f"maxOffsetsPerTrigger {run['stream_settings']['max_offsets_per_trigger']:,}, {run['stream_settings']['master']}, "
            f"{run['stream_settings']['shuffle_partitions']} shuffle partitions.",
            "",
            "| consumer (same data, same run) | processes | msgs/s | MB/s | kdq ÷ this |",
            "|---|---:|---:|---:|---:|",
        ]
        cu = run.get("catch_up")
        for b in run["baselines"]:
            name = ("raw consumption ceiling (confluent-kafka, no work)" if b["kind"] == "raw"
                    else "plain consumer (confluent-kafka + wire header + fastavro + dict counts)" if _encoding(run) == "Avro"
                    else "plain consumer (confluent-kafka + json + fastjsonschema + dict counts)")
            ratio = f"{cu['msgs_per_s'] / b['msgs_per_s']:.2f}" if cu else "–"
            lines.append(f"| {name} | {b['processes']} | {_n(b['msgs_per_s'])} | {_n(b['mb_per_s'], 1)} | {ratio} |")
        for k in run.get("kstreams", []):
            if not k.get("msgs_per_s"):
                lines.append(f"| {KSTREAMS_NAME} | 1 JVM, {k['threads']} threads | failed: {k.get('error', '?')} | – | – |")
                continue
            ratio = f"{cu['msgs_per_s'] / k['msgs_per_s']:.2f}" if cu else "–"
            lines.append(
                f"| {KSTREAMS_NAME} | 1 JVM, {k['threads']} threads | {_n(k['msgs_per_s'])} | {_n(k.get('mb_per_s'), 1)} | {ratio} |"
            )
        if cu:
            lines.append(
                f"| **kdq speed layer** (Spark {run['stream_settings']['master']}, all outputs, exactly once) | 1 JVM | "
                f"**{_n(cu['msgs_per_s'])}** (steady {_n(cu['steady_msgs_per_s'])}) | {_n(cu['mb_per_s'], 1)} | 1.00 |"
            )
            c = cu["cpu"]
            lines += [
                "",
                f"Catch-up: {cu['messages']:,} messages in {cu['batches']} micro-batches, {cu['seconds']} s from the first batch's start to the "
                f"last one's end ({cu['wall_seconds_incl_startup']} s including JVM start-up; first batch {cu['first_batch_seconds']} s). "
                f"CPU: stream {c['stream_cores']} cores, broker {c['broker_cores']}, machine {c['machine_cores']} of {m['cores']}. "
                f"Peak RSS (driver JVM + Python): {_gb(run.get('catch_up_peak_rss'))}.",
                "",
                "Mean per steady batch (ms): " + ", ".join(f"{k} {v:,.0f}" for k, v in cu["writer_ms_mean"].items()) + ".",
            ]
        checks = run.get("checks")
        if checks:
            lines += [
                "",
                f"Checks: archive rows = messages (exactly once): {checks['exactly_once']}; valid/invalid = ground truth: "
                f"{checks['archive_matches_expected']}; window counts = counted rows: {checks['counted_matches']}; "
                f"plain consumer = ground truth: {all(b.get('matches_expected', True) for b in run['baselines'])}"
                + (f"; each Avro kind's reason in the archive = the kinds produced: {checks['reasons_match_expected']}"
                   if "reasons_match_expected" in checks else "") + ".",
            ]
        if run.get("rule") == "topics1000":
            lines += ["", "Kafka Streams: not run on these topics (its baseline runs on the orders-rule topics only, "
                      "as for the other rule variants)."]
        done = [k for k in run.get("kstreams", []) if k.get("checks")]
        if done:
            c0 = done[0]["checks"]
            lines += [
                "",
                "Kafka Streams: " + "; ".join(
                    f"{k['threads']} threads: {k['seconds']} s from RUNNING to offsets committed at the end of the input and "
                    f"repartition topics ({k['startup_seconds']} s JVM start-up before), {k['cpu_cores']} cores, "
                    f"peak RSS {_gb(k.get('peak_rss'))}, counts = ground truth: {k['checks']['ok']}"
                    for k in done
                ) + f". Ground truth: verdicts by topic and status exact, every on-time record counted, "
                f"counted + dropped as late = messages ({c0['counted']['valid']:,} valid + {c0['counted']['invalid']:,} invalid "
                f"counted in {c0['windows']:,} windows, {c0.get('dropped_late', 0):,} of the {c0['late_in_workload']:,} late "
                "records dropped as later than the grace).",
            ]
        phases = [lp for lp in run.get("latency_phases", []) if lp.get("latency_s")]
        if phases:
            lines += [
                "",
                "| fixed-rate phase: produce → count visible in Delta | msgs/s | p50 | p95 | p99 | max | peak RSS | stream CPU | broker CPU |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            ]
            notes = []
            for lp in phases:
                L, c = lp["latency_s"], lp["cpu"]
                bound = "≥ " if lp.get("records_censored") else ""
                lines.append(
                    f"| {_n(lp['seconds'])} s at {_n(lp['target_msgs_per_s'])} msgs/s | {_n(lp['achieved_msgs_per_s'])} | "
                    f"{L['p50']:.2f} s | {bound}{L['p95']:.2f} s | {bound}{L['p99']:.2f} s | {bound}{L['p100']:.2f} s | "
                    f"{_gb(lp['peak_rss'])} | {c['stream_cores']} cores | {c['broker_cores']} cores |"
                )
                if lp.get("records_censored"):
                    notes.append(
                        f"At {_n(lp['target_msgs_per_s'])} msgs/s **the stream did not keep up**: {lp['records_censored']:,} records "
                        "were not visible when it was stopped; they count at their lower bound, so the upper percentiles are lower bounds."
                    )
                elif lp["achieved_msgs_per_s"] > ((cu or {}).get("steady_msgs_per_s") or (cu or {}).get("msgs_per_s") or 0):
                    notes.append(
                        f"At {_n(lp['target_msgs_per_s'])} msgs/s the rate is above the stream's sustained throughput: "
                        "the latency is the backlog building up during the phase, drained afterwards."
                    )
            lines += ["", f"{sum(lp['records_measured'] for lp in phases):,} counted records measured (late ones are left to the "
                      f"batch layer); exactly once: {all(lp['exactly_once'] for lp in phases if lp['drained'])}. " + " ".join(notes)]
        lines.append("")
    if "batch" in result:
        b = result["batch"]
        lines += [
            "### Batch layer: hourly recompute, fixed late data, growing archive",
            "",
            f"Archive synthesized at {b['rows_per_hour']:,} rows/hour (older hours added as it grows), short values; "
            "each run recomputes one hour of ingest time with its late records.",
            "",
            "| archive rows | late rows | late windows | corrections | late-rows scan: files / of total | bytes | recompute scan: files | bytes | seconds |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for s in b["stages"]:
            if s["warm_up"]:
                continue
            lines.append(
                f"| {s['archive_rows']:,} | {s['late_rows']:,} | {s['late_windows']:,} | {s['corrections']:,} | "
                f"{s['scanned_late_rows']['files']} / {s['archive_total']['files']} | {s['scanned_late_rows']['bytes'] / 1e6:.1f} MB of "
                f"{s['archive_total']['bytes'] / 1e6:.0f} MB | {s['scanned_recompute']['files']} | {s['scanned_recompute']['bytes'] / 1e6:.1f} MB | {s['seconds']} |"
            )
        lines += ["", f"Time ratio largest / smallest archive: **{b['time_ratio']}×** for a {b['growth']}× larger archive.", ""]
    comparison = avro_comparison(result)
    if comparison:
        lines += _avro_section(comparison)
    rows = targets(result)
    if rows:
        lines += ["### Targets", "", "| target | measured | met |", "|---|---|---|"]
        lines += [f"| {t} | {v} | {ok} |" for t, v, ok in rows]
        lines.append("")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), dpi=80)
    run = next((r for r in result.get("runs", []) if r.get("catch_up")), None)
    ax = axes[0]
    if run:
        names, values, colors = [], [], []
        for b in run["baselines"]:
            names.append(f"{b['kind']} ×{b['processes']}")
            values.append(b["msgs_per_s"])
            colors.append("#bbbbbb" if b["kind"] == "raw" else "#8fb3d9")
        for k in run.get("kstreams", []):
            if k.get("msgs_per_s"):
                names.append(f"kstreams ×{k['threads']}t")
                values.append(k["msgs_per_s"])
                colors.append("#5cb85c")
        names.append("kdq")
        values.append(run["catch_up"]["msgs_per_s"])
        colors.append("#d9534f")
        ax.barh(names, values, color=colors)
        ax.axvline(TARGETS["throughput_msgs_per_s"], color="black", linestyle=":", linewidth=1)
        ax.set_xlabel("msgs/s (1 KB JSON)")
        ax.set_title("Throughput (catch-up)")
    ax = axes[1]
    phases = [lp for lp in (run or {}).get("latency_phases", []) if lp.get("latency_s")]
    if phases:
        qs = ["p50", "p95", "p99"]
        width = 0.8 / len(phases)
        for i, lp in enumerate(phases):
            xs = [j + i * width for j in range(len(qs))]
            ax.bar(xs, [lp["latency_s"][q] for q in qs], width=width, label=f"{lp['target_msgs_per_s']:,}/s")
        ax.set_xticks([j + width * (len(phases) - 1) / 2 for j in range(len(qs))], qs)
        ax.axhline(5, color="black", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.legend(fontsize=8)
        ax.set_ylabel("seconds (log)")
        ax.set_title("Latency produce → Delta")
    ax = axes[2]
    if "batch" in result:
        stages = [s for s in result["batch"]["stages"] if not s["warm_up"]]
        ax.plot([s["archive_rows"] / 1e6 for s in stages], [s["seconds"] for s in stages], marker="o")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("archive rows (millions)")
        ax.set_ylabel("seconds")
        ax.set_title("Hourly recompute, fixed late data")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
