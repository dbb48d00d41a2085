"""Found by review: the sweep of orphan runtime cgroups judged a runtime dead when the pid in
its cgroup's name did not exist here, so an evolane in a pid namespace of its own (a container
sharing the host's cgroup tree, ``unshare -p``) killed every running command of the host's
runtimes (4 of 4 replays in flight, SIGKILL, charged to their units), and one on the host
could kill a container's. A runtime cgroup holding a process of another pid namespace is left
alone now."""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import trio

from evolane.sandbox import open_sandbox, sweep_stale_leases

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)


async def _runtime_cgroup_parent(root: Path) -> Path:
    async with open_sandbox(root) as host:
        roots = host.cgroups.roots()
    if not roots:
        pytest.skip("no writable cgroups here")
    return roots[0].parent


def test_a_runtime_cgroup_holding_another_pid_namespace_is_never_swept(tmp_path: Path) -> None:
    parent = trio.run(_runtime_cgroup_parent, tmp_path / "sandbox")
    # Named for a live process of ours until the other namespace's command is in it: every
    # runtime opened meanwhile (another pytest-xdist worker's) sweeps a runtime cgroup named
    # for no process and holding none of another namespace's, as this one is while it is made.
    namesake = subprocess.Popen(["sleep", "60"])
    foreign = parent / f"evolane-rt-{namesake.pid}-{secrets.token_hex(4)}"
    foreign.mkdir()
    procs = shlex.quote(str(foreign / "cgroup.procs"))
    held = subprocess.Popen(  # unshare stays in this namespace, its sleep is in a new one
        ["sh", "-c", f"echo $$ > {procs} && exec unshare -p -f --kill-child sleep 60"]
    )
    try:
        deadline = time.monotonic() + 30
        while len((foreign / "cgroup.procs").read_text().split()) < 2:
            assert time.monotonic() < deadline and held.poll() is None
            time.sleep(0.05)
        namesake.kill()
        namesake.wait()  # now a pid that is no process here
        sweep_stale_leases(tmp_path / "sandbox")
        assert held.poll() is None  # the runtime of the other namespace's command runs on
        assert foreign.is_dir()
    finally:
        for process in (namesake, held):
            process.kill()
            process.wait()
        deadline = time.monotonic() + 30
        while foreign.exists() and time.monotonic() < deadline:
            try:
                foreign.rmdir()
            except OSError:
                time.sleep(0.05)
