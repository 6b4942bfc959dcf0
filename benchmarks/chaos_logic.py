"""The chaos run's logic without services: traffic with its ground truth, the fault plan, the comparison.

``benchmarks/chaos.py`` drives the real stack with these; ``tests/unit/test_chaos.py`` tests them.

**Ground truth travels with each record.** The generator knows, for every record it makes, whether it
is valid and in which window it belongs (it chose the event time and whether to break the record), and
stamps both into Kafka headers. At the end the driver reads every topic back with a ``read_committed``
consumer and tallies the headers: what is in Kafka (committed transactions only) is what must be
counted, whatever the producer went through (broker restarts, aborted and retried transactions). No
product code takes part in that tally: the expected verdicts follow the README's reason table and the
issue's poison list, not the classifier.

Windows are epoch-aligned tumbling windows of ``window_seconds``. The event time is the Kafka timestamp
for ``chaos.orders`` and ``chaos.payments``, and the ``ts`` field for ``chaos.events`` (``topics.toml``
below): a record whose ``ts`` cannot be read (or whose value is not JSON at all) belongs to the window of
its Kafka timestamp. Poison records carry ``ts`` = Kafka timestamp, so their window is the same either
way; late and out-of-order events carry an old ``ts`` and a current Kafka timestamp, so using the wrong
one shows as a difference.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta, timezone

from kdq.traffic.generator import LATE, LATE_EXTRA_MS, ON_TIME, OUT_OF_ORDER, TrafficGenerator, TrafficSpec
from kdq.traffic.kinds import ENCODING_DEFECTS

VALID, INVALID = "valid", "invalid"
STATUSES = (VALID, INVALID)

# Kafka headers every chaos record carries (the ground truth).
H_STATUS = "kdq-chaos-status"  # valid | invalid
H_WINDOW = "kdq-chaos-window"  # window start, epoch millis
H_KIND = "kdq-chaos-kind"  # valid | invalid | poison
H_TIMING = "kdq-chaos-timing"  # on_time | out_of_order | late
H_DETAIL = "kdq-chaos-detail"  # the defect or poison name ("" for a valid record)
H_INTENT = "kdq-chaos-intent"  # commit | abort: what the producer meant to do with the record's transaction

ORDERS, PAYMENTS, EVENTS = "chaos.orders", "chaos.payments", "chaos.events"
# topic -> (record kind, partitions); orders and payments come from kdq.traffic's kinds.
TOPICS: dict[str, tuple[str, int]] = {ORDERS: ("orders", 4), PAYMENTS: ("payments", 3), EVENTS: ("events", 2)}

# The rule of chaos.events: its event time is the `ts` field, `n` a non-negative integer of any size, and
# `s` has a regex that backtracks catastrophically on a long run of a's without a match.
EVENTS_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "chaos event",
    "type": "object",
    "required": ["id", "ts"],
    "properties": {
        "id": {"type": "string", "maxLength": 16},
        "n": {"type": "integer", "minimum": 0},
        "s": {"type": "string", "pattern": "^(.*a){20}$"},
    },
}
# Two streaming summaries on the chaos traffic, with the counts' lateness: their late records go to the batch layer
# too, so the rebuilds, recomputes and kills beside the stream are checked on the summaries as on the counts.
# chaos.events' `n` includes the valid poison records (a 40-digit integer; no `n` at all: "missing").
SUMMARY_WINDOW_SECONDS = 60
SUMMARIES: tuple[dict, ...] = (
    {"name": "chaos_event_n", "topic": EVENTS, "value": "n", "group_by": [],
     "window_seconds": SUMMARY_WINDOW_SECONDS, "allowed_lateness_seconds": 60},
    {"name": "chaos_order_amount", "topic": ORDERS, "value": "amount", "group_by": ["currency"],
     "window_seconds": SUMMARY_WINDOW_SECONDS, "allowed_lateness_seconds": 60},
)
SUMMARY_OUT_OF_RANGE = 1e150  # docs/summaries.md: larger magnitudes (and infinities) are rejected as out_of_range

TOPICS_TOML = f"""\
[[topic]]
match = "{ORDERS}"
schema = "orders.schema.json"

[[topic]]
match = "{PAYMENTS}"
schema = "payments.schema.json"

[[topic]]
match = "{EVENTS}"
schema = "events.schema.json"
event_time_field = "ts"
"""


def window_of(ms: int, window_seconds: int) -> int:
    size = window_seconds * 1000
    return ms // size * size


def iso_utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _doc(document: dict) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


# -- records -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChaosRecord:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int  # the Kafka timestamp
    status: str  # what must be counted: valid | invalid
    window_ms: int  # where it must be counted
    kind: str  # valid | invalid | poison
    timing: str  # on_time | out_of_order | late
    detail: str = ""

    def headers(self, intent: str = "commit") -> list[tuple[str, bytes]]:
        return [
            (H_STATUS, self.status.encode()),
            (H_WINDOW, str(self.window_ms).encode()),
            (H_KIND, self.kind.encode()),
            (H_TIMING, self.timing.encode()),
            (H_DETAIL, self.detail.encode()),
            (H_INTENT, intent.encode()),
        ]


@dataclass(frozen=True)
class Poison:
    """A value that once failed (or could fail) a whole micro-batch, and the verdict the README gives it."""

    name: str
    status: str
    build: Callable[[random.Random, str, int], bytes | None]  # (rng, id, ts_ms) -> value
    weight: float = 1.0  # large values are rarer


def _event(id_: str, ts: object, **more: object) -> bytes:
    return _doc({"id": id_, "ts": ts, **more})


def _with_offset(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone(timedelta(hours=2))).isoformat(timespec="milliseconds")


NINES_40 = "9" * 40
POISONS: tuple[Poison, ...] = (
    # event times out of range (README: bad_timestamp, in the window of the Kafka timestamp)
    Poison("ts_epoch_nanoseconds", INVALID, lambda r, i, ts: _event(i, ts * 1_000_000)),
    Poison("ts_epoch_microseconds", INVALID, lambda r, i, ts: _event(i, ts * 1_000)),
    Poison("ts_negative", INVALID, lambda r, i, ts: _event(i, -r.randint(1, 10**6))),
    Poison("ts_nan_string", INVALID, lambda r, i, ts: _event(i, "NaN")),
    Poison("ts_beyond_64_bits", INVALID, lambda r, i, ts: f'{{"id":"{i}","ts":123456789012345678901234567890}}'.encode()),
    Poison("ts_1e400", INVALID, lambda r, i, ts: f'{{"id":"{i}","ts":1e400}}'.encode()),
    Poison("ts_year_10000", INVALID, lambda r, i, ts: _event(i, "10000-01-01T00:00:00Z")),
    Poison("ts_missing", INVALID, lambda r, i, ts: _doc({"id": i})),
    Poison("ts_huge_string", INVALID, lambda r, i, ts: _event(i, "7" * 50_000), weight=0.1),
    # not JSON (README: not_json covers NaN, duplicate keys, a lone surrogate escape, an empty value)
    Poison("ts_nan_literal", INVALID, lambda r, i, ts: f'{{"id":"{i}","ts":NaN}}'.encode()),
    Poison("duplicate_keys", INVALID, lambda r, i, ts: f'{{"id":"{i}","id":"{i}x","ts":{ts}}}'.encode()),
    Poison("lone_surrogate_escape", INVALID, lambda r, i, ts: f'{{"id":"\\ud800","ts":{ts}}}'.encode()),
    Poison("empty_value", INVALID, lambda r, i, ts: b""),
    # not UTF-8
    Poison("encoded_surrogate", INVALID, lambda r, i, ts: b'{"id":"\xed\xa0\x80","ts":' + str(ts).encode() + b"}"),
    Poison("garbage_bytes", INVALID, lambda r, i, ts: b"\xff" + r.randbytes(31)),
    # structure and numbers (README: too_complex beyond nesting 500 or a 1,000-digit number)
    Poison("deep_nesting", INVALID, lambda r, i, ts: b"[" * 50_000 + b"]" * 50_000, weight=0.1),
    Poison("number_too_long", INVALID, lambda r, i, ts: f'{{"id":"{i}","ts":{ts},"n":{"9" * 5_000}}}'.encode(), weight=0.2),
    Poison("number_1e999999999", INVALID, lambda r, i, ts: f'{{"id":"{i}","ts":{ts},"n":1e999999999}}'.encode()),
    Poison("negative_integer_beyond_64_bits", INVALID, lambda r, i, ts: f'{{"id":"{i}","ts":{ts},"n":-{NINES_40}}}'.encode()),
    Poison("catastrophic_regex", INVALID, lambda r, i, ts: _event(i, ts, s="a" * 64 + "b")),
    Poison("tombstone", INVALID, lambda r, i, ts: None),
    Poison("too_large", INVALID, lambda r, i, ts: _event(i, ts, pad="x" * 300_000), weight=0.1),
    # odd but fine: each must count as valid
    Poison("integer_beyond_64_bits", VALID, lambda r, i, ts: f'{{"id":"{i}","ts":{ts},"n":{NINES_40}}}'.encode()),
    Poison("ts_iso_with_offset", VALID, lambda r, i, ts: _event(i, _with_offset(ts))),
    Poison("nesting_100", VALID, lambda r, i, ts: f'{{"id":"{i}","ts":{ts},"x":{"[" * 100}1{"]" * 100}}}'.encode()),
    Poison("unicode_id", VALID, lambda r, i, ts: json.dumps({"id": "é€😀中" + i[-4:], "ts": ts}, ensure_ascii=False).encode()),
)
POISON_BY_NAME = {p.name: p for p in POISONS}

# Invalid events that are not poison: readable `ts`, broken rule (their window is the `ts` one).
EVENT_DEFECTS: dict[str, Callable[[random.Random, dict], bytes]] = {
    "negative_n": lambda r, d: _doc({**d, "n": -r.randint(1, 100)}),
    "long_id": lambda r, d: _doc({**d, "id": "x" * 40}),
    "n_as_string": lambda r, d: _doc({**d, "n": str(d["n"])}),
    "missing_id": lambda r, d: _doc({k: v for k, v in d.items() if k != "id"}),
}


@dataclass(frozen=True)
class TrafficMix:
    invalid_ratio: float = 0.10
    out_of_order: float = 0.05
    late: float = 0.02
    events_share: float = 0.30  # of all records, to chaos.events
    poison_ratio: float = 0.10  # of chaos.events records
    window_seconds: int = 1
    allowed_lateness_seconds: int = 60


class ChaosTraffic:
    """Deterministic for a seed and clock readings: orders and payments from ``kdq.traffic``'s record
    kinds (their validity is the demo generator's own, tested against the rules in test_traffic), events
    and poison records here; every record with its expected status and window."""

    def __init__(self, seed: int, mix: TrafficMix = TrafficMix()) -> None:
        self.mix = mix
        self.rng = random.Random(seed)
        self.events_rng = random.Random(seed + 1)
        spec = TrafficSpec(
            topics=((ORDERS, TOPICS[ORDERS][0]), (PAYMENTS, TOPICS[PAYMENTS][0])),
            partitions=max(p for _, p in TOPICS.values()),
            invalid_ratio=mix.invalid_ratio,
            out_of_order=mix.out_of_order,
            late=mix.late,
            allowed_lateness_seconds=mix.allowed_lateness_seconds,
            seed=seed + 2,
        )
        self.demo = TrafficGenerator(spec, {t: TOPICS[t][1] for t in (ORDERS, PAYMENTS)})
        self.seq = 0
        poisons = list(POISONS)
        self._poison_weights = [p.weight for p in poisons]
        self._poisons = poisons

    def record(self, now_ms: int) -> ChaosRecord:
        if self.rng.random() < self.mix.events_share:
            return self.event(now_ms)
        demo = self.demo.record(now_ms)
        return ChaosRecord(
            topic=demo.topic,
            partition=demo.partition,
            key=demo.key,
            value=demo.value,
            timestamp_ms=demo.timestamp_ms,
            status=VALID if demo.valid else INVALID,
            window_ms=window_of(demo.timestamp_ms, self.mix.window_seconds),
            kind=VALID if demo.valid else INVALID,
            timing=demo.timing,
            detail=demo.defect or "",
        )

    def _event_time(self, now_ms: int) -> tuple[int, str]:
        rng, lateness = self.events_rng, self.mix.allowed_lateness_seconds * 1000
        draw = rng.random()
        if draw < self.mix.late:
            return now_ms - lateness - rng.randint(*LATE_EXTRA_MS), LATE
        if draw < self.mix.late + self.mix.out_of_order:
            return now_ms - rng.randint(1, max(1, int(lateness * 0.8))), OUT_OF_ORDER
        return now_ms, ON_TIME

    def event(self, now_ms: int) -> ChaosRecord:
        rng = self.events_rng
        self.seq += 1
        id_ = f"e-{self.seq}"
        partition = rng.randrange(TOPICS[EVENTS][1])
        key = f"h-{rng.randrange(8)}".encode()
        window = window_of(now_ms, self.mix.window_seconds)
        if rng.random() < self.mix.poison_ratio:
            poison = rng.choices(self._poisons, self._poison_weights)[0]
            value = poison.build(rng, id_, now_ms)
            return ChaosRecord(EVENTS, partition, key, value, now_ms, poison.status, window, "poison", ON_TIME, poison.name)
        event_ms, timing = self._event_time(now_ms)
        document = {"id": id_, "ts": event_ms if rng.random() < 0.8 else iso_utc(event_ms), "n": rng.randint(0, 1000)}
        event_window = window_of(event_ms, self.mix.window_seconds)
        if rng.random() >= self.mix.invalid_ratio:
            return ChaosRecord(EVENTS, partition, key, _doc(document), now_ms, VALID, event_window, VALID, timing)
        defects = {**EVENT_DEFECTS, **ENCODING_DEFECTS}
        name = sorted(defects)[rng.randrange(len(defects))]
        value = defects[name](rng, document)
        if name in ENCODING_DEFECTS:
            # An unreadable value has no readable `ts`: it belongs to the window of its (current) Kafka timestamp.
            return ChaosRecord(EVENTS, partition, key, value, now_ms, INVALID, window, INVALID, ON_TIME, name)
        return ChaosRecord(EVENTS, partition, key, value, now_ms, INVALID, event_window, INVALID, timing, name)


# -- the fault plan --------------------------------------------------------------------------------------

BROKER_RESTART, INFLUX_OUTAGE, SCHEDULER_RESTART, STREAM_KILL = (
    "broker_restart", "influx_outage", "scheduler_restart", "stream_kill",
)
UNPLANNED = "unplanned_death"  # not a fault: a component something outside the run killed
KILL_TARGETS = (("driver_process_group", 0.6), ("driver_jvm", 0.2), ("python_driver", 0.2))


@dataclass(frozen=True)
class PlannedFault:
    at_s: float  # seconds after the fault phase began
    kind: str
    down_s: float  # how long the component stays stopped
    how: str = ""  # broker: graceful (SIGTERM) or sigkill


def kills_wanted(minutes: float, per_20_minutes: int = 15) -> int:
    return max(1, math.ceil(per_20_minutes * minutes / 20))


def plan_faults(
    rng: random.Random,
    window_s: float,
    broker_restarts: int = 2,
    influx_outage_s: float = 120.0,
    scheduler_restarts: int = 1,
    settle_s: float = 45.0,
    attempts: int = 5000,
) -> list[PlannedFault]:
    """Random start times for the faults other than stream kills, in [5 %, 90 %] of the window.

    Each fault's span (down time plus ``settle_s``) avoids the others', so what follows a fault can be
    attributed to it; when the window is too short for that, the spans may overlap.
    """
    how = (["graceful", "sigkill"] * broker_restarts)[:broker_restarts]  # one of each for two restarts
    rng.shuffle(how)
    wanted = [(BROKER_RESTART, rng.uniform(5, 20), how[i]) for i in range(broker_restarts)]
    wanted += [(INFLUX_OUTAGE, influx_outage_s, "")]
    wanted += [(SCHEDULER_RESTART, 0.0, "") for _ in range(scheduler_restarts)]
    lo, hi = 0.05 * window_s, 0.9 * window_s

    def draw() -> list[PlannedFault]:
        return [PlannedFault(round(rng.uniform(lo, max(lo, hi - down)), 1), kind, round(down, 1), h) for kind, down, h in wanted]

    for _ in range(attempts):
        faults = sorted(draw(), key=lambda f: f.at_s)
        spans = [(f.at_s, f.at_s + f.down_s + settle_s) for f in faults]
        if all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)):
            return faults
    return sorted(draw(), key=lambda f: f.at_s)


# -- the jobs run beside the stream (issue 23, chaos second edition) -------------------------------------

REBUILD, MAINTENANCE, BACKFILL, ARCHIVE_BACKFILL = "rebuild", "maintenance", "backfill", "archive_from_kafka"
JOB_KINDS = (REBUILD, MAINTENANCE, BACKFILL, ARCHIVE_BACKFILL)


@dataclass(frozen=True)
class PlannedJob:
    at_s: float  # seconds after the fault phase began
    kind: str
    n: int = 1  # the first or second run of its kind


def plan_jobs(
    rng: random.Random, window_s: float, rebuilds: int = 2, maintenance: int = 1, backfills: int = 1,
    archive_backfills: int = 1,
) -> list[PlannedJob]:
    """Start times of the jobs that write the stream's tables beside it, during the fault phase.

    Each starts in [10 %, 75 %] of the window, so it overlaps the stream's traffic and faults and can
    finish before the traffic stops. The rebuilds are of the hour the stream is writing at their start;
    the second starts at least a fifth of the window after the first, so they do not simply queue behind
    each other. The backfill re-runs the recompute intervals that already ran, so it starts after the
    first third of the window.
    """
    lo, hi = 0.10 * window_s, 0.75 * window_s
    jobs = []
    first = rng.uniform(lo, (lo + hi) / 2)
    for i in range(rebuilds):
        jobs.append(PlannedJob(round(min(hi, first + i * rng.uniform(0.2, 0.35) * window_s), 1), REBUILD, i + 1))
    jobs += [PlannedJob(round(rng.uniform(lo, hi), 1), MAINTENANCE, i + 1) for i in range(maintenance)]
    jobs += [PlannedJob(round(rng.uniform(max(lo, window_s / 3), hi), 1), BACKFILL, i + 1) for i in range(backfills)]
    jobs += [PlannedJob(round(rng.uniform(lo, hi), 1), ARCHIVE_BACKFILL, i + 1) for i in range(archive_backfills)]
    return sorted(jobs, key=lambda j: j.at_s)


REPLAY, AFTER_COMMIT = "replay", "after_commit"


def plan_kill(rng: random.Random, remaining_s: float, kills_left: int, recovery_s: float, batch_s: float) -> tuple[str, float]:
    """When to SIGKILL a restarted stream: (mode, delay in seconds).

    ``replay``: ``delay`` after its first micro-batch started (often the replay of the batch killed
    before); ``after_commit``: ``delay`` after it committed a batch, so the stream makes progress between
    kills and the kill lands in a later batch or between two. The delay is uniform over about one batch
    (``batch_s``, as measured), so kills hit every step of a batch: ledger, archive append, MERGE,
    metrics, InfluxDB, commit. Half of the kills wait for a commit; only replay kills are planned when
    the remaining time is short for the kills still wanted (each costs ``recovery_s`` of supervisor
    detection and JVM start-up).
    """
    behind = remaining_s / max(kills_left, 1) < recovery_s
    mode = REPLAY if behind or rng.random() < 0.5 else AFTER_COMMIT
    return mode, rng.uniform(1.0, max(2.0, 1.2 * batch_s))


def kill_target(rng: random.Random) -> str:
    names, weights = zip(*KILL_TARGETS, strict=True)
    return rng.choices(names, weights)[0]


# -- ground truth ----------------------------------------------------------------------------------------

Key = tuple[str, int, str]  # (topic, window_start_ms, status)


@dataclass
class Truth:
    counts: Counter = field(default_factory=Counter)  # Key -> records
    records: Counter = field(default_factory=Counter)  # (topic, kind, timing, detail) -> records
    offsets: set = field(default_factory=set)  # (topic, partition, offset) of every committed record
    unstamped: int = 0  # records without the ground-truth headers (must be 0)
    meant_to_abort: int = 0  # records of transactions the producer aborted, seen by this reader
    summaries: dict = field(default_factory=dict)  # SummaryKey -> SummaryState, of the valid records

    def add(self, topic: str, partition: int, offset: int, headers: Iterable[tuple[str, bytes | None]] | None,
            value: bytes | None = None) -> None:
        h = {k: (v or b"").decode() for k, v in (headers or [])}
        self.offsets.add((topic, partition, offset))
        if H_STATUS not in h or H_WINDOW not in h:
            self.unstamped += 1
            return
        if h.get(H_INTENT) == "abort":
            self.meant_to_abort += 1
            return
        self.counts[(topic, int(h[H_WINDOW]), h[H_STATUS])] += 1
        self.records[(topic, h.get(H_KIND, ""), h.get(H_TIMING, ""), h.get(H_DETAIL, ""))] += 1
        if h[H_STATUS] == VALID:
            add_to_summaries(self.summaries, topic, int(h[H_WINDOW]), value)

    def summary(self) -> dict:
        by_kind: Counter = Counter()
        by_timing: Counter = Counter()
        by_topic: dict[str, Counter] = defaultdict(Counter)
        poison: Counter = Counter()
        for (topic, kind, timing, detail), n in self.records.items():
            by_kind[kind] += n
            by_timing[timing] += n
            by_topic[topic][kind] += n
            if kind == "poison":
                poison[detail] += n
        status: Counter = Counter()
        for (_, _, st), n in self.counts.items():
            status[st] += n
        return {
            "records": sum(self.records.values()),
            "by_status": dict(status),
            "by_kind": dict(by_kind),
            "by_timing": dict(by_timing),
            "by_topic": {t: dict(c) for t, c in sorted(by_topic.items())},
            "poison": dict(sorted(poison.items())),
            "windows": len({(t, w) for t, w, _ in self.counts}),
            "unstamped": self.unstamped,
            "meant_to_abort_but_read": self.meant_to_abort,
        }


# -- comparison ------------------------------------------------------------------------------------------


def compare_counts(expected: Mapping[Key, int], got: Mapping[Key, int], limit: int = 200) -> dict:
    """Per (topic, window, status): a missing key is 0 (no row / no message / field 0 means none counted)."""
    keys = set(expected) | set(got)
    diffs = sorted(
        (k, int(expected.get(k, 0)), int(got.get(k, 0))) for k in keys if int(expected.get(k, 0)) != int(got.get(k, 0))
    )
    lost = sum(max(0, e - g) for _, e, g in diffs)
    extra = sum(max(0, g - e) for _, e, g in diffs)
    return {
        "equal": not diffs,
        "windows": len({(t, w) for t, w, _ in keys}),
        "expected_records": int(sum(expected.values())),
        "counted_records": int(sum(got.values())),
        "lost": lost,
        "counted_twice": extra,
        "differing_keys": len(diffs),
        "differences": [
            {"topic": t, "window_start_ms": w, "window_start": iso_utc(w), "status": s, "expected": e, "got": g}
            for (t, w, s), e, g in diffs[:limit]
        ],
    }


SummaryKey = tuple[str, str, int, tuple]  # (summary, topic, window_start_ms, group values in group_by's order)


@dataclass
class SummaryState:
    count: int = 0
    sum: float = 0.0
    min: float | None = None
    max: float | None = None
    rejected: Counter = field(default_factory=Counter)

    def add(self, number: float) -> None:
        self.count += 1
        self.sum += number
        self.min = number if self.min is None else min(self.min, number)
        self.max = number if self.max is None else max(self.max, number)

    @property
    def records(self) -> int:
        return self.count + sum(self.rejected.values())


def _at(document: object, path: str) -> object:
    for step in path.split("."):
        if not isinstance(document, dict) or step not in document:
            return None
        document = document[step]
    return document


def add_to_summaries(states: dict, topic: str, window_ms: int, value: bytes | None) -> None:
    """A valid record's part of every summary on its topic, by docs/summaries.md's definitions (count, sum, min,
    max, rejected by reason), written independently of kdq's Spark and JVM code."""
    wanted = [s for s in SUMMARIES if s["topic"] == topic]
    if not wanted:
        return
    document = json.loads(value) if value else None
    window = window_ms - window_ms % (SUMMARY_WINDOW_SECONDS * 1000)
    for summary in wanted:
        groups = tuple(None if (g := _at(document, path)) is None else str(g) for path in summary["group_by"])
        state = states.setdefault((summary["name"], topic, window, groups), SummaryState())
        number = _at(document, summary["value"])
        if number is None:
            state.rejected["missing"] += 1
        elif isinstance(number, bool) or not isinstance(number, (int, float)):
            state.rejected["not_numeric"] += 1
        else:
            try:
                number = float(number)
            except OverflowError:  # an integer beyond a double's range
                number = math.inf
            if not abs(number) <= SUMMARY_OUT_OF_RANGE:
                state.rejected["out_of_range"] += 1
            else:
                state.add(number)


def compare_summaries(expected: Mapping[SummaryKey, SummaryState], got: Mapping[SummaryKey, SummaryState],
                      limit: int = 200) -> dict:
    """Per (summary, topic, window, group): count, min, max and rejections exact, the sum to 1e-9 of count x the
    largest magnitude (docs/summaries.md: the batch layer sums from scratch, the stream by increments). Records are
    the values plus the rejections; a missing key has none."""
    empty = SummaryState()
    diffs = []
    for key in sorted(set(expected) | set(got), key=repr):
        e, g = expected.get(key, empty), got.get(key, empty)
        scale = max(abs(e.min or 0.0), abs(e.max or 0.0), 1.0) * max(e.count, 1)
        if (e.count, e.min, e.max, dict(e.rejected)) != (g.count, g.min, g.max, dict(g.rejected)) or \
                abs(e.sum - g.sum) > 1e-9 * scale:
            diffs.append((key, e, g))
    lost = sum(max(0, e.records - g.records) for _, e, g in diffs)
    extra = sum(max(0, g.records - e.records) for _, e, g in diffs)
    return {
        "equal": not diffs,
        "windows": len({(t, w) for _, t, w, _ in set(expected) | set(got)}),
        "expected_records": sum(s.records for s in expected.values()),
        "counted_records": sum(s.records for s in got.values()),
        "lost": lost,
        "counted_twice": extra,
        "differing_keys": len(diffs),
        "differences": [
            {"topic": t, "window_start_ms": w, "window_start": iso_utc(w), "status": f"{name} {list(groups)}",
             "expected": _state_text(e), "got": _state_text(g)}
            for (name, t, w, groups), e, g in diffs[:limit]
        ],
    }


def _state_text(s: SummaryState) -> str:
    return f"count {s.count}, sum {s.sum!r}, min {s.min!r}, max {s.max!r}, rejected {dict(sorted(s.rejected.items()))}"


def summaries_from_rows(rows: Iterable[tuple]) -> tuple[dict[SummaryKey, SummaryState], list[SummaryKey]]:
    """Delta rows (summary, topic, window_ms, groups map, count, sum, min, max, rejected map) -> states, plus keys
    that have more than one row."""
    names = {s["name"]: s["group_by"] for s in SUMMARIES}
    states: dict[SummaryKey, SummaryState] = {}
    duplicates = []
    for summary, topic, window, groups, count, total, low, high, rejected in rows:
        key = (summary, topic, int(window), tuple((groups or {}).get(path) for path in names.get(summary, [])))
        if key in states:
            duplicates.append(key)
        states[key] = SummaryState(int(count), float(total or 0.0), low, high,
                                   Counter({k: int(v) for k, v in (rejected or {}).items() if v}))
    return states, sorted(duplicates, key=repr)


def counts_from_rows(rows: Iterable[tuple[str, int, str, int]]) -> tuple[dict[Key, int], list[Key]]:
    """Delta rows (topic, window_ms, status, count) -> counts, plus keys that have more than one row."""
    counts: Counter = Counter()
    rows_per_key: Counter = Counter()
    for topic, window, status, count in rows:
        counts[(topic, int(window), status)] += int(count)
        rows_per_key[(topic, int(window), status)] += 1
    return dict(counts), sorted(k for k, n in rows_per_key.items() if n > 1)


def counts_from_points(points: Mapping[str, Mapping[int, tuple[int | None, int | None]]]) -> dict[Key, int]:
    """InfluxDB points per measurement (topic): time -> (valid, invalid) -> counts per key."""
    counts: dict[Key, int] = {}
    for topic, series in points.items():
        for window, (valid, invalid) in series.items():
            counts[(topic, int(window), VALID)] = int(valid or 0)
            counts[(topic, int(window), INVALID)] = int(invalid or 0)
    return counts


def last_values(messages: Iterable[tuple[bytes | None, bytes | None]]) -> tuple[dict[Key, int], int]:
    """Metrics-topic messages in offset order -> the latest count per window key (what a compacted-topic
    consumer converges to), and the number of messages whose key or value could not be read."""
    latest: dict[Key, int] = {}
    unreadable = 0
    for key, value in messages:
        try:
            k = json.loads(key)
            if "status" not in k:
                continue  # a streaming summary's message
            latest[(k["topic"], int(k["window"]), k["status"])] = int(value)
        except (TypeError, ValueError, KeyError):
            unreadable += 1
    return latest, unreadable


def compare_archive(expected: set, archived: Mapping[tuple[str, int, int], int], limit: int = 50) -> dict:
    """(topic, partition, offset) of committed records vs how often the raw archive holds each."""
    missing = sorted(expected - set(archived))
    duplicated = sorted(k for k, n in archived.items() if n > 1 and k in expected)
    unexpected = sorted(k for k in archived if k not in expected)
    return {
        "equal": not (missing or duplicated or unexpected),
        "expected_records": len(expected),
        "archived_rows": int(sum(archived.values())),
        "missing": len(missing),
        "duplicated": len(duplicated),
        "unexpected": len(unexpected),
        "examples": {
            "missing": [list(k) for k in missing[:limit]],
            "duplicated": [list(k) + [archived[k]] for k in duplicated[:limit]],
            "unexpected": [list(k) for k in unexpected[:limit]],
        },
    }


def records_behind(progress_ends: Mapping[str, Mapping[str, int]], kafka_ends: Mapping[tuple[str, int], int]) -> int:
    """Records the stream has not read yet: Kafka's end offsets minus the stream's last committed ones."""
    behind = 0
    for (topic, partition), end in kafka_ends.items():
        done = int((progress_ends.get(topic) or {}).get(str(partition), 0))
        behind += max(0, int(end) - done)
    return behind


# -- what happened after each fault ---------------------------------------------------------------------


def _first(events: Sequence[dict], kind: str, after: float, before: float = math.inf) -> dict | None:
    return next((e for e in events if e["kind"] == kind and after <= e["t"] < before), None)


def fault_outcomes(faults: Sequence[dict], events: Sequence[dict], settle_s: float = 60.0,
                   kill_exit_s: float = 35.0) -> list[dict]:
    """Each injected fault with what the monitor saw after it.

    ``faults``: dicts with ``t`` (seconds since the run began), ``kind`` and ``end_t`` (when the component
    was back; the kill time for a kill). ``events``: the monitor's observations, sorted by ``t``, with
    kinds ``stream_started``, ``stream_gone``, ``batch_committed``, ``supervisor_restart``,
    ``batch_failure``, ``influx_pending``. Whether the stream survived a broker restart, an InfluxDB outage
    or a scheduler restart is judged by stream exits in the fault's span that no SIGKILL explains.
    """
    events = sorted(events, key=lambda e: e["t"])
    # A stream that exits within ``kill_exit_s`` after a SIGKILL is that kill's doing, not another fault's.
    kills = [f["t"] for f in faults if f["kind"] == STREAM_KILL]
    unexplained = [
        e for e in events
        if e["kind"] == "stream_gone" and not any(k - 2 <= e["t"] <= k + kill_exit_s for k in kills)
    ]
    out = []
    for fault in sorted(faults, key=lambda f: f["t"]):
        t, end = fault["t"], fault.get("end_t", fault["t"])
        row = dict(fault)
        if fault["kind"] == UNPLANNED:
            out.append(row)
            continue
        if fault["kind"] == STREAM_KILL:
            back = _first(events, "stream_started", t)
            restart = _first(events, "supervisor_restart", t, back["t"] + 5 if back else math.inf)
            row["stream_back_s"] = round(back["t"] - t, 1) if back else None
            row["by_supervisor"] = restart is not None
            row["supervisor_restarts_in_a_row"] = (restart or {}).get("restarts")
            committed = _first(events, "batch_committed", back["t"]) if back else None
            row["first_batch_after_s"] = round(committed["t"] - t, 1) if committed else None
        else:
            window_end = end + settle_s
            gone = [e for e in unexplained if t <= e["t"] < window_end]
            row["stream_survived"] = not gone
            if gone:
                back = _first(events, "stream_started", gone[0]["t"])
                row["stream_back_s"] = round(back["t"] - gone[0]["t"], 1) if back else None
            row["batch_failures_recorded"] = sum(1 for e in events if e["kind"] == "batch_failure" and t <= e["t"] < window_end)
            pending = _first(events, "influx_pending", t, window_end)
            row["influx_push_failure_recorded"] = pending is not None
            committed = _first(events, "batch_committed", end)
            row["next_batch_after_s"] = round(committed["t"] - end, 1) if committed else None
        out.append(row)
    return out


# -- the report ------------------------------------------------------------------------------------------


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _fault_line(f: dict) -> str:
    kind = f["kind"]
    if kind == UNPLANNED:
        what = f"{f.get('component')} found dead, stopped by nothing in this run (killed from outside)"
        after = (f"started again by the chaos driver in {_fmt(f.get('restarted_after_s'))} s" if not f.get("error")
                 else f"could not be started again: {f['error']}")
        return f"| {f.get('n', '')} | {_fmt(f['t'])} | {kind} | {what} | {after} |"
    if kind == STREAM_KILL:
        age = f", {_fmt(f['batch_age_s'])} s into it" if f.get("batch_age_s") is not None else ""
        what = (f"SIGKILL {f.get('target', '')} (pid {f.get('pid', '?')}), {f.get('mode', '')} kill, "
                f"batch {f.get('batch_in_flight', '-')}{age}")
        after = (
            f"back after {_fmt(f.get('stream_back_s'))} s"
            + (" (supervisor restart" + (f", {f['supervisor_restarts_in_a_row']} in a row" if f.get("supervisor_restarts_in_a_row") else "") + ")"
               if f.get("by_supervisor") else " (no supervisor restart seen)")
            + f"; first batch committed {_fmt(f.get('first_batch_after_s'))} s after the kill"
        )
        if f.get("left_over_after_30s"):
            after += (f"; its Python driver outlived the JVM: {'exited after ' + _fmt(f['left_over_exited_after_s']) + ' s' if f.get('left_over_exited_after_s') is not None else 'still running, killed after ' + _fmt(f.get('left_over_killed_after_s')) + ' s'}")
    else:
        what = {
            BROKER_RESTART: f"Kafka broker restart ({f.get('how', '')}), down {_fmt(f.get('down_s'))} s",
            INFLUX_OUTAGE: f"InfluxDB stopped for {_fmt(f.get('down_s'))} s",
            SCHEDULER_RESTART: (
                f"Airflow scheduler restarted alone: SIGTERM (pid {f.get('old_pid', '?')})"
                + (", a second SIGTERM after 30 s" if f.get("second_sigterm") else "")
                + (", still running after 90 s: SIGKILL" if f.get("old_scheduler_killed") else f", exited after {_fmt(f.get('stopped_after_s'))} s")
                + f"; a replacement `airflow scheduler` (pid {f.get('new_pid', '?')})"
            ),
        }.get(kind, kind)
        parts = ["stream survived" if f.get("stream_survived") else f"stream restarted (back after {_fmt(f.get('stream_back_s'))} s)"]
        if f.get("batch_failures_recorded"):
            parts.append(f"{f['batch_failures_recorded']} batch failure(s) recorded")
        if kind == INFLUX_OUTAGE:
            parts.append("push failure recorded for catch-up" if f.get("influx_push_failure_recorded") else "no push failure recorded")
        if kind == SCHEDULER_RESTART and f.get("healthy_after_s") is not None:
            parts.append(f"scheduler healthy after {_fmt(f['healthy_after_s'])} s")
        if kind == SCHEDULER_RESTART and f.get("next_supervisor_run_after_s") is not None:
            parts.append(f"next supervisor run {_fmt(f['next_supervisor_run_after_s'])} s after")
        parts.append(f"next batch committed {_fmt(f.get('next_batch_after_s'))} s after recovery")
        if f.get("error"):
            parts.append(f"ERROR: {f['error']}")
        after = "; ".join(parts)
    return f"| {f.get('n', '')} | {_fmt(f['t'])} | {kind} | {what} | {after} |"


def markdown(result: dict) -> str:
    p = result["parameters"]
    lines = [
        "# Chaos run",
        "",
        summary_line(result),
        "",
        f"Command: `{result['command']}`, seed **{result['seed']}**. Started {result['started_at']}, "
        f"{_fmt(result.get('duration_seconds', 0) / 60)} min in all (traffic and faults {_fmt(result.get('fault_phase_seconds', 0) / 60)} min).",
        f"Code: {result.get('code', {}).get('commit', '?')}"
        + (f" with uncommitted changes in {', '.join(result['code']['dirty'])}" if result.get("code", {}).get("dirty") else ""),
        f"Machine: {result.get('machine', {}).get('cpu', '?')}, {result.get('machine', {}).get('cores', '?')} cores, "
        f"load average at start {result.get('machine', {}).get('load_average_at_start', '?')}.",
        "",
        f"Parameters: {p['rate']} records/s over {', '.join(f'{t} ({n} partitions)' for t, n in p['topics'].items())}; "
        f"invalid {p['invalid_ratio']:.0%}, out of order {p['out_of_order']:.0%}, late {p['late']:.0%}, poison "
        f"{p['poison_ratio']:.0%} of {EVENTS}; transactions of {p['transaction_seconds']} s, {p['abort_ratio']:.0%} aborted on purpose; "
        f"allowed lateness {p['allowed_lateness_seconds']} s, trigger {p['trigger_seconds']} s; supervisor every {p['supervisor_seconds']} s"
        + (f"; tables and checkpoints on {p['storage']}." if p.get("storage") else "."),
        "",
        "## Verdict",
        "",
        f"**{result['verdict']}**",
        "",
        "| output | expected records | counted | lost | counted twice | differing keys |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, c in result.get("comparison", {}).items():
        if name == "raw_archive":
            lines.append(
                f"| raw archive (each committed record once) | {_fmt(c['expected_records'])} | {_fmt(c['archived_rows'])} | "
                f"{_fmt(c['missing'])} | {_fmt(c['duplicated'])} dup., {_fmt(c['unexpected'])} unexpected | - |"
            )
            continue
        lines.append(
            f"| {name} | {_fmt(c['expected_records'])} | {_fmt(c['counted_records'])} | {_fmt(c['lost'])} | "
            f"{_fmt(c['counted_twice'])} | {_fmt(c['differing_keys'])} |"
        )
    for name, c in result.get("comparison", {}).items():
        if c.get("differences"):
            lines += ["", f"First differences in {name}:", "", "| topic | window | status | expected | got |", "|---|---|---|---:|---:|"]
            lines += [f"| {d['topic']} | {d['window_start']} | {d['status']} | {d['expected']} | {d['got']} |" for d in c["differences"][:30]]
        if c.get("duplicate_rows"):
            lines += ["", f"{name}: {len(c['duplicate_rows'])} keys with more than one row, e.g. {c['duplicate_rows'][:5]}"]
    t = result.get("truth", {})
    lines += [
        "",
        "## Traffic (read back from Kafka, read_committed)",
        "",
        f"{_fmt(t.get('records'))} committed records in {_fmt(t.get('windows'))} windows: "
        + ", ".join(f"{k} {_fmt(v)}" for k, v in sorted(t.get("by_kind", {}).items()))
        + "; " + ", ".join(f"{k} {_fmt(v)}" for k, v in sorted(t.get("by_timing", {}).items()))
        + f". Expected verdicts: {', '.join(f'{k} {_fmt(v)}' for k, v in sorted(t.get('by_status', {}).items()))}.",
        "",
        "Poison records: " + ", ".join(f"{k} {_fmt(v)}" for k, v in t.get("poison", {}).items()) + ".",
        "",
    ]
    prod = result.get("producer", {})
    if prod:
        lines += [
            f"Producer: {_fmt(prod.get('committed'))} records in {_fmt(prod.get('transactions_committed'))} committed transactions, "
            f"{_fmt(prod.get('aborted_on_purpose'))} records in {_fmt(prod.get('transactions_aborted_on_purpose'))} transactions aborted on purpose "
            f"(a read_uncommitted reader finds {_fmt(result.get('aborted_records_in_log'))} of them in the log, the read_committed "
            f"truth reader {_fmt(t.get('meant_to_abort_but_read'))}), {_fmt(prod.get('lost_to_faults', 0))} records in "
            f"{_fmt(prod.get('transactions_failed', 0))} transactions that faults made fail (aborted, never committed), "
            f"{_fmt(prod.get('producer_restarts', 0))} producer re-creations, {_fmt(prod.get('errors', 0))} retried errors.",
            "",
        ]
    kills = [f for f in result.get("faults", []) if f["kind"] == STREAM_KILL]
    back = [f["stream_back_s"] for f in kills if f.get("stream_back_s") is not None]
    lines += [
        "## Faults",
        "",
        f"{len(kills)} stream kills"
        + (f" (back after {min(back):.0f}–{max(back):.0f} s, median {sorted(back)[len(back) // 2]:.0f} s)" if back else "")
        + ", " + ", ".join(f"{n} {k}" for k, n in sorted(Counter(f["kind"] for f in result.get("faults", []) if f["kind"] != STREAM_KILL).items()))
        + (f" ({sum(1 for f in result.get('faults', []) if f['kind'] == UNPLANNED)} {UNPLANNED}: a component killed from "
           "outside the run, not a planned fault)" if any(f["kind"] == UNPLANNED for f in result.get("faults", [])) else "")
        + ". Times (t) are seconds since the fault phase began (the traffic started before it, once the supervisor's stream was counting).",
        "",
        "| # | t (s) | fault | what | what happened after |",
        "|---|---:|---|---|---|",
    ]
    lines += [_fault_line({**f, "n": i + 1}) for i, f in enumerate(result.get("faults", []))]
    end = result.get("end", {})
    if end:
        lines += ["", "## End of the run", ""]
        lines += [f"- {line}" for line in end.get("notes", [])]
    jobs = result.get("jobs", [])
    if jobs:
        lines += [
            "",
            "## Jobs beside the stream",
            "",
            "Started during the fault phase, each while the stream was writing (the recompute DAG also ran on its "
            f"schedule, every {_fmt(p.get('recompute_minutes'))} min; its runs are under Airflow below).",
            "",
            "| # | t (s) | job | what | outcome |",
            "|---|---:|---|---|---|",
        ]
        lines += [_job_line({**j, "n": i + 1}) for i, j in enumerate(jobs)]
    if result.get("writers"):
        lines += ["", "## Writers beside the stream (`kdq status`, read at the end of the run)", "", "```"]
        lines += [str(line) for line in result["writers"]]
        lines += ["```"]
    air = result.get("airflow", {})
    if air:
        lines += ["", "## Airflow", ""]
        lines += [f"- {dag} runs: " + (", ".join(f"{s} {n}" for s, n in sorted(states.items())) or "none")
                  for dag, states in air.get("runs", {}).items()]
    return "\n".join(lines) + "\n"


def _job_line(j: dict) -> str:
    outcome = j.get("state") or "?"
    if j.get("seconds") is not None:
        outcome += f" after {_fmt(j['seconds'])} s"
    if j.get("detail"):
        outcome += f"; {j['detail']}"
    if j.get("error"):
        outcome += f"; ERROR: {j['error']}"
    return f"| {j.get('n', '')} | {_fmt(j.get('t'))} | {j['kind']} | {j.get('what', '')} | {outcome} |"


def summary_line(result: dict) -> str:
    """One line for the README: when, how long, what was injected, the verdict."""
    faults = Counter(f["kind"] for f in result.get("faults", []))
    t = result.get("truth", {})
    return (
        f"{result.get('started_at', '?')[:16].replace('T', ' ')} UTC, seed {result.get('seed')}: "
        f"{_fmt(result.get('fault_phase_seconds', 0) / 60)} min of traffic ({_fmt(t.get('records'))} committed records, "
        f"{_fmt(t.get('by_kind', {}).get('poison'))} poison, {_fmt(t.get('by_timing', {}).get('late'))} late) with "
        f"{faults.get(STREAM_KILL, 0)} stream SIGKILLs, {faults.get(BROKER_RESTART, 0)} broker restarts, "
        f"{faults.get(INFLUX_OUTAGE, 0)} InfluxDB outage, {faults.get(SCHEDULER_RESTART, 0)} scheduler restart"
        + (f", beside the stream {_jobs_phrase(result['jobs'])}" if result.get("jobs") else "")
        + ": "
        f"{result.get('verdict', '?')}."
    )


def _jobs_phrase(jobs: Sequence[dict]) -> str:
    counts = Counter(j["kind"] for j in jobs)
    names = {REBUILD: "rebuild", MAINTENANCE: "maintenance", BACKFILL: "recompute backfill", ARCHIVE_BACKFILL: "archive backfill"}
    return ", ".join(f"{n} {names.get(k, k)}{'s' if n > 1 else ''}" for k, n in counts.items())


def as_jsonable(obj: object) -> object:
    """Dataclasses, tuples-as-keys and Counters into plain JSON values."""
    if hasattr(obj, "__dataclass_fields__"):
        return as_jsonable(asdict(obj))  # type: ignore[arg-type]
    if isinstance(obj, Mapping):
        return {("|".join(map(str, k)) if isinstance(k, tuple) else str(k)): as_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [as_jsonable(v) for v in obj]
    return obj
