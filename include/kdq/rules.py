"""Validation rules: which JSON Schema (and which event-time field) applies to which topic.

Rules live in one folder (``paths.rules_dir``, default ``config/rules/``):

* by convention, ``<topic>.schema.json`` applies to exactly the topic ``<topic>``;
* an optional ``topics.toml`` maps topics to rules explicitly::

      [[topic]]
      match = "re:legacy\\..*"        # or an exact topic name
      schema = "legacy.schema.json"    # optional, relative to the folder
      event_time_field = "meta.event_time"   # optional, dotted path into the value
      event_time_format = "epoch_millis"     # auto (default) | epoch_millis | iso8601

      [[topic]]
      match = "re:payments\\..*"
      registry = true                  # judged by the Schema Registry ([registry] in kdq.toml): the
                                       # schema each message's header names (Avro, Protobuf, JSON Schema)
      subject_strategy = "topic_name"  # the subject a message's schema must be a version of: <topic>-value
                                       # (record_name: the record's name; topic_record_name: <topic>-<name>)

Explicit entries win over convention files, and the first matching entry wins,
in file order. An exact entry without ``schema`` uses ``<topic>.schema.json``
when that file exists, so adding an event-time field to a topic never silently
drops its schema. A topic without any rule is valid when its value is UTF-8 JSON.

Everything here is pure Python (no Spark, no Airflow) so the stream, the batch
jobs, the DAGs and the CLI load and check rules the same way. A broken rule is
rejected at load time with a :class:`RuleError` naming the file and the problem:
a rule that fails only once data arrives would turn a typo into a dashboard
full of "invalid".
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import logging
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kdq.expectations_config import ExpectationError, ExpectationSet, parse_expectations

log = logging.getLogger(__name__)

TOPICS_FILE = "topics.toml"
SCHEMA_SUFFIX = ".schema.json"
PATTERN_PREFIX = "re:"
EVENT_TIME_FORMATS = ("auto", "epoch_millis", "iso8601")
NO_RULE_VERSION = "none"

# Part of every rule version: bump it when the meaning of a rule changes
# (e.g. how a keyword is evaluated), so stored results are rebuilt.
RULES_FORMAT_VERSION = 1

_ENTRY_KEYS = ("match", "schema", "event_time_field", "event_time_format", "registry", "subject_strategy")
# How a registry-backed topic names the subject its messages' schemas must belong to, as Confluent's serializers'
# subject name strategies do: topic_name (their default, TopicNameStrategy: "<topic>-value"), record_name
# (RecordNameStrategy: the record's fully-qualified name) and topic_record_name (TopicRecordNameStrategy:
# "<topic>-<record name>"). The record name is the schema's: Avro's full name, the Protobuf message, a JSON
# Schema's title.
SUBJECT_STRATEGIES = ("topic_name", "record_name", "topic_record_name")


class RuleError(ValueError):
    """A rule file is broken. The message names the file and the problem."""


@functools.lru_cache(maxsize=1024)
def _compiled_pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _short_hash(payload: Any) -> str:
    # Document order is kept (no sort_keys): it decides which failing keyword
    # is reported, so reordering a schema is a (reason-only) rule change.
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def rule_version(
    schema: dict | None, event_time_field: str | None, event_time_format: str, subject_strategy: str | None = None
) -> str:
    """The version of what a rule computes: schema (or the registry's subject strategy) plus event-time settings.

    Where a rule came from (convention file or topics.toml, exact or pattern)
    is not part of it: moving a rule between the two must not trigger a rebuild.
    """
    payload = {
        "format": RULES_FORMAT_VERSION,
        "schema": schema,
        "event_time_field": event_time_field,
        "event_time_format": event_time_format,
    }
    if subject_strategy is not None:  # only then: the versions of every JSON rule stay what they were
        payload["registry"] = {"subject_strategy": subject_strategy}
    return _short_hash(payload)


@dataclass(frozen=True)
class TopicRule:
    """One rule. ``match`` is the exact topic, or (``is_pattern``) a regex matched against the whole name."""

    match: str
    is_pattern: bool
    schema: dict | None
    schema_file: Path | None
    event_time_field: str | None
    event_time_format: str
    version: str
    # Judged by the Schema Registry instead of a schema file: how the topic names its subject (None: not).
    subject_strategy: str | None = None

    @property
    def registry(self) -> bool:
        return self.subject_strategy is not None

    @property
    def subject(self) -> str | None:
        """The registry subject of an exact registry-backed rule's topic (topic-name strategy), else None."""
        return f"{self.match}-value" if self.subject_strategy == "topic_name" and not self.is_pattern else None

    @property
    def subjects_known(self) -> bool:
        """Whether the registry can say which subjects this rule's records belong to: an exact topic by the
        topic-name strategy (``<topic>-value``) or the topic-record-name one (every ``<topic>-<record>``). A
        pattern's topics, and the record-name strategy's subjects (shared by every topic), are not known."""
        return not self.is_pattern and self.subject_strategy in ("topic_name", "topic_record_name")

    def owns_subject(self, subject: str) -> bool:
        """Whether ``subject`` is one of this rule's topic's subjects (see :attr:`subjects_known`)."""
        if not self.subjects_known:
            return False
        if self.subject_strategy == "topic_name":
            return subject == f"{self.match}-value"
        return subject.startswith(f"{self.match}-") and subject not in (f"{self.match}-key", f"{self.match}-value")

    @property
    def label(self) -> str:
        """How the rule is written in topics.toml: ``orders`` or ``re:legacy\\..*``."""
        return f"{PATTERN_PREFIX}{self.match}" if self.is_pattern else self.match

    @property
    def event_time_segments(self) -> list[str] | None:
        """The event-time field as object member names: ``meta.event_time`` → ``["meta", "event_time"]``.

        Names are taken literally (``@timestamp``, ``event-time``, quotes): the
        classifier walks the parsed JSON by member name, no path syntax involved.
        """
        return self.event_time_field.split(".") if self.event_time_field else None

    def matches(self, topic: str) -> bool:
        if self.is_pattern:
            return _compiled_pattern(self.match).fullmatch(topic) is not None
        return topic == self.match


@dataclass(frozen=True)
class RuleSet:
    """All rules of a folder, in precedence order (first match wins)."""

    rules: tuple[TopicRule, ...] = ()
    version: str = NO_RULE_VERSION
    # The folder the rules came from: its other JSON files are what a $ref may name.
    folder: Path | None = None
    # [remotes] of topics.toml: (URI prefix, subfolder) — the subfolder's files are also known by
    # prefix + their path in it, so a $ref to a remote URI resolves to a local copy.
    remotes: tuple[tuple[str, Path], ...] = ()
    # [expectations] of topics.toml (kdq.expectations_config): what opens incidents. Deliberately outside
    # `version` and every rule's version: they judge the counts, never change them, so no rebuild.
    expectations: ExpectationSet = ExpectationSet()

    def rule_for(self, topic: str) -> TopicRule | None:
        for rule in self.rules:
            if rule.matches(topic):
                return rule
        return None

    def version_for(self, topic: str) -> str:
        """Short hash of the topic's effective rule; ``"none"`` for topics without one."""
        rule = self.rule_for(topic)
        return rule.version if rule is not None else NO_RULE_VERSION

    def __len__(self) -> int:
        return len(self.rules)

    def with_subject_versions(self, versions: Mapping[str, Sequence[int]]) -> RuleSet:
        """This rule set with each exact registry-backed rule's version including its subjects' versions
        (``versions``: subject -> version numbers, as the registry lists them; see :attr:`TopicRule.subjects_known`
        for which rules' subjects are known): a schema version registered or deleted is a rule change (a rebuild
        finds the windows counted before it, their ``rules_version`` stale), as editing a schema file is. Pattern
        rules and the record-name strategy keep their settings' version: their subjects are not known in advance."""
        rules = []
        for rule in self.rules:
            subject = rule.subject
            if subject is not None and subject in versions:
                rule = replace(rule, version=_short_hash(
                    {"rule": rule.version, "subject": subject, "versions": sorted(int(v) for v in versions[subject])}
                ))
            elif rule.subjects_known and subject is None:  # topic_record_name: each record type's subject
                owned = {s: sorted(int(v) for v in vs) for s, vs in sorted(versions.items()) if rule.owns_subject(s)}
                if owned:
                    rule = replace(rule, version=_short_hash({"rule": rule.version, "subjects": owned}))
            rules.append(rule)
        return replace(self, rules=tuple(rules), version=_short_hash([[r.label, r.version] for r in rules]))

    def registry_rules_in_use(self, selected: Callable[[str], bool]) -> tuple[TopicRule, ...]:
        """The registry-backed rules a job reading the topics ``selected`` accepts may meet: every pattern rule
        (its topics may appear any time) and each exact rule whose topic is selected. A job with none needs no
        Schema Registry (the shipped demo rules name topics that tests' streams never read)."""
        return tuple(r for r in self.rules if r.registry and (r.is_pattern or selected(r.match)))

    def describe(self) -> list[str]:
        """One line per rule, in precedence order, for the job logs."""
        lines = []
        for rule in self.rules:
            if rule.registry:
                what = f"the Schema Registry (subject strategy {rule.subject_strategy})"
            elif rule.schema_file:
                what = f"schema {rule.schema_file.name}"
            else:
                what = "no schema (valid iff UTF-8 JSON)"
            clock = f", event time from {rule.event_time_field!r} ({rule.event_time_format})" if rule.event_time_field else ""
            lines.append(f"{rule.label}: {what}{clock}, version {rule.version}")
        lines.append("other topics: no rule (valid iff UTF-8 JSON)")
        return lines


def _json_pointer(parts: Any) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def load_schema(path: Path) -> dict | bool:
    """Read and check one JSON Schema file; :class:`RuleError` naming the file on any problem."""
    from jsonschema import FormatChecker, SchemaError
    from jsonschema.validators import Draft202012Validator, validator_for

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RuleError(f"{path}: schema file not found") from None
    except UnicodeDecodeError as exc:
        raise RuleError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise RuleError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RuleError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    if isinstance(schema, bool):
        return schema  # true: everything passes; false: nothing does
    if not isinstance(schema, dict):
        raise RuleError(f"{path}: a rule must be a JSON Schema (an object or true/false), got {type(schema).__name__}")
    cls = validator_for(schema, default=Draft202012Validator)
    # Formats of the metaschema checked, except "regex": patterns are ECMA-262 regexes
    # that the JVM classifier compiles (and refuses at start, naming the file); Python's
    # re is another dialect and would refuse valid ones.
    formats = FormatChecker(formats=[name for name in cls.FORMAT_CHECKER.checkers if name != "regex"])
    try:
        cls.check_schema(schema, format_checker=formats)
    except SchemaError as exc:
        where = _json_pointer(exc.path) or "/"
        raise RuleError(f"{path}: not a valid JSON Schema at {where}: {exc.message}") from None
    return schema


def _entry_name(index: int, entry: Any) -> str:
    match = entry.get("match") if isinstance(entry, dict) else None
    return f"[[topic]] entry #{index}" + (f" (match = {match!r})" if isinstance(match, str) else "")


def _check_field(toml: Path, name: str, field: Any) -> str:
    if not isinstance(field, str) or not field or any(not s for s in field.split(".")):
        raise RuleError(
            f"{toml}: {name}: event_time_field must be a dotted path such as 'ts' or 'meta.ts', got {field!r}"
        )
    return field


def _remotes(toml: Path, rules_dir: Path, table: Any) -> tuple[tuple[str, Path], ...]:
    """``[remotes]``: ``"https://schemas.example.com/" = "mirror/"`` — local copies of remote schemas."""
    if not isinstance(table, dict):
        raise RuleError(f"{toml}: [remotes] must be a table of \"<URI prefix>\" = \"<subfolder>\"")
    remotes = []
    for prefix, folder in table.items():
        if not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", prefix) or not prefix.endswith("/"):
            raise RuleError(f"{toml}: [remotes]: {prefix!r} must be an absolute URI ending with '/', e.g. 'https://schemas.example.com/'")
        path = (rules_dir / folder).resolve() if isinstance(folder, str) else None
        if path is None or not path.is_dir() or not path.is_relative_to(rules_dir.resolve()):
            raise RuleError(f"{toml}: [remotes]: {prefix!r} = {folder!r} must name a subfolder of {rules_dir}")
        remotes.append((prefix, path))
    return tuple(remotes)


def load_rules(rules_dir: Path) -> RuleSet:
    """Load and check every rule in ``rules_dir``; an empty or missing folder gives an empty RuleSet."""
    rules_dir = Path(rules_dir)
    if not rules_dir.exists():
        return RuleSet((), _short_hash([]), None)
    if not rules_dir.is_dir():
        raise RuleError(f"{rules_dir}: rules_dir is not a folder")

    schemas: dict[Path, dict] = {}

    def schema_at(path: Path) -> dict:
        path = path.resolve()
        if path not in schemas:
            schemas[path] = load_schema(path)
        return schemas[path]

    # Every convention file is checked even if an explicit entry shadows it:
    # a broken file in the rules folder is a mistake worth reporting.
    convention: dict[str, Path] = {}
    for path in sorted(rules_dir.glob(f"*{SCHEMA_SUFFIX}")):
        schema_at(path)
        convention[path.name[: -len(SCHEMA_SUFFIX)]] = path

    explicit: list[TopicRule] = []
    remotes: tuple[tuple[str, Path], ...] = ()
    expectations = ExpectationSet()
    toml = rules_dir / TOPICS_FILE
    if toml.exists():
        try:
            data = tomllib.loads(toml.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise RuleError(f"{toml}: not valid TOML: {exc}") from None
        except UnicodeDecodeError as exc:
            raise RuleError(f"{toml}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        for key in data:
            if key not in ("topic", "remotes", "expectations"):
                raise RuleError(
                    f"{toml}: unknown top-level key {key!r}; rules are [[topic]] entries "
                    "(and one [remotes] table, one [expectations] table)"
                )
        remotes = _remotes(toml, rules_dir, data.get("remotes", {}))
        try:
            expectations = parse_expectations(data.get("expectations", {}))
        except ExpectationError as exc:
            raise RuleError(f"{toml}: {exc}") from None
        entries = data.get("topic", [])
        if not isinstance(entries, list):
            raise RuleError(f"{toml}: 'topic' must be an array of tables ([[topic]])")
        exact_seen: dict[str, int] = {}
        for index, entry in enumerate(entries, start=1):
            name = _entry_name(index, entry)
            if not isinstance(entry, dict):
                raise RuleError(f"{toml}: {name}: must be a table")
            for key in entry:
                if key not in _ENTRY_KEYS:
                    close = difflib.get_close_matches(key, _ENTRY_KEYS, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise RuleError(
                        f"{toml}: {name}: unknown key {key!r}{hint}; allowed keys: {', '.join(_ENTRY_KEYS)}"
                    )
            match = entry.get("match")
            if not isinstance(match, str) or not match:
                raise RuleError(f"{toml}: {name}: 'match' is required (an exact topic name or 're:<regex>')")
            is_pattern = match.startswith(PATTERN_PREFIX)
            if is_pattern:
                match = match[len(PATTERN_PREFIX) :]
                try:
                    _compiled_pattern(match)
                except re.error as exc:
                    raise RuleError(f"{toml}: {name}: bad regex {match!r}: {exc}") from None
            else:
                if match in exact_seen:
                    raise RuleError(
                        f"{toml}: {name}: duplicate exact topic {match!r} (already in entry #{exact_seen[match]})"
                    )
                exact_seen[match] = index

            registry = entry.get("registry", False)
            if not isinstance(registry, bool):
                raise RuleError(f"{toml}: {name}: 'registry' must be true or false, got {registry!r}")
            strategy = entry.get("subject_strategy")
            if strategy is not None and not registry:
                raise RuleError(f"{toml}: {name}: 'subject_strategy' applies only with registry = true")
            if registry:
                strategy = strategy or SUBJECT_STRATEGIES[0]
                if strategy not in SUBJECT_STRATEGIES:
                    raise RuleError(
                        f"{toml}: {name}: bad subject_strategy {strategy!r}; supported: {', '.join(SUBJECT_STRATEGIES)}"
                    )
                if "schema" in entry:
                    raise RuleError(
                        f"{toml}: {name}: 'schema' and registry = true exclude each other: a registry-backed topic "
                        "is judged by the schema each message's header names"
                    )
                if not is_pattern and match in convention:
                    log.warning(
                        "%s is shadowed by the topics.toml entry %r (registry = true); it never applies",
                        convention[match],
                        match,
                    )
            schema_file: Path | None = None
            if "schema" in entry:
                rel = entry["schema"]
                if not isinstance(rel, str) or not rel:
                    raise RuleError(f"{toml}: {name}: 'schema' must be a file name, got {rel!r}")
                schema_file = rules_dir / rel
                if not schema_file.is_file():
                    raise RuleError(f"{toml}: {name}: schema file {rel!r} not found in {rules_dir}")
            elif not is_pattern and match in convention and not registry:
                schema_file = convention[match]
            schema = schema_at(schema_file) if schema_file is not None else None

            field = entry.get("event_time_field")
            if field is not None:
                field = _check_field(toml, name, field)
            fmt = entry.get("event_time_format", "auto")
            if fmt not in EVENT_TIME_FORMATS:
                raise RuleError(
                    f"{toml}: {name}: bad event_time_format {fmt!r}; expected one of {', '.join(EVENT_TIME_FORMATS)}"
                )
            explicit.append(
                TopicRule(
                    match=match,
                    is_pattern=is_pattern,
                    schema=schema,
                    schema_file=schema_file,
                    event_time_field=field,
                    event_time_format=fmt,
                    version=rule_version(schema, field, fmt, strategy),
                    subject_strategy=strategy,
                )
            )

    rules = list(explicit)
    exact = {r.match for r in explicit if not r.is_pattern}
    for topic, path in convention.items():
        if topic in exact:
            continue
        shadow = next((r for r in explicit if r.is_pattern and r.matches(topic)), None)
        if shadow is not None:
            log.warning(
                "%s is shadowed by the topics.toml entry %r (explicit entries win); it never applies",
                path,
                shadow.label,
            )
        schema = schema_at(path)
        rules.append(
            TopicRule(
                match=topic,
                is_pattern=False,
                schema=schema,
                schema_file=path,
                event_time_field=None,
                event_time_format="auto",
                version=rule_version(schema, None, "auto"),
            )
        )
    version = _short_hash([[r.label, r.version] for r in rules])
    return RuleSet(tuple(rules), version, rules_dir.resolve(), remotes, expectations)
