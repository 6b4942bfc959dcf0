"""kdq.background_session: a batch job in a session of its own, still stopped by whoever started it.

Real processes: the wrapper is started as the batch jobs' prefix starts it (its file path, a session niceness, a
command), and stopped the ways its starters stop it: Airflow's task supervisor ``killpg``s its task's process group
(SIGINT first), a terminal's Ctrl-C hits the foreground group, SparkSubmitHook.on_kill SIGKILLs the process it
started. The job here is a shell that starts a grandchild, like spark-submit's JVM starting the Python driver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from kdq.background_session import main

WRAPPER = Path(__file__).resolve().parents[2] / "include" / "kdq" / "background_session.py"


def _start(tmp_path: Path, script: str) -> tuple[subprocess.Popen, list[int]]:
    """The wrapper in a process group of its own (standing in for the Airflow task's group), running ``sh -c
    script``; returns it and the pids of the job and its grandchild once both are up (``script`` writes them)."""
    pids = tmp_path / "pids"
    wrapper = subprocess.Popen([sys.executable, str(WRAPPER), "19", "sh", "-c", script, "job", str(pids)],
                               process_group=0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if pids.exists() and len(pids.read_text().split()) == 2:
            return wrapper, [int(p) for p in pids.read_text().split()]
        time.sleep(0.05)
    wrapper.kill()
    raise AssertionError("the job did not start within 20 s")


# The job: a shell (the job's leader, like spark-submit's JVM) that starts a grandchild (the Python driver) and waits.
JOB = 'sleep 60 & echo "$$ $!" > "$1.tmp"; mv "$1.tmp" "$1"; wait'


def _gone(pids: list[int], within: float = 15) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def cleanup():
    started: list[int] = []
    yield started
    for pid in started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_job_runs_in_a_session_of_its_own_at_the_given_weight(tmp_path: Path, cleanup: list[int]) -> None:
    wrapper, (job, grandchild) = _start(tmp_path, JOB)
    cleanup += [wrapper.pid, job, grandchild]
    assert os.getsid(job) == job != os.getsid(wrapper.pid)  # a new session, led by the job
    assert os.getpgid(grandchild) == job  # the job's whole tree is in its group
    enabled = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if enabled.exists() and enabled.read_text().strip() == "1":  # else no weight to check: processes' niceness rules
        assert Path(f"/proc/{job}/autogroup").read_text().split()[-1] == "19"
        assert Path(f"/proc/{wrapper.pid}/autogroup").read_text() != Path(f"/proc/{job}/autogroup").read_text()
    wrapper.kill()
    wrapper.wait(timeout=10)


def test_a_killpg_of_the_starters_group_stops_the_whole_job(tmp_path: Path, cleanup: list[int]) -> None:
    """What Airflow's supervisor does to a task it kills: SIGINT to the task's process group. The wrapper is in
    it; the job (in its own session) and its grandchild are not, and still end; the wrapper reports the signal."""
    wrapper, pids = _start(tmp_path, JOB)
    cleanup += [wrapper.pid, *pids]
    os.killpg(wrapper.pid, signal.SIGINT)
    assert wrapper.wait(timeout=15) == 128 + signal.SIGINT
    assert _gone(pids), "the job or its grandchild outlived the starter's killpg"


def test_a_sigkill_of_the_wrapper_takes_the_job_with_it(tmp_path: Path, cleanup: list[int]) -> None:
    """SparkSubmitHook.on_kill SIGKILLs the process it started (the wrapper): the kernel kills the job
    (PR_SET_PDEATHSIG), as the hook's kill killed spark-submit's JVM when there was no wrapper."""
    wrapper, (job, grandchild) = _start(tmp_path, JOB)
    cleanup += [wrapper.pid, job, grandchild]
    wrapper.kill()
    wrapper.wait(timeout=10)
    assert _gone([job]), "the job outlived its killed wrapper"


def test_the_jobs_exit_status_is_the_wrappers() -> None:
    assert subprocess.run([sys.executable, str(WRAPPER), "19", "sh", "-c", "exit 3"], timeout=30).returncode == 3
    assert subprocess.run([sys.executable, str(WRAPPER), "19", "sh", "-c", "true"], timeout=30).returncode == 0
    assert subprocess.run([sys.executable, str(WRAPPER), "19", "sh", "-c", "kill -TERM $$"],
                          timeout=30).returncode == 128 + signal.SIGTERM


def test_a_bad_command_line_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spark-submit"]) == 2 and main(["low", "spark-submit"]) == 2
    assert "usage" in capsys.readouterr().err


def test_a_conflicting_write_retries_at_the_streams_weight() -> None:
    """A batch job (in its session at 19) whose Delta write lost a race retries at the stream's weight (10), and
    runs at 19 again once it committed; a session already at 10 or above is left alone."""
    probe = (
        "from kdq.background_session import session_niceness, session_priority_at_least\n"
        "from kdq.spark.writers import retry_on_conflict\n"
        "seen = []\n"
        "def write():\n"
        "    seen.append(session_niceness())\n"
        "    if len(seen) < 3:\n"
        "        raise RuntimeError('ConcurrentAppendException: a concurrent MERGE added data')\n"
        "    return 'committed'\n"
        "import kdq.spark.writers as w; w.time.sleep = lambda s: None\n"
        "print(retry_on_conflict(write, 'test write'), seen, session_niceness())\n"
        "with session_priority_at_least(19) as raised:\n"
        "    print(raised, session_niceness())\n"
    )
    out = subprocess.run([sys.executable, str(WRAPPER), "19", sys.executable, "-c", probe], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    if Path("/proc/self/autogroup").exists():  # Linux built with autogroup (Debian's kernels are)
        assert out.stdout.split("\n")[:2] == ["committed [19, 10, 10] 19", "False 19"], out.stdout
    else:  # no session weight to raise: the retries run as the first attempt did
        assert out.stdout.split("\n")[:2] == ["committed [None, None, None] None", "False None"], out.stdout
