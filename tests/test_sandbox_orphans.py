"""A tree's orphans that exit before it ends are reaped: evolane is their subreaper.

Found by review: under ``--isolation process`` no namespace init reaps a daemon a command
started (double fork, ``setsid``) once it exits, so it stayed a zombie child of evolane,
holding a pid of the host's ``pids.max`` (charged until reaped) for the rest of the run: a
replay that ran a few such daemons per case (``git`` detaches its ``gc --auto``) stopped
the run after ~20 units as the host's failure, and a candidate could do it on purpose.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio

from evolane.sandbox import SandboxSpec, open_sandbox
from evolane.sandbox._tree import _children, _zombie_uid

# Starts 5 daemons (double fork, setsid) that exit at once, waits for them to be gone.
_DAEMONS = """
import os, time
for _ in range(5):
    if os.fork() == 0:
        os.setsid()
        if os.fork():
            os._exit(0)
        os._exit(0)
    os.wait()
time.sleep(0.3)
print(os.getuid())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root evolane has unit uids")
@pytest.mark.parametrize("spawner", [True, False], ids=["spawn server", "launcher chain"])
async def test_a_trees_orphans_that_exited_are_reaped(tmp_path: Path, spawner: bool) -> None:
    spec = SandboxSpec(
        argv=(sys.executable, "-c", _DAEMONS), isolation="process", drop_root=True, kill_grace=0.2
    )
    async with open_sandbox(tmp_path / "sandbox", use_spawner=spawner) as host:
        with trio.fail_after(60):
            outcome = await host.run(spec, timeout=30)
        uid = int(outcome.stdout.text())
        zombies = [pid for pid in _children() if _zombie_uid(pid) == uid]
    assert outcome.ok and uid != 0, outcome
    assert zombies == [], zombies  # each held one of the host's pids until evolane exited
