"""The current rules of a job, with the Schema Registry's subject versions in the versions of registry-backed rules.

:func:`kdq.rules.load_rules` is pure (files only); a job that classifies records (the stream, a rebuild, a backfill
from Kafka) loads its rules through :func:`current_rules`, which asks the registry for the versions of each exact
registry-backed rule's subjects (``<topic>-value``; each ``<topic>-<record>`` by the topic-record-name strategy)
and folds them into that rule's version (:meth:`kdq.rules.RuleSet.with_subject_versions`). So a schema version registered (or deleted) is a rule change like
an edited schema file: the windows counted before it keep the older ``rules_version``, and a rebuild of their range
re-judges them with the subject as it is. Without a registry (none configured, none recorded by the local stack) the
versions are the rules' settings alone, as they are for every JSON rule.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kdq.config import Config, ConfigError
from kdq.rules import RuleSet, load_rules

log = logging.getLogger(__name__)


def subject_versions(
    config: Config, subjects: list[str], attempts: int = 3, listed: Callable[[str], bool] | None = None
) -> dict[str, list[int]]:
    """subject -> its version numbers (empty for a subject the registry does not have yet), asked now, for
    ``subjects`` and for every subject the registry lists that ``listed`` accepts; retried with backoff, then a
    ConfigError naming the registry."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    client_conf = config.registry_client_conf()
    for attempt in range(attempts):
        try:
            client = SchemaRegistryClient(client_conf)
            out: dict[str, list[int]] = {}
            wanted = list(subjects)
            if listed is not None:
                wanted += sorted(s for s in client.get_subjects() if listed(s) and s not in subjects)
            for subject in wanted:
                try:
                    out[subject] = sorted(client.get_versions(subject))
                except SchemaRegistryError as exc:
                    if exc.http_status_code != 404:
                        raise
                    out[subject] = []
            return out
        except Exception as exc:  # the client raises its own errors and httpx's
            if attempt == attempts - 1:
                raise ConfigError(
                    f"the Schema Registry at {client_conf['url']} did not list the versions of {', '.join(subjects)}: "
                    f"{exc}"
                ) from None
            log.warning("listing subject versions failed (%s); again in %d s", exc, 2**attempt)
            time.sleep(2**attempt)
    raise AssertionError("unreachable")


def current_rules(config: Config) -> RuleSet:
    """The rules folder's rules, with subject versions in the registry-backed rules' versions when a registry is
    configured or running (see the module doc)."""
    rules = load_rules(config.rules_dir)
    subjects = sorted({r.subject for r in rules.rules if r.subject is not None})
    by_record = [r for r in rules.rules if r.subjects_known and r.subject is None]  # topic_record_name
    if not subjects and not by_record:
        return rules
    try:
        config.registry_url()
    except ConfigError:
        log.info(
            "no Schema Registry configured: the versions of %s are their settings alone",
            ", ".join(r.label for r in rules.rules if r.subjects_known),
        )
        return rules
    listed = (lambda s: any(r.owns_subject(s) for r in by_record)) if by_record else None
    return rules.with_subject_versions(subject_versions(config, subjects, listed=listed))
