"""The record classifier: one JVM function, ``io.kdq.spark.classify.Classifier``, for both layers.

Validation runs inside Spark's JVM on the raw value bytes (module
``jvm/kdq-spark-functions``, built by ``scripts/setup.sh``): strict UTF-8,
one JSON document, the topic's JSON Schema (networknt json-schema-validator,
drafts 4 to 2020-12, every keyword) and the event-time field, returning one
struct per record::

    problem STRING          -- null when valid, else too_large | null_value | not_utf8 | not_json |
                            -- too_complex | schema:<pointer> | pattern_budget:<pointer> | internal_error:<class>
    event_ms BIGINT         -- the rule's event-time field, epoch millis in 1970..9999, else null
    event_time_bad BOOLEAN  -- the rule has an event-time field and it could not be read
    rules_version STRING    -- the matched rule's version, "none" without a rule

The rules travel as one JSON document (:func:`classifier_config`) inside the
registered UDF object; each JVM compiles a rule set once (cached by the
document's hash) and finds a record's rule by a per-topic lookup, so the cost
does not grow with the number of rules. :func:`check_rules` compiles them in
the driver at start: a broken rule (an unresolvable ``$ref``, a regex Java
refuses) stops the job naming the file, never a micro-batch later.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kdq.config import StreamConfig
from kdq.rules import RuleError, RuleSet, TopicRule

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

CLASSIFIER_CLASS = "io.kdq.spark.classify.Classifier"
# Base URI of the rules folder's files: a $ref such as "common.schema.json#/$defs/id" resolves
# against it to another file of the folder, which travels in "resources" (never fetched).
RULES_BASE_URI = "kdq:/rules/"
MAX_NESTING_DEPTH = 500


def _base_uri(folder: Path | None, path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        relative = path.resolve().relative_to(folder.resolve()) if folder is not None else Path(path.name)
    except ValueError:
        relative = Path(path.name)
    return RULES_BASE_URI + relative.as_posix()


def _resources(rules: RuleSet) -> dict[str, Any]:
    """Every JSON document of the rules folder, by its base URI, by its absolute ``$id``, and by its remote
    URI where ``[remotes]`` maps a URI prefix to its subfolder."""
    resources: dict[str, Any] = {}
    folder = rules.folder
    if folder is None or not folder.is_dir():
        return resources
    for path in sorted(folder.rglob("*.json")):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RuleError(f"{path}: a JSON file of the rules folder cannot be read as JSON: {exc}") from None
        resources[_base_uri(folder, path)] = document
        for prefix, subfolder in rules.remotes:
            if path.resolve().is_relative_to(subfolder):
                resources[prefix + path.resolve().relative_to(subfolder).as_posix()] = document
        identifier = document.get("$id") if isinstance(document, dict) else None
        if isinstance(identifier, str) and "://" in identifier:
            resources.setdefault(identifier.split("#")[0], document)
    return resources


def _rule(rule: TopicRule, folder: Path | None) -> dict[str, Any]:
    document = {
        "label": rule.label,
        "match": rule.match,
        "is_pattern": rule.is_pattern,
        "source": str(rule.schema_file) if rule.schema_file else f"{folder or '.'}/topics.toml",
        "base_uri": _base_uri(folder, rule.schema_file) or f"{RULES_BASE_URI}topics.toml",
        "schema": rule.schema,
        "event_time_field": rule.event_time_segments,
        "event_time_format": rule.event_time_format,
        "version": rule.version,
    }
    if rule.registry:
        # Where the registry is and how to log in is not here but in the Spark configuration
        # (io.kdq.spark.registry.RegistryConnection): this document is stored in the stream's checkpoint.
        document["registry"] = {"subject_strategy": rule.subject_strategy}
    return document


def classifier_config(rules: RuleSet, stream: StreamConfig) -> str:
    """The rule set as the JSON document the JVM classifier compiles (deterministic: same rules, same text)."""
    document = {
        "max_value_bytes": stream.max_value_bytes,
        "max_nesting_depth": MAX_NESTING_DEPTH,
        "assert_format": True,
        "rules": [_rule(r, rules.folder) for r in rules.rules],
        "resources": _resources(rules),
    }
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, sort_keys=False)


@dataclass(frozen=True)
class ClassifierDocument:
    """A rule set as the exact JSON document the JVM compiles (:func:`classifier_config`).

    What the speed layer stores in its checkpoint with each batch (by :attr:`sha256`), so that a replay of a
    batch after a rule change classifies it as its first attempt did.
    """

    text: str

    @classmethod
    def of(cls, rules: RuleSet, stream: StreamConfig) -> ClassifierDocument:
        return cls(classifier_config(rules, stream))

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def _java_message(exc: Exception) -> str:
    java = getattr(exc, "java_exception", None)
    if java is not None:
        return str(java.getMessage())
    return str(exc)


def check_rules(
    spark: SparkSession, rules: RuleSet | ClassifierDocument, stream: StreamConfig, ask_registry: bool = True
) -> str:
    """Compile every rule in the driver's JVM now, and (``ask_registry``: a job's start) check that the Schema
    Registry of registry-backed rules answers; :class:`RuleError` naming the file (or rule) and the problem."""
    jvm = spark.sparkContext._jvm
    document = rules if isinstance(rules, ClassifierDocument) else ClassifierDocument.of(rules, stream)
    try:
        return str(jvm.io.kdq.spark.classify.Classifier.check(document.text, ask_registry))
    except Exception as exc:
        if "Classifier" in str(exc) and "does not exist" in str(exc):
            raise RuleError(
                f"{CLASSIFIER_CLASS} is not on Spark's classpath: run `make setup` (it builds "
                "jvm/kdq-spark-functions into .cache/jars/kdq/)"
            ) from None
        raise RuleError(_java_message(exc)) from None


def classifier(
    spark: SparkSession, rules: RuleSet | ClassifierDocument, stream: StreamConfig
) -> Callable[[Column, Column], Column]:
    """``f(topic, value)`` → the classification struct, with the rule set checked and registered once per session.

    ``rules`` is the current rule set, or a :class:`ClassifierDocument` (a stored one: ``stream`` is then
    not read, the document carries its limits)."""
    from pyspark.sql import functions as F

    document = rules if isinstance(rules, ClassifierDocument) else ClassifierDocument.of(rules, stream)
    name = "kdq_classify_" + document.sha256[:16]
    if not spark.catalog.functionExists(name):
        # Compiled, not the registry asked: the job's start did that (kdq.spark.stream_job), and a micro-batch
        # must go on counting the schemas it has seen through an outage.
        check_rules(spark, document, stream, ask_registry=False)
        jvm = spark.sparkContext._jvm
        udf = jvm.io.kdq.spark.classify.Classifier(document.text)
        spark._jsparkSession.udf().register(name, udf, jvm.io.kdq.spark.classify.Classifier.returnType())
    return lambda topic, value: F.call_function(name, topic, value)
