"""The stream's table upkeep between micro-batches (kdq.spark.stream_upkeep), on real Delta tables.

The stream's own MERGEs neither compact nor checkpoint inside their commits; the upkeep does both while the stream
waits for its next trigger: the open hour's files folded once the stream's MERGEs added AUTO_COMPACT_MIN_FILES,
a checkpoint every CHECKPOINT_EVERY commits, every count and the stream's idempotent-write version kept.
"""

from __future__ import annotations

import datetime as dt

from delta.tables import DeltaTable
from pyspark.sql import functions as F

from kdq.spark.session import small_query_session
from kdq.spark.stream_upkeep import (
    CHECKPOINT_EVERY,
    MAINTENANCE_IDLE_MS,
    HourFiles,
    StreamUpkeep,
    hours_predicate,
    window_hours,
)
from kdq.spark.tables import ensure_tables, table_path
from kdq.spark.writers import delta_snapshot, merge_window_increments, txn_version
from kdq.tables import AUTO_COMPACT_MIN_FILES, RAW_ARCHIVE, STREAM_CHECKPOINT_INTERVAL, WINDOW_COUNTS
from tests.conftest import make_config

DAY_MS = int(dt.datetime(2026, 11, 24, tzinfo=dt.UTC).timestamp() * 1000)
HOUR_MS = 3_600_000


def test_window_hours_are_the_tables_partitions() -> None:
    assert window_hours([DAY_MS, DAY_MS + 5 * HOUR_MS + 59_999, DAY_MS - 1]) == {
        ("2026-11-24", 0), ("2026-11-24", 5), ("2026-11-23", 23)}
    assert hours_predicate([("2026-11-24", 5), ("2026-11-23", 23)]) == (
        "(window_date = DATE'2026-11-23' AND window_hour = 23) OR (window_date = DATE'2026-11-24' AND window_hour = 5)")


def test_hour_files_are_taken_once_due_and_given_back_when_not_compacted() -> None:
    files = HourFiles()
    for _ in range(3):
        files.merged([("d", 1), ("d", 2)])
    files.merged([("d", 2)])
    assert files.take(4) == [("d", 2)]
    assert files.take(4) == []  # taken: not again until more files come
    files.give_back([("d", 2)], 4)
    assert files.take(3) == [("d", 1), ("d", 2)]


def _files_in_hour(spark, path: str, hour: int) -> int:
    return sum(1 for name in spark.read.format("delta").load(path).inputFiles() if f"window_hour={hour}/" in name)


def _counts(spark, path: str) -> dict:
    frame = spark.read.format("delta").load(path)
    return {(r["topic"], r["ms"]): r["count"] for r in frame.select(
        "topic", F.unix_millis("window_start").alias("ms"), "count").collect()}


def test_the_upkeep_compacts_and_checkpoints_between_batches(spark, tmp_path) -> None:
    config = make_config(tmp_path, spark={"master": "local[2]", "shuffle_partitions": 2})
    ensure_tables(spark, config)
    path = table_path(config, WINDOW_COUNTS)
    archive = table_path(config, RAW_ARCHIVE)
    for table in (path, archive):
        assert DeltaTable.forPath(spark, table).detail().first()["properties"]["delta.checkpointInterval"] == str(
            STREAM_CHECKPOINT_INTERVAL)
    writer = small_query_session(spark)
    writer.conf.set("spark.databricks.delta.autoCompact.enabled", "false")  # as the speed layer's session
    upkeep = StreamUpkeep(writer, spark, "stream-app", [archive, path], [path])
    hour = DAY_MS + 7 * HOUR_MS
    batches = AUTO_COMPACT_MIN_FILES + 2
    for version in range(1, batches + 1):
        rows = [{"topic": t, "window_start_ms": hour + version * 1000, "status": "valid", "count": version,
                 "rules_version": "r1"} for t in ("a", "b")]
        with upkeep.merging():
            merge_window_increments(writer, rows, config, "stream-app", version)
        upkeep.merged(r["window_start_ms"] for r in rows)
        if version == AUTO_COMPACT_MIN_FILES - 1:
            assert _files_in_hour(spark, path, 7) == version  # nothing compacted inside the MERGEs' commits
            upkeep.between_batches(MAINTENANCE_IDLE_MS - 1)  # too short a pause: snapshots only
            assert _files_in_hour(spark, path, 7) == version
    before = _counts(spark, path)
    assert delta_snapshot(spark, path).checkpointProvider().version() < 0  # no checkpoint inside the commits

    upkeep.between_batches(MAINTENANCE_IDLE_MS)  # one compaction or checkpoint per pause: the compaction first
    assert _files_in_hour(spark, path, 7) == 1
    assert _counts(spark, path) == before and len(before) == 2 * batches
    assert delta_snapshot(spark, path).checkpointProvider().version() < 0
    upkeep.between_batches(MAINTENANCE_IDLE_MS)  # the archive has too few commits: window_counts' checkpoint
    assert delta_snapshot(spark, path).checkpointProvider().version() >= CHECKPOINT_EVERY
    upkeep.between_batches(MAINTENANCE_IDLE_MS)  # nothing left to do
    assert txn_version(writer, path, "stream-app") == batches  # a replayed batch is still skipped
    merge_window_increments(writer, [{"topic": "a", "window_start_ms": hour + 1000, "status": "valid", "count": 5,
                                      "rules_version": "r1"}], config, "stream-app", batches)
    assert _counts(spark, path) == before


def test_the_upkeeps_compaction_beside_a_recompute_of_the_same_hour_loses_nothing(
        spark, tmp_path, caplog, monkeypatch) -> None:
    """Overlap: while the stream's upkeep compacts its open hour, the hourly recompute (another job, its own
    session) MERGEs corrections into windows of that very hour. The compaction is started from inside the
    recompute, just before its MERGE, so the two transactions always overlap. Delta fails whichever commits
    second, or lets both commit: the upkeep then leaves the hour for its next pause, the recompute retries its
    step. Every stream increment and every correction lands exactly once, and the hour is compacted in the end."""
    import threading
    import time

    from kdq.spark import batch_layer as bl

    config = make_config(tmp_path, spark={"master": "local[2]", "shuffle_partitions": 2})
    ensure_tables(spark, config)
    path = table_path(config, WINDOW_COUNTS)
    writer = small_query_session(spark)
    writer.conf.set("spark.databricks.delta.autoCompact.enabled", "false")  # as the speed layer's session
    recompute_session = spark.newSession()  # the recompute's own job (Delta's txn guard is session-wide)
    min_files = 3
    upkeep = StreamUpkeep(writer, spark, "stream-app", [path], [path], min_files=min_files)
    hour = DAY_MS + 7 * HOUR_MS
    expected: dict = {}
    version = 0

    def stream_batches(count: int) -> None:
        nonlocal version
        for _ in range(count):
            version += 1
            rows = [{"topic": t, "window_start_ms": hour + version * 1000, "status": "valid", "count": version,
                     "rules_version": "r1"} for t in ("a", "b")]
            with upkeep.merging():
                merge_window_increments(writer, rows, config, "stream-app", version)
            upkeep.merged(r["window_start_ms"] for r in rows)
            expected.update({(r["topic"], r["window_start_ms"]): r["count"] for r in rows})

    # The upkeep's compaction starts when the recompute is about to MERGE (its first attempt in each round).
    compactions: list[threading.Thread] = []
    compaction_errors: list[BaseException] = []
    merge_absolute = bl._merge_absolute

    def compact(delay: float) -> None:
        time.sleep(delay)
        try:
            assert upkeep.compact(min_files)  # due: it tries (and may lose to the recompute)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            compaction_errors.append(exc)

    def merge_beside_a_compaction(*args, **kwargs):
        if len(compactions) < rounds_started:
            # Even rounds: the OPTIMIZE reads its snapshot first and the MERGE starts while it rewrites the hour;
            # odd rounds: the MERGE starts first and the OPTIMIZE while it runs.
            compaction_first = rounds_started % 2 == 1
            compactions.append(threading.Thread(target=compact, args=(0.0 if compaction_first else 0.3,)))
            compactions[-1].start()
            if compaction_first:
                time.sleep(0.3)
        return merge_absolute(*args, **kwargs)

    monkeypatch.setattr(bl, "_merge_absolute", merge_beside_a_compaction)
    caplog.set_level("INFO")
    rounds = 4
    rounds_started = 0
    for round_ in range(rounds):
        stream_batches(min_files)
        rounds_started += 1
        # The recompute sets absolute counts on two windows the stream wrote in this round, one file each.
        corrected = {("a", hour + (version - 1) * 1000): 100 + round_, ("b", hour + version * 1000): 200 + round_}
        new_counts = recompute_session.createDataFrame(
            [(t, ms, ms + 1000, "valid", n, "r1") for (t, ms), n in corrected.items()],
            "topic STRING, s BIGINT, e BIGINT, status STRING, count BIGINT, rules_version STRING",
        ).select("topic", F.timestamp_millis("s").alias("window_start"), F.timestamp_millis("e").alias("window_end"),
                 "status", "count", "rules_version")
        interval = (hour + round_ * HOUR_MS, hour + (round_ + 1) * HOUR_MS)  # one batch app id per round
        bl.apply_corrections(recompute_session, config, new_counts, f"run-{round_}", interval, "late_data")
        compactions[-1].join(timeout=600)
        assert not compactions[-1].is_alive() and not compaction_errors, compaction_errors
        expected.update(corrected)
        assert _counts(spark, path) == expected
    assert len(compactions) == rounds

    # Which side lost (either is correct), or whether Delta let both commit: every round's two transactions met.
    upkeep_lost = sum("conflicted with another writer" in r.getMessage() for r in caplog.records)
    recompute_retried = sum("conflicted with a concurrent commit" in r.getMessage() for r in caplog.records)
    history = DeltaTable.forPath(spark, path).history().select("version", "readVersion", "operation").collect()
    both_committed = sum(1 for r in history if r["readVersion"] is not None and r["readVersion"] < r["version"] - 1)
    print(f"rounds: {rounds}, upkeep left the hour: {upkeep_lost}, recompute retried: {recompute_retried}, "
          f"both committed: {both_committed}")
    assert upkeep_lost + recompute_retried + both_committed >= 1  # timing decides how often; 3-4 of 4 here

    # Later batches and a quiet pause compact whatever a conflict or the corrections left: one file in the hour.
    stream_batches(min_files)
    for _ in range(3):
        if not upkeep.compact(min_files):
            break
    assert _files_in_hour(spark, path, 7) == 1
    assert _counts(spark, path) == expected
    assert txn_version(writer, path, "stream-app") == version
