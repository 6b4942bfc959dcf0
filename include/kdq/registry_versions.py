"""The current rules of a job, with the Schema Registry's subject versions in the versions of registry-backed rules.

:func:`kdq.rules.load_rules` is pure (files only); a job that classifies records (the stream, a rebuild, a backfill
from Kafka) loads its rules through :func:`current_rules`, which asks the registry for the versions of each exact
registry-backed rule's subject (``<topic>-value``) and folds them into that rule's version
(:meth:`kdq.rules.RuleSet.with_subject_versions`). So a schema version registered (or deleted) is a rule change like
an edited schema file: the windows counted before it keep the older ``rules_version``, and a rebuild of their range
re-judges them with the subject as it is. Without a registry (none configured, none recorded by the local stack) the
versions are the rules' settings alone, as they are for every JSON rule.
"""

from __future__ import annotations

import logging
import time

from kdq.config import Config, ConfigError
from kdq.rules import RuleSet, load_rules

log = logging.getLogger(__name__)


def subject_versions(config: Config, subjects: list[str], attempts: int = 3) -> dict[str, list[int]]:
    """subject -> its version numbers (empty for a subject the registry does not have yet), asked now; retried
    with backoff, then a ConfigError naming the registry."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    client_conf = config.registry_client_conf()
    for attempt in range(attempts):
        try:
            client = SchemaRegistryClient(client_conf)
            out: dict[str, list[int]] = {}
            for subject in subjects:
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
    if not subjects:
        return rules
    try:
        config.registry_url()
    except ConfigError:
        log.info("no Schema Registry configured: the versions of %s are their settings alone", ", ".join(subjects))
        return rules
    return rules.with_subject_versions(subject_versions(config, subjects))
