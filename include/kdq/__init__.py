"""kdq: per-topic, per-window data-quality counts for Kafka.

This package holds the shared domain logic (configuration, window arithmetic,
rules, table and topic names). It imports neither Airflow nor Spark at module
level, so DAGs, Spark jobs, the CLI and tests can all import it cheaply;
Spark-specific code lives in :mod:`kdq.spark`, the local stack in
:mod:`kdq.stack`.
"""

__version__ = "0.1.0"
