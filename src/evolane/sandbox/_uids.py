"""Unit uids claimed host-wide, so two runtimes on one host (two agents, two test workers,
a stress run beside a campaign) never run units as the same uid at once.

Found by review: each host counted uids from its own random place with no claim shared
across the host, so two hosts could hand one uid to two live units; one unit's end then
removed the other's IPC objects (`remove_litter`), and the two could signal each other. A
claim is an ``flock`` on a file named after the uid in `CLAIMS` (a root-only folder), held
from the uid's hand-out until its litter is removed. The file is unlinked on release while
still locked, and a claim checks that the locked file is still the one the path names.

A dead process's locks are free at once, but its files stay: a claim that finds the file
there and locks it took the uid of a holder that died holding it (a runtime SIGKILLed
before its lifeline killed its trees, or with it), and first ends what that holder left:
the uid's processes and its litter (`end_uid`). Found by review: the next unit given such
a uid met the dead run's live tree, which could signal it, and its IPC objects.
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
MAX_CLAIM_FILES = 1 << 17
"""Entries of the claims folder a sweep looks at, at most (two per unit uid of the span)."""
SWEEP_BATCH = 256
"""Stale claims a sweep holds and ends at once (one scan of /proc for all of them)."""


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


def claim_uid(
    folder: Path | None, draw: Callable[[bool], int], end: Callable[[int], bool] | None = None
) -> UidClaim:
    """A uid no other live unit on the host holds: ``draw(jump)`` gives the next candidate
    (``jump``: the last one was taken, go elsewhere). A uid whose holder died holding it
    is taken once ``end(uid)`` says what it left is gone (else it stays for a sweep:
    `sweep_stale_claims`). Raises `OSError` (EAGAIN) when `MAX_TRIES` candidates are all
    taken."""
    if folder is None:
        return UidClaim(draw(False), None, None)
    jump = False
    for _ in range(MAX_TRIES):
        uid = draw(jump)
        locked = _lock(folder / str(uid))
        jump = True
        if locked is None:
            continue
        fd, stale = locked
        if stale and (end is None or not end(uid)):
            os.close(fd)  # what the dead holder left stays, claimed by its file
            continue
        return UidClaim(uid, close_in_forks(fd), folder / str(uid))
    raise OSError(errno.EAGAIN, f"no free unit uid after {MAX_TRIES} tries in {folder}")


def release_uid(claim: UidClaim | None, ended: bool = True) -> None:
    """Let go of ``claim`` (its uid's litter removed); never raises. Not ``ended`` (some
    process of the uid still lives): its file stays, so the next claim of the uid, or the
    next host's sweep, ends what is left before the uid serves again."""
    if claim is None or claim.fd is None or claim.path is None:
        return
    if ended:
        with contextlib.suppress(OSError):
            os.unlink(claim.path)  # still locked: a claimer that opened it sees it gone
    close_fd(claim.fd)


def sweep_stale_claims(
    folder: Path | None, end: Callable[[set[int]], set[int]], uids: range
) -> int:
    """End what each holder that died holding one of ``uids`` left (``end``: given the
    uids, says which it ended, as `evolane.sandbox._litter.end_uids`, in one pass for
    up to `SWEEP_BATCH` of them) and free its uid; how many. A file named otherwise is
    never acted on (no process of another uid is killed for a name found here); at most
    `MAX_CLAIM_FILES` entries are looked at."""
    if folder is None:
        return 0
    swept = 0
    held: dict[int, tuple[int, Path]] = {}
    try:
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for _, entry in zip(range(MAX_CLAIM_FILES), entries, strict=False):
                uid = _uid_named(entry.name)
                locked = _lock(Path(entry.path), create=False) if uid in uids else None
                if locked is not None:
                    held[uid] = (locked[0], Path(entry.path))
                if len(held) >= SWEEP_BATCH:
                    swept += _end_held(held, end)
        swept += _end_held(held, end)
    finally:
        for fd, _ in held.values():  # an error part way: let go of what is still held
            close_fd(fd)
    return swept


def _end_held(held: dict[int, tuple[int, Path]], end: Callable[[set[int]], set[int]]) -> int:
    """End the stale claims ``held`` (uid: locked descriptor, path), freeing those ended
    and letting go of the rest (their files stay); how many were freed. Empties ``held``."""
    ended = end(set(held)) if held else set()
    freed = 0
    while held:
        uid, (fd, path) = held.popitem()
        if uid in ended:
            release_uid(UidClaim(uid, fd, path))
            freed += 1
        else:
            os.close(fd)
    return freed


def _uid_named(name: str) -> int:
    """The uid a claim file of this name claims; -1 for a name no claim has (one that
    only reads as a uid: ``02000000001``, other scripts' digits, ``²``). Found by review:
    such a file ended the live claim's uid, or stopped the sweep."""
    return int(name) if name.isascii() and name.isdigit() and str(int(name)) == name else -1


def _lock(path: Path, create: bool = True) -> tuple[int, bool] | None:
    """A locked descriptor of ``path`` while ``path`` still names it, and whether the file
    was there before (its holder died holding it); None when taken (or, not ``create``,
    gone)."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
    fd, stale = None, True
    if create:
        with contextlib.suppress(FileExistsError):
            fd, stale = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600), False
    if fd is None:
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:  # released since: the next try draws again
            return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if same_file(path, fd):
            return fd, stale
    except BlockingIOError:
        pass
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None
