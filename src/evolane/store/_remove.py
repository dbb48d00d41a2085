"""Remove a directory tree that a hostile command may have built: no recursion, no symlink
followed, no path longer than one name, at most two directory descriptors open.

``shutil.rmtree`` (Python 3.11) recurses once per level: a 1,500-deep chain of folders left in
a workspace raised RecursionError in every later sweep of that store. Here each folder met
is emptied of its files and its sub-folders are renamed up to the top of the tree being
removed (one ``renameat`` each, same filesystem), so the walk stays flat whatever the depth.

Standard library only: the lifeline process (run with ``python -I -S``) loads this file too.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_HOIST_PREFIX = ".evolane-rm-"


def remove_tree(path: Path | str) -> bool:
    """Remove ``path`` (a file, a symlink or a folder with everything under it); True when
    it is gone. Errors are swallowed (a leftover is litter, never a crash): read-only folders
    are made writable first, a mount point or a foreign file that cannot go stays."""
    path = os.fspath(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return not os.path.lexists(path)
    try:
        top = os.open(path, _DIR_FLAGS)
    except OSError:
        return False
    try:
        _empty(top)
    finally:
        os.close(top)
    with contextlib.suppress(OSError):
        os.rmdir(path)
    return not os.path.lexists(path)


def _empty(top: int) -> None:
    """Empty the folder open as ``top``: its files go, each sub-folder is emptied the same
    way after its own sub-folders were renamed up into ``top``."""
    names = itertools.count()
    device = os.fstat(top).st_dev
    stuck: set[str] = set()  # folders of ``top`` that could not be emptied (left in place)
    while True:
        with contextlib.suppress(OSError):
            os.fchmod(top, 0o700)
        folders = [name for name in _unlink_files(top) if name not in stuck]
        if not folders:
            return
        for name in folders:
            if not _flatten(top, name, names, device):
                stuck.add(name)
                continue
            try:
                os.rmdir(name, dir_fd=top)
            except OSError:
                stuck.add(name)


def _unlink_files(folder: int) -> list[str]:
    """Unlink every non-folder entry of ``folder``; returns the names of its sub-folders."""
    folders = []
    try:
        with os.scandir(folder) as scan:
            entries = list(scan)
    except OSError:
        return []
    for entry in entries:
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if is_dir:
            folders.append(entry.name)
            continue
        with contextlib.suppress(OSError):
            os.unlink(entry.name, dir_fd=folder)
    return folders


def _flatten(top: int, name: str, names: itertools.count[int], device: int) -> bool:
    """Empty ``top/name`` of files and move its sub-folders up into ``top``; True when the
    folder was left empty. A folder on another filesystem (a mount point) is not entered."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=top)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_dev != device:
            return False
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o700)
        for child in _unlink_files(fd):
            _hoist(fd, child, top, names)
        with os.scandir(fd) as scan:
            return next(scan, None) is None
    except OSError:
        return False
    finally:
        os.close(fd)


def _hoist(parent: int, child: str, top: int, names: itertools.count[int]) -> None:
    """Rename ``parent/child`` to a fresh name in ``top`` (an empty folder of that name is
    replaced, a non-empty one makes us pick the next name)."""
    for _ in range(64):
        target = f"{_HOIST_PREFIX}{next(names)}"
        try:
            os.rename(child, target, src_dir_fd=parent, dst_dir_fd=top)
            return
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                return
