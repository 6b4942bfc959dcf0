"""Human-readable speed-layer status from its heartbeat and progress files (no Spark import)."""

from __future__ import annotations

import json
import time

from kdq.config import Config


def _read(path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def stream_status(config: Config) -> dict:
    folder = config.data_dir / "stream"
    return {
        "heartbeat": _read(folder / "heartbeat.json"),
        "progress": _read(folder / "progress.json"),
        "influx_push": _read(folder / "influx_push_state.json") or {"pending_since_ms": None},
        "current_batch": _read(folder / "current_batch.json"),
        "batch_failure": _read(folder / "batch_failure.json"),
    }


def heartbeat_age_seconds(config: Config) -> float | None:
    beat = stream_status(config)["heartbeat"]
    if not beat or beat.get("state") != "running":
        return None
    return max(0.0, time.time() - beat["time_ms"] / 1000)


def describe_stream(config: Config) -> list[str]:
    from kdq.stream_process import stream_process

    status = stream_status(config)
    running = stream_process(config).running()
    beat, progress = status["heartbeat"], status["progress"]
    if beat is None:
        return [f"{'stream':<10} {'-':<28} never started (kdq stream --detach)"]
    age = time.time() - beat["time_ms"] / 1000
    lines = [
        f"{'stream':<10} {'pid ' + str(beat.get('pid')):<28} "
        f"{'running' if running else 'not running'}; heartbeat {age:.0f}s ago ({beat.get('state')})"
    ]
    if progress:
        lines.append(
            f"{'':<10} batch {progress['batch_id']}: {progress['input_rows']} rows, "
            f"{progress.get('processed_rows_per_second') or 0:.0f} rows/s, "
            f"{progress['duration_ms'].get('triggerExecution', 0)} ms; "
            f"lag {sum((progress.get('consumer_lag') or {}).values())} msgs; "
            f"late rows {sum((progress.get('late_rows') or {}).values())}"
        )
    lines += _batch_lines(config, running)
    pending = status["influx_push"].get("pending_since_ms")
    if pending:
        lines.append(f"{'':<10} InfluxDB push pending since {pending} (the hourly catch-up pushes it)")
    return lines


def _batch_lines(config: Config, running: bool) -> list[str]:
    """The batch in flight (flagged HUNG past stream.max_batch_seconds), a recorded failure, the quarantine."""
    from kdq import batch_failures

    lines = []
    limit = config.stream.max_batch_seconds
    current = batch_failures.running_batch(config) if running else None
    if current is not None and current["batch_id"] is not None:
        flag = f"HUNG (> stream.max_batch_seconds = {limit:.0f}s)" if current["seconds"] > limit else "running"
        lines.append(f"{'':<10} batch {current['batch_id']} {flag} for {current['seconds']:.0f}s")
    failure = batch_failures.read_failure(config)
    if failure is not None:
        blocked = batch_failures.blocked(config, config.stream.max_batch_failures) is not None
        first = failure["error"].splitlines()[0][:200] if failure.get("error") else ""
        lines.append(
            f"{'':<10} batch {failure['batch_id']} {'hung' if failure.get('kind') == 'hung' else 'failed'} "
            f"{failure['attempts']}x in a row{' - BLOCKED, see `kdq stream-failure`' if blocked else ''}: {first}"
        )
    quarantined = batch_failures.read_quarantine(config)
    if quarantined:
        lines.append(f"{'':<10} {len(quarantined)} quarantined offset range(s) (kdq stream-failure lists them)")
    return lines
