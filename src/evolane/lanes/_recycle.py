"""Unit folders of in-process backends, recycled: a finished unit's folder is emptied (on
the event loop while that is small and fast, `recycle_soon`; else in the host's cleanup
thread) down to its empty ``work`` and ``out`` folders and kept as a spare; the next unit
renames a spare to its own name instead of making three folders. A unit still gets a fresh
folder of its own (its own path, nothing in it, the modes a new folder gets); anything a
spare cannot be checked to be is removed instead.

Each folder made or removed is a journaled metadata change of the filesystem, the largest
per-unit cost of a unit that does nothing (issue 22): recycling leaves two renames and the
unlinks of what the unit wrote."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
import threading
from collections import deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from evolane.sandbox import INLINE_BYTES, INLINE_FILES, INLINE_FOLDER_BYTES, SandboxHost
from evolane.store import remove_tree

MAX_SPARE = 64
"""Emptied unit folders kept per scratch root at most (beyond: removed)."""

MAX_ROOTS = 16
"""Scratch roots (sandbox leases) whose spares are known at most; a lease's spares go with
its folder when it is swept."""

SKELETON = ("out", "work")
"""The sub-folders a recycled unit folder keeps (empty), sorted."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_spares: dict[str, deque[str]] = {}  # scratch root -> spare folders (appends/pops: atomic)
_names = itertools.count()
_lock = threading.Lock()
_fresh: dict[str, int] = {}  # what a new folder looks like: "mode" and "uid"


def take_spare(unit_dir: Path) -> bool:
    """Give ``unit_dir`` a recycled folder holding empty ``work`` and ``out``: False (nothing
    done) when no spare is left or ``unit_dir`` exists (an earlier attempt's)."""
    spares = _spares.get(str(unit_dir.parent))
    while spares:
        try:
            spare = spares.pop()
        except IndexError:  # taken by another thread meanwhile
            return False
        try:
            os.rename(spare, unit_dir)  # never over a folder with something in it
        except OSError as error:
            if error.errno != errno.ENOENT:  # a leftover in the way: keep the spare
                spares.append(spare)
                return False
            if not unit_dir.parent.is_dir():
                return False
            continue  # this spare is gone (its lease was swept): try the next
        return True
    return False


def note_fresh(folder: Path) -> None:
    """Remember what a newly made folder looks like (mode, owner): a spare must match it."""
    if "mode" not in _fresh:
        with contextlib.suppress(OSError):
            info = os.lstat(folder)
            _fresh.update(mode=stat.S_IMODE(info.st_mode), uid=info.st_uid)


def recycle(unit_dir: Path, bounded: bool = False) -> bool:
    """Empty ``unit_dir`` to its skeleton and keep it as a spare; else remove it (blocking
    I/O). ``bounded`` (inline work): a folder over `INLINE_FILES` entries or a listing over
    `INLINE_FOLDER_BYTES`, files over `INLINE_BYTES` to free in all, or a removal stops it:
    False, and what is left is for an unbounded call (the host's cleanup thread). True
    once done."""
    root = str(unit_dir.parent)
    with _lock:
        spares = _spares.get(root)
        if spares is None:
            while len(_spares) >= MAX_ROOTS:  # the oldest root's spares are forgotten
                del _spares[next(iter(_spares))]
            spares = _spares[root] = deque()
    if len(spares) >= MAX_SPARE:
        return _removed(unit_dir, bounded)
    emptied = _emptied(unit_dir, _Bound() if bounded else None)
    if emptied is None:
        return False
    if not emptied:
        return _removed(unit_dir, bounded)
    spare = os.path.join(root, f".spare-{next(_names)}")
    try:
        os.rename(unit_dir, spare)
    except OSError:
        return _removed(unit_dir, bounded)
    spares.append(spare)
    return True


def recycle_soon(host: SandboxHost, unit_dir: Path) -> None:
    """Recycle ``unit_dir`` now, on the event loop, when it is small (``bounded``) and the
    host's inline gate is open; else (or if that fails) in the host's cleanup thread.
    Never raises: a cleanup failure leaves litter, not damage."""
    try:
        done = host.inline.attempt(partial(recycle, unit_dir, True))
    except Exception:
        done = False
    if not done:
        host.defer(partial(recycle, unit_dir))


def _removed(unit_dir: Path, bounded: bool) -> bool:
    """Remove ``unit_dir``, unless ``bounded``: a removal walks a tree of any size, so it
    is left for an unbounded call (False)."""
    if bounded:
        return False
    remove_tree(unit_dir)
    return True


@dataclass
class _Bound:
    """What a bounded recycling may still do: entries per folder, listing bytes per folder,
    bytes of files to free in all."""

    entries: int = INLINE_FILES
    folder_bytes: int = INLINE_FOLDER_BYTES
    freed: int = INLINE_BYTES


def _emptied(unit_dir: Path, bound: _Bound | None = None) -> bool | None:
    """Whether ``unit_dir`` is now exactly a fresh folder with empty ``work`` and ``out``:
    the files the unit left are unlinked; anything else (a folder of its own, a mode or
    owner changed) leaves it as it is and says False. None: past ``bound`` (the files
    before it may be unlinked already)."""
    if "mode" not in _fresh:
        return False
    try:
        top = os.open(unit_dir, _DIR_FLAGS)
    except OSError:
        return False
    try:
        entries = _listed(top, bound)
        if entries is None or entries is False:
            return entries
        if sorted(e.name for e in entries if e.is_dir(follow_symlinks=False)) != list(SKELETON):
            return False
        for entry in entries:
            if entry.name not in SKELETON:
                os.unlink(entry.name, dir_fd=top)
        for name in SKELETON:
            emptied = _emptied_folder(top, name, bound)
            if not emptied:
                return emptied
        return True
    except OSError:
        return False
    finally:
        os.close(top)


def _listed(fd: int, bound: _Bound | None) -> list[os.DirEntry[str]] | bool | None:
    """The entries of the fresh folder open at ``fd``: False when it is not fresh (a mode
    or owner changed), None past ``bound`` (each file's blocks count against its bytes)."""
    info = os.fstat(fd)
    if stat.S_IMODE(info.st_mode) != _fresh["mode"] or info.st_uid != _fresh["uid"]:
        return False
    if bound is not None and info.st_size > bound.folder_bytes:
        return None
    entries = []
    with os.scandir(fd) as scan:
        for entry in scan:
            entries.append(entry)
            if bound is None:
                continue
            if len(entries) > bound.entries:
                return None
            if not entry.is_dir(follow_symlinks=False):
                bound.freed -= entry.stat(follow_symlinks=False).st_blocks * 512
                if bound.freed < 0:
                    return None
    return entries


def _emptied_folder(top: int, name: str, bound: _Bound | None) -> bool | None:
    """Unlink the files of ``top/name``: False if it holds a folder or is no longer fresh,
    None past ``bound``."""
    fd = os.open(name, _DIR_FLAGS, dir_fd=top)
    try:
        entries = _listed(fd, bound)
        if entries is None or entries is False:
            return entries
        if any(entry.is_dir(follow_symlinks=False) for entry in entries):
            return False
        for entry in entries:
            os.unlink(entry.name, dir_fd=fd)
        return True
    finally:
        os.close(fd)
