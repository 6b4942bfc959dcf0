"""The classifier takes a stored document as well as a RuleSet; the checkpoint keeps documents by hash."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import functions as F

from kdq.config import StreamConfig
from kdq.rules import load_rules
from kdq.spark.classifier import ClassifierDocument, classifier
from kdq.spark.ledger import RulesDocuments


def _problems(spark, rules, values: list[bytes]) -> list[str | None]:
    df = spark.createDataFrame([(i, "t", v) for i, v in enumerate(values)], "id int, topic string, value binary")
    verdict = classifier(spark, rules, StreamConfig())
    rows = df.select("id", verdict(F.col("topic"), F.col("value")).alias("v")).orderBy("id").collect()
    return [r.v.problem for r in rows]


def test_a_stored_document_classifies_like_the_rules_it_was_made_from(spark, tmp_path) -> None:
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "t.schema.json").write_text(json.dumps({"type": "object", "required": ["a"]}))
    old = load_rules(folder)
    stored = ClassifierDocument.of(old, StreamConfig())
    (folder / "t.schema.json").write_text(json.dumps({"type": "object", "required": ["b"]}))
    new = load_rules(folder)
    assert ClassifierDocument.of(new, StreamConfig()).sha256 != stored.sha256

    values = [b'{"a":1}', b'{"b":1}']
    assert _problems(spark, old, values) == [None, "schema:/required/0"]
    assert _problems(spark, new, values) == ["schema:/required/0", None]
    assert _problems(spark, ClassifierDocument(stored.text), values) == [None, "schema:/required/0"]

    documents = RulesDocuments(spark, str(tmp_path / "checkpoint"))
    assert documents.get(stored.sha256) is None
    documents.put(stored.sha256, stored.text)
    documents.put(stored.sha256, stored.text)  # once per hash; a second put is a no-op
    again = RulesDocuments(spark, str(tmp_path / "checkpoint"))  # a restarted driver
    assert again.get(stored.sha256) == stored.text
    assert (tmp_path / "checkpoint" / "kdq_rules" / f"{stored.sha256}.json").read_text() == stored.text
    again.put(stored.sha256, stored.text)  # already there (another driver's put): fine
    with pytest.raises(ValueError, match="sha256"):
        again.get("../ledger")
