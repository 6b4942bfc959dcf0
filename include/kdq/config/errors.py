"""ConfigError, and what a configuration error may show of a value: never a secret.

Errors land in task logs: a message names a key and the problem, with the values of secret keys, of settings maps of
the wrong type and URLs' user info replaced by :data:`REDACTED`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


class ConfigError(ValueError):
    """A configuration value is missing, unknown or invalid. The message names the key, never a secret value."""

    # A traceback names it kdq.config.ConfigError, where it is imported from (task logs are searched for that).
    __module__ = "kdq.config"


# Keys whose values Spark (spark.redaction.regex), Hadoop (hadoop.security.sensitive-config-keys) or a Kafka client
# (the Java client's PASSWORD-type settings, librdkafka's sensitive ones) treat as secret: passwords, JAAS lines with
# them, tokens, keys, private-key PEMs. An error names such a key and the problem, never its value, since errors land
# in task logs. Matched against the dotted path of a setting (``kafka.client.ssl.key.pem``), so a nested TOML table
# (``ssl.key.pem = ...`` without quotes) is recognised too.
SECRET_KEY = re.compile(
    r"(?i)secret|password|passwd|token|credential|jaas|access[._-]?key|private[._-]?key"
    r"|ssl[._]key(?:[._]pem)?$|ssl\.keystore\.key$|certificate\.chain$|truststore\.certificates$"
    r"|oauthbearer\.config$|account\.key|encryption\.key"
)
# The settings maps that hold such keys: a value of the wrong type there (a string, a list) is not shown at all.
SECRET_MAPS = ("kafka.client", "spark.conf")
REDACTED = "<redacted>"
# A URL's user info (user:password@), up to the last @ of the authority (a password may hold an unescaped @).
_URL_USERINFO = re.compile(r"(?<=://)[^/?#\s'\"]*@")


def redact(key: str, value: Any) -> Any:
    """``value`` of ``key`` (a dotted path) as an error message may show it: a secret key's value hidden, mappings
    redacted key by key, a settings map of the wrong type hidden whole, URLs without their user info."""
    if SECRET_KEY.search(key):
        return REDACTED
    if isinstance(value, Mapping):
        return {k: redact(f"{key}.{k}" if key else str(k), v) for k, v in value.items()}
    if key in SECRET_MAPS:
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_text(text: str) -> str:
    """``text`` without the user info (``user:password@``) of the URLs in it: for messages that quote a URL
    (``influxdb.url`` may carry credentials)."""
    return _URL_USERINFO.sub(REDACTED + "@", text)


def secret_values(raw: Any, key: str = "", secret: bool = False) -> set[str]:
    """Every string under a secret key of the raw configuration (file, environment, overrides), every string of a
    settings map that is not a mapping, and URLs' user info: scrubbed from a message whatever path led a validator
    to quote it. ``key`` is the dotted path of ``raw``."""
    found: set[str] = set()
    secret = secret or bool(key and SECRET_KEY.search(key))
    if isinstance(raw, Mapping):
        for k, v in raw.items():
            found |= secret_values(v, f"{key}.{k}" if key else str(k), secret)
    elif isinstance(raw, list | tuple):
        for v in raw:
            found |= secret_values(v, key, secret or key in SECRET_MAPS)
    elif isinstance(raw, str) and raw:
        if secret or key in SECRET_MAPS:
            found.add(raw)
        found.update(m.group(0)[:-1] for m in _URL_USERINFO.finditer(raw))
    return {v for v in found if len(v) >= 3}


def scrub(message: str, secrets: set[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        message = message.replace(secret, REDACTED)
    return redact_text(message)
