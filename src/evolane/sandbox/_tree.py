"""One sandboxed process tree and the kill ladder that ends it.

The tree is the leader's process group, the unit's cgroups and any process carrying the
unit's lease marker. The leader stays an unreaped zombie until the ladder is done, so its
pgid can never be recycled under our signals: SIGTERM to all of it, a grace period, SIGKILL
to all of it, a lease sweep for escapees, and only then reaping.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from dataclasses import dataclass, field

import trio

from evolane.sandbox._cgroups import UnitCgroups
from evolane.sandbox._lifeline import (
    group_members,
    is_zombie,
    lease_holders,
    lease_matches,
    lease_of,
    process_group_of,
)

POLL_SECONDS = 0.005
FINAL_WAIT_SECONDS = 5.0
_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the reaper of orphaned descendants (Linux), so escapees stay ours."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


@dataclass
class KillReport:
    """What the ladder had to do."""

    pids_killed: int = 0
    escaped_found: int = 0  # processes that had left the leader's process group
    survivors: int = 0
    escalated: bool = False


@dataclass
class ProcessTree:
    """A spawned leader plus everything it started, tracked until all of it is reaped."""

    pid: int
    cgroups: UnitCgroups | None
    lease: str
    exited: bool = False
    status: int | None = None
    rusage: object | None = None
    seen: set[int] = field(default_factory=set)
    signalled: set[int] = field(default_factory=set)
    left_group: set[int] = field(default_factory=set)
    escapees: set[int] = field(default_factory=set)

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

    def reap_leader(self) -> bool:
        """Collect the leader's status and resource usage; only after the ladder is done."""
        if self.status is None and self.leader_exited():
            with contextlib.suppress(ChildProcessError):
                pid, status, rusage = os.wait4(self.pid, os.WNOHANG)
                if pid == self.pid:
                    self.status, self.rusage = status, rusage
        return self.status is not None

    def _members_alive(self) -> bool:
        if self.cgroups is not None:
            return self.cgroups.populated()
        members = group_members(self.pid)
        self.seen |= members
        return bool(members)

    def _live_escapees(self) -> set[int]:
        """Known escapees that still run and still carry our lease (a recycled pid does not)."""
        for pid in list(self.escapees):
            lease = lease_of(pid)
            if lease is None or not lease_matches(lease, self.lease) or is_zombie(pid):
                self.escapees.discard(pid)
        return set(self.escapees)

    def alive(self) -> bool:
        """True while any process of the tree still runs."""
        if not self.leader_exited():
            return True
        return self._members_alive() or bool(self._live_escapees())

    def targets(self) -> set[int]:
        """Every process to signal now: current members and verified escapees, nothing stale."""
        members = self.cgroups.pids() if self.cgroups is not None else group_members(self.pid)
        self.seen |= members
        return members | self._live_escapees()

    # ----- actions ---------------------------------------------------------------------

    def signal_all(self, signum: int) -> int:
        """Send ``signum`` to the group (its pgid is held by the unreaped leader) and targets."""
        targets = self.targets()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)
        sent = 0
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                self._note_group(pid)
                os.kill(pid, signum)
                self.signalled.add(pid)
                sent += 1
        return sent

    def _note_group(self, pid: int) -> None:
        if pid not in self.signalled and process_group_of(pid) not in (self.pid, None):
            self.left_group.add(pid)

    def kill_all(self) -> int:
        """SIGKILL everything: the cgroups (atomically where possible), the group, escapees."""
        if self.cgroups is not None:
            self.seen |= self.cgroups.pids()
            self.cgroups.kill()
        return self.signal_all(signal.SIGKILL)

    def sweep_lease(self) -> int:
        """Find processes that carry the lease but left the group (and the cgroup); kill them."""
        found = lease_holders(self.lease)
        new = found - self.escapees
        self.escapees |= found
        self.seen |= found
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                self._note_group(pid)
                os.kill(pid, signal.SIGKILL)
                self.signalled.add(pid)
        return len(new)

    def reap_adopted(self, protected: set[int]) -> None:
        """Reap members reparented to us (the subreaper) that have exited.

        ``protected`` holds the leaders of other live units: a recycled pid among ``seen``
        must never steal their exit status.
        """
        for pid in self.seen | self.escapees:
            if pid == self.pid or pid in protected:
                continue
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


async def wait_until_gone(tree: ProcessTree, seconds: float) -> bool:
    """Poll until the whole tree is gone or ``seconds`` pass; True when gone."""
    with trio.move_on_after(seconds):
        while tree.alive():
            await trio.sleep(POLL_SECONDS)
        return True
    return False


async def kill_ladder(
    tree: ProcessTree, grace: float, sweep: bool, protected: set[int]
) -> KillReport:
    """End the tree: TERM, ``grace``, KILL, lease sweep; returns once all of it is reaped.

    Call it shielded from cancellation. ``sweep`` forces the /proc lease scan (always done
    when the tree escalated to SIGKILL or has no cgroup).
    """
    report = KillReport()
    if tree.alive():
        tree.signal_all(signal.SIGTERM)
        if not await wait_until_gone(tree, grace):
            report.escalated = True
            tree.kill_all()
    if sweep or report.escalated or tree.cgroups is None:
        tree.sweep_lease()
    deadline = trio.current_time() + FINAL_WAIT_SECONDS
    while tree.alive() and trio.current_time() < deadline:
        tree.kill_all()
        tree.sweep_lease()
        await trio.sleep(POLL_SECONDS)
    if tree.alive():
        report.survivors = max(1, len(tree.escapees))
    report.pids_killed = len(tree.signalled)
    report.escaped_found = len(tree.left_group)
    tree.reap_leader()
    tree.reap_adopted(protected)
    return report
