"""Spawning from the event loop (issue 22): once a unit's program was found lately, the spawn
server's reply and its clone's exec are awaited on trio, with no worker thread. Every failure
path ends in bounded time with its clone reaped, the loop keeps running meanwhile, a thread's
spawn in flight sends the loop's to a thread, and a run cancelled at either wait leaves
nothing behind. (A failed clone stopped before its exit: `test_sandbox_spawner`, both ways.)"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from evolane.sandbox import SandboxHost, SandboxSpec, _spawnd, _spawner, _start, open_sandbox
from evolane.sandbox._lifeline import lease_holders
from tests.sandbox_helpers import altered_server, count_hops, run_sh, zombies

TRUE = shutil.which("true") or "/bin/true"
SLEEP = shutil.which("sleep") or "/bin/sleep"
# Where a fault goes in the server: in the server once it has cloned (its reply waits), or in
# the clone before its exec (the error pipe's EOF waits).
REPLY_WAITS = (
    "        pid = _clone(libc, cgroup_fd)\n",
    "        pid and __import__('time').sleep",
)
EXEC_WAITS = (
    "        os.write(failed, os.getpid().to_bytes(PID_BYTES, sys.byteorder))\n",
    "        __import__('time').sleep",
)


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[SandboxHost]:
    async with open_sandbox(tmp_path / "sandbox") as opened:
        yield opened


def _slowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: tuple, seconds: float) -> None:
    """Servers started from now on wait ``seconds`` at ``where`` (see `REPLY_WAITS`)."""
    after, sleep = where
    insert = f"{sleep}({seconds})\n"
    monkeypatch.setattr(_spawnd, "__file__", altered_server(tmp_path, after, insert))


async def test_a_program_found_lately_spawns_from_the_loop_with_no_thread(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert host.spawner is not None, "this Linux host must spawn through the server"
    hops = count_hops(monkeypatch)
    assert (await run_sh(host, "true")).ok  # sh looked up in PATH: a thread
    assert hops["_spawn_unless_cancelled"] == 1
    outcome = await run_sh(host, "echo $PPID; cat /proc/self/cgroup")
    assert outcome.ok, outcome
    assert hops["_spawn_unless_cancelled"] == 1  # no second hop
    lines = outcome.stdout.text().splitlines()
    assert lines[0] == str(os.getpid())  # still born a child of evolane, in its cgroup
    if host.cgroups.unified is not None:
        assert any(f"/{host.cgroups.unified.name}/" in line for line in lines[1:]), lines
    host.programs.seconds = 0.0  # what was found is stale at once: looked up again
    assert (await run_sh(host, "true")).ok and hops["_spawn_unless_cancelled"] == 2


async def test_a_program_removed_since_it_was_found_fails_to_spawn_and_leaves_nothing(
    host: SandboxHost, tmp_path: Path
) -> None:
    before = zombies()  # of other tests, in a whole run
    program = tmp_path / "tool"
    program.write_text("#!/bin/sh\necho ran\n")
    program.chmod(0o755)
    spec = SandboxSpec(argv=(str(program),), kill_grace=0.2)
    assert (await host.run(spec, timeout=30)).stdout.text() == "ran\n"
    program.unlink()  # found a moment ago: the loop's spawn does not look again
    outcome = await host.run(spec, timeout=30)
    assert outcome.status == "spawn_failed" and "No such file" in (outcome.error or ""), outcome
    assert zombies() <= before and lease_holders(host.lease) == set()
    assert host.spawner is not None and not host.spawner.broken


@pytest.mark.parametrize("where", [REPLY_WAITS, EXEC_WAITS], ids=["reply", "exec"])
async def test_the_loop_runs_on_while_a_spawn_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: tuple
) -> None:
    _slowed(tmp_path, monkeypatch, where, 0.3)
    spawner = _spawner.Spawner.start()
    assert spawner is not None
    ticks, spawning = [], True
    try:

        async def tick() -> None:
            while spawning:
                ticks.append(1)
                await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            pid = await spawner.spawn_from_trio(TRUE, ["true"], {}, "/", (1, 2), [], [], (), None)
            spawning = False
        assert pid is not None and os.waitpid(pid, 0)[0] == pid
        assert len(ticks) > 1  # other tasks ran during the 0.3 s the spawn waited
    finally:
        spawner.close()


async def test_a_lost_reply_on_the_loop_kills_and_reaps_its_clone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _slowed(tmp_path, monkeypatch, REPLY_WAITS, 3)  # past the reply timeout below
    before = {p.pid for p in psutil.Process().children()}
    spawner = _spawner.Spawner.start()  # its probe waits out the stall
    assert spawner is not None
    spawner.reply_timeout = 1.0
    try:
        with pytest.raises(OSError, match="timed out"):
            await spawner.spawn_from_trio(SLEEP, ["sleep", "60"], {}, "/", (1, 2), [], [], (), None)
        assert spawner.broken
        assert {p.pid for p in psutil.Process().children()} <= before | {spawner.pid}
        # Broken: the next spawn is not sent at all, so the launcher chain may run it.
        with pytest.raises(_spawner.SpawnerUnavailable):
            await spawner.spawn_from_trio(TRUE, ["true"], {}, "/", (1, 2), [], [], (), None)
    finally:
        spawner.close()


async def test_a_thread_spawn_in_flight_sends_the_loop_spawn_to_a_thread(tmp_path: Path) -> None:
    spawner = _spawner.Spawner.start()
    assert spawner is not None
    children = {p.pid for p in psutil.Process().children()}
    try:
        with spawner._lock:  # as a worker thread's `spawn` holds it
            none = await spawner.spawn_from_trio(TRUE, ["true"], {}, "/", (1, 2), [], [], (), None)
        assert none is None and {p.pid for p in psutil.Process().children()} == children
        pid = await spawner.spawn_from_trio(TRUE, ["true"], {}, "/", (1, 2), [], [], (), None)
        assert pid is not None and os.waitpid(pid, 0)[0] == pid and not spawner.broken
    finally:
        spawner.close()


@pytest.mark.parametrize("where", [REPLY_WAITS, EXEC_WAITS], ids=["reply", "exec"])
async def test_a_run_cancelled_while_its_loop_spawn_waits_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: tuple
) -> None:
    _slowed(tmp_path, monkeypatch, where, 0.5)
    waiting, before = trio.Event(), zombies()
    real = _spawner.Spawner.spawn_from_trio

    async def spied(*args: Any) -> int | None:
        waiting.set()
        return await real(*args)

    async with open_sandbox(tmp_path / "sandbox") as host:
        assert (await run_sh(host, "true")).ok  # sh found: the next spawn is the loop's
        monkeypatch.setattr(_spawner.Spawner, "spawn_from_trio", spied)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_sh, host, "sleep 60")
                await waiting.wait()
                scope.cancel()  # the spawn in flight ends first (shielded), then is killed
        assert scope.cancelled_caught
        await trio.to_thread.run_sync(host.settle)
        assert lease_holders(host.lease) == set() and zombies() <= before
        assert not [p for p in host.lease_dir.iterdir() if p.name.startswith("unit")]
        for root in host.cgroups.roots():
            assert not [p for p in root.iterdir() if p.is_dir()], list(root.iterdir())
        assert host.spawner is not None and not host.spawner.broken
        assert (await run_sh(host, "echo after")).stdout.text() == "after\n"


def test_the_program_cache_keeps_recent_lookups_of_names_and_absolute_paths_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(_start.time, "monotonic", lambda: now[0])
    cache = _start.ProgramCache(seconds=1.0)
    cache.put("sh", "/bin", "/bin/sh")
    cache.put("./run", "/bin", "/unit/work/run")  # relative to each unit's own workspace
    cache.put("/opt/tool", "/bin", "/opt/tool")
    assert cache.get("sh", "/bin") == "/bin/sh" and cache.get("sh", "/usr/bin") is None
    assert cache.get("./run", "/bin") is None and cache.get("/opt/tool", "/bin") == "/opt/tool"
    now[0] += 1.5
    assert cache.get("sh", "/bin") is None  # stale: looked up again
    for n in range(3 * _start._PROGRAMS_KEPT):
        cache.put(f"p{n}", "/bin", f"/bin/p{n}")
    assert len(cache._found) <= _start._PROGRAMS_KEPT
    assert cache.get(f"p{3 * _start._PROGRAMS_KEPT - 1}", "/bin") is not None
