"""Background processes (the local stack's components, the stream, the demo traffic): start detached, find again
by pid file, stop cleanly.

A pid file alone is not proof (pids are reused), so a process counts as ours
only if its command line still contains the marker we started it with (the
component's own config file path).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

# CPU priority of the local stack's processes. On the 2-core machine `make run` keeps both cores 85-95 % busy
# (benchmarks/results/local_run.md); at equal priority a query on the SQL endpoint waited for the stream, the broker
# and Airflow, and a day's GROUP BY took 1.05-1.8 s (median). The endpoint answers people, so it keeps the default
# priority (INTERACTIVE_NICENESS); everything else the stack starts (the broker, InfluxDB, Airflow with the stream it
# supervises, a standalone Spark cluster, the demo traffic) runs at SERVICE_NICENESS and still gets every cycle
# the endpoint leaves: a query takes a core for a fraction of a second, the stream catches up after it. The batch
# jobs go lower again (kdq.spark.submit.priority_prefix: the idle class, nice +10, a session of their own at 19).
# Measured beside make run's stream and demo (Connect, median of ~20 queries each): everything at 0: 1.10 s;
# the broker, InfluxDB, Airflow and the demo at 10: 0.77 s; the stream too: 0.61 s.
SERVICE_NICENESS = 10
INTERACTIVE_NICENESS = 0


def niced(command: Sequence[str], niceness: int) -> list[str]:
    """``command`` under ``nice`` so that it runs at ``niceness`` (inherited by its threads and children), or as is
    when this process already runs there or lower (an Airflow task at SERVICE_NICENESS starting the stream), or
    where there is no ``nice``. ``nice -n`` adds to the caller's niceness, hence the difference."""
    increment = niceness - os.nice(0)
    if increment > 0 and shutil.which("nice"):
        return ["nice", "-n", str(increment), *command]
    return list(command)


class StackError(RuntimeError):
    """A local component could not be installed, started or reached; the message says which and why."""


def set_session_niceness(pid: int, niceness: int) -> bool:
    """Give the session that ``pid`` leads the CPU weight of ``niceness`` among sessions. With Linux's autogroup
    (``/proc/sys/kernel/sched_autogroup_enabled`` = 1, most distributions' default) the kernel shares the CPU between
    sessions first and applies a process's own niceness only inside its session: the stack starts each service in a
    session of its own (:meth:`ManagedProcess.start`), so without this a niced stream, broker or Airflow competed
    with the SQL endpoint as an equal (``benchmarks.local_run``: a day's ``GROUP BY`` at 1.6-1.9 s median beside a
    stream at 0.8 cores, where the same query took 0.6 s with the stream niced in one session). Raising an
    autogroup's niceness needs no privilege. Returns whether it was set (False: no autogroup here, or the process
    is gone); the processes' own niceness still orders them when autogroup is off."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{niceness}\n")
    except OSError:
        return False
    return True


def is_marked(cmdline: Sequence[str], marker: str) -> bool:
    """Whether a command line is the managed process's: it holds ``marker``. An empty one is a process between two
    ``exec`` calls (spark-submit execs spark-class, which execs java), whose /proc cmdline reads empty for a
    moment: the pid file named it, so it is still ours (seen: a benchmark took a starting stream for an exited one)."""
    return not cmdline or any(marker in part for part in cmdline)


@dataclass(frozen=True)
class ManagedProcess:
    name: str
    pid_file: Path
    log_file: Path
    marker: str  # a string that must appear in the command line (e.g. its config file path)
    niceness: int = SERVICE_NICENESS  # its CPU priority (see SERVICE_NICENESS); the SQL endpoint's is 0

    def process(self) -> psutil.Process | None:
        try:
            pid = int(self.pid_file.read_text().strip())
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            if is_marked(proc.cmdline(), self.marker):
                return proc
        except (FileNotFoundError, ValueError, psutil.Error):
            pass
        return None

    def running(self) -> bool:
        return self.process() is not None

    def pids(self) -> set[int]:
        """The running process and its descendants (a spark-submit JVM starts the Python driver as a child)."""
        proc = self.process()
        if proc is None:
            return set()
        try:
            return {proc.pid, *(child.pid for child in proc.children(recursive=True))}
        except psutil.Error:
            return {proc.pid}

    def start(self, command: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> int:
        """Start detached in its own session (so Ctrl-C in a terminal does not hit it); return the pid."""
        existing = self.process()
        if existing is not None:
            return existing.pid
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                niced(command, self.niceness),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        self.pid_file.write_text(str(proc.pid))
        # Popen returns after the child's setsid and exec: its session (autogroup) exists and is its own.
        set_session_niceness(proc.pid, self.niceness)
        # Until the child has exec'd, its command line is still Python's and
        # process() would not recognise it; wait for the exec (or the exit).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None and self.process() is None:
            time.sleep(0.02)
        return proc.pid

    def stop(self, timeout: float = 30.0, graceful_child: str | None = None) -> bool:
        """SIGTERM the process group, SIGKILL after ``timeout``; True if something was stopped.

        ``graceful_child``: a command-line fragment of a descendant to signal
        first and wait for (spark-submit's Python driver: a SIGTERM to the whole
        group would also hit the JVM, which then dies under the running batch).
        """
        proc = self.process()
        if proc is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        family = [proc, *proc.children(recursive=True)]
        if graceful_child is not None:
            drivers = [p for p in family[1:] if any(graceful_child in part for part in _cmdline(p))]
            for driver in drivers:
                driver.terminate()
            psutil.wait_procs(drivers, timeout=timeout)
            psutil.wait_procs([proc], timeout=15)  # the JVM exits once its driver has
        family = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not family:
            self.pid_file.unlink(missing_ok=True)
            return True
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            for member in family:
                try:
                    member.terminate()
                except psutil.NoSuchProcess:
                    pass
        _, alive = psutil.wait_procs(family, timeout=timeout)
        for leftover in alive:
            try:
                leftover.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=10)
        self.pid_file.unlink(missing_ok=True)
        return True

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log yet)"


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def quiet_port(rng: random.Random | None = None, taken: Collection[int] = ()) -> int:
    """A free loopback port below the kernel's ephemeral range, for components that keep their port.

    The local stack records its ports and reuses them on every start; a port from the ephemeral range
    (what ``free_port`` and every outgoing connection get) can be taken by any program's connection while
    the component is down, and its restart then fails (seen in the chaos run: a test suite's broker took
    InfluxDB's port during its outage). Nothing is handed a port below that range unless it asks for one.
    """
    rng = rng or random.SystemRandom()
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(1000):
        port = rng.randrange(max(1024, low - 12000), low)
        if port in taken:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port below the ephemeral range")


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    interval: float = 0.25,
    alive: Callable[[], bool] | None = None,
    log: Callable[[], str] | None = None,
) -> None:
    """Poll ``check`` until it is true; raise StackError naming ``what`` on deadline or process death."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # a probe that errors just means "not yet"
            pass
        if alive is not None and not alive():
            raise StackError(f"{what}: the process exited during start-up.\n{log() if log else ''}")
        time.sleep(interval)
    raise StackError(f"{what}: not ready after {timeout:.0f}s.\n{log() if log else ''}")
