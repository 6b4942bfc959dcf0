"""Pure, deterministic record generation for the demo (a seed and clock readings give the same records), and
the rate limiter that paces it."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from kdq.traffic.kinds import KINDS, RegistryKind, _json

ON_TIME, OUT_OF_ORDER, LATE = "on_time", "out_of_order", "late"
TIMINGS = (ON_TIME, OUT_OF_ORDER, LATE)
LATE_EXTRA_MS = (10_000, 600_000)  # how much later than the allowed lateness a late record is


@dataclass(frozen=True)
class TrafficSpec:
    """What to produce. Fractions are per record; ``out_of_order`` and ``late`` exclude each other."""

    topics: tuple[tuple[str, str], ...] = (("orders", "orders"), ("payments", "payments"), ("ops.metrics", "measurements"))
    rate: float = 50.0
    partitions: int = 3
    invalid_ratio: float = 0.1
    out_of_order: float = 0.05
    late: float = 0.01
    allowed_lateness_seconds: int = 60
    duration_seconds: float | None = None
    count: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("invalid_ratio", "out_of_order", "late"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be between 0 and 1, got {getattr(self, name)}")
        if self.out_of_order + self.late > 1:
            raise ValueError(f"out_of_order + late must be at most 1, got {self.out_of_order + self.late}")
        if self.rate <= 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        if self.partitions < 1:
            raise ValueError(f"partitions must be at least 1, got {self.partitions}")
        if self.count is not None and self.count < 0:
            raise ValueError(f"count must not be negative, got {self.count}")
        if self.duration_seconds is not None and self.duration_seconds < 0:
            raise ValueError(f"duration must not be negative, got {self.duration_seconds}")
        if not self.topics:
            raise ValueError("at least one topic is needed")


@dataclass(frozen=True)
class DemoRecord:
    topic: str
    partition: int
    key: bytes | None
    value: bytes
    timestamp_ms: int
    kind: str
    valid: bool
    timing: str
    defect: str | None = None


class TrafficGenerator:
    """Deterministic record factory: the same spec (with a seed) and clock readings give the same records."""

    def __init__(
        self, spec: TrafficSpec, partitions: dict[str, int] | None = None, schema_ids: dict[str, int] | None = None
    ) -> None:
        """``schema_ids``: topic -> the id its kind's schema got from the registry (:func:`register_schemas`),
        for the topics of :class:`RegistryKind` kinds."""
        self.spec = spec
        self.schema_ids = dict(schema_ids or {})
        for topic, kind in spec.topics:
            if isinstance(KINDS[kind], RegistryKind) and topic not in self.schema_ids:
                raise ValueError(f"topic {topic!r}: kind {kind!r} is written through the Schema Registry, and no schema"
                                 " id was registered for it")
        self.rng = random.Random(spec.seed)
        self.seq = 0
        # Partitions per topic: the spec's, or fewer when an existing topic has fewer.
        self.partitions = {topic: (partitions or {}).get(topic, spec.partitions) for topic, _ in spec.topics}

    def event_time(self, now_ms: int) -> tuple[int, str]:
        draw = self.rng.random()
        lateness_ms = self.spec.allowed_lateness_seconds * 1000
        if draw < self.spec.late:
            return now_ms - lateness_ms - self.rng.randint(*LATE_EXTRA_MS), LATE
        if draw < self.spec.late + self.spec.out_of_order:
            return now_ms - self.rng.randint(1, max(1, int(lateness_ms * 0.8))), OUT_OF_ORDER
        return now_ms, ON_TIME

    def record(self, now_ms: int) -> DemoRecord:
        topic, kind_name = self.spec.topics[self.rng.randrange(len(self.spec.topics))]
        kind = KINDS[kind_name]
        event_ms, timing = self.event_time(now_ms)
        document = kind.document(self.rng, self.seq, event_ms)
        self.seq += 1
        defect = None
        invalid = self.rng.random() < self.spec.invalid_ratio
        if invalid:
            defects = kind.all_defects()
            defect = sorted(defects)[self.rng.randrange(len(defects))]
        if isinstance(kind, RegistryKind):
            value = kind.encode(document, self.schema_ids[topic])
            if defect is not None:
                value = kind.all_defects()[defect](self.rng, document, value)
        elif defect is not None:
            value = kind.all_defects()[defect](self.rng, document)
        else:
            value = _json(document)
        return DemoRecord(
            topic=topic,
            partition=self.rng.randrange(self.partitions[topic]),
            key=kind.key(document),
            value=value,
            timestamp_ms=event_ms,
            kind=kind_name,
            valid=defect is None,
            timing=timing,
            defect=defect,
        )

    def records(self, n: int, now_ms: int, step_ms: int = 0) -> list[DemoRecord]:
        return [self.record(now_ms + i * step_ms) for i in range(n)]


class RateLimiter:
    """Paces a loop at ``rate`` per second: record *i* is due at ``start + i / rate``.

    After a stall (a slow broker, a suspended laptop) it does not burst to catch up more than
    ``max_burst_seconds`` worth of records.
    """

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic, max_burst_seconds: float = 1.0) -> None:
        self.rate = rate
        self.clock = clock
        self.max_burst = max(1, int(rate * max_burst_seconds))
        self.start = clock()
        self.sent = 0

    def due(self) -> int:
        """Records that may be sent now (and are counted as sent)."""
        owed = int((self.clock() - self.start) * self.rate + 1e-9) - self.sent  # 1e-9: float noise
        if owed > self.max_burst:  # fell behind: forget the backlog instead of flooding
            self.sent += owed - self.max_burst
            owed = self.max_burst
        owed = max(owed, 0)
        self.sent += owed
        return owed

    def wait_seconds(self) -> float:
        """Time until the next record is due."""
        return max(0.0, self.start + (self.sent + 1) / self.rate - self.clock())
