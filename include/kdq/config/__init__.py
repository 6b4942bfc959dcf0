"""The one configuration object every part of kdq reads.

Configuration flows one way: a TOML file plus ``KDQ_<SECTION>__<KEY>``
environment variables become a typed, frozen :class:`Config`, which is passed
to functions. Nothing below the entrypoints reads the environment.

Bad configuration is rejected at start with a :class:`ConfigError` that names
the key, where it came from (file or variable) and the problem, because a typo
in a config key that silently falls back to a default is how monitoring
products end up monitoring nothing.

The package: :mod:`~kdq.config.errors` (ConfigError, redaction of secrets in messages),
:mod:`~kdq.config.sections` (the ``[paths]`` ... ``[registry]`` sections), :mod:`~kdq.config.summary`
(``[[summaries]]``), :mod:`~kdq.config.local_stack` (the local stack's recorded addresses),
:mod:`~kdq.config.model` (:class:`Config`), :mod:`~kdq.config.loading` (:func:`load_config`) and
:mod:`~kdq.config.kafka_checks` (the brokers answer and accept the login). Import from ``kdq.config``.
"""

from kdq.config.errors import REDACTED, SECRET_KEY, SECRET_MAPS, ConfigError, redact, redact_text
from kdq.config.kafka_checks import check_kafka_login, check_kafka_reachable, kafka_login_refused
from kdq.config.loading import CONFIG_FILE_ENV, DEFAULT_CONFIG_NAME, ENV_PREFIX, find_config_file, load_config
from kdq.config.local_stack import StackAddresses
from kdq.config.model import Config
from kdq.config.sections import (
    FRESH_CHECKPOINT_POLICIES,
    LOCAL_REGISTRY_API,
    InfluxConfig,
    KafkaConfig,
    PathsConfig,
    RegistryConfig,
    SparkConfig,
    StreamConfig,
)
from kdq.config.summary import SUMMARY_PATTERN_PREFIX, SummaryConfig

__all__ = [
    "CONFIG_FILE_ENV",
    "DEFAULT_CONFIG_NAME",
    "ENV_PREFIX",
    "FRESH_CHECKPOINT_POLICIES",
    "LOCAL_REGISTRY_API",
    "REDACTED",
    "SECRET_KEY",
    "SECRET_MAPS",
    "SUMMARY_PATTERN_PREFIX",
    "Config",
    "ConfigError",
    "InfluxConfig",
    "KafkaConfig",
    "PathsConfig",
    "RegistryConfig",
    "SparkConfig",
    "StackAddresses",
    "StreamConfig",
    "SummaryConfig",
    "check_kafka_login",
    "check_kafka_reachable",
    "find_config_file",
    "kafka_login_refused",
    "load_config",
    "redact",
    "redact_text",
]
