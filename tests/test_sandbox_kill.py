"""The kill ladder: nothing survives a deadline, a cancel, a stop, an exit or a dead runtime."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from evolane.sandbox import (
    SandboxHost,
    SandboxSpec,
    Stop,
    UnitStop,
    _lifeline,
    lease_holders,
    open_sandbox,
)
from evolane.testing import DAEMON_AFTER_EXIT_SH, EVIL_TREE_SH, POLITE_TREE_SH, descendants
from tests.sandbox_helpers import sh, survivors


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[SandboxHost]:
    async with open_sandbox(tmp_path / "sandbox") as opened:
        yield opened


def _baseline(host: SandboxHost) -> set[int]:
    return descendants()  # the lifeline is already among them


async def test_evil_tree_dies_whole_at_the_deadline(host: SandboxHost) -> None:
    before = _baseline(host)
    spec = SandboxSpec(**sh(EVIL_TREE_SH, kill_grace=0.2))
    with trio.fail_after(10):
        outcome = await host.run(spec, timeout=1.0)
    assert outcome.status == "timed_out"
    assert outcome.stdout.head == b"ready\n"
    assert outcome.pids_killed >= 40, outcome  # ~50 processes, TERM and KILL phases together
    assert outcome.escaped_found >= 2  # the setsid and double-fork escapers
    assert outcome.survivors == 0
    assert outcome.kill_latency_seconds is not None  # its figure: benchmarks/kill.py
    assert survivors(host, before) == set()


async def test_evil_tree_dies_whole_when_the_caller_is_cancelled(host: SandboxHost) -> None:
    before = _baseline(host)
    spec = SandboxSpec(**sh(EVIL_TREE_SH, kill_grace=0.2))
    with trio.fail_after(10):
        with trio.move_on_after(1.0) as scope:
            await host.run(spec, timeout=60)
    assert scope.cancelled_caught
    assert survivors(host, before) == set()


@pytest.mark.parametrize("stop_type", [trio.Event, UnitStop], ids=["event", "unit-stop"])
async def test_stop_event_ends_the_run_as_cancelled(
    host: SandboxHost, stop_type: type[Stop]
) -> None:
    """A stop kills the tree and the run ends ``cancelled``: a plain event through a task
    that waits for it, a lane's `UnitStop` through the cancel scope the watch binds to it."""
    stop = stop_type()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_set_later, stop, 0.5)
        with trio.fail_after(10):
            outcome = await host.run(SandboxSpec(**sh(POLITE_TREE_SH)), timeout=60, stop=stop)
    assert outcome.status == "cancelled"
    assert outcome.signal == signal.SIGTERM  # it died of the TERM, not of the KILL after grace
    assert outcome.kill_latency_seconds is not None
    assert lease_holders(host.lease) == set()


async def _set_later(event: Stop, seconds: float) -> None:
    await trio.sleep(seconds)
    event.set()


async def test_daemons_left_after_a_normal_exit_are_killed(host: SandboxHost) -> None:
    before = _baseline(host)
    with trio.fail_after(10):
        outcome = await host.run(
            SandboxSpec(**sh(DAEMON_AFTER_EXIT_SH, kill_grace=0.2)), timeout=30
        )
    assert outcome.status == "exited" and outcome.exit_code == 0
    # The daemon held the pipes, yet the result came back once the ladder had killed it.
    assert outcome.stdout.head == b"started\n"
    # (not "timed_out": the result did not wait for the 30 s deadline)
    assert survivors(host, before) == set()


async def test_a_polite_tree_is_gone_right_after_the_deadline(host: SandboxHost) -> None:
    with trio.fail_after(20):  # a hang guard: the TERM ends it, no KILL after the 30 s grace
        outcome = await host.run(SandboxSpec(**sh(POLITE_TREE_SH, kill_grace=30.0)), timeout=0.5)
    assert outcome.status == "timed_out"
    assert outcome.signal == signal.SIGTERM  # no wait for the grace (the KILL would come after)
    assert outcome.kill_latency_seconds is not None
    assert lease_holders(host.lease) == set()


async def test_a_stopped_tree_takes_its_term_at_the_deadline(host: SandboxHost) -> None:
    """Found by review: a tree stopped whole (SIGSTOP) kept its TERM pending and was only
    killed after the whole grace; continued with it, it ends on the TERM."""
    script = "sleep 100 & kill -STOP 0"  # the whole group stops itself
    with trio.fail_after(20):  # a hang guard: the TERM ends it, no KILL after the 30 s grace
        outcome = await host.run(SandboxSpec(**sh(script, kill_grace=30.0)), timeout=0.5)
    assert outcome.status == "timed_out"
    assert outcome.signal == signal.SIGTERM, outcome
    assert lease_holders(host.lease) == set()


RUNTIME = textwrap.dedent(
    """
    import sys, trio
    from evolane.sandbox import SandboxSpec, open_sandbox
    from evolane.testing import EVIL_TREE_SH

    async def main(root):
        async with open_sandbox(root) as host:
            print(host.lease, flush=True)
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    spec = SandboxSpec(argv=("sh", "-c", EVIL_TREE_SH))
                    nursery.start_soon(lambda: host.run(spec, timeout=600))

    trio.run(main, sys.argv[1])
    """
)


FORKING_RUNTIME = RUNTIME.replace(
    "print(host.lease, flush=True)",
    "print(host.lease, flush=True)\n"
    "        import os, time\n"
    "        child = os.fork()  # a worker, as multiprocessing forks one: it outlives the test\n"
    "        if child == 0:\n"
    "            time.sleep(120)\n"
    "            os._exit(0)\n"
    "        print(child, flush=True)",
)


def _start_runtime(root: Path, script: str = RUNTIME) -> tuple[subprocess.Popen[str], str]:
    runtime = subprocess.Popen(
        [sys.executable, "-c", script, str(root)], stdout=subprocess.PIPE, text=True
    )
    assert runtime.stdout is not None
    lease = runtime.stdout.readline().strip()
    assert lease.startswith("rt-"), lease
    deadline = time.monotonic() + 30  # generous: shared, loaded CI machines
    while len(lease_holders(lease)) < 100 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(lease_holders(lease)) >= 100, "the trees did not start"
    return runtime, lease


def _wait_until(predicate: object, seconds: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if predicate():  # type: ignore[operator]
            return time.monotonic() - start
        time.sleep(0.01)
    return None


def test_sigkilled_runtime_takes_every_tree_with_it(tmp_path: Path) -> None:
    runtime, lease = _start_runtime(tmp_path / "sandbox")
    try:
        _sigkill_then_all_gone(runtime, lease, tmp_path / "sandbox")
    finally:
        runtime.kill()
        runtime.wait(timeout=5)


def _sigkill_then_all_gone(runtime: subprocess.Popen[str], lease: str, root: Path) -> None:
    """SIGKILL ``runtime``: every process of its ``lease`` ends and its workspaces go."""
    runtime.send_signal(signal.SIGKILL)
    runtime.wait(timeout=5)
    # Generous for loaded machines; how fast the lifeline kills is a benchmark's figure.
    took = _wait_until(lambda: not lease_holders(lease), 10.0)
    assert took is not None, f"survivors after 10 s: {sorted(lease_holders(lease))}"
    # The lifeline also removed the dead runtime's workspaces.
    assert _wait_until(lambda: not (root / lease).exists(), 10.0) is not None


def test_a_sigkilled_runtime_with_a_forked_child_alive_takes_every_tree_with_it(
    tmp_path: Path,
) -> None:
    # Found by review: the child (a multiprocessing worker) held copies of the lifeline's
    # pipe and the lease's lock, so the runtime's death went unseen: its trees ran on, and
    # its lease passed for live, for as long as the child lived.
    runtime, lease = _start_runtime(tmp_path / "sandbox", FORKING_RUNTIME)
    assert runtime.stdout is not None
    child = int(runtime.stdout.readline())
    try:
        _sigkill_then_all_gone(runtime, lease, tmp_path / "sandbox")
        assert _alive(child)  # the child lived throughout
    finally:
        runtime.kill()
        runtime.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_next_runtime_sweeps_what_a_dead_runtime_left(tmp_path: Path) -> None:
    # Any runtime that opens a sandbox sweeps every dead runtime's cgroups, so another
    # evolane on the host (a second test run) may sweep this one's trees first: the
    # scenario is then run again in a fresh folder (our folder is swept only by us).
    for attempt in range(3):
        if await _dead_runtime_swept_by_the_next(tmp_path / f"sandbox{attempt}"):
            return
    pytest.fail("another runtime swept the dead runtime's trees first, three times over")


async def _dead_runtime_swept_by_the_next(root: Path) -> bool:
    """Kill a runtime and its lifeline, then open a sandbox on ``root``: it must sweep
    the dead runtime's trees and folder. False when something else swept the trees first."""
    runtime, lease = _start_runtime(root)
    try:
        # Take the lifeline down first, so only the next start can clean up.
        lifelines = [
            p
            for p in descendants()
            if "_lifeline.py" in " ".join(_cmdline(p)) and lease in _cmdline(p)
        ]
        assert len(lifelines) == 1
        os.kill(lifelines[0], signal.SIGKILL)
        runtime.send_signal(signal.SIGKILL)
        runtime.wait(timeout=5)
        time.sleep(0.2)
        assert (root / lease).exists()
        if not lease_holders(lease):
            return False  # "without a lifeline the trees outlive the runtime": not here
        async with open_sandbox(root) as host:
            # At least: the count takes in every dead runtime's cgroups on the host, and
            # another test process (a pytest-xdist worker) may have just killed one.
            assert host.stale_swept >= 1
            assert lease_holders(lease) == set()
            assert not (root / lease).exists()
        return True
    finally:
        runtime.kill()
        runtime.wait(timeout=5)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


async def test_cgroups_of_a_dead_runtime_under_another_root_are_removed(tmp_path: Path) -> None:
    runtime, lease = _start_runtime(tmp_path / "elsewhere")
    try:
        lifelines = [p for p in descendants() if lease in _cmdline(p)]
        for pid in lifelines:
            os.kill(pid, signal.SIGKILL)
        runtime.send_signal(signal.SIGKILL)
        runtime.wait(timeout=5)
        async with open_sandbox(tmp_path / "sandbox") as host:
            if not host.cgroups.roots():
                pytest.skip("this host has no writable cgroups")
            leftovers = [root.parent / f"evolane-{lease}" for root in host.cgroups.roots()]
            assert not any(path.exists() for path in leftovers)
            assert lease_holders(lease) == set()
    finally:
        runtime.kill()
        runtime.wait(timeout=5)


def test_sweeping_stale_leases_does_not_make_the_caller_a_subreaper(tmp_path: Path) -> None:
    # A subreaper inherits every orphan below it; a one-off sweep must not take that on.
    probe = (
        "import ctypes, sys\n"
        "from evolane.sandbox import sweep_stale_leases\n"
        "sweep_stale_leases(sys.argv[1])\n"
        "flag = ctypes.c_int(-1)\n"
        "ctypes.CDLL(None).prctl(37, ctypes.byref(flag), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER\n"
        "print(flag.value)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "sandbox")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


def test_a_cgroup_walk_is_iterative_deepest_first_and_capped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / "top"
    chain = [deep / "/".join(["d"] * n) if n else deep for n in range(1100)]  # past recursion
    for folder in chain:
        folder.mkdir()
    (deep / "side").mkdir()
    (deep / "a-file").write_text("not a cgroup")
    found = _lifeline.cgroup_dirs(deep)
    assert len(found) == 1101 and found[-1] == deep and set(chain) <= set(found)
    order = {path: n for n, path in enumerate(found)}
    for child, parent in zip(chain[1:], chain[:-1], strict=True):
        assert order[child] < order[parent]  # removed before its parent
    monkeypatch.setattr(_lifeline, "CGROUP_WALK_MAX", 10)
    assert len(_lifeline.cgroup_dirs(deep)) == 10
    (deep / "a-file").unlink()
    for folder in [deep / "side", *reversed(chain)]:  # pytest's own removal recurses
        folder.rmdir()


async def test_cgroups_a_root_command_made_inside_its_own_are_killed_and_removed(
    tmp_path: Path,
) -> None:
    async with open_sandbox(tmp_path / "sandbox") as host:
        if host.cgroups.unified is None or os.geteuid() != 0:
            pytest.skip("needs root and a writable cgroup v2")
        # The command nests a cgroup in its unit's and leaves a sleeper there; the unit's
        # cgroup is then no longer removable by one rmdir.
        script = (
            "cg=" + str(host.cgroups.unified.parent) + "$(sed -n 's/^0:://p' /proc/self/cgroup)\n"
            'mkdir "$cg/nested" && echo "$cg"\n'
            'sh -c \'echo 0 > "$1/nested/cgroup.procs"; exec sleep 60\' nested "$cg" &\n'
            "sleep 0.3\n"
        )
        spec = SandboxSpec(argv=("sh", "-c", script), isolation="process", kill_grace=0.2)
        outcome = await host.run(spec, timeout=30)
        assert outcome.ok, outcome
        unit_cgroup = Path(outcome.stdout.text().strip())
        assert unit_cgroup.parent.parent == host.cgroups.unified.parent, unit_cgroup
        await trio.to_thread.run_sync(host.settle)
        assert not unit_cgroup.exists()
        assert lease_holders(host.lease) == set()
