"""The watch over one running unit: it drains the unit's output, waits for its leader (or
its deadline, or a stop) sampling its memory meanwhile, then runs the kill ladder (`run_unit`'s body
in `evolane.sandbox._run`)."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable

import psutil
import trio

from evolane.sandbox._capture import BoundedCapture, drain
from evolane.sandbox._disk import CHECK_SECONDS
from evolane.sandbox._stop import Stop, cut_by
from evolane.sandbox._tree import KillReport, ProcessTree, kill_ladder

_DRAIN_AFTER_KILL_SECONDS = 1.0
# The first RSS sample comes after a typical short replay has ended (its leader's rusage
# covers it): each sample costs the event loop /proc and cgroup reads.
_SAMPLE_FIRST, _SAMPLE_MAX = 0.25, 1.0


class Watch:
    """Waits for the leader, then runs the kill ladder; samples memory meanwhile."""

    def __init__(
        self, tree: ProcessTree, grace: float, activity: Callable[[], object] | None = None
    ) -> None:
        self.tree, self.grace, self.activity = tree, grace, activity
        self.reason = "exited"
        self.kill = KillReport()
        self.kill_latency: float | None = None
        self.peak_rss = 0
        self.disk_low = False
        self._draining = 0
        self._drained = trio.Event()

    async def drain(self, read_fd: int, capture: BoundedCapture) -> None:
        """Drain one pipe (`drain`: closed however it ends); the last drain to reach EOF
        wakes `finish`."""
        self._draining += 1
        try:
            await drain(read_fd, capture, self.activity)
        finally:
            self._draining -= 1
            if self._draining == 0:
                self._drained.set()

    async def wait(
        self,
        deadline: float,
        stop: Stop | None,
        low: Callable[[], bool] | None = None,
    ) -> None:
        """Wait for the leader's exit, the deadline, ``stop``, or ``low`` (the free-disk
        floor, checked every `CHECK_SECONDS`: `disk_low`), whichever comes first, sampling
        the tree's memory meanwhile (`peak_rss`)."""
        pidfd = os.pidfd_open(self.tree.pid)
        try:
            with trio.move_on_at(deadline):
                async with cut_by(stop) as cut:  # a lane's stop: no task (issue 22)
                    await self._until_exit(pidfd, low)
                if cut.cancelled_caught:
                    self.reason = "cancelled"
                return
            self.reason = "timed_out"
        except trio.Cancelled:
            self.reason = "cancelled"
            raise
        finally:
            os.close(pidfd)

    async def _until_exit(self, pidfd: int, low: Callable[[], bool] | None) -> None:
        """Until the leader exits or ``low`` says the disk is below its floor (then
        `disk_low`: the caller ends the run); the RSS sampled at `_SAMPLE_FIRST`, then at
        intervals doubling to `_SAMPLE_MAX` (a short run costs no sampling), in this one
        task: a task of its own each cost ~0.1 ms of CPU a command to start and cancel."""
        now = trio.current_time()
        disk_due = now if low is not None else math.inf
        interval = _SAMPLE_FIRST
        sample_due = now + interval
        while True:
            now = trio.current_time()
            if low is not None and now >= disk_due:
                if low():
                    self.disk_low, self.reason = True, "cancelled"
                    break
                disk_due = now + CHECK_SECONDS
            if now >= sample_due:
                interval = min(interval * 2, _SAMPLE_MAX)
                sample_due = now + interval
                self._sample()
            with trio.move_on_at(min(disk_due, sample_due)):
                await trio.lowlevel.wait_readable(pidfd)
                break

    async def finish(self, nursery: trio.Nursery) -> None:
        """Kill what is left (shielded), then let the drains reach EOF, bounded."""
        forced = self.reason != "exited"
        started = trio.current_time()
        self.kill = await kill_ladder(self.tree, self.grace, forced)
        if forced:
            self.kill_latency = trio.current_time() - started
        with trio.move_on_after(_DRAIN_AFTER_KILL_SECONDS):
            await self._drained.wait()
        nursery.cancel_scope.cancel()

    def _sample(self) -> None:
        """One RSS sample of the tree (`peak_rss`)."""
        pids = self.tree.cgroups.pids() if self.tree.cgroups is not None else set()
        self.peak_rss = max(self.peak_rss, rss_of(pids | {self.tree.pid}))


def rss_of(pids: set[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_info().rss
    return total
