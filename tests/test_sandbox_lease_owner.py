"""A lease is swept only when its owner is provably dead: never one whose pid means nothing
here (another host, another pid namespace sharing the store), unless its host rebooted."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from evolane.sandbox import lease_holders, open_sandbox
from evolane.sandbox._lease_owner import LOCK_FILE, claim, owner_is_dead, process_space
from evolane.sandbox._lifeline import remove_lease_folder

DEAD_PID = 4_000_000  # above any pid_max: no process has it


def _lease(root: Path, name: str, **owner: object) -> Path:
    lease = root / name
    lease.mkdir(parents=True)
    (lease / "units").mkdir()
    (lease / "owner.json").write_text(json.dumps({"pid": DEAD_PID, "create_time": 1.0, **owner}))
    return lease


async def test_leases_of_other_hosts_and_pid_namespaces_are_left_alone(tmp_path: Path) -> None:
    here = process_space()
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


def test_a_lease_lock_held_is_a_live_owner_and_a_free_one_a_dead_owner(tmp_path: Path) -> None:
    """The lock speaks before the pid: a live owner of any host or namespace holds it, and
    the kernel frees it when the owner dies, however it dies."""
    live = tmp_path / "rt-1-live"
    live.mkdir()
    fd = claim(live)
    assert fd is not None and (live / LOCK_FILE).is_file()
    try:
        # the owner file may say anything (a pid of another namespace, one reused here)
        (live / "owner.json").write_text(json.dumps({"pid": DEAD_PID, "create_time": 1.0}))
        assert not owner_is_dead(live)
    finally:
        os.close(fd)
    assert owner_is_dead(live)  # the lock went with its owner's descriptor


async def test_a_dead_runtimes_lease_of_another_namespace_or_host_is_swept(tmp_path: Path) -> None:
    """Found by review of the namespace check: a lease whose owner ran in another pid
    namespace (a container since restarted) or on another host was never swept, its units'
    folders left in the store for ever. Its lock, free, says its owner is dead."""
    root = tmp_path / "sandbox"
    here = process_space()
    gone = [
        _lease(root, "rt-1n1-aaaa", **{**here, "pid_ns": "pid:[1]"}),
        _lease(root, "rt-2-bbbb", host="elsewhere", boot_id="b-elsewhere", pid_ns="x"),
    ]
    for lease in gone:
        (lease / LOCK_FILE).touch()  # what a dead owner leaves: the file, no lock on it
    alive = _lease(root, "rt-3-cccc", host="elsewhere", boot_id="b-elsewhere", pid_ns="x")
    (alive / "owner.json").unlink()
    fd = claim(alive)  # a live owner elsewhere: its lock held
    try:
        async with open_sandbox(root) as host:
            assert host.stale_swept >= 2
        assert not any(lease.exists() for lease in gone)
        assert (alive / LOCK_FILE).exists() and (alive / "units").is_dir()
    finally:
        if fd is not None:
            os.close(fd)


def _lifeline_of(lease: str) -> int:
    """The pid, here, of the lifeline process watching ``lease``."""
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(b"_lifeline.py") for arg in argv) and lease.encode() in argv:
            return int(entry)
    raise AssertionError(f"no lifeline for {lease}")


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)
async def test_a_runtime_killed_in_another_pid_namespace_is_swept_from_here(
    tmp_path: Path,
) -> None:
    """A container killed outright (its pid namespace with it: no lifeline cleans up)
    leaves its lease; the next runtime, here, sweeps it."""
    root = tmp_path / "sandbox"
    unshare = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
    runtime = subprocess.Popen(
        [*unshare, sys.executable, "-c", RUNTIME, str(root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert runtime.stdout is not None
        lease = runtime.stdout.readline().strip()
        if not lease:
            pytest.skip("no pid namespace here")
        deadline = time.monotonic() + 60  # a guard against a hang, not a timing figure
        while not lease_holders(lease):
            assert time.monotonic() < deadline, "the unit did not start"
            await trio.sleep(0.05)
        lifeline = _lifeline_of(lease)
        # Stopped, the lifeline cleans up nothing: the kernel ends it with the namespace. Left
        # to run, it may see its pipe close before the kernel's kill reaches it (CI once saw
        # it remove the lease's owner.json), a case `test_a_lease_removed_part_way_...` takes.
        os.kill(lifeline, signal.SIGSTOP)
    finally:
        runtime.kill()  # unshare: --kill-child takes the namespace's every process with it
        runtime.wait(timeout=10)
    deadline = time.monotonic() + 60  # the kernel ends the namespace's processes: in time
    while lease_holders(lease) or not owner_is_dead(root / lease):  # its lock freed with them
        assert time.monotonic() < deadline, "the dead namespace's lease still reads as live"
        await trio.sleep(0.05)
    assert (root / lease / "owner.json").exists()  # nothing in the namespace cleaned up
    async with open_sandbox(root) as host:
        assert host.stale_swept >= 1
    assert not (root / lease).exists()


class _Killed(BaseException):
    """The remover's end, at a chosen removal."""


class _Removals:
    """Lets ``cut`` removals through, then ends the remover."""

    def __init__(self, cut: int) -> None:
        self.cut = cut

    def wrap(self, real: Callable[..., None]) -> Callable[..., None]:
        def removal(*args: object, **kwargs: object) -> None:
            if self.cut <= 0:
                raise _Killed
            self.cut -= 1
            real(*args, **kwargs)

        return removal


def test_a_lease_removed_part_way_still_reads_as_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by CI: a killed container's lifeline, ended by the kernel while it removed the
    lease, left the folder without owner.json; a sweep then waited a minute, and an owner
    file of another namespace without its lock file was never taken for dead. Cut at every
    removal, what is left of a dead owner's lease reads as dead, or is gone."""
    template = tmp_path / "template" / "rt-1n1-aaaa"
    template.mkdir(parents=True)
    fd = claim(template)
    assert fd is not None
    os.close(fd)  # its owner died
    owner = {"pid": DEAD_PID, "create_time": 1.0, **process_space(), "pid_ns": "pid:[1]"}
    (template / "owner.json").write_text(json.dumps(owner))  # a pid that means nothing here
    for folder in ("units/u-1/workspace/deep", "units/u-2", "spool"):
        (template / folder).mkdir(parents=True)
        (template / folder / "file").write_text("x")
    for cut in range(100):
        lease = tmp_path / f"cut-{cut}" / template.name
        shutil.copytree(template, lease)
        removals = _Removals(cut)
        monkeypatch.setattr(os, "unlink", removals.wrap(os.unlink))
        monkeypatch.setattr(os, "rmdir", removals.wrap(os.rmdir))
        try:
            finished = remove_lease_folder(lease)
        except _Killed:
            finished = False
        finally:
            monkeypatch.undo()
        # what is left reads as dead, or holds nothing: a host that died being made, swept
        # after a minute (`owner_is_dead`), with no unit of it left behind
        left = sorted(p.name for p in lease.iterdir()) if lease.exists() else []
        assert not left or owner_is_dead(lease), f"cut after {cut} removals: {left}"
        if finished:
            assert not lease.exists() and cut > 8  # every entry was removed, one at a time
            return
    raise AssertionError("the removal never finished")
