"""The leak check's negative control: a test that leaves a process behind must fail."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from evolane.testing import kill_processes, leaked_processes, lease_holders
from evolane.testing._leaks import descendants


def test_a_leaked_child_is_reported_and_killed() -> None:
    before = descendants()
    leaked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        found = leaked_processes(before, lease=None, settle=0.1)
        assert [line.split()[1] for line in found] == [f"{leaked.pid}:"]
        kill_processes(found)
        assert leaked.wait(timeout=5) != 0
    finally:
        leaked.kill()
        leaked.wait(timeout=5)


def test_an_escaped_process_is_found_by_its_lease_marker(tmp_path: Path) -> None:
    # A double fork + setsid: the grandchild leaves our tree and only the lease finds it.
    script = textwrap.dedent(
        """
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                with open(sys.argv[1] + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.rename(sys.argv[1] + ".tmp", sys.argv[1])
                time.sleep(60)
            os._exit(0)
        os.wait()
        """
    )
    pid_file = tmp_path / "pid"
    before = descendants()
    env = {"PATH": "/usr/bin:/bin", "EVOLANE_LEASE": "negative-control-lease"}
    subprocess.run([sys.executable, "-c", script, str(pid_file)], env=env, timeout=10, check=True)
    deadline = time.monotonic() + 5
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    escaped = int(pid_file.read_text())
    assert escaped in lease_holders("negative-control-lease")
    found = leaked_processes(before, lease="negative-control-lease", settle=0.1)
    kill_processes(found)
    assert [line.split()[1] for line in found] == [f"{escaped}:"]


def test_the_autouse_fixture_fails_a_leaking_test(pytester: pytest.Pytester) -> None:
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(
        test_leaky="""
        import subprocess, sys
        def test_leaks():
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        def test_clean():
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        """
    )
    # The leak is killed, not waited for: a run that waited would take an hour, so a bound
    # of minutes (a loaded host's, not a timing figure) tells them apart.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "addopts=", timeout=600)
    result.assert_outcomes(passed=2, errors=1)  # test_leaks passes, then errors at teardown
    result.stdout.fnmatch_lines(["*test_leaks leaked processes*"])
