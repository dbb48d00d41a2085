"""A lease is swept only when its owner is provably dead: never one whose pid means nothing
here (another host, another pid namespace sharing the store), unless its host rebooted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio

from evolane.sandbox import lease_holders, open_sandbox

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
    import sys, trio
    from evolane.sandbox import SandboxSpec, open_sandbox

    async def main(root):
        async with open_sandbox(root) as host:
            async with trio.open_nursery() as nursery:
                spec = SandboxSpec(argv=("sleep", "60"))
                nursery.start_soon(lambda: host.run(spec, timeout=120))
                print(host.lease, flush=True)

    trio.run(main, sys.argv[1])
    """
)


SWEEP = "import sys, trio; from evolane.sandbox import open_sandbox\n" + (
    "async def main():\n    async with open_sandbox(sys.argv[1]):\n        pass\ntrio.run(main)\n"
)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)
async def test_a_runtime_in_another_pid_namespace_leaves_a_live_run_alone(tmp_path: Path) -> None:
    """Found by review: a run started in another pid namespace (a container) on the same
    store and cgroup tree took a live run's lease for dead (its pid is none there), removed
    its folder and killed its units' cgroups: the run failed, its replays `signal_9`."""
    root = tmp_path / "sandbox"
    runtime = subprocess.Popen(
        [sys.executable, "-c", RUNTIME, str(root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert runtime.stdout is not None
        lease = runtime.stdout.readline().strip()
        assert lease.startswith("rt-"), lease
        deadline = time.monotonic() + 60  # a guard against a hang, not a timing figure
        while not lease_holders(lease):
            assert time.monotonic() < deadline, "the unit did not start"
            await trio.sleep(0.05)
        unshare = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
        sweep = subprocess.run(
            [*unshare, sys.executable, "-c", SWEEP, str(root)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if sweep.returncode != 0 and "unshare" in sweep.stderr:
            pytest.skip(f"no pid namespace here: {sweep.stderr.strip()}")
        assert sweep.returncode == 0, sweep.stderr
        assert (root / lease / "owner.json").exists(), "a live runtime's lease was swept"
        assert lease_holders(lease), "a live runtime's unit was killed"
    finally:
        runtime.kill()
        runtime.wait(timeout=10)
