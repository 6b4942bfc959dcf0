"""One driver per checkpoint: a lease inside the checkpoint, enforced by every stream driver.

Two drivers on one checkpoint (a second ``kdq stream`` on another host, a supervisor that cannot see its own
stream, a restored backup started beside the original) both plan and write the same micro-batches. The stream
therefore holds a lease in ``<checkpoint>/kdq_driver/`` while it runs, through :mod:`kdq.storage`'s files (the
local disk, or Hadoop's FileSystem of the driver's session for ``s3a://``, ``hdfs://`` ...). No Spark import.

The protocol needs only writes of one's own file, deletes and a strongly consistent listing (local disks,
HDFS, and S3 since December 2020); no compare-and-swap:

1. **Write, then list.** A starting driver writes its own lease file ``<created_ms>-<uuid>`` (state
   ``pending``: ``{host, boot_id, pid, pid_started, created_ms, renewed_ms, expires_ms}``), then lists the
   folder. If any *other* live lease is there it deletes its own and refuses to start (:class:`LeaseHeld`,
   naming the other driver: host, pid, age). Because both wrote before they listed, of two drivers starting
   at once the one that lists last sees the other: at worst both refuse (the supervisor tries again later),
   never both proceed.
2. **Dead leases are ignored and cleaned.** A lease is dead when it expired (``expires_ms`` passed), or, on
   the same host (hostname and boot id), when its process is gone (pid not alive, or alive with another
   start time: a reused pid). A driver killed with SIGKILL on this host thus blocks nobody; one that died on
   another host blocks for at most ``stream.driver_lease_seconds``.
3. **Renew, and fence.** The winner marks its lease ``active`` and renews it every tenth of the lease from a
   daemon thread. A renewal that finds its own file gone (a starter found it expired and deleted it) or
   another driver's *active* live lease (that one started while this one was paused past its expiry) stops
   the driver (the ``on_lost`` callback: the stream stops its query at once, logs ``FENCED`` and exits). So
   does failing to renew until its own lease expired (storage unreachable: another driver may start now).
   Pending leases of other drivers never fence: a starter that is about to refuse must not stop the owner.
4. **Release.** A graceful stop deletes the lease.

Limits: expiry is judged with the reader's clock, so the hosts' clocks must agree to well within the lease
(NTP). A driver paused for longer than its lease can finish the write it was in before its next renewal (at
most a tenth of the lease later) notices and stops it; the stream's writes are idempotent per batch, so such a
write changes nothing a replay would not.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kdq import storage
from kdq.storage import Files, Location
from kdq.stream.state import pid_alive

log = logging.getLogger("kdq.driver_lease")

FOLDER = "kdq_driver"
PENDING, ACTIVE = "pending", "active"


class LeaseHeld(RuntimeError):
    """Another driver holds the checkpoint: this one must not start. ``owner``: that driver's lease."""

    def __init__(self, message: str, owner: dict) -> None:
        super().__init__(message)
        self.owner = owner


def lease_folder(checkpoint: Location) -> str:
    return storage.join(checkpoint, FOLDER)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def process_started(pid: int) -> float | None:
    """The process's start time (to tell a reused pid from the original), None when unknown."""
    try:
        import psutil

        return round(psutil.Process(pid).create_time(), 2)
    except Exception:  # psutil missing, or no such process
        return None


def this_host() -> dict:
    return {"host": socket.gethostname(), "boot_id": _boot_id()}


def holder_dead(lease: dict, host: dict | None = None) -> bool:
    """The lease's process is known to be gone: it ran on this host (same hostname and boot) and its pid is not
    alive, or is alive with another start time (the pid was reused). A lease of another host is never known dead
    here (its expiry decides)."""
    host = host or this_host()
    if lease.get("host") != host["host"] or (lease.get("boot_id") or "") != host["boot_id"]:
        return False
    pid = int(lease.get("pid") or 0)
    if pid <= 0 or not pid_alive(pid):
        return True
    started = lease.get("pid_started")
    now_started = process_started(pid) if started is not None else None
    return started is not None and now_started is not None and abs(float(started) - now_started) > 1.0


def is_live(lease: dict, now_ms: int, host: dict | None = None) -> bool:
    """Unexpired and its holder not known dead (an unreadable lease counts as live: it may be mid-write)."""
    if lease.get("unreadable"):
        return True
    return int(lease.get("expires_ms") or 0) > now_ms and not holder_dead(lease, host)


def describe(lease: dict, now_ms: int) -> str:
    """"pid 812 on host a1, started 42 s ago, lease renewed 3 s ago (expires in 57 s)"."""
    if lease.get("unreadable"):
        return f"an unreadable lease file {lease['name']} (being written? delete it if no driver runs)"
    created, renewed, expires = (int(lease.get(k) or 0) for k in ("created_ms", "renewed_ms", "expires_ms"))
    return (
        f"pid {lease.get('pid')} on host {lease.get('host')}, started {(now_ms - created) / 1000:.0f} s ago, "
        f"lease renewed {(now_ms - renewed) / 1000:.0f} s ago (expires in {(expires - now_ms) / 1000:.0f} s)"
    )


def read_leases(files: Files, checkpoint: Location, skip: str | None = None) -> list[dict]:
    """Every lease in the checkpoint but ``skip`` (one's own), each with its file ``name``."""
    folder = lease_folder(checkpoint)
    leases = []
    for name in sorted(files.names(folder)):
        if name == skip or name.startswith("."):
            continue
        lease = _read(files, storage.join(folder, name))
        if lease is not None:
            leases.append({**lease, "name": name})
    return leases


def _read(files: Files, location: str) -> dict | None:
    """The lease's content; None when it is gone; ``{"unreadable": True}`` when it stays unparsable (a write in
    progress on a store without atomic replace)."""
    for attempt in range(3):
        try:
            lease = json.loads(files.read_bytes(location))
            if isinstance(lease, dict):
                return lease
        except FileNotFoundError:
            return None
        except ValueError:
            pass
        time.sleep(0.2 * (attempt + 1))
    return {"unreadable": True}


def checkpoint_owner(config: Any, now_ms: int | None = None) -> str | None:
    """The driver that holds the stream's checkpoint, described, if a live one does, else None;
    :class:`kdq.storage.RemoteStorageUnavailable` when the checkpoint is on remote storage this process cannot
    read (no Spark session: the supervisor)."""
    from kdq.stream.checkpoint_offsets import speed_layer_checkpoint

    checkpoint = speed_layer_checkpoint(config)
    leases = read_leases(storage.files_for(checkpoint), checkpoint)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    host = this_host()
    live = [lease for lease in leases if is_live(lease, now, host)]
    return describe(live[0], now) if live else None


def owner_of_checkpoint(config: Any, now_ms: int | None = None) -> str | None:
    """:func:`checkpoint_owner`, None when the checkpoint cannot be read here."""
    try:
        return checkpoint_owner(config, now_ms)
    except storage.RemoteStorageUnavailable:
        return None


class DriverLease:
    """This driver's lease on ``checkpoint`` (see the module doc). ``clock`` (seconds), ``host`` and ``pid`` are
    injectable for tests."""

    def __init__(
        self,
        files: Files,
        checkpoint: Location,
        lease_seconds: float = 60.0,
        clock: Callable[[], float] = time.time,
        host: dict | None = None,
        pid: int | None = None,
    ) -> None:
        self.files = files
        self.checkpoint = checkpoint
        self.folder = lease_folder(checkpoint)
        self.lease_ms = int(lease_seconds * 1000)
        self.renew_seconds = max(0.2, lease_seconds / 10)
        self.clock = clock
        self.host = host or this_host()
        self.pid = os.getpid() if pid is None else pid
        self.name: str | None = None
        self.created_ms = 0
        self.expires_ms = 0
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _now(self) -> int:
        return int(self.clock() * 1000)

    def _content(self, state: str, now: int) -> bytes:
        return json.dumps({
            **self.host, "pid": self.pid, "pid_started": process_started(self.pid) if self.pid == os.getpid() else None,
            "created_ms": self.created_ms, "renewed_ms": now, "expires_ms": now + self.lease_ms, "state": state,
        }).encode()

    def acquire(self) -> None:
        """Write, then list: :class:`LeaseHeld` when another live lease exists (this one is deleted again)."""
        self.files.mkdirs(self.folder)
        now = self._now()
        self.created_ms = now
        self.name = f"{now:013d}-{uuid.uuid4().hex}"
        own = storage.join(self.folder, self.name)
        self.files.create_if_absent(own, self._content(PENDING, now))
        others = read_leases(self.files, self.checkpoint, skip=self.name)
        now = self._now()
        live = [lease for lease in others if is_live(lease, now, self.host)]
        if live:
            self.files.delete(own)
            owner = live[0]
            raise LeaseHeld(
                f"another driver holds the checkpoint {self.checkpoint}: {describe(owner, now)}. One checkpoint has "
                "one driver at a time: stop that one first (kdq stream-stop, kdq down on its host), or, if it died "
                f"on another host, wait for its lease to expire (stream.driver_lease_seconds = "
                f"{self.lease_ms / 1000:.0f})",
                owner,
            )
        for dead in others:
            try:
                self.files.delete(storage.join(self.folder, dead["name"]))
                log.info("removed the dead driver lease %s (%s)", dead["name"], describe(dead, now))
            except Exception:  # another starter removed it, or the store hiccupped: harmless
                pass
        self.files.write_bytes(own, self._content(ACTIVE, now))
        self.expires_ms = now + self.lease_ms

    def renew(self) -> str | None:
        """Renew once; the reason this driver must stop (fenced), or None."""
        try:
            names = self.files.names(self.folder)
            if self.name not in names:
                return (
                    f"its lease {self.name} was deleted: another driver found it expired (this one was paused or cut "
                    f"off from the storage for longer than the lease, {self.lease_ms / 1000:.0f} s)"
                )
            now = self._now()
            for other in read_leases(self.files, self.checkpoint, skip=self.name):
                if other.get("state") == ACTIVE and is_live(other, now, self.host):
                    return f"another driver took the checkpoint over: {describe(other, now)}"
            now = self._now()
            self.files.write_bytes(storage.join(self.folder, self.name), self._content(ACTIVE, now))
            self.expires_ms = now + self.lease_ms
            return None
        except Exception as exc:  # the storage is unreachable: keep trying until the lease expires
            if self._now() >= self.expires_ms:
                return f"it could not renew its lease before it expired ({str(exc).splitlines()[0][:300]})"
            log.warning("could not renew the driver lease (expires in %.0f s): %s",
                        (self.expires_ms - self._now()) / 1000, str(exc).splitlines()[0][:300])
            return None

    def keep_renewed(self, on_lost: Callable[[str], None]) -> None:
        """Renew from a daemon thread until :meth:`release`; on a fence, log it and call ``on_lost(reason)`` once."""

        def run() -> None:
            while not self._stop.wait(self.renew_seconds):
                reason = self.renew()
                if reason is not None:
                    self.lost = reason
                    log.error("FENCED: this driver stops: %s", reason)
                    self._delete_own()
                    on_lost(reason)
                    return

        self._thread = threading.Thread(target=run, name="kdq-driver-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and delete the lease (a graceful stop)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        self._delete_own()

    def _delete_own(self) -> None:
        if self.name is None:
            return
        try:
            self.files.delete(storage.join(self.folder, self.name))
        except Exception:  # expires on its own
            log.warning("could not delete the driver lease %s; it expires in %.0f s", self.name, self.lease_ms / 1000)
