"""The JVM classifier's RuleCompilerCasesTest runs the Python classifier tests' SCHEMAS/CASES table from a frozen
export (jvm/kdq-spark-functions/src/test/resources/rule_compiler_cases.json): it must be the export of today's
table, or the two classifiers' agreement is checked on stale cases."""

from __future__ import annotations

import importlib.util

from tests.conftest import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "jvm" / "kdq-spark-functions" / "scripts" / "export_rule_compiler_cases.py"


def _exporter():
    spec = importlib.util.spec_from_file_location("export_rule_compiler_cases", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_jvm_cases_are_the_export_of_the_python_table() -> None:
    exporter = _exporter()
    assert exporter.OUT.read_text() == exporter.export_text(exporter.DEFAULT_SOURCE), (
        "rule_compiler_cases.json is not the export of the Python table: run "
        ".venv/bin/python jvm/kdq-spark-functions/scripts/export_rule_compiler_cases.py"
    )
