"""A running session's heartbeat: the mtime of ``runs/<id>/session.alive``, renewed every
`ALIVE_INTERVAL` seconds while the session runs.

A session that ends in order counts its own wall into the run's ``elapsed_seconds``; one that
dies without saying so (SIGKILL, the OOM killer, power loss) is counted by the next
``--resume`` up to the last moment its run folder was written (`last_written`). Events and
journal lines come only as units end, so a session whose commands hung silently, then was
killed, left no trace of its silent minutes: they were counted nowhere, and a kill and a
resume gave the campaign its ``--wall-clock-budget`` back (found by hostile review: a
session killed 25 s into a silent hang counted 5 s). The heartbeat bounds what such a death
leaves uncounted to one interval.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import trio

ALIVE_FILE = "session.alive"
"""The heartbeat file of a run folder (empty; only its mtime says anything)."""

ALIVE_INTERVAL = 1.0
"""Seconds between two renewals of the heartbeat's mtime."""

WRITTEN_FILES = ("events.jsonl", "journal.jsonl", ALIVE_FILE)
"""The files of a run folder whose mtimes say when its session was last alive."""


def _touch(path: Path) -> None:
    """Set ``path``'s mtime to now, creating it empty if needed; a store that refuses (full,
    read-only) costs the heartbeat, never the run."""
    with contextlib.suppress(OSError):
        try:
            os.utime(path)
        except FileNotFoundError:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644))


@contextlib.asynccontextmanager
async def session_alive(run_dir: Path) -> AsyncIterator[None]:
    """Renew ``run_dir``'s heartbeat every `ALIVE_INTERVAL` seconds while the body runs: a
    system task (no nursery, so what the body raises leaves as itself, never in a group),
    cancelled when the body ends or raises."""
    scope = trio.CancelScope()

    async def beat() -> None:
        with scope:
            while True:
                _touch(run_dir / ALIVE_FILE)  # one utime: no thread hop
                await trio.sleep(ALIVE_INTERVAL)

    trio.lowlevel.spawn_system_task(beat, name="session-alive")
    try:
        yield
    finally:
        scope.cancel()


def last_written(run_dir: Path, since: float) -> float:
    """The newest mtime (``time.time()`` scale) of ``run_dir``'s `WRITTEN_FILES`, at least
    ``since`` and at most now."""
    last = since
    for name in WRITTEN_FILES:
        with contextlib.suppress(OSError):
            last = max(last, (run_dir / name).stat().st_mtime)
    return min(last, time.time())
