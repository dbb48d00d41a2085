"""One sandboxed process tree and the kill ladder that ends it.

The tree is the leader's process group, the unit's cgroups and any process carrying the
unit's lease marker. Two rules keep every signal and every reap on the tree's own
processes even when pids are recycled:

- the leader stays an unreaped zombie until the ladder is done, so its pgid cannot be
  recycled under ``killpg``, and group members are reaped by pgid only after it;
- a process outside the leader's group (an escapee) is held by a pidfd opened while its
  membership is verified, and is signalled and reaped only through that pidfd.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
from collections.abc import Callable, Container
from dataclasses import dataclass, field

import trio

from evolane.sandbox._cgroups import UnitCgroups
from evolane.sandbox._lifeline import group_members, lease_holders, lease_matches, lease_of
from evolane.sandbox._lifeline import process_group_of as group_of
from evolane.sandbox._litter import kill_processes_of, processes_of
from evolane.sandbox._procfs import live_uid, proc_status, read_proc_file

FINAL_WAIT_SECONDS = 5.0
MAX_TRACKED_ESCAPEES = 256
_POLL_FIRST, _POLL_MAX = 0.002, 0.05
_PR_SET_CHILD_SUBREAPER = 36
CHILDREN_BYTES = 1 << 22
"""Bytes of one thread's ``children`` list read at most (~500,000 pids, past any pid_max)."""


def become_subreaper() -> bool:
    """Make this process the reaper of orphaned descendants (Linux), so escapees stay ours."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:  # gone already, or out of descriptors: the cgroup still covers it
        return None


def _has_exited(pidfd: int) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


@dataclass
class KillReport:
    """What the ladder had to do."""

    pids_killed: int = 0
    escaped_found: int = 0  # processes that had left the leader's process group
    survivors: int = 0
    escalated: bool = False  # SIGKILL was needed


@dataclass
class ProcessTree:
    """A spawned leader plus everything it started, tracked until all of it is reaped."""

    pid: int
    cgroups: UnitCgroups | None
    lease: str
    exited: bool = False
    status: int | None = None
    rusage: object | None = None
    escapees: dict[int, int] = field(default_factory=dict)  # pid -> pidfd
    signalled: set[int] = field(default_factory=set)  # pid numbers, for counting only
    uid: int | None = None  # the unit uid its processes run as (a root evolane's drop_root)
    owns_uid: bool = False  # the uid is claimed host-wide for it: its processes are the tree's
    leaders: set[int] = field(default_factory=set)
    """The leaders of a host's trees (`SandboxHost.active_leaders`, shared by its trees),
    each from its tree's start until it is reaped, so no number in it can be reused
    meanwhile: never a tree's orphan, `reap_orphans` looks at none (issue 22: ~10 system
    calls each, for each other lane's leader, in half the commands' scans)."""

    def __post_init__(self) -> None:
        self.leaders.add(self.pid)

    # ----- facts -----------------------------------------------------------------------

    def leader_exited(self) -> bool:
        """True once the leader has exited; it stays unreaped (a zombie holding the pgid)."""
        if not self.exited:
            try:
                found = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                self.exited = found is not None
            except ChildProcessError:
                self.exited = True
        return self.exited

    def members(self) -> set[int]:
        """Live processes of the tree by membership (cgroup, else the leader's group and
        the processes of the tree's own uid)."""
        if self.cgroups is not None:
            return self.cgroups.pids()
        return group_members(self.pid) | set(self._uid_processes())

    def _uid_processes(self) -> list[int]:
        """Without a cgroup, the live processes of a uid that is the tree's alone (a
        /proc scan): they are the tree's, whatever group or environment they took."""
        if self.cgroups is not None or self.uid is None or not self.owns_uid:
            return []
        return processes_of(self.uid)

    def alive(self) -> bool:
        """True while any process of the tree still runs (may scan /proc without cgroups)."""
        if not self.leader_exited():
            return True
        if self.cgroups is not None:
            populated = self.cgroups.populated()
        else:
            populated = bool(group_members(self.pid)) or bool(self._uid_processes())
        return populated or any(not _has_exited(fd) for fd in self.escapees.values())

    def _adopt_escapees(self, pids: set[int], verify: str) -> None:
        """Hold a pidfd on each process outside the group, kept only if still ours after opening."""
        for pid in pids:
            if pid == self.pid or pid in self.escapees or group_of(pid) == self.pid:
                continue
            if len(self.escapees) >= MAX_TRACKED_ESCAPEES:
                return
            fd = _pidfd(pid)
            if fd is None:
                continue
            if verify == "cgroup":
                ours = self.cgroups is not None and pid in self.cgroups.pids()
            elif verify == "uid":  # read through the pidfd: not a reuse of the number
                ours = self.uid is not None and live_uid(pid) == self.uid
            else:
                lease = lease_of(pid)
                ours = lease is not None and lease_matches(lease, self.lease)
            if ours:
                self.escapees[pid] = fd
            else:
                os.close(fd)

    # ----- actions ---------------------------------------------------------------------

    def signal_all(self, signum: int) -> None:
        """Send ``signum`` to the group and to every held escapee."""
        members = self.members()
        self.signalled |= members
        if self.cgroups is not None:
            self._adopt_escapees(members, verify="cgroup")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)
        for pid, fd in self.escapees.items():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(fd, signum)
                self.signalled.add(pid)

    def terminate(self) -> None:
        """SIGTERM to the group and held escapees, then SIGCONT: a stopped process acts on
        its TERM only once continued (found by review: a tree that had SIGSTOPped itself
        waited out the whole grace for its SIGKILL)."""
        self.signal_all(signal.SIGTERM)
        self.signal_all(signal.SIGCONT)

    def kill_all(self) -> None:
        """SIGKILL everything: the cgroups (atomically), the group, held escapees."""
        if self.cgroups is not None:
            self.signalled |= self.cgroups.pids()
            self.cgroups.kill()
        self.signal_all(signal.SIGKILL)

    def sweep_lease(self) -> None:
        """Scan /proc for processes carrying the lease outside the group; hold and kill them.
        A tree of a unit uid of its own with no cgroup: its uid's processes too (found by
        review: an escapee that cleared its environment had neither mark, outlived the run,
        and the uid, released, served the next unit, this runtime's or another's, beside
        it; a fork storm's past `MAX_TRACKED_ESCAPEES` outlived it by thousands)."""
        self._adopt_escapees(lease_holders(self.lease), verify="lease")
        own = set(self._uid_processes())
        self._adopt_escapees(own, verify="uid")
        for pid, fd in self.escapees.items():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                self.signalled.add(pid)
        if self.uid is not None and own - self.escapees.keys():  # past those held (a fork
            self.signalled.update(kill_processes_of(self.uid))  # storm): by pidfds

    def reap(self) -> None:
        """Reap the leader, then adopted group members by pgid, then escapees by pidfd."""
        if self.status is None and self.leader_exited():
            try:
                pid, status, rusage = os.wait4(self.pid, os.WNOHANG)
                if pid == self.pid:
                    self.status, self.rusage = status, rusage
            except ChildProcessError:  # not a child of ours now: its number may be reused
                self.leaders.discard(self.pid)
        if self.status is not None:
            self.leaders.discard(self.pid)  # reaped: its number may be reused
            # Zombies of the group keep its pgid allocated until they are reaped.
            while True:
                try:
                    if os.waitid(os.P_PGID, self.pid, os.WEXITED | os.WNOHANG) is None:
                        break
                except ChildProcessError:
                    break
        for fd in self.escapees.values():
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
            os.close(fd)
        self.escapees.clear()
        reap_orphans(self.pid, self.uid, self.cgroups, self.leaders)


def reap_orphans(
    leader: int, uid: int | None, cgroups: UnitCgroups | None, leaders: Container[int] = ()
) -> int:
    """Reap this process's zombie children that were the tree's: that ran as its unit uid
    ``uid`` or in its cgroup v2 (`UnitCgroups.holds`), but its ``leader`` (its own reap, its
    status); how many. They are the tree's orphans, re-parented to us (the subreaper), that
    exited before the tree ended: nothing else waits for them (the leaders of other trees
    are in cgroups of their own, evolane's other children in its own). Found by review:
    under ``--isolation process`` (no namespace init reaps them) each daemon a replay
    started and that exited held a pid of the host's ``pids.max`` until evolane exited, and
    ~20 units of such replays stopped the run as the host's failure; a non-root evolane
    has no unit uids, so there the cgroup tells (found by review). Children in ``leaders``
    (other trees' unreaped leaders: `ProcessTree.leaders`) are never looked at."""
    if (uid is None and cgroups is None) or (cgroups is not None and cgroups.charged() == 0):
        return 0  # nothing to tell them by, or none left: its pids cgroup counts zombies
    with contextlib.suppress(ChildProcessError):  # no zombie child at all: the common case
        if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return 0
    reaped = 0
    for pid in _children():
        fd = None if pid == leader or pid in leaders else _pidfd(pid)
        if fd is None:
            continue
        try:  # read through the pid once held: reaped by then, its number is not reused
            zombie = _zombie_uid(pid)
            ours = zombie == uid or (cgroups is not None and cgroups.holds(pid))
            if zombie is not None and ours:
                with contextlib.suppress(ChildProcessError):
                    reaped += os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG) is not None
        finally:
            os.close(fd)
    return reaped


def _children() -> list[int]:
    """This process's children (each of its threads' ``children`` list)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):
                kids = read_proc_file(f"/proc/self/task/{task}/children", CHILDREN_BYTES)
                found += map(int, kids.split())
    return found


def _zombie_uid(pid: int) -> int | None:
    """The real uid of ``pid`` when it is a zombie, else None."""
    found = proc_status(pid)
    return found.uid if found is not None and found.state == "Z" else None


async def _alive(tree: ProcessTree) -> bool:
    if tree.cgroups is not None:
        return tree.alive()
    return await trio.to_thread.run_sync(tree.alive)  # a /proc scan: keep the loop free


async def _act(tree: ProcessTree, action: Callable[..., None], *args: int) -> None:
    if tree.cgroups is not None:
        action(*args)
    else:
        await trio.to_thread.run_sync(action, *args)


async def wait_until_gone(tree: ProcessTree, seconds: float) -> bool:
    """Poll (backing off from 2 to 50 ms) until the tree is gone or ``seconds`` pass."""
    interval = _POLL_FIRST
    with trio.move_on_after(seconds):
        while await _alive(tree):
            await trio.sleep(interval)
            interval = min(interval * 2, _POLL_MAX)
        return True
    return False


async def kill_ladder(tree: ProcessTree, grace: float, sweep: bool) -> KillReport:
    """End the tree: TERM, ``grace``, KILL, lease sweep; returns once all of it is reaped.

    Call it shielded from cancellation. ``sweep`` forces the /proc lease scan (always done
    when the tree escalated to SIGKILL or has no cgroup).
    """
    report = KillReport()
    # ``gone``: the last look found nothing left, and nothing was done since (no signal, no
    # sweep adopting escapees), so looking again would read the same files for the same
    # answer (issue 22: three reads of cgroup.events a command where one tells).
    gone = not await _alive(tree)
    if not gone:
        await _act(tree, tree.terminate)
        gone = await wait_until_gone(tree, grace)
        if not gone:
            report.escalated = True
            await _act(tree, tree.kill_all)
    if sweep or report.escalated or tree.cgroups is None:
        await trio.to_thread.run_sync(tree.sweep_lease)
        gone = False
    deadline = trio.current_time() + FINAL_WAIT_SECONDS
    interval = _POLL_FIRST
    while not gone and trio.current_time() < deadline:
        gone = not await _alive(tree)
        if gone:
            break
        await _act(tree, tree.kill_all)
        await trio.to_thread.run_sync(tree.sweep_lease)
        await trio.sleep(interval)
        interval = min(interval * 2, _POLL_MAX)
    if not gone and await _alive(tree):
        members = await trio.to_thread.run_sync(tree.members)
        report.survivors = max(1, len(members) + len(tree.escapees))
    report.pids_killed = len(tree.signalled)
    report.escaped_found = len(tree.escapees)
    tree.reap()
    return report
