"""The local stack's processes run at a lower CPU priority than the SQL endpoint (kdq.procs): a managed
process is started under ``nice`` in a session of its own whose autogroup gets the same niceness, its threads and
children inherit both, and the endpoint's keeps the default."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from kdq.procs import INTERACTIVE_NICENESS, SERVICE_NICENESS, ManagedProcess, niced, set_session_niceness
from kdq.stack.sql_endpoint import LocalSqlEndpoint
from tests.conftest import make_config


def test_niced_command_lines() -> None:
    """The niceness is absolute: the increment is what this process lacks, nothing when it is already there."""
    own = os.nice(0)
    assert niced(["java", "-jar", "x.jar"], own + 10) == ["nice", "-n", "10", "java", "-jar", "x.jar"]
    assert niced(["java"], own) == ["java"]
    assert niced(["java"], own - 1) == ["java"]


def test_a_managed_process_and_its_child_run_at_the_service_priority(tmp_path: Path) -> None:
    marker = f"kdq-priority-test-{tmp_path.name}"
    process = ManagedProcess("sleeper", tmp_path / "p.pid", tmp_path / "p.log", marker=marker)
    child_code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); time.sleep(300)"
    process.start([sys.executable, "-c", child_code, marker])
    try:
        proc = process.process()
        assert proc is not None
        # Found again by its marker once nice has exec'd python: during the exec /proc's cmdline reads empty until
        # the new image's arguments are set up (is_marked accepts that), so wait for the marker to show. The deadline
        # is generous because the process runs niced in a niced session: on a loaded 2-core host it may get a tenth
        # of a core (stop 53's CI still read an empty cmdline after 10 s).
        deadline = time.monotonic() + 90
        while marker not in " ".join(proc.cmdline()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker in " ".join(proc.cmdline())
        while not proc.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.nice() == SERVICE_NICENESS
        children = proc.children()
        assert children and {child.nice() for child in children} == {SERVICE_NICENESS}
        # Its session (autogroup) has the same weight among sessions, shared by the child; where the kernel has no
        # autogroup the process's own niceness is all there is, and setting it reports so.
        autogroup = Path(f"/proc/{proc.pid}/autogroup")
        if autogroup.exists():
            assert autogroup.read_text().split()[-2:] == ["nice", str(SERVICE_NICENESS)]
            assert Path(f"/proc/{children[0].pid}/autogroup").read_text() == autogroup.read_text()
            assert Path(f"/proc/{os.getpid()}/autogroup").read_text() != autogroup.read_text()
        else:
            assert not set_session_niceness(proc.pid, SERVICE_NICENESS)
    finally:
        assert process.stop(timeout=5)


def test_the_sql_endpoint_keeps_the_default_priority(tmp_path: Path) -> None:
    endpoint = LocalSqlEndpoint(make_config(tmp_path), connect_port=1, thrift_port=2)
    assert endpoint.process.niceness == INTERACTIVE_NICENESS == 0
