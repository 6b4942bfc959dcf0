"""The speed layer under load: the real ``spark_jobs/stream_counts.py`` started with spark-submit
(``kdq.spark.stream_process.start_stream``), catching up on a pre-loaded backlog, then fed at a fixed rate.

Its own process tree is sampled for CPU and RSS (driver JVM + Python driver +
any Python workers); throughput comes from its progress records
(``<data_dir>/stream/progress.jsonl``); latency from the raw archive (each
record's batch id and produce time, carried in its key) and the commit times
of the window-count MERGEs in the Delta log.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

from benchmarks.measure import ProcessSampler
from kdq.config import Config, load_config

log = logging.getLogger("kdq.bench")
# Where a failed run's whole stream log is kept: the run's work dir (and the log in it) is removed at the end,
# and the cause of a failed micro-batch is often far above the last lines the error message quotes.
FAILED_LOGS = Path(__file__).resolve().parents[1] / "test-artifacts" / "bench-failed-streams"


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(str(value))


def write_config(config: Config, path: Path) -> Config:
    """Persist a Config as TOML (absolute paths) so the spark-submit child loads exactly these settings."""
    lines = []
    for name in ("paths", "kafka", "spark", "stream", "influxdb"):
        lines.append(f"[{name}]")
        for key, value in getattr(config, name).model_dump().items():
            if name == "paths" and isinstance(value, Path):  # folders; not paths.storage_uri (a URI or empty)
                value = str(config.path(value))
            lines.append(f"{key} = {_toml_value(value)}")
    registry = config.registry.model_dump(exclude_defaults=True)
    if registry:  # the avro variant's registry.url (the stack's registry: the stream's data folder records none)
        lines.append("[registry]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in registry.items()]
    for summary in config.summaries:
        lines.append("[[summaries]]")
        for key, value in summary.model_dump(exclude_none=True).items():
            lines.append(f"{key} = {_toml_value(value)}")
    path.write_text("\n".join(lines) + "\n")
    return load_config(path=path, env={})


def read_progress(config: Config) -> list[dict]:
    path = config.data_dir / "stream" / "progress.jsonl"
    records = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written
    return records


def consumed(progress: list[dict], topics: list[str]) -> int:
    """Records read so far from ``topics``: the latest batch's end offsets (offsets start at 0 in fresh topics)."""
    if not progress:
        return 0
    latest = max(progress, key=lambda p: p["batch_id"])
    ends = latest.get("end_offsets") or {}
    return sum(int(off) for t in topics for off in (ends.get(t) or {}).values())


class StreamRun:
    """One speed-layer process: start, wait for offsets, stop; sampled throughout."""

    def __init__(self, config: Config, trigger_seconds: float | None) -> None:
        self.config = config
        self.trigger_seconds = trigger_seconds
        self.pid: int | None = None
        self.sampler: ProcessSampler | None = None
        self.started = 0.0

    def start(self) -> None:
        from kdq.spark.stream_process import start_stream

        args = [] if self.trigger_seconds is None else ["--trigger-seconds", str(self.trigger_seconds)]
        self.started = time.monotonic()
        self.pid = start_stream(self.config, args)
        self.sampler = ProcessSampler(self.pid).start()
        log.info("speed layer started (pid %d), log %s", self.pid, self.config.data_dir / "stream" / "stream.log")

    def alive(self) -> bool:
        from kdq.spark.stream_process import stream_process

        return stream_process(self.config).running()

    def log_tail(self, lines: int = 40) -> str:
        from kdq.spark.stream_process import stream_process

        return stream_process(self.config).log_tail(lines)

    def keep_log(self, folder: Path = FAILED_LOGS) -> Path | None:
        """Copy the stream's whole log (and its batch-failure record) out of the work dir; the copy's path."""
        source = self.config.data_dir / "stream" / "stream.log"
        if not source.exists():
            return None
        folder.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        kept = folder / f"{stamp}-pid{self.pid}-stream.log"
        shutil.copyfile(source, kept)
        failure = self.config.data_dir / "stream" / "batch_failure.json"
        if failure.exists():
            shutil.copyfile(failure, kept.with_name(kept.name.replace("stream.log", "batch_failure.json")))
        return kept

    def _failed(self, what: str, folder: Path = FAILED_LOGS) -> RuntimeError:
        kept = self.keep_log(folder)
        where = f"\nwhole stream log kept in {kept}" if kept else ""
        return RuntimeError(f"{what}:\n{self.log_tail()}{where}")

    def wait_consumed(self, topics: list[str], expected: int, timeout: float) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            progress = read_progress(self.config)
            if consumed(progress, topics) >= expected:
                return progress
            if not self.alive():
                raise self._failed("the speed layer exited")
            time.sleep(0.5)
        raise self._failed(
            f"the speed layer read {consumed(read_progress(self.config), topics)} of {expected} records "
            f"within {timeout:.0f} s"
        )

    def stop(self) -> None:
        from kdq.spark.stream_process import stop_stream

        try:
            stop_stream(self.config, timeout=120)
        finally:
            if self.sampler is not None:
                self.sampler.sample()
                self.sampler.stop()

    def app_id(self) -> str:
        return (self.config.checkpoints_dir / "speed_layer" / "kdq_app_id").read_text().strip()
