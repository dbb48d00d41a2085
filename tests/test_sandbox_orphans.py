"""A tree's orphans that exit before it ends are reaped: evolane is their subreaper.

Found by review: under ``--isolation process`` no namespace init reaps a daemon a command
started (double fork, ``setsid``) once it exits, so it stayed a zombie child of evolane,
holding a pid of the host's ``pids.max`` (charged until reaped) for the rest of the run: a
replay that ran a few such daemons per case (``git`` detaches its ``gc --auto``) stopped
the run after ~20 units as the host's failure, and a candidate could do it on purpose.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import trio

from evolane.sandbox import Limits, SandboxSpec, open_sandbox
from evolane.sandbox._cgroups import CgroupRoots, UnitCgroups
from evolane.sandbox._tree import _children, _zombie_uid, reap_orphans
from tests.nonroot_helpers import (
    as_user,
    delegated_v2,
    free_uid,
    needs_root_and_setpriv,
    owned_folder,
)

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
@pytest.mark.parametrize("processes", [None, 64], ids=["no pids cgroup", "a pids cgroup"])
@pytest.mark.parametrize("spawner", [True, False], ids=["spawn server", "launcher chain"])
async def test_a_trees_orphans_that_exited_are_reaped(
    tmp_path: Path, spawner: bool, processes: int | None
) -> None:
    # a pids cgroup counts its zombies: none left there, nothing is looked for
    spec = SandboxSpec(
        argv=(sys.executable, "-c", _DAEMONS),
        isolation="process",
        drop_root=True,
        kill_grace=0.2,
        limits=Limits(processes=processes),
    )
    async with open_sandbox(tmp_path / "sandbox", use_spawner=spawner) as host:
        with trio.fail_after(60):
            outcome = await host.run(spec, timeout=30)
        uid = int(outcome.stdout.text())
        zombies = [pid for pid in _children() if _zombie_uid(pid) == uid]
        leaders = set(host.active_leaders)  # none once its tree is reaped
    assert outcome.ok and uid != 0, outcome
    assert leaders == set(), leaders
    assert zombies == [], zombies  # each held one of the host's pids until evolane exited


# As an unprivileged user in a cgroup v2 of its own (delegated), evolane runs 8 units at
# once, each starting daemons that exit and then exiting with a code of its own: no
# zombie is left, and each unit's leader was reaped by its own tree (its exit code, not
# "could not be reaped"), never as another tree's orphan.
# sh: the uid may not read the venv's Python (a folder of root's); setsid forks when it
# leads its group, and the subshell that started it exits first, so it is an orphan.
_SH_DAEMONS = "for i in 1 2 3 4 5; do (setsid sh -c 'exit 0' &); done; sleep 0.3"
_NONROOT = (
    "import json, sys, trio\n"
    f"DAEMONS = {_SH_DAEMONS!r}\n"
    "from evolane.sandbox import SandboxSpec, open_sandbox\n"
    "from evolane.sandbox._tree import _children, _zombie_uid\n"
    "async def main(root, spawner):\n"
    "    async with open_sandbox(root, use_spawner=spawner) as host:\n"
    "        outcomes = {}\n"
    "        async def one(code):\n"
    "            argv = ('sh', '-c', DAEMONS + f'; exit {code}')\n"
    "            spec = SandboxSpec(argv=argv, isolation='process', kill_grace=0.2)\n"
    "            outcomes[code] = await host.run(spec, timeout=60)\n"
    "        async with trio.open_nursery() as nursery:\n"
    "            for code in range(8):\n"
    "                nursery.start_soon(one, code)\n"
    "        left = [pid for pid in _children() if _zombie_uid(pid) is not None]\n"
    "        codes = {c: o.exit_code for c, o in outcomes.items()}\n"
    "        print(json.dumps({'left': left, 'codes': codes,\n"
    "            'errors': [o.error for o in outcomes.values() if o.error],\n"
    "            'enforcement': outcomes[0].enforcement}))\n"
    "trio.run(main, sys.argv[1], sys.argv[2] == 'spawner')\n"
)


@pytest.mark.parametrize("spawner", [True, False], ids=["spawn server", "launcher chain"])
def test_a_non_root_trees_orphans_that_exited_are_reaped_by_its_cgroup(
    tmp_path: Path, spawner: bool
) -> None:
    # Found by review: without unit uids (a non-root evolane) nothing told a tree's orphans
    # from evolane's other children, so each exited daemon stayed a zombie until the end.
    needs_root_and_setpriv()
    uid = free_uid()
    with owned_folder(uid) as home, delegated_v2(uid, tmp_path.name) as cgroup:
        way = "spawner" if spawner else "launcher"
        argv = [sys.executable, "-c", _NONROOT, str(home / "sandbox"), way]
        done = as_user(uid, argv, home, cgroup=cgroup)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout)
    assert "cgroup_v2_kill" in said["enforcement"], said  # the unit's cgroup v2 tells
    assert said["codes"] == {str(code): code for code in range(8)}, said
    assert said["errors"] == [] and said["left"] == [], said  # 40 zombies on the old code


def _exits_in(cgroup: UnitCgroups, code: int) -> int:
    """The pid of a child that joins ``cgroup``'s v2 folder and exits ``code`` (a zombie)."""
    (procs,) = [name for name in cgroup.procs_files if cgroup.unified_dir in name]
    pid = os.posix_spawn("/bin/sh", ["sh", "-c", f'echo $$ > "$0"; exit {code}', procs], {})
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # exited; left unreaped
    return pid


@pytest.mark.skipif(os.geteuid() != 0, reason="makes cgroups of its own")
def test_only_the_ended_trees_own_zombies_are_reaped_never_one_waited_for(tmp_path: Path) -> None:
    # The leader of the ended tree and another tree's leader, both exited and waited for by
    # their trees, are left to them; the ended tree's orphan is reaped.
    roots = CgroupRoots.detect(f"test-{os.getpid()}-{tmp_path.name}")
    if roots.unified is None:
        pytest.skip("needs a writable cgroup v2")
    try:
        ended, other = (roots.unit(name, Limits()) for name in ("ended", "other"))
        assert ended is not None and other is not None
        leader, orphan, waited = (_exits_in(c, n) for c, n in ((ended, 3), (ended, 4), (other, 5)))
        assert reap_orphans(leader, None, ended, leaders={orphan}) == 0  # a leader: not looked at
        assert reap_orphans(leader, None, ended) == 1
        assert os.waitstatus_to_exitcode(os.waitpid(leader, 0)[1]) == 3
        assert os.waitstatus_to_exitcode(os.waitpid(waited, 0)[1]) == 5
        with pytest.raises(ChildProcessError):
            os.waitpid(orphan, os.WNOHANG)  # reaped already
    finally:
        for cgroup in (ended, other):
            cgroup.remove()
        roots.remove()
