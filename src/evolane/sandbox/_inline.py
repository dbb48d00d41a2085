"""When small file work may run on the event loop instead of a worker thread.

A thread hop costs far more than the work it carries when that work is a few metadata calls
on a local disk: every system call the worker makes releases the GIL, and while the event
loop is busy each release is a hand-off between the two threads (issue 22 measured ~75
context switches per in-process unit with its folder work in threads, ~9 without, and 33 %
less CPU). So small, bounded file work (storing a replay's output of a few files, emptying an
in-process unit's folder for the next unit, laying a small command unit out) runs inline
while it stays fast; once `STRIKES` pieces in a row take longer than `SLOW_SECONDS` (a slow
or network disk; one slow piece alone is a cold cache, a preemption or a garbage
collection), or one piece takes longer than `STALL_SECONDS` (a stalled disk: every unit's
deadline waits on the loop), every piece goes to threads
for `PAUSE_SECONDS`, then inline is tried again. A piece that never waited (no voluntary
context switch of its thread) counts its CPU time, not its wall: it was only preempted, by
a host busy with other work, as a worker thread would have been too (issue 22: at load
6-12 on 2 cores such pieces closed the gate for whole runs, and every layout and spawn then
hopped to threads: ~0.7 ms more CPU and 20 more context switches a command). Work that is
not small by its own bounds (`INLINE_FILES`, `INLINE_BYTES`, `INLINE_FOLDER_BYTES`, no
symlink to resolve) is never run inline.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import TypeVar

SLOW_SECONDS = 0.005
"""An inline piece longer than this is slow (a healthy local disk takes ~0.1 ms)."""

STRIKES = 3
"""Slow inline pieces in a row that send the next ones to threads."""

STALL_SECONDS = 0.02
"""An inline piece longer than this sends the next ones to threads at once."""

PAUSE_SECONDS = 30.0
"""How long pieces go to threads once the gate closed, before inline is tried again."""

INLINE_FILES = 64
"""Files (or folder entries) a piece may touch and still run inline."""

INLINE_BYTES = 1 << 20
"""Bytes of files a piece may read, hash or free and still run inline."""

INLINE_FOLDER_BYTES = 64 << 10
"""Bytes of one folder's listing (``st_size``) a piece may read inline: a folder that once
held a million entries stays that large when emptied (a fresh one lists 4 KiB)."""

INLINE_WORK: ContextVar[bool] = ContextVar("evolane_inline_work", default=True)
"""Whether a sandbox host opened in this context may run small file work on the event loop
at all. `evolane.aio` turns it off for its guest: the host's asyncio loop shares the thread,
and pieces run inline held a 10 ms asyncio ticker back 29-71 ms at load 3-5 (`python
benchmarks/aio_latency.py`, over its 50 ms target), against 23-33 ms with every piece in a
worker thread."""

T = TypeVar("T")

Usage = Callable[[], tuple[int, float]]
"""The calling thread's voluntary context switches and CPU seconds so far."""


def thread_usage() -> tuple[int, float]:
    """This thread's voluntary context switches and CPU seconds (one ``getrusage``)."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_nvcsw, usage.ru_utime + usage.ru_stime


def held_seconds(wall: float, before: tuple[int, float], after: tuple[int, float]) -> float:
    """How long a piece that took ``wall`` seconds held the loop by its own doing: all of
    it when its thread waited (the disk, a lock), else its CPU time alone."""
    if after[0] > before[0]:
        return wall
    return min(wall, after[1] - before[1])


class InlineGate:
    """Says whether small file work may run inline now; told how long each inline piece took.

    IO-free: the caller gives the clock (``now``, any monotonic seconds)."""

    def __init__(
        self,
        slow: float = SLOW_SECONDS,
        strikes: int = STRIKES,
        pause: float = PAUSE_SECONDS,
        stall: float = STALL_SECONDS,
        usage: Usage = thread_usage,
        enabled: bool = True,
    ) -> None:
        self.slow, self.strikes, self.pause, self.stall = slow, strikes, pause, stall
        self._usage = usage
        self._closed_until = float("-inf") if enabled else float("inf")  # closed for good
        self._in_a_row = 0
        self.closings = 0
        """How often the gate closed (`strikes` slow pieces in a row)."""

    def open(self, now: float) -> bool:
        """Whether a piece may run inline at ``now``."""
        return now >= self._closed_until

    def took(self, seconds: float, now: float) -> None:
        """An inline piece that ended at ``now`` took ``seconds``."""
        if seconds <= self.slow:
            self._in_a_row = 0
            return
        self._in_a_row += 1
        if self._in_a_row >= self.strikes or seconds > self.stall:
            self._in_a_row = 0
            self.closings += 1
            self._closed_until = max(self._closed_until, now + self.pause)

    def attempt(self, piece: Callable[[], T]) -> T | None:
        """``piece()`` run inline and timed (`held_seconds`) when the gate is open; None
        (nothing run) when it is closed. ``piece`` must itself return None when it is not
        small enough."""
        start = time.monotonic()
        if not self.open(start):
            return None
        before = self._usage()
        try:
            return piece()
        finally:
            end = time.monotonic()
            self.took(held_seconds(end - start, before, self._usage()), end)
