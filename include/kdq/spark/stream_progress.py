"""The speed layer's progress for the supervisor: each batch's progress, its :class:`kdq.stream.micro_batch.MicroBatchReport`
figures and a heartbeat, written to ``<data_dir>/stream/`` by a Spark query listener (:class:`ProgressRecorder`)."""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import TYPE_CHECKING

from pyspark.sql.streaming import StreamingQueryListener

from kdq.spark.writers import now_ms
from kdq.stream import failures as batch_failures
from kdq.stream import state as stream_state

if TYPE_CHECKING:
    from kdq.spark.speed_layer import SpeedLayer

log = logging.getLogger("kdq.stream")


def _offsets(text: str | None) -> dict:
    """Kafka source offsets JSON ({topic: {partition: offset}}); anything else (null, empty) → {}."""
    try:
        value = json.loads(text) if text else {}
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


class ProgressRecorder(StreamingQueryListener):
    """Writes each batch's progress and a heartbeat to ``<data_dir>/stream/`` (cheap, local, atomic)."""

    def __init__(self, layer: SpeedLayer, history: int = 200) -> None:
        self.layer = layer
        self.dir = stream_state.state_dir(layer.config)
        self.history = history
        self.lock = threading.Lock()

    def heartbeat(self, state: str, extra: dict | None = None) -> None:
        with self.lock:
            stream_state.atomic_write_json(
                self.dir / stream_state.HEARTBEAT,
                {"state": state, "pid": os.getpid(), "time_ms": now_ms(), "app_id": self.layer.app_id, **(extra or {})},
            )

    def onQueryStarted(self, event) -> None:  # noqa: N802 - Spark's listener API
        self.heartbeat("running", {"query_id": str(event.id), "run_id": str(event.runId)})

    def onQueryIdle(self, event) -> None:  # noqa: N802
        self.heartbeat("running", {"idle": True})

    def onQueryTerminated(self, event) -> None:  # noqa: N802
        self.heartbeat("stopped", {"exception": event.exception})

    def onQueryProgress(self, event) -> None:  # noqa: N802
        try:
            self._record(event.progress)
        except Exception:  # a broken progress record must never take the stream down
            log.exception("could not record progress of batch %s", getattr(event.progress, "batchId", "?"))

    def _record(self, progress) -> None:
        record = {
            "batch_id": progress.batchId,
            "timestamp": progress.timestamp,
            "input_rows": progress.numInputRows,
            "input_rows_per_second": progress.inputRowsPerSecond,
            "processed_rows_per_second": progress.processedRowsPerSecond,
            "duration_ms": dict(progress.durationMs or {}),
        }
        lag: dict[str, int] = {}
        offsets: dict = {}
        for source in progress.sources:
            end = _offsets(source.endOffset)
            latest = _offsets(source.latestOffset)
            offsets = end
            for topic, partitions in latest.items():
                lag[topic] = sum(
                    max(0, int(latest_off) - int(end.get(topic, {}).get(p, latest_off)))
                    for p, latest_off in partitions.items()
                )
        record["end_offsets"] = offsets
        record["consumer_lag"] = lag
        report = self.layer.reports.get(progress.batchId)
        if report is not None:
            now = now_ms()
            record.update(
                late_rows=report.late_rows,
                # per topic, the counted invalid rows beside input_rows_by_topic: the expectations run's hint
                # that a topic just went bad (ExpectationSet.ratio_breaches)
                input_rows_by_topic=report.input_rows_by_topic,
                invalid_rows_by_topic=report.invalid_rows_by_topic,
                event_time_lag_ms={t: now - ms for t, ms in report.max_event_ms.items()},
                changed_windows=report.changed_windows,
                influx_ok=report.influx_ok,
                replayed=report.replayed,
                writer_ms=report.durations_ms,
                end_to_end_latency_ms=report.end_to_end_latency_ms(),
            )
        with self.lock:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(self.dir / stream_state.PROGRESS_LOG, "a") as out:
                out.write(json.dumps(record, default=str) + "\n")
            stream_state.atomic_write_json(self.dir / stream_state.PROGRESS, record)
        self.heartbeat("running", {"last_batch_id": progress.batchId})
        batch_failures.batch_finished(self.layer.config, progress.batchId)  # done; clears its failure
        self._trim()

    def _trim(self) -> None:
        path = self.dir / stream_state.PROGRESS_LOG
        if path.stat().st_size > 4 * 1024 * 1024:
            lines = path.read_text().splitlines()[-self.history :]
            tmp = path.with_suffix(".tmp")
            tmp.write_text("\n".join(lines) + "\n")
            os.replace(tmp, path)
