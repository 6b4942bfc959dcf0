"""A benchmark stopped with SIGTERM runs its ``finally`` (where it stops the stack it started), and a second
signal during that shutdown does not cut it short (benchmarks.signals)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, time
from pathlib import Path
from benchmarks.signals import interrupt_on_stop_signals

interrupt_on_stop_signals()
out = Path(sys.argv[1])
try:
    out.write_text("running")
    time.sleep(60)
finally:
    out.write_text("stopping")
    time.sleep(1.0)  # a second signal arrives here
    out.write_text("stopped")
"""


def _wait_for(path: Path, text: str, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text() == text:
            return text
        time.sleep(0.02)
    return path.read_text() if path.exists() else ""


def test_sigterm_runs_the_finally_and_a_second_signal_does_not_cut_it_short(tmp_path: Path) -> None:
    out = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(out)], cwd=PROJECT, stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for(out, "running", 30) == "running"
        proc.send_signal(signal.SIGTERM)
        assert _wait_for(out, "stopping", 10) == "stopping"
        proc.send_signal(signal.SIGTERM)  # ignored: the shutdown runs to its end
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert out.read_text() == "stopped"
    assert "KeyboardInterrupt: SIGTERM" in stderr
    assert proc.returncode == -signal.SIGINT  # Python ends an uncaught KeyboardInterrupt by SIGINT, as Ctrl-C
