"""The speed layer as a local background process: start detached via spark-submit, stop gracefully."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from kdq.config import Config
from kdq.procs import ManagedProcess
from kdq.stream import failures
from kdq.stream import state as stream_state


def stream_process(config: Config) -> ManagedProcess:
    from kdq.spark.submit import process_marker

    folder = stream_state.state_dir(config)
    return ManagedProcess(
        name="stream",
        pid_file=folder / stream_state.STREAM_PID,
        log_file=folder / stream_state.STREAM_LOG,
        # A fragment of the very command line start_stream runs (the warehouse dir: under the data folder, or
        # paths.storage_uri); the pid file says which process, the marker that it is still ours.
        marker=process_marker(config, "stream_counts"),
    )


def child_env(config: Config, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "TZ": "UTC",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }
    if config.source != "defaults":
        env["KDQ_CONFIG"] = config.source
    return {**env, **(extra or {})}


def start_stream(config: Config, job_args: list[str] | None = None, extra_env: dict[str, str] | None = None) -> int:
    """Start the speed layer detached (no-op if it already runs); returns its pid."""
    from kdq.spark.submit import submit_command

    process = stream_process(config)
    command = submit_command(config, "stream_counts", job_args or [], app_name="kdq-speed-layer")
    return process.start(command, env=child_env(config, extra_env), cwd=config.base_dir)


def stop_stream(config: Config, timeout: float = 150.0) -> bool:
    """SIGTERM: the job finishes its current micro-batch, then exits; SIGKILL after ``timeout``."""
    return stream_process(config).stop(timeout=timeout, graceful_child="stream_counts.py")


def describe_stream(config: Config) -> list[str]:
    """The stream's lines of `kdq status`: process, heartbeat, last batch, a hung or failing batch, pending pushes."""
    status = stream_state.stream_status(config)
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
        latency = progress.get("end_to_end_latency_ms")
        if latency:
            lines.append(
                f"{'':<10} end-to-end latency (Kafka timestamp → counts in Delta) at batch {progress['batch_id']}: "
                f"oldest record {latency['oldest'] / 1000:.1f}s, newest {latency['newest'] / 1000:.1f}s"
            )
    lines += _batch_lines(config, running)
    pending = status["influx_push"].get("pending_since_ms")
    if pending:
        lines.append(f"{'':<10} InfluxDB push pending since {pending} (the hourly catch-up pushes it)")
    return lines


def _batch_lines(config: Config, running: bool) -> list[str]:
    """The batch in flight (flagged HUNG past stream.max_batch_seconds), a recorded failure, the quarantine."""
    lines = []
    configured = config.stream.max_batch_seconds
    current = failures.running_batch(config) if running else None
    if current is not None and current["batch_id"] is not None:
        limit = failures.hung_limit(config, current["batch_id"], configured)
        grown = "" if limit == configured else f", this attempt's limit {limit:.0f}s"
        flag = f"HUNG (> stream.max_batch_seconds = {configured:.0f}s{grown})" if current["seconds"] > limit else "running"
        lines.append(f"{'':<10} batch {current['batch_id']} {flag} for {current['seconds']:.0f}s")
    failure = failures.read_failure(config)
    if failure is not None:
        blocked = failures.blocked(config, config.stream.max_batch_failures) is not None
        first = failure["error"].splitlines()[0][:200] if failure.get("error") else ""
        if failure.get("kind") == "transient":
            counted = f"; {failure['attempts']} counted failure(s)" if failure.get("attempts") else ""
            lines.append(
                f"{'':<10} batch {failure['batch_id']} failed transiently {failure.get('transient_attempts', 1)}x "
                f"(the environment, not the batch: restarted with backoff, never blocks{counted}): {first}"
            )
        else:
            lines.append(
                f"{'':<10} batch {failure['batch_id']} {'hung' if failure.get('kind') == 'hung' else 'failed'} "
                f"{failure['attempts']}x in a row{' - BLOCKED, see `kdq stream-failure`' if blocked else ''}: {first}"
            )
    refusal = stream_state.read_refusal(config)
    if refusal is not None and not running:
        lines.append(f"{'':<10} driver {refusal.get('kind', 'refused')} at {refusal.get('time_ms')}: "
                     f"{str(refusal.get('message'))[:300]}")
    quarantined = failures.read_quarantine(config)
    if quarantined:
        lines.append(f"{'':<10} {len(quarantined)} quarantined offset range(s) (kdq stream-failure lists them)")
    return lines
