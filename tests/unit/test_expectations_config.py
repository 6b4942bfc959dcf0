"""[expectations] in topics.toml: parsed and checked with the rules, merged per topic, never in a rule version."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kdq.anomaly import AnomalySettings, alpha_for_budget
from kdq.expectations_config import ExpectationSet
from kdq.rules import RuleError, load_rules
from tests.conftest import PROJECT_ROOT

RULES = """
[[topic]]
match = 're:legacy\\..*'
schema = "legacy.json"
event_time_field = "ts"

[[topic]]
match = "orders"
"""

EXPECTATIONS = """
[expectations]
clear_after_minutes = 15
invalid_ratio = { above = 0.05, over_minutes = 5, min_records = 20, worsen_at = [0.2, 0.5] }
silence = { below = 3, over_minutes = 10 }
anomaly = { weeks = 3 }
latency = { above_seconds = 120 }
lag = { above_records = 100000, clear_after_minutes = 5 }
batch_failing = { attempts_above = 1 }
batch_running = { above_seconds = 900 }
unruled_topic = true

[[expectations.reason]]
reason = "schema:/properties/amount"
count_above = 100

[[expectations.topic]]
match = "orders"
invalid_ratio = { above = 0.01 }
silence = false
reason = []

[[expectations.topic]]
match = 're:legacy\\..*'
unruled_topic = false
clear_after_minutes = 30

[[expectations.topic.reason]]             # this entry's reasons (they replace the defaults')
reason = "not_json"
share_above = 0.5
"""


def folder(tmp_path: Path, toml: str) -> Path:
    (tmp_path / "orders.schema.json").write_text(json.dumps({"type": "object", "required": ["id"]}))
    (tmp_path / "legacy.json").write_text(json.dumps({"type": "object"}))
    (tmp_path / "topics.toml").write_text(toml)
    return tmp_path


def test_expectations_change_no_rule_version(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = load_rules(folder(tmp_path / "a", RULES))
    expecting = load_rules(folder(tmp_path / "b", RULES + EXPECTATIONS))
    assert plain.expectations == ExpectationSet() and expecting.expectations != ExpectationSet()
    assert expecting.version == plain.version
    for topic in ("orders", "legacy.eu", "payments"):
        assert expecting.version_for(topic) == plain.version_for(topic)


def test_the_shipped_topics_toml_changes_no_version_and_parses(tmp_path: Path) -> None:
    shipped = PROJECT_ROOT / "config" / "rules"
    assert (shipped / "topics.toml").is_file()
    without = tmp_path / "rules"
    shutil.copytree(shipped, without)
    (without / "topics.toml").unlink()
    rules, bare = load_rules(shipped), load_rules(without)
    # Its active entries are the demo's registry-backed topics; every schema file's rule keeps its version.
    assert [r.label for r in rules.rules if r.registry] == ["orders.avro", "payments.proto"]
    assert [(r.label, r.version) for r in rules.rules if not r.registry] == [(r.label, r.version) for r in bare.rules]
    # The demo's expectation: a burst (`kdq demo --burst`) over its ~10 % invalid traffic, nothing else.
    (ratio,) = rules.expectations.for_topic("orders")
    assert (ratio.name, ratio.threshold, ratio.over_minutes, ratio.min_records) == ("invalid_ratio", 0.3, 1, 50)
    # The commented example, uncommented, is a valid configuration (so the documentation does not rot).
    text = (shipped / "topics.toml").read_text()
    example = "\n".join(line[2:] for line in text.splitlines() if line.startswith("# ") and "=" in line
                        or line.startswith("# [")).replace("legacy.schema.json", "legacy.json")
    (tmp_path / "ex").mkdir()
    loaded = load_rules(folder(tmp_path / "ex", example))
    assert loaded.expectations.for_topic("orders")[0].threshold == 0.01


def test_defaults_and_entries_merge_key_by_key_first_match_wins(tmp_path: Path) -> None:
    exp = load_rules(folder(tmp_path, RULES + EXPECTATIONS)).expectations
    default = {c.name: c for c in exp.for_topic("clicks")}
    assert set(default) == {"invalid_ratio", "silence", "anomaly", "reason_count:schema:/properties/amount"}
    ratio = default["invalid_ratio"]
    assert (ratio.threshold, ratio.over_minutes, ratio.min_records, ratio.worsen_at) == (0.05, 5, 20, (0.2, 0.5))
    assert ratio.clear_after_minutes == 15 and ratio.level(0.3) == 1 and ratio.level(0.6) == 2
    assert default["silence"].lower_is_worse and default["silence"].violated(2) and not default["silence"].violated(3)
    assert default["anomaly"].anomaly == AnomalySettings(weeks=3)
    assert default["anomaly"].threshold == alpha_for_budget(AnomalySettings(weeks=3))
    orders = {c.name: c for c in exp.for_topic("orders")}
    assert set(orders) == {"invalid_ratio", "anomaly"}  # silence off, reasons replaced by none
    assert (orders["invalid_ratio"].threshold, orders["invalid_ratio"].over_minutes) == (0.01, 5)
    legacy = {c.name: c for c in exp.for_topic("legacy.eu")}
    assert set(legacy) == {"invalid_ratio", "silence", "anomaly", "reason_share:not_json"}
    assert legacy["invalid_ratio"].clear_after_minutes == 30
    assert exp.unruled_check("legacy.eu") is None and exp.unruled_check("clicks") is not None
    assert {c.name: c.clear_after_minutes for c in exp.stream} == {"latency": 15, "lag": 5, "batch_failing": 15,
                                                                  "batch_running": 15}
    assert {c.name: c.threshold for c in exp.stream if c.name.startswith("batch_")} == {
        "batch_failing": 1.0, "batch_running": 900.0}
    assert exp.lookback_minutes() >= 3 * 7 * 24 * 60
    assert exp.reads_reasons()  # the defaults' reason_count, the legacy entry's reason_share


def test_only_a_reason_check_makes_an_evaluation_read_the_reasons(tmp_path: Path) -> None:
    def mkdir(path: Path) -> Path:
        path.mkdir()
        return path

    ratio_only = load_rules(folder(mkdir(tmp_path / "a"), RULES + "[expectations]\ninvalid_ratio = { above = 0.3 }\n"))
    assert not ratio_only.expectations.reads_reasons()
    in_an_entry = load_rules(folder(mkdir(tmp_path / "b"), RULES + (
        "[expectations]\ninvalid_ratio = { above = 0.3 }\n"
        "[[expectations.topic]]\nmatch = 'orders'\n"
        "[[expectations.topic.reason]]\nreason = 'not_json'\ncount_above = 5\n")))
    assert in_an_entry.expectations.reads_reasons()


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[expectations]\ninvalid_raito = { above = 0.1 }\n", "unknown key 'invalid_raito' (did you mean 'invalid_ratio'?)"),
        ("[expectations]\ninvalid_ratio = { abov = 0.1 }\n", "invalid_ratio: unknown key 'abov' (did you mean 'above'?)"),
        ("[expectations]\ninvalid_ratio = { above = 5 }\n", "invalid_ratio: above must be a number >= 0 and < 1, got 5"),
        ("[expectations]\ninvalid_ratio = { over_minutes = 5 }\n", "invalid_ratio: above is required"),
        ("[expectations]\ninvalid_ratio = true\n", "invalid_ratio must be a table"),
        ("[expectations]\ninvalid_ratio = { above = 0.1, worsen_at = [0.05] }\n",
         "worsen_at must be strictly increasing, above the threshold 0.1"),
        ("[expectations]\nsilence = { below = 5, worsen_at = [6] }\n", "worsen_at must be strictly decreasing, below"),
        ("[expectations]\nsilence = { over_minutes = 0 }\n", "silence: over_minutes must be an integer >= 1, got 0"),
        ("[expectations]\nlatency = { above_seconds = 0 }\n", "latency: above_seconds must be a number > 0"),
        ("[expectations]\nbatch_failing = { attempts_above = -1 }\n", "batch_failing: attempts_above must be an integer >= 0"),
        ("[expectations]\nbatch_running = {}\n", "batch_running: above_seconds is required"),
        ("[expectations]\nanomaly = { weeks = 'two' }\n", "anomaly: weeks must be an integer > 0"),
        ("[expectations]\nclear_after_minutes = 0\n", "clear_after_minutes must be an integer >= 1"),
        ("[expectations]\nunruled_topic = 'yes'\n", "unruled_topic must be true or false"),
        ("[[expectations.reason]]\ncount_above = 3\n", "reason #1: reason is required"),
        ("[[expectations.reason]]\nreason = 'not_json'\ncount_above = 3\nshare_above = 0.1\n",
         "exactly one of count_above and share_above"),
        ("[[expectations.reason]]\nreason = 'x'\ncount_above = 3\n[[expectations.reason]]\nreason = 'x'\ncount_above = 4\n",
         "'reason_count:x' is declared twice"),
        ("[[expectations.topic]]\nmatch = 'orders'\nlatency = { above_seconds = 1 }\n",
         "entry #1 (match = 'orders'): unknown key 'latency'"),
        ("[[expectations.topic]]\nmatch = 'orders'\nbatch_running = { above_seconds = 1 }\n",
         "the stream's checks are set in [expectations] only"),
        ("[[expectations.topic]]\ninvalid_ratio = { above = 0.1 }\n", "entry #1: 'match' is required"),
        ("[[expectations.topic]]\nmatch = 're:(('\n", "bad regex"),
        ("[[expectations.topic]]\nmatch = 'orders'\ninvalid_ratio = { over_minutes = 3 }\n",
         "(match = 'orders'): invalid_ratio: above is required"),
    ],
)
def test_broken_expectations_name_the_file_and_the_key(tmp_path: Path, toml: str, message: str) -> None:
    with pytest.raises(RuleError) as info:
        load_rules(folder(tmp_path, toml))
    assert str(info.value).startswith(f"{tmp_path / 'topics.toml'}: ")
    assert message in str(info.value)


def test_an_empty_table_is_the_check_with_its_defaults_and_false_turns_it_off(tmp_path: Path) -> None:
    exp = load_rules(folder(tmp_path, "[expectations]\nsilence = {}\nbatch_failing = {}\n")).expectations
    (silence,) = exp.defaults
    assert (silence.name, silence.threshold, silence.over_minutes) == ("silence", 1.0, 15)
    assert [(c.name, c.threshold) for c in exp.stream] == [("batch_failing", 0.0)]
    (tmp_path / "off").mkdir()
    off = load_rules(folder(tmp_path / "off", "[expectations]\nsilence = false\n")).expectations
    assert off.defaults == ()
