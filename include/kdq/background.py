"""Run a command in the background of the machine: in a scheduling group of its own, at a low weight.

    python -m kdq.background [--autogroup-nice N] -- command [arg ...]

Linux with autogroup (``/proc/sys/kernel/sched_autogroup_enabled`` = 1, the default of most distributions'
kernels) shares the CPU between *sessions* first and applies a process's nice value only among the processes of
its own session. A batch job that Airflow's task runner starts sits in Airflow's session: however nice or idle
its threads are, that session competes with the stream's and the SQL endpoint's sessions as an equal. Measured
under ``make run`` (``benchmarks.local_run``): with the expectations run and the daily jobs in Airflow's session
the machine stayed saturated and the stream's micro-batches took five times as long.

So this starts a new session for the command (unless it already leads one), gives that session's autogroup the
niceness ``N`` (default 19: CFS weight 15 against 1024 for a session at 0) by writing ``/proc/self/autogroup``,
and execs the command: the pid stays the same and signals reach it as before. Where there is no autogroup (another
kernel, another OS) it only execs, and the nice/idle prefix that follows it on the command line does the work.
Standard library only: it runs before anything else of kdq is imported.

A session of its own also takes the command out of its starter's process group, so a ``killpg`` of the starter
(``kdq down`` stopping Airflow, a test stopping a ``kdq job``) no longer reaches it. So on Linux the command gets
a parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGTERM)``, which survives the exec): when the process that
started it dies, the job is sent SIGTERM and Spark stops as on any SIGTERM. Without it, a killed Airflow task left
its spark-submit running (the always-on expectations run: an hour of evaluations with nobody to read them).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

AUTOGROUP = "/proc/self/autogroup"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """SIGTERM for this process (and what it execs) when its parent dies; at once when the parent ``parent`` (the
    starter, read before anything else) is already gone. Linux only; elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the job outlives its starter, as any session leader would
        return
    if os.getppid() != parent:  # the starter died before the prctl: nobody is left to send the signal
        os.kill(os.getpid(), signal.SIGTERM)


def enter_background(nice: int) -> bool:
    """A session of its own for this process, at autogroup niceness ``nice``; True when the niceness was set."""
    if os.getsid(0) != os.getpid():
        try:
            os.setsid()
        except OSError:  # a process-group leader cannot start a session: it stays in the one it has
            pass
    try:
        with open(AUTOGROUP, "w") as out:
            out.write(str(nice))
        return True
    except OSError:  # no autogroup on this kernel, or not allowed to lower it
        return False


def main(argv: Sequence[str] | None = None) -> int:
    parent = os.getppid()
    args = list(sys.argv[1:] if argv is None else argv)
    nice = 19
    if args[:1] == ["--autogroup-nice"] and len(args) > 1:
        nice, args = int(args[1]), args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m kdq.background [--autogroup-nice N] -- command [arg ...]", file=sys.stderr)
        return 2
    die_with_parent(parent)
    enter_background(nice)
    os.execvp(args[0], args)
    return 127  # not reached: execvp replaces this process or raises


if __name__ == "__main__":
    raise SystemExit(main())
