"""One sandboxed process tree and the kill ladder that ends it.

The tree is the leader's process group, the unit's cgroups and any process carrying the
unit's lease marker. The ladder runs before anything is left unreaped: SIGTERM to all of
it, a grace period, SIGKILL to all of it, a lease sweep for escapees, then reaping.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from dataclasses import dataclass, field

import trio

from evolane.sandbox._cgroups import UnitCgroups
from evolane.sandbox._lifeline import is_zombie, lease_holders

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
    escaped_found: int = 0
    survivors: int = 0
    escalated: bool = False


@dataclass
class ProcessTree:
    """A spawned leader plus everything it started, tracked until all of it is reaped."""

    pid: int
    cgroups: UnitCgroups | None
    lease: str
    status: int | None = None
    rusage: object | None = None
    seen: set[int] = field(default_factory=set)
    escapees: set[int] = field(default_factory=set)

    # ----- facts -----------------------------------------------------------------------

    def poll_leader(self) -> bool:
        """Reap the leader if it has exited; True once it is reaped."""
        if self.status is None:
            with contextlib.suppress(ChildProcessError):
                pid, status, rusage = os.wait4(self.pid, os.WNOHANG)
                if pid == self.pid:
                    self.status, self.rusage = status, rusage
        return self.status is not None

    def _group_alive(self) -> bool:
        # Reap our own zombies in the group (adopted orphans) so that they stop counting.
        while True:
            try:
                found = os.waitid(os.P_PGID, self.pid, os.WEXITED | os.WNOHANG)
            except ChildProcessError:
                break
            if found is None:
                break
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _escapees_alive(self) -> bool:
        alive = False
        for pid in list(self.escapees):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if is_zombie(pid):
                self.escapees.discard(pid)
            else:
                alive = True
        return alive

    def alive(self) -> bool:
        """True while any process of the tree still runs."""
        if not self.poll_leader():
            return True
        if self.cgroups is not None and self.cgroups.populated():
            return True
        return self._group_alive() or self._escapees_alive()

    def remember_members(self) -> None:
        """Note every current cgroup member, so that adopted ones can be reaped later."""
        if self.cgroups is not None:
            self.seen |= self.cgroups.pids()

    # ----- actions ---------------------------------------------------------------------

    def signal_all(self, signum: int) -> int:
        """Send ``signum`` to the group, every cgroup member and known escapees."""
        self.remember_members()
        targets = set(self.seen) | self.escapees
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)
        sent = 0
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
                sent += 1
        return sent

    def kill_all(self) -> int:
        """SIGKILL everything: the group, the cgroups (atomically where possible), escapees."""
        self.remember_members()
        killed = len(self.seen)
        if self.cgroups is not None:
            self.cgroups.kill()
        killed = max(killed, self.signal_all(signal.SIGKILL))
        return killed

    def sweep_lease(self) -> int:
        """Find processes that carry the lease but left the group (and the cgroup); kill them."""
        found = lease_holders(self.lease)
        new = found - self.escapees
        self.escapees |= found
        self.seen |= found
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return len(new)

    def reap_adopted(self) -> None:
        """Reap members that were reparented to us (we are the subreaper) and have exited."""
        for pid in self.seen | self.escapees:
            if pid == self.pid:
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


async def kill_ladder(tree: ProcessTree, grace: float, sweep: bool) -> KillReport:
    """End the tree: TERM, ``grace``, KILL, lease sweep; returns once all of it is reaped.

    Call it shielded from cancellation. ``sweep`` forces the /proc lease scan (always done
    when the tree escalated to SIGKILL or has no cgroup).
    """
    report = KillReport()
    if tree.alive():
        tree.signal_all(signal.SIGTERM)
        if not await wait_until_gone(tree, grace):
            report.escalated = True
            report.pids_killed = tree.kill_all()
    if sweep or report.escalated or tree.cgroups is None:
        report.escaped_found = tree.sweep_lease()
        report.pids_killed += report.escaped_found
    deadline = trio.current_time() + FINAL_WAIT_SECONDS
    while tree.alive() and trio.current_time() < deadline:
        tree.kill_all()
        tree.sweep_lease()
        await trio.sleep(POLL_SECONDS)
    tree.reap_adopted()
    if tree.alive():
        report.survivors = max(1, len(tree.escapees))
    return report
