"""The official JSON-Schema-Test-Suite (draft 2020-12, every required case) through the Spark function.

The suite is vendored in jvm/kdq-spark-functions/src/test/resources/json-schema-test-suite/ (MIT,
commit in its README). Every test group becomes a rule file of its own topic in one rules folder,
loaded with :func:`kdq.rules.load_rules` like a user's rules; the suite's remote documents
(http://localhost:1234/…) are a subfolder mapped with ``[remotes]``, so nothing is fetched. All
cases then run as one DataFrame through the classifier both layers use, and each must get the
suite's verdict: valid exactly when the record has no problem.

Deliberate exclusion: kdq asserts ``format`` (config/rules/README.md), while draft 2020-12's default
treats it as an annotation; the suite's cases "… is only an annotation by default" therefore come
out invalid with ``schema:/format``, and are checked to do exactly that.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kdq.rules import load_rules
from tests.unit.test_classifier import verdicts

SUITE = (
    Path(__file__).resolve().parents[2]
    / "jvm"
    / "kdq-spark-functions"
    / "src"
    / "test"
    / "resources"
    / "json-schema-test-suite"
)
ANNOTATION_ONLY = "only an annotation by default"


def _cases() -> list[tuple[str, str, str, object, bool, object]]:
    """(topic, file, description, schema, expected valid, data) for every required draft 2020-12 case."""
    cases = []
    for path in sorted((SUITE / "tests" / "draft2020-12").glob("*.json")):
        for g, group in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            topic = f"{path.stem}.{g}"
            for test in group["tests"]:
                description = f"{path.name} / {group['description']} / {test['description']}"
                cases.append((topic, path.name, description, group["schema"], test["valid"], test["data"]))
    return cases


@pytest.fixture(scope="module")
def suite_rules(tmp_path_factory: pytest.TempPathFactory):
    folder: Path = tmp_path_factory.mktemp("suite-rules")
    shutil.copytree(SUITE / "remotes", folder / "remotes")
    (folder / "topics.toml").write_text('[remotes]\n"http://localhost:1234/" = "remotes/"\n')
    for topic, _, _, schema, _, _ in _cases():
        (folder / f"{topic}.schema.json").write_text(json.dumps(schema))
    return load_rules(folder)


def test_every_required_case_gets_the_suites_verdict(spark, suite_rules) -> None:
    cases = _cases()
    assert len(cases) > 1200, "the vendored suite is incomplete"
    got = verdicts(spark, suite_rules, [(topic, json.dumps(data).encode()) for topic, _, _, _, _, data in cases])
    wrong, annotation_only = [], 0
    for (_, _, description, _, valid, _), verdict in zip(cases, got, strict=True):
        if ANNOTATION_ONLY in description:
            annotation_only += 1
            if verdict.problem != "schema:/format":
                wrong.append(f"{description}: format is asserted, expected schema:/format, got {verdict.problem!r}")
        elif (verdict.problem is None) != valid:
            wrong.append(f"{description}: expected {'valid' if valid else 'invalid'}, got {verdict.problem!r}")
    assert wrong == [], f"{len(wrong)} of {len(cases)} cases disagree with the suite:\n" + "\n".join(wrong[:50])
    assert annotation_only == 19
