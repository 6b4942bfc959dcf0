"""No value can stop the counts: every record gets a verdict from the classification both layers use.

The speed layer, the hourly recompute, the rebuild and archive-from-Kafka all call
:func:`kdq.spark.transforms.classify`; a record it cannot classify would fail the
whole micro-batch, and a replay would fail the same way forever. Here generated
adversarial values (random bytes, absurd event times, deep nesting, numbers beyond
64 bits, lone surrogates, duplicate keys, a rule with a catastrophic regex) and
the named poison records (POISON) go through it, and every row must come
back with a verdict.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdq.config import StreamConfig
from kdq.rules import RuleSet, load_rules
from kdq.spark.classifier import MAX_NESTING_DEPTH

# Everything classify may answer; "schema:<pointer>" reasons are checked by prefix.
KNOWN_REASONS = {"too_large", "null_value", "not_utf8", "not_json", "too_complex", "bad_timestamp", "future_timestamp"}
RULE_REASON_PREFIXES = ("schema:", "pattern_budget:")
MAX_EVENT_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
KAFKA_TS = dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC)
STREAM = StreamConfig(window_seconds=1, max_value_bytes=200_000)

# One topic per event-time format, one with a schema, one without any rule.
TOPICS = ("evt.auto", "evt.millis", "evt.iso", "nested.auto", "schema", "plain")
TOPICS_TOML = """
[[topic]]
match = "evt.auto"
event_time_field = "ts"

[[topic]]
match = "evt.millis"
event_time_field = "ts"
event_time_format = "epoch_millis"

[[topic]]
match = "evt.iso"
event_time_field = "ts"
event_time_format = "iso8601"

[[topic]]
match = "nested.auto"
event_time_field = "meta.ts"
"""
SCHEMA = {
    "type": "object",
    "required": ["id"],
    "properties": {
        "id": {"type": "string", "maxLength": 8},
        "n": {"type": "integer", "minimum": 0},
        # Exponential backtracking for java.util.regex on a long run of a's without a match.
        "s": {"type": "string", "pattern": "^(.*a){20}$"},
    },
}


@pytest.fixture(scope="module")
def ruleset(tmp_path_factory: pytest.TempPathFactory) -> RuleSet:
    folder: Path = tmp_path_factory.mktemp("adversarial-rules")
    (folder / "topics.toml").write_text(TOPICS_TOML)
    (folder / "schema.schema.json").write_text(json.dumps(SCHEMA))
    return load_rules(folder)


def classify_values(
    spark, ruleset: RuleSet, records: list[tuple[str, bytes | None]], kafka_ts: list[dt.datetime | None] | None = None
) -> list:
    """(topic, value) → classified rows in input order (offset = position)."""
    from kdq.spark import transforms

    stamps = kafka_ts or [KAFKA_TS] * len(records)
    rows = [(topic, 0, i, value, stamps[i], None) for i, (topic, value) in enumerate(records)]
    frame = spark.createDataFrame(
        rows, "topic string, partition int, offset long, value binary, timestamp timestamp, key binary"
    )
    ingest_ms = int(time.time() * 1000)
    classified = transforms.classify(frame, ruleset, STREAM, ingest_ms)
    return sorted(classified.collect(), key=lambda r: r["offset"])


def _lone_surrogate(value: object) -> bool:
    """Whether a decoded JSON value holds a lone surrogate anywhere (iterative: values nest deeper than Python's
    recursion limit)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if any(0xD800 <= ord(c) <= 0xDFFF for c in item):
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    if len({k for k, _ in pairs}) != len(pairs):
        raise ValueError("duplicate key")
    return dict(pairs)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def bytes_verdict(value: bytes | None) -> str | None:
    """What the bytes alone decide, by an oracle independent of the classifier (Python's decoder and json
    module, made strict): ``null_value``, ``not_utf8`` or ``not_json``; ``"json"`` for a well-formed JSON text
    (the rest depends on the topic's rule); None when this oracle cannot tell (empty or blank, a BOM, nesting or
    numbers beyond Python's own limits, where the classifier's size and complexity limits decide)."""
    if value is None:
        return "null_value"
    try:
        text = value.decode("utf-8")  # strict: an encoded surrogate is no UTF-8
    except UnicodeDecodeError:
        return "not_utf8"
    if not text.strip() or text.startswith("\ufeff"):
        return None
    try:
        parsed = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        return None
    except ValueError as exc:
        # Python's own limit on integer digits is no JSON rule (the classifier says too_complex there).
        return None if "digits" in str(exc) else "not_json"
    return "not_json" if _lone_surrogate(parsed) else "json"


def _depth(value: object) -> int:
    """Nesting depth of a decoded JSON value as the parser's limit counts it: a scalar 0, ``[1]`` 1, ``[[1]]`` 2."""
    deepest, pending = 0, [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


UNDECIDED = object()  # what expected_reason answers where this oracle cannot tell


def expected_reason(topic: str, value: bytes | None, kafka_ts: dt.datetime | None, ingest: dt.datetime) -> object:
    """The one reason classify must give, by the precedence it documents (what is wrong with the bytes, then the
    clock, then the rule), wherever this oracle can tell: the bytes' verdict (:func:`bytes_verdict`); a well-formed
    text nested deeper than the parser's limit is ``too_complex``; a Kafka timestamp outside 1970..9999 (or none)
    is ``bad_timestamp`` on every topic; on the topic without a rule the Kafka timestamp is the event time, so the
    record is ``future_timestamp`` beyond the future margin and valid (None) otherwise. :data:`UNDECIDED` else (a
    rule's event-time field or schema decides, or the bytes are beyond this oracle)."""
    verdict = bytes_verdict(value)
    if verdict in ("null_value", "not_utf8", "not_json"):
        return verdict
    if verdict != "json":
        return UNDECIDED
    if _depth(json.loads(value)) > MAX_NESTING_DEPTH:
        return "too_complex"
    if kafka_ts is None or not 0 <= kafka_ts.timestamp() * 1000 <= MAX_EVENT_MS:
        return "bad_timestamp"
    if topic != "plain":
        return UNDECIDED
    # ingest: as Spark hands back a timestamp, naive in this process's zone (which .timestamp() assumes).
    ahead_seconds = kafka_ts.timestamp() - ingest.timestamp()
    return "future_timestamp" if ahead_seconds > STREAM.future_margin_seconds else None


def assert_every_record_has_a_verdict(
    records: list[tuple[str, bytes | None]], got: list, kafka_ts: list[dt.datetime | None] | None = None
) -> int:
    """Every record once, with a verdict, and the expected reason wherever :func:`expected_reason` tells;
    returns how many reasons were checked exactly."""
    assert len(got) == len(records), "every record comes back exactly once"
    exact = 0
    stamps = kafka_ts or [KAFKA_TS] * len(records)
    for (topic, value), stamp, row in zip(records, stamps, got, strict=True):
        where = f"{topic} {value[:200] if value else value!r} kafka_ts={stamp}"
        assert row["valid"] in (True, False), where
        assert row["valid"] == (row["reason"] is None), where
        if row["reason"] is not None:
            assert row["reason"] in KNOWN_REASONS or row["reason"].startswith(RULE_REASON_PREFIXES), (where, row["reason"])
        # Not only a known reason: the right one wherever the oracle can tell.
        expected = expected_reason(topic, value, stamp, row["ingest_time"])
        if expected is not UNDECIDED:
            assert row["reason"] == expected, (where, row["reason"], expected)
            exact += 1
        elif bytes_verdict(value) == "json":
            assert row["reason"] not in ("null_value", "not_utf8", "not_json"), (where, row["reason"])
        assert row["event_time"] is not None and row["window_start"] is not None and row["event_hour"], where
        assert 0 <= row["event_time"].timestamp() * 1000 <= MAX_EVENT_MS, where
    return exact


# -- generated values -------------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    # Every code point, lone surrogates included: json.dumps escapes them as \udXXX.
    st.text(st.characters(codec=None, exclude_categories=()), max_size=40),
)
_json_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=20,
)
_event_times = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([1_700_000_000_000_000_000, 1_700_000_000_000_000, -1, -62_135_596_800_001, MAX_EVENT_MS + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.from_regex(r"-?[0-9]{1,30}", fullmatch=True),
    st.from_regex(r"[+-]?[0-9]{1,6}-[0-9]{1,2}-[0-9]{1,2}([T ][0-9]{1,2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,9})?)?(Z|[+-][0-9]{2}:?[0-9]{2})?)?", fullmatch=True),
    st.sampled_from(["NaN", "Infinity", "", "now", "9" * 5000]),
    _json_values,
)


def _encode(value: object) -> bytes:
    return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")


@st.composite
def _record(draw: st.DrawFn) -> tuple[str, bytes | None]:
    topic = draw(st.sampled_from(TOPICS))
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return topic, draw(st.one_of(st.none(), st.binary(max_size=64)))
    if kind == 1:
        depth = draw(st.integers(1, 3000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        return topic, (opener * depth + "1" + closer * depth).encode()
    if kind == 2:
        key = draw(st.sampled_from(["ts", "id", "a"]))
        return topic, f'{{"{key}":1,"{key}":2}}'.encode()
    if kind == 3:
        return topic, _encode(draw(_json_values))
    ts = draw(_event_times)
    body = {"id": draw(st.text(max_size=10)), "ts": ts, "meta": {"ts": ts}}
    if draw(st.booleans()):
        body["s"] = "a" * draw(st.integers(0, 80)) + draw(st.sampled_from(["", "b", "ab"]))
    return topic, _encode(body)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(records=st.lists(_record(), min_size=1, max_size=40))
def test_generated_values_all_get_a_verdict(spark, ruleset: RuleSet, records) -> None:
    assert_every_record_has_a_verdict(records, classify_values(spark, ruleset, records))


# Kafka timestamps as Spark's source can deliver them (up to about year 294,000; beyond that the source
# itself fails, see kdq.spark.kafka_fallback, which delivers null instead), and none at all.
_kafka_timestamps = st.one_of(
    st.none(),
    st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31), timezones=st.just(dt.UTC)),
    st.sampled_from([dt.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=dt.UTC)]),  # Kafka's -1: no timestamp
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(pairs=st.lists(st.tuples(_record(), _kafka_timestamps), min_size=1, max_size=30))
def test_generated_kafka_timestamps_all_get_a_verdict(spark, ruleset: RuleSet, pairs) -> None:
    records = [record for record, _ in pairs]
    stamps = [stamp for _, stamp in pairs]
    got = classify_values(spark, ruleset, records, stamps)
    assert_every_record_has_a_verdict(records, got, stamps)
    for (_, stamp), row in zip(pairs, got, strict=True):
        if stamp is None or stamp.year < 1970:
            # Only what is wrong with the bytes outranks the clock.
            assert row["reason"] in ("bad_timestamp", "not_json", "not_utf8", "null_value", "too_large", "too_complex"), row


# -- the named poison records -----------------------------------------------------------------------

POISON: list[tuple[str, bytes, str | None]] = [
    # event times out of range, read from the configured field
    ("evt.auto", b'{"ts": 1700000000000000000}', "bad_timestamp"),  # epoch nanoseconds
    ("evt.millis", b'{"ts": 1700000000000000000}', "bad_timestamp"),
    ("evt.auto", b'{"ts": 1700000000000000}', "bad_timestamp"),  # epoch microseconds
    ("evt.millis", b'{"ts": "1700000000000000"}', "bad_timestamp"),
    ("evt.auto", b'{"ts": -1}', "bad_timestamp"),  # negative
    ("evt.auto", b'{"ts": -62135596800001}', "bad_timestamp"),  # before year 1
    ("evt.auto", b'{"ts": 253402300800000}', "bad_timestamp"),  # after 9999
    ("evt.iso", b'{"ts": "10000-01-01T00:00:00Z"}', "bad_timestamp"),
    ("evt.iso", b'{"ts": "0000-01-01T00:00:00Z"}', "bad_timestamp"),
    ("evt.iso", b'{"ts": "1969-12-31T23:59:59Z"}', "bad_timestamp"),
    ("evt.auto", b'{"ts": "NaN"}', "bad_timestamp"),
    ("evt.auto", b'{"ts": NaN}', "not_json"),
    ("evt.auto", b'{"ts": "' + b"9" * 100_000 + b'"}', "bad_timestamp"),  # huge string
    ("evt.auto", b'{"ts": 123456789012345678901234567890}', "bad_timestamp"),  # beyond 64 bits
    ("evt.auto", b'{"ts": 1e400}', "bad_timestamp"),
    ("nested.auto", b'{"meta": {"ts": 1700000000000000000}}', "bad_timestamp"),
    # the boundaries themselves are fine
    ("evt.auto", b'{"ts": 0}', None),
    ("evt.auto", b'{"ts": 1700000000000}', None),
    ("evt.auto", b'{"ts": 253402300799999}', "future_timestamp"),  # readable, but far ahead of ingest
    ("evt.iso", b'{"ts": "9999-12-31T23:59:59.999Z"}', "future_timestamp"),
    # structure
    ("plain", b"[" * 20_000 + b"]" * 20_000, "too_complex"),  # deeper than the parser's limit
    ("plain", b"[" * MAX_NESTING_DEPTH + b"]" * MAX_NESTING_DEPTH, None),  # at the limit
    ("plain", b"[" * (MAX_NESTING_DEPTH + 1) + b"]" * (MAX_NESTING_DEPTH + 1), "too_complex"),  # one past it
    ("schema", b'{"id":"a","n":' + b"9" * 40 + b"}", None),  # an integer beyond 64 bits, still >= 0
    ("schema", b'{"id":"a","n":-' + b"9" * 40 + b"}", "schema:/properties/n/minimum"),
    ("schema", b'{"id":"a","n":' + b"9" * 5_000 + b"}", "too_complex"),  # a number longer than the parser's limit
    ("schema", b'{"id":"a","n":1e999999999}', "too_complex"),  # multipleOf-style arithmetic on it could hang
    ("schema", b'{"id":"\\ud800"}', "not_json"),  # a lone surrogate escape is no Unicode text
    ("schema", b'{"id":"a","s":"' + b"a" * 64 + b'b"}', "pattern_budget:/properties/s/pattern"),  # catastrophic regex
    ("schema", b'{"id":"a","s":"aaab"}', "schema:/properties/s/pattern"),
    ("schema", b'{"id":"\xed\xa0\x80"}', "not_utf8"),  # an encoded surrogate is not UTF-8
    ("schema", b'{"id":"a","id":"b"}', "not_json"),  # duplicate keys
]


def test_named_poison_records_get_their_reason(spark, ruleset: RuleSet) -> None:
    records = [(topic, value) for topic, value, _ in POISON]
    got = classify_values(spark, ruleset, records)
    assert_every_record_has_a_verdict(records, got)
    mismatches = [
        f"{topic} {value[:60]!r}: expected {expected!r}, got {row['reason']!r}"
        for (topic, value, expected), row in zip(POISON, got, strict=True)
        if row["reason"] != expected
    ]
    assert mismatches == [], "\n".join(mismatches)
    # A bad event time counts in the window of the Kafka timestamp.
    assert got[0]["event_time"] == KAFKA_TS.replace(tzinfo=None)
