"""Remove a directory tree that a hostile command may have built: no recursion, no symlink
followed, no path longer than one name, at most two directory descriptors open.

``shutil.rmtree`` (Python 3.11) recurses once per level: a 1,500-deep chain of folders left in
a workspace raised RecursionError in every later sweep of that store. Here each folder met
is emptied of its files and its sub-folders are renamed up to the top of the tree being
removed (one ``renameat`` each, same filesystem), so the walk stays flat whatever the depth.

A folder its owner closed (mode 000: not listable; or read-only: a folder cannot move to
another parent without write permission on itself, for its ``..``) is opened up first, as
its owner may, without following a symlink: found by review, a non-root evolane left every
optimizer's read-only context folder, and whatever a command closed, in the store for good.

Standard library only: the lifeline process (run with ``python -I -S``) loads this file too.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_HOIST_PREFIX = ".evolane-rm-"
_REFUSED = (errno.EACCES, errno.EPERM)


def remove_tree(path: Path | str) -> bool:
    """Remove ``path`` (a file, a symlink or a folder with everything under it); True when
    it is gone. Errors are swallowed (a leftover is litter, never a crash): read-only folders
    are made writable where a removal in them is refused, a mount point or a foreign file
    that cannot go stays."""
    path = os.fspath(path)
    try:
        top = _open_folder(path)
    except FileNotFoundError:
        return True
    except OSError as error:
        if error.errno not in (errno.ENOTDIR, errno.ELOOP):
            return False
        with contextlib.suppress(OSError):  # a file or a symlink (never followed)
            os.unlink(path)
        return not os.path.lexists(path)
    try:
        _empty(top)
    finally:
        os.close(top)
    try:
        os.rmdir(path)
    except OSError:
        return not os.path.lexists(path)
    return True


def remove_small_tree(path: Path | str, entries: int, folder_bytes: int, freed: int) -> bool:
    """Remove the folder ``path`` when it is small: at most ``entries`` entries in all, no
    folder listing over ``folder_bytes``, at most ``freed`` bytes of files; True once gone
    (or absent). False when it is larger or a removal is refused; nothing is removed then
    unless the walk was within bounds, and `remove_tree` finishes what is left. Each entry
    is removed through its parent's descriptor (no path is followed)."""
    try:
        top = os.open(os.fspath(path), _DIR_FLAGS)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    folders = [top]
    found: list[tuple[int, str, bool]] = []  # (parent's descriptor, name, is a folder)
    try:
        for folder in folders:  # grows as sub-folders are opened: at most `entries` of them
            if os.fstat(folder).st_size > folder_bytes:
                return False
            with os.scandir(folder) as scan:
                for entry in scan:
                    is_dir = entry.is_dir(follow_symlinks=False)
                    found.append((folder, entry.name, is_dir))
                    if not is_dir:
                        freed -= entry.stat(follow_symlinks=False).st_blocks * 512
                    if len(found) > entries or freed < 0:
                        return False
                    if is_dir:
                        folders.append(os.open(entry.name, _DIR_FLAGS, dir_fd=folder))
        for parent, name, is_dir in reversed(found):  # what a folder holds goes before it
            if is_dir:
                os.rmdir(name, dir_fd=parent)
            else:
                os.unlink(name, dir_fd=parent)
        os.rmdir(path)
        return True
    except OSError:
        return False
    finally:
        for folder in folders:
            os.close(folder)


def _empty(top: int) -> None:
    """Empty the folder open as ``top``: its files go, each sub-folder is removed at once
    when empty, else emptied the same way after its own sub-folders were renamed up into
    ``top``. A folder is made writable only when a removal in it is refused."""
    names = itertools.count()
    device = os.fstat(top).st_dev
    stuck: set[str] = set()  # folders of ``top`` that could not be emptied (left in place)
    writable = False
    while True:
        folders, refused = _unlink_files(top)
        if refused and not writable:
            writable = _make_writable(top)
            continue
        folders = [name for name in folders if name not in stuck]
        if not folders:
            return
        for name in folders:
            failed = _rmdir(top, name)  # an empty folder goes in one call
            if failed in _REFUSED and not writable:
                writable = _make_writable(top)
                failed = _rmdir(top, name)
            if not failed:
                continue
            writable = writable or _make_writable(top)  # its sub-folders are moved up here
            if not _flatten(top, name, names, device) or _rmdir(top, name):
                stuck.add(name)


def _rmdir(folder: int, name: str) -> int:
    """Remove the empty folder ``folder/name``: 0, else the error number."""
    try:
        os.rmdir(name, dir_fd=folder)
    except OSError as error:
        return error.errno or -1
    return 0


def _make_writable(folder: int) -> bool:
    with contextlib.suppress(OSError):
        os.fchmod(folder, 0o700)
    return True


def _unlink_files(folder: int) -> tuple[list[str], bool]:
    """Unlink every non-folder entry of ``folder``: the names of its sub-folders, and
    whether an unlink was refused for want of permission (a read-only folder)."""
    folders = []
    refused = False
    try:
        with os.scandir(folder) as scan:
            entries = list(scan)
    except OSError:
        return [], False
    for entry in entries:
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if is_dir:
            folders.append(entry.name)
            continue
        try:
            os.unlink(entry.name, dir_fd=folder)
        except OSError as error:
            refused = refused or error.errno in _REFUSED
    return folders, refused


def _flatten(top: int, name: str, names: itertools.count[int], device: int) -> bool:
    """Empty ``top/name`` of files and move its sub-folders up into ``top``; False when it
    could not be entered (a mount point, on another filesystem, is not). Whether it was
    left empty, its removal tells."""
    try:
        fd = _open_folder(name, top)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_dev != device:
            return False
        children, refused = _unlink_files(fd)
        if refused or children:  # unlinks refused, or sub-folders to move out of it
            _make_writable(fd)
        if refused:
            children, _ = _unlink_files(fd)
        for child in children:
            if _rmdir(fd, child):
                _hoist(fd, child, top, names)
        return True
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
            if error.errno in _REFUSED and _open_up(child, parent):
                continue  # a read-only folder, made writable: try again
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                return


def _open_folder(name: str, parent: int | None = None) -> int:
    """A descriptor of the folder ``name`` (in ``parent``), never through a symlink; a
    folder whose mode refuses it is opened up (`_open_up`) and tried once more."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as error:
        if error.errno not in _REFUSED or not _open_up(name, parent):
            raise
    return os.open(name, _DIR_FLAGS, dir_fd=parent)


def _open_up(name: str, parent: int | None = None) -> bool:
    """Give the owner every permission on the folder ``name`` (in ``parent``): True when
    done. Through an ``O_PATH`` descriptor (which needs no permission on the folder and
    never follows a symlink): nothing but that folder is changed."""
    try:
        fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return False
    try:
        os.chmod(f"/proc/self/fd/{fd}", 0o700)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True
