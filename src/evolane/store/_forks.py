"""Descriptors a child forked from this process must not keep: locks held for the process's
life (a run's target, a lease, an evolve queue) and pipes whose EOF tells the process died.

Found by review: a child the agent forked (a `multiprocessing` worker) kept copies, so a
runtime killed by SIGKILL went unseen (its lifeline never woke, its trees ran on) and its
locks passed for held, for as long as the child lived. Each such descriptor is registered
with `close_in_forks` when taken and let go of with `close_fd`; a forked child closes its
copies of those still registered (the parent's stay open). `same_file` tells whether a lock
file is still the one its path names (its holder unlinks it, locked, to let go).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

_REGISTERED: set[int] = set()


def close_in_forks(fd: int) -> int:
    """Register ``fd``: a child forked from now on closes its copy. Returns ``fd``."""
    _REGISTERED.add(fd)
    return fd


def close_fd(fd: int) -> None:
    """Close ``fd`` (registered or not) and forget it; never raises."""
    _REGISTERED.discard(fd)
    with contextlib.suppress(OSError):
        os.close(fd)


def same_file(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file ``fd`` holds: a lock file its holder removes
    while locked (to let go) may be replaced between another's open and lock."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _close_in_child() -> None:
    for fd in list(_REGISTERED):  # the only thread of the child: no lock to take
        with contextlib.suppress(OSError):
            os.close(fd)
    _REGISTERED.clear()


os.register_at_fork(after_in_child=_close_in_child)
