"""The host's own pid limit, above evolane's ``--max-procs``, is said before a run.

Found by review: under an enclosing ``pids.max`` (a container's, a CI job's) a replay whose
fork the host refused failed, and the kernel counted the refusal in the replay's own cgroup
(``pids.events``: v1, and v2 before 6.12), so the report said "processes limit 512 hit
(--max-procs)", owner candidate: a candidate that fixed 8 of 12 cases was rejected. The run
cannot tell such a refusal from the tree's own limit after the fact; it says, at its start
and in ``doctor``, when its command trees may hold more processes than the host allows.
These tests make a pids cgroup of their own (a child of this process's, removed after).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.campaign_helpers import toy_flags, write_toy

_V1_PIDS = Path("/sys/fs/cgroup/pids")


def _own_v1_pids() -> Path | None:
    """This process's v1 pids cgroup folder, when the controller is mounted there."""
    if not (_V1_PIDS / "cgroup.procs").exists():
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return _V1_PIDS / path.lstrip("/")
    return None


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A pids cgroup of this test's own with ``pids.max`` 200 (and its limit)."""
    own = _own_v1_pids()
    if own is None or os.geteuid() != 0:
        pytest.skip("needs root and a v1 pids controller (this host kind has both)")
    cgroup = own / f"evolane-test-{os.getpid()}-{tmp_path.name}"
    cgroup.mkdir()
    try:
        (cgroup / "pids.max").write_text("200")
        yield cgroup, 200
    finally:
        for _ in range(100):  # its processes have ended: the folder goes once they are reaped
            try:
                cgroup.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def _inside(cgroup: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` run as a process of ``cgroup`` (it joins before it runs anything)."""

    def join() -> None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    return subprocess.run(
        argv, capture_output=True, text=True, timeout=300, preexec_fn=join, check=False
    )


def test_the_headroom_is_the_enclosing_limit_less_what_it_holds(
    limited: tuple[Path, int],
) -> None:
    cgroup, limit = limited
    code = "from evolane.sandbox import process_headroom as h; left, at = h(); print(left, at)"
    done = _inside(cgroup, [sys.executable, "-c", code])
    assert done.returncode == 0, done.stderr
    left, where = done.stdout.split()
    assert Path(where) == cgroup
    assert 0 < int(left) < limit  # the interpreter itself is one of the tasks counted


def test_a_run_says_when_its_command_trees_may_outgrow_the_hosts_pid_limit(
    limited: tuple[Path, int], tmp_path: Path
) -> None:
    cgroup, _ = limited
    paths = write_toy(tmp_path, {"default": "fix:8"})
    flags = [*toy_flags(paths, paths["store"]), "--iterations", "1"]
    done = _inside(cgroup, [sys.executable, "-m", "evolane", "optimize", *flags])
    assert done.returncode == 0, done.stdout + done.stderr
    (events,) = Path(paths["store"]).glob("runs/*/events.jsonl")
    said = [
        json.loads(line)["message"]
        for line in events.read_text().splitlines()
        if '"event.warning"' in line
    ]
    warned = [line for line in said if line.startswith("the host allows")]
    assert warned, said
    assert f"({cgroup}/pids.max), fewer than 5 command trees x --max-procs 512" in warned[0]
    # with room for every tree, nothing is said
    flags += ["--max-procs", "8", "--store", str(tmp_path / "store2")]
    again = _inside(cgroup, [sys.executable, "-m", "evolane", "optimize", *flags])
    assert again.returncode == 0, again.stdout + again.stderr
    (events,) = (tmp_path / "store2").glob("runs/*/events.jsonl")
    assert "the host allows" not in events.read_text()


def test_a_run_with_no_process_limit_says_so_under_the_hosts_pid_limit(
    limited: tuple[Path, int], tmp_path: Path
) -> None:
    # Found by review: with --max-procs none nothing was said, though one tree may then
    # take every process the host leaves (every sibling's fork and spawn refused).
    cgroup, _ = limited
    paths = write_toy(tmp_path, {"default": "fix:8"})
    flags = [*toy_flags(paths, paths["store"]), "--iterations", "1", "--max-procs", "none"]
    done = _inside(cgroup, [sys.executable, "-m", "evolane", "optimize", *flags])
    assert done.returncode == 0, done.stdout + done.stderr
    (events,) = Path(paths["store"]).glob("runs/*/events.jsonl")
    assert f"({cgroup}/pids.max) and --max-procs is off" in events.read_text()
