"""The batch layer's exactly-once correction protocol, shared by the hourly recompute, the rebuild and
the streaming summaries.

A correction run writes two Delta tables: a log of what it changed (``corrections`` /
``summary_corrections``) and the corrected table (``window_counts`` / ``summaries``), as two commits
guarded by the same (app id, version). The version comes from the tables' own logs, ``Vc`` / ``Vw``,
the last version each committed for the app id:

* ``Vc == Vw``: the previous attempt finished (or none ran): record and apply as ``Vw + 1``;
* ``Vc > Vw``: an attempt recorded its changes and died before applying them. If the recomputation
  still gives the recorded changes, the same version is reused: Delta skips the log append (already
  committed) and the apply completes the attempt. Otherwise a new version records and applies the
  new changes; the interrupted attempt's log rows stay (earlier ``corrected_at``) and no apply ever
  carried them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdq.spark.writers import txn_version

log = logging.getLogger("kdq.corrections")


def latest_attempt(log_rows: DataFrame, key: Callable[[dict], Hashable]) -> set:
    """``key`` of every row of the latest attempt among ``log_rows`` (one append shares one ``corrected_at``)."""
    rows = [r.asDict() for r in log_rows.withColumn("__at", F.unix_millis("corrected_at")).collect()]
    if not rows:
        return set()
    latest = max(r["__at"] for r in rows)
    return {key(r) for r in rows if r["__at"] == latest}


def record_then_apply(
    spark: SparkSession,
    log_path: str,
    target_path: str,
    app_id: str,
    wanted: Iterable[Hashable],
    recorded: Callable[[], set],
    record: Callable[[int], Any],
    apply: Callable[[int], Any],
    what: str,
) -> int:
    """Record the changes in the log table, then apply them to the target, under one (app id, version)
    chosen as the module doc says. Returns the version. Callers retry the whole step (recomputing
    their changes) on a conflicting concurrent commit (:func:`kdq.spark.writers.retry_on_conflict`).

    ``wanted``: the keys of the changes to make; ``recorded()``: the keys the latest recorded attempt
    holds (only called when an interrupted attempt is possible); ``record(version)`` /
    ``apply(version)``: the two idempotent writes.
    """
    wanted = set(wanted)
    vc = txn_version(spark, log_path, app_id)
    vw = txn_version(spark, target_path, app_id)
    version = max(vc, vw) + 1
    if vc > vw:
        if recorded() == wanted:
            version = vc  # Delta skips the log append (already committed); the apply completes the attempt
            log.warning("completing an interrupted %s (app id %s, version %d)", what, app_id, version)
        else:
            log.warning(
                "an interrupted %s (app id %s, version %d) recorded changes that no longer apply; "
                "recording the current ones as version %d", what, app_id, vc, version,
            )
    record(version)
    apply(version)
    return version
