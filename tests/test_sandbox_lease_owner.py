"""A lease is swept only when its owner is provably dead: never one whose pid means nothing
here (another host, another pid namespace sharing the store), unless its host rebooted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evolane.sandbox import open_sandbox

DEAD_PID = 4_000_000  # above any pid_max: no process has it


def _lease(root: Path, name: str, **owner: object) -> Path:
    lease = root / name
    lease.mkdir(parents=True)
    (lease / "units").mkdir()
    (lease / "owner.json").write_text(json.dumps({"pid": DEAD_PID, "create_time": 1.0, **owner}))
    return lease


async def test_leases_of_other_hosts_and_pid_namespaces_are_left_alone(tmp_path: Path) -> None:
    from evolane.sandbox._host import _process_space

    here = _process_space()
    root = tmp_path / "sandbox"
    other_ns = _lease(root, "rt-1-aaaa", **{**here, "pid_ns": "pid:[1]"})
    other_host = _lease(root, "rt-2-bbbb", host="elsewhere", boot_id="b-elsewhere", pid_ns="x")
    rebooted = _lease(root, "rt-3-cccc", **{**here, "boot_id": "an-earlier-boot"})
    dead_here = _lease(root, "rt-4-dddd", **here)
    older = _lease(root, "rt-5-eeee")  # an older evolane's owner file: pid and time only
    async with open_sandbox(root) as host:
        assert host.stale_swept >= 3
    assert other_ns.exists() and other_host.exists()
    assert not rebooted.exists() and not dead_here.exists() and not older.exists()


RUNTIME = textwrap.dedent(
    """
    import sys, time, trio
    from evolane.sandbox import open_sandbox

    async def main() -> None:
        async with open_sandbox(sys.argv[1]) as host:
            print(host.lease, flush=True)
            await trio.sleep(60)

    trio.run(main)
    """
)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)
async def test_a_live_runtime_in_another_pid_namespace_keeps_its_lease(tmp_path: Path) -> None:
    root = tmp_path / "sandbox"
    command = [
        "unshare",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        sys.executable,
        "-c",
        RUNTIME,
    ]
    runtime = subprocess.Popen([*command, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        assert runtime.stdout is not None
        lease = runtime.stdout.readline().strip()
        if not lease.startswith("rt-"):
            pytest.skip("no pid namespace here")
        async with open_sandbox(root):
            pass
        assert (root / lease / "owner.json").exists(), "a live runtime's lease was swept"
    finally:
        runtime.kill()
        runtime.wait(timeout=10)
