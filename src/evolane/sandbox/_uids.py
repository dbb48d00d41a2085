"""Unit uids claimed host-wide, so two runtimes on one host (two agents, two test workers,
a stress run beside a campaign) never run units as the same uid at once.

Found by review: each host counted uids from its own random place with no claim shared
across the host, so two hosts could hand one uid to two live units; one unit's end then
removed the other's IPC objects (`remove_litter`), and the two could signal each other. A
claim is an ``flock`` on a file named after the uid in `CLAIMS` (a root-only folder), held
from the uid's hand-out until its litter is removed; a dead process's claims are free at
once (the kernel drops its locks). The file is unlinked on release while still locked, and
a claim checks that the locked file is still the one the path names.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evolane.store import close_fd, close_in_forks, same_file

CLAIMS = Path("/run/evolane-unit-uids")
"""Where a root evolane claims its unit uids: one folder per host, whatever the sandbox root."""
MAX_TRIES = 64
"""Uids tried for one claim, each at a fresh random place after a taken one."""


@dataclass(frozen=True)
class UidClaim:
    """A unit uid and the lock that claims it (None: claims unavailable here)."""

    uid: int
    fd: int | None
    path: Path | None


def claims_folder(folder: Path = CLAIMS) -> Path | None:
    """``folder`` made ready for claims (root's own, mode 0700, not a link), or None where
    it cannot be (no ``/run``, read-only): each host then counts from its own random place,
    as before claims, and two hosts may meet on a uid."""
    with contextlib.suppress(OSError):
        folder.mkdir(mode=0o700, exist_ok=True)
    try:
        info = folder.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        return None
    return folder


def claim_uid(folder: Path | None, draw: Callable[[bool], int]) -> UidClaim:
    """A uid no other live unit on the host holds: ``draw(jump)`` gives the next candidate
    (``jump``: the last one was taken, go elsewhere). Raises `OSError` (EAGAIN) when
    `MAX_TRIES` candidates are all taken."""
    if folder is None:
        return UidClaim(draw(False), None, None)
    jump = False
    for _ in range(MAX_TRIES):
        uid = draw(jump)
        path = folder / str(uid)
        fd = _lock(path)
        if fd is not None:
            return UidClaim(uid, close_in_forks(fd), path)
        jump = True
    raise OSError(errno.EAGAIN, f"no free unit uid after {MAX_TRIES} tries in {folder}")


def release_uid(claim: UidClaim | None) -> None:
    """Let go of ``claim`` (its uid's litter removed); never raises."""
    if claim is None or claim.fd is None or claim.path is None:
        return
    with contextlib.suppress(OSError):
        os.unlink(claim.path)  # still locked: a claimer that opened it sees it gone
    close_fd(claim.fd)


def _lock(path: Path) -> int | None:
    """A locked descriptor of ``path`` while ``path`` still names it; None when taken."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if same_file(path, fd):
            return fd
    except BlockingIOError:
        pass
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None
