"""One driver per checkpoint: the lease protocol of kdq.driver_lease on the local disk,
with a fake clock and "drivers" on fake hosts racing each other."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kdq import driver_lease
from kdq.driver_lease import DriverLease, LeaseHeld
from kdq.storage import LOCAL_FILES, LocalFiles
from tests.conftest import make_config


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def driver(checkpoint: Path, clock: Clock, n: int, files=LOCAL_FILES, lease_seconds: float = 60) -> DriverLease:
    return DriverLease(files, checkpoint, lease_seconds=lease_seconds, clock=clock,
                       host={"host": f"host-{n}", "boot_id": f"boot-{n}"}, pid=1000 + n)


def leases(checkpoint: Path) -> list[dict]:
    return driver_lease.read_leases(LOCAL_FILES, checkpoint)


def test_a_second_driver_refuses_naming_the_first(tmp_path: Path) -> None:
    clock = Clock()
    first = driver(tmp_path, clock, 1)
    first.acquire()
    clock.now += 42
    assert first.renew() is None
    clock.now += 3
    with pytest.raises(LeaseHeld) as refused:
        driver(tmp_path, clock, 2).acquire()
    message = str(refused.value)
    assert "pid 1001 on host host-1, started 45 s ago, lease renewed 3 s ago (expires in 57 s)" in message, message
    assert "one driver at a time" in message and refused.value.owner["pid"] == 1001
    assert [lease["pid"] for lease in leases(tmp_path)] == [1001], "the refused driver removed its own lease"
    assert first.renew() is None, "the owner keeps running"


def test_two_drivers_racing_never_both_start(tmp_path: Path) -> None:
    """Both write before either lists (the worst interleaving)."""
    barrier = threading.Barrier(2)

    class AfterWriteWaits(LocalFiles):
        def create_if_absent(self, location, data):
            written = super().create_if_absent(location, data)
            barrier.wait(timeout=10)
            return written

    clock = Clock()
    racers = [driver(tmp_path, clock, n, files=AfterWriteWaits()) for n in (1, 2)]
    outcomes: dict[int, str] = {}

    def start(n: int) -> None:
        try:
            racers[n].acquire()
            outcomes[n] = "started"
        except LeaseHeld:
            outcomes[n] = "refused"

    threads = [threading.Thread(target=start, args=(n,)) for n in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    # The one that lists first sees the other's pending lease and refuses; the other may then start (it lists
    # after the refused one deleted its lease) or refuse too: never both start.
    assert sorted(outcomes.values()) in (["refused", "refused"], ["refused", "started"]), outcomes
    assert len(leases(tmp_path)) == list(outcomes.values()).count("started")


def test_many_unsynchronised_races_start_at_most_one(tmp_path: Path) -> None:
    for round_ in range(25):
        checkpoint = tmp_path / str(round_)
        clock = Clock()
        started: list[int] = []

        def start(n: int, checkpoint: Path = checkpoint, clock: Clock = clock, started: list = started) -> None:
            try:
                driver(checkpoint, clock, n).acquire()
                started.append(n)
            except LeaseHeld:
                pass

        threads = [threading.Thread(target=start, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert len(started) <= 1, (round_, started)
        assert len(leases(checkpoint)) == len(started)


def test_an_expired_lease_of_a_dead_driver_is_ignored_and_cleaned(tmp_path: Path) -> None:
    clock = Clock()
    driver(tmp_path, clock, 1).acquire()  # then dies on its host: no renewal, no release
    clock.now += 59
    with pytest.raises(LeaseHeld):
        driver(tmp_path, clock, 2).acquire()
    clock.now += 2
    second = driver(tmp_path, clock, 2)
    second.acquire()
    assert [lease["pid"] for lease in leases(tmp_path)] == [1002]


def test_a_killed_driver_on_this_host_blocks_nobody(tmp_path: Path) -> None:
    """SIGKILL (the supervisor stopping a hung stream) leaves the lease: on the same host its dead pid frees it."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    clock = Clock()
    here = driver_lease.this_host()
    DriverLease(LOCAL_FILES, tmp_path, clock=clock, host=here, pid=dead.pid).acquire()
    with pytest.raises(LeaseHeld):  # on another host its expiry decides
        driver(tmp_path, clock, 2).acquire()
    DriverLease(LOCAL_FILES, tmp_path, clock=clock, host=here).acquire()  # this process, same host: starts


def test_a_paused_driver_is_fenced_by_the_one_that_took_over(tmp_path: Path) -> None:
    clock = Clock()
    first = driver(tmp_path, clock, 1)
    first.acquire()
    clock.now += 61  # first is paused (GC, a frozen VM) past its lease
    second = driver(tmp_path, clock, 2)
    second.acquire()
    reason = first.renew()
    assert reason is not None and "was deleted: another driver found it expired" in reason
    assert second.renew() is None


def test_fenced_by_a_newer_active_lease_even_when_its_own_file_survived(tmp_path: Path) -> None:
    clock = Clock()
    first = driver(tmp_path, clock, 1)
    first.acquire()
    own = tmp_path / "kdq_driver" / first.name
    saved = own.read_bytes()
    clock.now += 61
    driver(tmp_path, clock, 2).acquire()
    own.write_bytes(saved)  # the cleanup lost a race with a late write of the paused driver
    reason = first.renew()
    assert reason is not None and "took the checkpoint over: pid 1002 on host host-2" in reason


def test_a_starter_about_to_refuse_never_fences_the_owner(tmp_path: Path) -> None:
    clock = Clock()
    owner = driver(tmp_path, clock, 1)
    owner.acquire()
    seen: list[str | None] = []

    class OwnerRenewsInBetween(LocalFiles):
        def create_if_absent(self, location, data):
            written = super().create_if_absent(location, data)
            seen.append(owner.renew())  # the owner renews while the starter's pending lease is there
            return written

    with pytest.raises(LeaseHeld):
        driver(tmp_path, clock, 2, files=OwnerRenewsInBetween()).acquire()
    assert seen == [None]
    assert owner.renew() is None


def test_release_deletes_and_the_next_driver_starts_at_once(tmp_path: Path) -> None:
    clock = Clock()
    first = driver(tmp_path, clock, 1)
    first.acquire()
    first.release()
    assert leases(tmp_path) == []
    driver(tmp_path, clock, 2).acquire()


def test_renewal_failing_until_expiry_fences(tmp_path: Path) -> None:
    clock = Clock()
    broken = {"on": False}

    class Flaky(LocalFiles):
        def names(self, location):
            if broken["on"]:
                raise OSError("s3a: Unable to execute HTTP request: Connection refused")
            return super().names(location)

    first = driver(tmp_path, clock, 1, files=Flaky())
    first.acquire()
    broken["on"] = True
    clock.now += 30
    assert first.renew() is None, "retries while the lease still holds"
    clock.now += 31
    reason = first.renew()
    assert reason is not None and "could not renew its lease before it expired" in reason


def test_the_renewing_thread_calls_on_lost_once(tmp_path: Path) -> None:
    first = DriverLease(LOCAL_FILES, tmp_path, lease_seconds=2, host={"host": "h1", "boot_id": "b"}, pid=1)
    first.acquire()
    lost = threading.Event()
    reasons: list[str] = []
    first.keep_renewed(lambda reason: (reasons.append(reason), lost.set()))
    other = tmp_path / "kdq_driver" / "9999999999999-other"
    now_ms = int(__import__("time").time() * 1000)
    other.write_text(json.dumps({"host": "h2", "boot_id": "c", "pid": 2, "created_ms": now_ms,
                                 "renewed_ms": now_ms, "expires_ms": now_ms + 60_000, "state": "active"}))
    assert lost.wait(10), "fenced within a few renewals"
    assert len(reasons) == 1 and "took the checkpoint over" in reasons[0]
    assert first.lost == reasons[0]
    first.release()


def test_owner_of_a_local_checkpoint_for_the_supervisor(tmp_path: Path) -> None:
    config = make_config(tmp_path / "data")
    from kdq.stream.checkpoint_offsets import speed_layer_checkpoint

    checkpoint = Path(speed_layer_checkpoint(config))
    assert driver_lease.owner_of_checkpoint(config) is None
    lease = DriverLease(LOCAL_FILES, checkpoint, host={"host": "elsewhere", "boot_id": "x"}, pid=77)
    lease.acquire()
    owner = driver_lease.owner_of_checkpoint(config)
    assert owner is not None and "pid 77 on host elsewhere" in owner
    lease.release()
    assert driver_lease.owner_of_checkpoint(config) is None


def test_an_unreadable_lease_counts_as_held(tmp_path: Path) -> None:
    (tmp_path / "kdq_driver").mkdir()
    (tmp_path / "kdq_driver" / "0000000000001-x").write_text("")
    with pytest.raises(LeaseHeld, match="unreadable lease file 0000000000001-x"):
        driver(tmp_path, Clock(), 1).acquire()
