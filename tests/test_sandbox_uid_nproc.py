"""``--max-procs`` on a host with no pids cgroup (a cgroup v2-only host, where the pids
controller is not delegated to evolane): a root evolane's command runs as a unit uid of its
own, so RLIMIT_NPROC of that uid bounds the tree as ``pids.max`` would. Before, such a host
bounded no tree at all: a fork bomb took every pid of the host."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest
import trio

from evolane.measure import CommandSettings, describe_limits
from evolane.sandbox import Limits, SandboxSpec, lease_holders, open_sandbox
from evolane.sandbox import _cgroups as cgroups_module
from evolane.sandbox._cgroups import CgroupRoots
from evolane.sandbox._launch import NAMESPACE_EXTRA_PROCESSES, launcher_argv, uid_process_cap

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="only a root evolane has unit uids")

# Forks children that sleep until it has 40 of them or a fork fails; prints how many and
# the error number (0: none failed).
_FORKER = """
import os, time
children, failed = [], 0
for _ in range(40):
    try:
        pid = os.fork()
    except OSError as error:
        failed = error.errno
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    children.append(pid)
print(len(children), failed, os.getuid(), flush=True)
"""


def _without_pids_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hosts opened from now on see this host as a cgroup v2-only one: no v1 pids or memory
    cgroup (the ones `CgroupRoots.detect` made are removed again)."""
    real = CgroupRoots.detect

    def v2_only(lease: str) -> CgroupRoots:
        found = real(lease)
        for made in (found.pids, found.memory):
            if made is not None:
                with contextlib.suppress(OSError):
                    made.rmdir()
        return CgroupRoots(found.unified, None, None)

    monkeypatch.setattr(cgroups_module.CgroupRoots, "detect", staticmethod(v2_only))


@root_only
@pytest.mark.parametrize(
    ("isolation", "spawner"),
    [("process", True), ("process", False), ("namespace", True)],
    ids=["spawn server", "launcher chain", "namespace"],
)
async def test_a_unit_uids_tree_is_bounded_by_its_rlimit_where_no_pids_cgroup_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolation: str, spawner: bool
) -> None:
    _without_pids_cgroup(monkeypatch)
    spec = SandboxSpec(
        argv=(sys.executable, "-c", _FORKER),
        limits=Limits(processes=8),
        isolation=isolation,
        drop_root=True,
        kill_grace=0.2,
    )
    async with open_sandbox(tmp_path / "sandbox", use_spawner=spawner) as host:
        assert "pids_cgroup" not in host.cgroups.mechanisms
        with trio.fail_after(60):
            outcome = await host.run(spec, timeout=30)
        lease = host.lease
    forked, errno, uid = (int(word) for word in outcome.stdout.text().split())
    assert uid != 0  # the unit uid, whose processes are the tree's alone
    # EAGAIN at the limit; the namespace's launchers count on top (as for pids.max).
    assert forked < 8 + NAMESPACE_EXTRA_PROCESSES and errno == 11, outcome.stdout.text()
    assert "uid_nproc_rlimit" in outcome.enforcement
    assert outcome.survivors == 0 and lease_holders(lease) == set()


@root_only
async def test_a_pids_cgroup_stays_the_bound_where_there_is_one(tmp_path: Path) -> None:
    """No RLIMIT_NPROC where the pids cgroup counts the tree (as before)."""
    spec = SandboxSpec(argv=("true",), limits=Limits(processes=8), drop_root=True)
    async with open_sandbox(tmp_path / "sandbox") as host:
        if "pids_cgroup" not in host.cgroups.mechanisms:
            pytest.skip("this host has no writable pids cgroup")
        outcome = await host.run(spec, timeout=30)
    assert outcome.ok and "uid_nproc_rlimit" not in outcome.enforcement
    assert "pids_cgroup" in outcome.enforcement


def test_the_launcher_chain_sets_the_rlimit_it_is_given() -> None:
    argv, _ = launcher_argv(("true",), [], Limits(processes=8, uid_processes=10), False, None, None)
    # util-linux prlimit's flag, or the spec of the tiny Python that stands in for it
    assert any(arg == "--nproc=10:10" or "RLIMIT_NPROC,10,10" in arg for arg in argv), argv


def test_the_limits_line_names_what_bounds_processes() -> None:
    limits = CommandSettings()
    v2_only = ("cgroup_v2",)
    assert "processes 512 (rlimit_nproc)" in describe_limits(limits, v2_only, unit_uids=True)
    assert "processes 512 NOT ENFORCED" in describe_limits(limits, v2_only, unit_uids=False)
    both = ("cgroup_v2", "pids_cgroup")
    assert "processes 512 (pids_cgroup)" in describe_limits(limits, both, unit_uids=True)
    assert "memory 4 GiB NOT ENFORCED" in describe_limits(limits, v2_only, unit_uids=True)


def test_the_cap_is_the_sandboxs_own_whatever_the_spec_says() -> None:
    asked = Limits(processes=8, uid_processes=3)
    assert uid_process_cap(asked, False, 2_000_000_001, 2).uid_processes == 10
    for pids_cgroup, uid in ((True, 2_000_000_001), (False, None)):
        assert uid_process_cap(asked, pids_cgroup, uid, 0).uid_processes is None
    assert uid_process_cap(Limits(), False, 2_000_000_001, 0).uid_processes is None
