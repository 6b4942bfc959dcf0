"""The speed layer's fault switches for the tests: kill the process, fail or hang a micro-batch at a named
point (:class:`FaultInjector`, read from ``KDQ_FAULT_*`` by :func:`kdq.spark.stream_job.run_speed_layer`)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kdq.spark import transforms

log = logging.getLogger("kdq.stream")

FAULT_POINTS = ("after_ledger", "after_archive", "after_merge", "after_metrics", "before_commit")


@dataclass(frozen=True)
class FaultInjector:
    """Test switch: kill the process (SIGKILL semantics, ``os._exit``) at a named point of a batch.

    Set by the job's entrypoint from KDQ_FAULT_POINT / KDQ_FAULT_BATCH /
    KDQ_FAULT_MARKER; the marker file makes it fire once, so the restarted
    process runs through.
    """

    point: str | None = None
    batch_id: int | None = None
    marker: Path | None = None
    # Fault switches for the tests of failing and hung batches: KDQ_FAULT_FAIL_VALUE fails every batch holding a record whose value contains it
    # (a deterministic bug; quarantined records are exempt, as they skip classification);
    # KDQ_FAULT_HANG_SECONDS sleeps at the start of batch KDQ_FAULT_BATCH or later (once per marker).
    fail_value: str | None = None
    hang_seconds: float | None = None

    @classmethod
    def from_env(cls, env: dict[str, str]) -> FaultInjector:
        point = env.get("KDQ_FAULT_POINT") or None
        if point is not None and point not in FAULT_POINTS:
            raise ValueError(f"KDQ_FAULT_POINT: expected one of {FAULT_POINTS}, got {point!r}")
        batch = env.get("KDQ_FAULT_BATCH")
        marker = env.get("KDQ_FAULT_MARKER")
        hang = env.get("KDQ_FAULT_HANG_SECONDS")
        return cls(
            point, int(batch) if batch else None, Path(marker) if marker else None,
            env.get("KDQ_FAULT_FAIL_VALUE") or None, float(hang) if hang else None,
        )

    def maybe_hang(self, batch_id: int) -> None:
        if not self.hang_seconds or (self.batch_id is not None and batch_id < self.batch_id):
            return
        if self.marker is not None:
            if self.marker.exists():
                return
            self.marker.write_text(f"hang batch {batch_id}\n")
        log.error("fault injection: batch %d hangs for %.0f s", batch_id, self.hang_seconds)
        time.sleep(self.hang_seconds)

    def poison(self, batch: DataFrame) -> DataFrame:
        """Make any Spark job over a record containing ``fail_value`` fail (unless the record is quarantined)."""
        if not self.fail_value:
            return batch
        hit = F.col("value").cast("string").contains(self.fail_value)
        if transforms.QUARANTINED_COLUMN in batch.columns:
            hit = hit & ~F.col(transforms.QUARANTINED_COLUMN)
        message = F.concat(
            F.lit("KDQ_FAULT_FAIL_VALUE: cannot process record "), F.col("topic"), F.lit(" partition "),
            F.col("partition").cast("string"), F.lit(" offset "), F.col("offset").cast("string"),
        )
        return batch.withColumn("value", F.when(hit, F.raise_error(message)).otherwise(F.col("value")))

    def maybe_crash(self, point: str, batch_id: int, rows: int) -> None:
        if self.point != point or rows == 0:
            return
        if self.batch_id is not None and batch_id < self.batch_id:
            return
        if self.marker is not None:
            if self.marker.exists():
                return
            self.marker.write_text(f"{point} batch {batch_id}\n")
        log.error("fault injection: killing the process at %s of batch %d", point, batch_id)
        os._exit(137)
