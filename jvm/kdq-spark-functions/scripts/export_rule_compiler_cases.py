"""Export the Python rule tests' SCHEMAS and CASES table for the JVM classifier's tests.

The table lives in tests/unit/test_classifier.py; pass another file as the first argument if it moves.

Writes src/test/resources/rule_compiler_cases.json: a Classifier configuration built like the
rules folder of that test (topics.toml entries first, then the <topic>.schema.json files in name
order, plus config/rules/orders.schema.json) and every (topic, value, expected reason) row, values
in base64. Re-run after changing the Python table:

    .venv/bin/python jvm/kdq-spark-functions/scripts/export_rule_compiler_cases.py
"""

from __future__ import annotations

import base64
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OUT = Path(__file__).resolve().parents[1] / "src" / "test" / "resources" / "rule_compiler_cases.json"


DEFAULT_SOURCE = ROOT / "tests" / "unit" / "test_classifier.py"


def export_text(source: Path) -> str:
    """The export of the table in ``source``, exactly as written to OUT (tests/unit/test_rule_compiler_export.py
    compares it with the committed file, so the JVM tests never run a stale copy of the Python table)."""
    spec = importlib.util.spec_from_file_location("trc", source)
    trc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trc)

    def rule(label, match, schema, *, is_pattern=False, source=None, field=None, fmt="auto"):
        name = source or f"{label}.schema.json"
        return {
            "label": label,
            "match": match,
            "is_pattern": is_pattern,
            "source": f"rules/{name}",
            "base_uri": f"kdq:/rules/{name}",
            "schema": schema,
            "event_time_field": field,
            "event_time_format": fmt,
            "version": f"v-{label}",
        }

    pattern_schema = {"type": "object", "required": ["id"]}
    rules = [
        rule("pat.free", "pat.free", None),
        rule("re:pat\\..*", "pat\\..*", pattern_schema, is_pattern=True, source="pattern-rule.json"),
        rule("evt", "evt", None, field=["meta", "event_time"], fmt="epoch_millis"),
    ]
    schemas = dict(trc.SCHEMAS)
    schemas["orders"] = json.loads((ROOT / "config" / "rules" / "orders.schema.json").read_text())
    for topic in sorted(schemas):
        rules.append(rule(topic, topic, schemas[topic]))
    config = {
        "max_value_bytes": trc.MAX_BYTES,
        "max_nesting_depth": 500,
        "assert_format": True,
        "rules": rules,
        "resources": {},
    }
    cases = [
        {
            "topic": topic,
            "value": None if value is None else base64.b64encode(value).decode(),
            "expected": expected,
        }
        for topic, value, expected in trc.CASES
    ]
    return json.dumps({"config": config, "cases": cases}, indent=1, ensure_ascii=False) + "\n"


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SOURCE
    text = export_text(source)
    OUT.write_text(text)
    print(f"{OUT}: {len(json.loads(text)['cases'])} cases (from {source})")


if __name__ == "__main__":
    main()
