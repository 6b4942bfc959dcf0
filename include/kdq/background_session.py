"""Run a command in a session of its own at a low CPU weight, staying in the caller's process group to pass
signals on: ``python background_session.py <session niceness> <command> [args...]``.

Why a session of its own: with Linux's autogroup (``/proc/sys/kernel/sched_autogroup_enabled`` = 1, most
distributions' default) the kernel shares the CPU between sessions first, by each session's weight, and applies a
process's own niceness and scheduling class only among the processes of its session. A batch job that stays in
Airflow's session (SCHED_IDLE inside it) therefore leaves that whole session's weight to use: when the hourly
recompute was busy, Airflow's session competed with the stream's as an equal (both at niceness 10, weight 110), and
the stream's share of a contended core fell to a half (``benchmarks.local_run``: the stream's cores 0.76 quiet, 0.59
with the batch jobs taking 0.17). In a session of its own at niceness 19 (weight 15) the job gets 15/125 of a core
the stream also wants, 15/1039 of one the SQL endpoint wants, and every cycle nobody wants.

Why this wrapper and not ``setsid`` in front of the command: whoever started the job signals the process group it
started it in (Airflow's task supervisor ``killpg``s its task's group with SIGINT, SIGTERM, then SIGKILL; a terminal
sends Ctrl-C to its foreground group), and a job in a new session is out of that group's reach. This process stays
in the caller's group and session, passes SIGINT, SIGTERM, SIGHUP and SIGQUIT on to the job's whole process group
(the spark-submit JVM, its Python driver and their workers, as the caller's ``killpg`` did), ends what is left of
that group when the job's leader has exited, and exits with the job's status; if it is killed itself (SIGKILL), the
kernel kills the job's leader (``PR_SET_PDEATHSIG``), as SparkSubmitHook's ``on_kill`` killed spark-submit before.

A job that loses a race to the stream raises its session to the stream's weight until it commits
(:func:`session_priority_at_least`, used by ``kdq.spark.writers.retry_on_conflict``): a Delta commit conflicts when
another writer commits to the same partitions while it runs, and at weight 15 a correction MERGE into the stream's
open hour took 20-30 s per attempt against the stream's commit every ~10 s, so all five attempts lost
(``benchmarks.local_run``). Any member of a session may set its autogroup's niceness to any value from 0 to 19.

Standard library only: it runs as a script (its file path), before anything else of kdq is importable or needed.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

PR_SET_PDEATHSIG = 1  # linux/prctl.h
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _in_new_session(niceness: int, starter: int):
    """The child's set-up, run after its ``setsid`` and before its ``exec`` (Popen's ``preexec_fn``; this process
    has a single thread, so that is safe): its session's autogroup weight, and death with its starter."""

    def setup() -> None:
        try:  # no autogroup (disabled, another OS): the processes' own niceness still orders them
            with open("/proc/self/autogroup", "w") as autogroup:
                autogroup.write(f"{niceness}\n")
        except OSError:
            pass
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):  # not Linux: the forwarded signals still reach the job
            pass
        if os.getppid() != starter:  # the starter died before the prctl: nobody would stop this job
            os._exit(128 + signal.SIGKILL)

    return setup


def run(niceness: int, command: list[str]) -> int:
    """Run ``command`` in a new session whose autogroup has ``niceness``; return its exit status (128 + the
    signal's number when a signal ended it, as a shell reports it)."""
    job = subprocess.Popen(command, start_new_session=True, preexec_fn=_in_new_session(niceness, os.getpid()))

    def forward(signum: int, _frame: object) -> None:
        try:
            os.killpg(job.pid, signum)  # the job leads its session and its process group
        except ProcessLookupError:
            pass

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    status = job.wait()
    _end_group(job.pid)
    return 128 - status if status < 0 else status


def _end_group(pgid: int, grace: float = 5.0) -> None:
    """End what is left of the job's process group once its leader has exited: SIGTERM, SIGKILL after ``grace``
    seconds. Left-overs would be orphans (a Python driver or worker whose JVM is gone); and after a forwarded
    SIGINT they would be out of reach of the starter's escalation to SIGTERM and SIGKILL, which only reaches this
    process's group."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return  # the group is empty: the usual end of a job
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def session_niceness() -> int | None:
    """This process's session's autogroup niceness (None: no autogroup here)."""
    try:
        with open("/proc/self/autogroup") as autogroup:  # "/autogroup-123 nice 19"
            return int(autogroup.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _set_session_niceness(niceness: int, tries: int = 20) -> bool:
    for _ in range(tries):
        try:
            with open("/proc/self/autogroup", "w") as autogroup:
                autogroup.write(f"{niceness}\n")
            return True
        except OSError as exc:
            if exc.errno != errno.EAGAIN:  # EAGAIN: the kernel takes one change per 100 ms from unprivileged users
                return False
            time.sleep(0.1)
    return False


@contextmanager
def session_priority_at_least(niceness: int) -> Iterator[bool]:
    """Within the block, this process's session runs at ``niceness`` if it runs lower (a batch job's session at
    19 raised to the stream's 10), and back where it was after; yields whether it was raised. A session at
    ``niceness`` or above it (the stream's, the SQL endpoint's, a terminal's) is left alone."""
    before = session_niceness()
    raised = before is not None and before > niceness >= 0 and _set_session_niceness(niceness)
    try:
        yield raised
    finally:
        if raised:
            _set_session_niceness(before)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].lstrip("-").isdigit():
        print("usage: background_session.py <session niceness -20..19> <command> [args...]", file=sys.stderr)
        return 2
    return run(int(argv[0]), argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
