"""The stream's state files under concurrent writers of one process."""

from __future__ import annotations

import threading
from pathlib import Path

from kdq.stream.state import atomic_write_json, read_json


def test_threads_of_one_process_replace_a_state_file_at_once(tmp_path: Path) -> None:
    """The foreachBatch thread writes current_batch.json when a batch starts while the query listener's thread
    writes it for the batch that just finished: with one temporary name per process, one thread's rename
    took the other's file away and the stream died (FileNotFoundError, seen in a 5,000 msgs/s benchmark)."""
    path = tmp_path / "current_batch.json"
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def write(worker: int) -> None:
        start.wait()
        try:
            for i in range(300):
                atomic_write_json(path, {"worker": worker, "i": i})
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    assert read_json(path)["i"] == 299  # every writer's last write is a whole file
    assert [p.name for p in tmp_path.iterdir()] == ["current_batch.json"]  # no temporary file left behind
