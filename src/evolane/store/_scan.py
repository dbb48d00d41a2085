"""Walk a directory a command wrote, within caps, before a byte of it is read or stored.

The walk is iterative (a stack, never recursion) and reads only directory entries and
``lstat`` results: depth, path length, file and folder counts and the total of the files'
sizes are checked as each entry is met, so a 150 MB sparse file or 20,000 small files are
refused after one ``lstat`` too many, before any hashing, copying or fsync. A folder is not
even listed whole once it holds more entries than the caps have room for (a device, FIFO
or socket met while listing it is then the error, as in the walk); with
``max_folder_bytes``, a folder whose listing is larger (``st_size``: one that once held a
million entries) is not listed at all.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from evolane.store._blobs import StoreError

MAX_TREE_DEPTH = 64
"""Folder levels a stored path may have: no skill or prompt folder nests deeper, and every
walk of a stored tree stays far from the interpreter's recursion limit."""
MAX_PATH_BYTES = 1024
"""Bytes of a path relative to the tree root: with the workspace prefix it stays well inside
PATH_MAX (4096), so every stored path can be materialised and removed again."""
MAX_TREE_FILES = 100_000
"""Files and symlinks of a tree snapshot by default (a gate or lane passes its own, lower)."""
MAX_TREE_FOLDERS = 100_000
"""Folders of a tree snapshot by default: folders cost a walk even when they hold nothing."""
MAX_TREE_BYTES = 1 << 30
"""Bytes of all the files of a tree snapshot by default (apparent sizes: a sparse file
counts at its full length, which is what hashing it would read)."""

Cap = Literal[
    "max_depth", "max_path_bytes", "max_files", "max_folders", "max_bytes", "max_folder_bytes"
]


class UnsupportedEntryError(StoreError):
    """A directory holds something a tree cannot record (device, fifo, socket, bad name)."""


class TreeLimitError(StoreError):
    """A tree is over one of its `TreeLimits`; ``cap`` names which, the text says by what."""

    def __init__(self, cap: Cap, message: str) -> None:
        super().__init__(message)
        self.cap = cap


@dataclass(frozen=True, slots=True)
class TreeLimits:
    """Caps on a tree walked for a snapshot; each is checked while walking."""

    max_depth: int = MAX_TREE_DEPTH
    max_path_bytes: int = MAX_PATH_BYTES
    max_files: int = MAX_TREE_FILES
    max_folders: int = MAX_TREE_FOLDERS
    max_bytes: int = MAX_TREE_BYTES
    max_folder_bytes: int | None = None
    """Bytes of one folder's own listing (its ``st_size``); None: not checked."""

    def __post_init__(self) -> None:
        for name in ("max_depth", "max_path_bytes", "max_files", "max_folders", "max_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_folder_bytes is not None and self.max_folder_bytes < 0:
            raise ValueError(f"max_folder_bytes must be >= 0, got {self.max_folder_bytes}")


@dataclass(frozen=True, slots=True)
class ScannedEntry:
    """One file or symlink met by `scan_tree`: where it is and what ``lstat`` said."""

    relative: str  # POSIX path from the root
    path: str  # absolute path on disk
    kind: Literal["file", "symlink"]
    size: int  # st_size of a file, 0 for a symlink
    executable: bool
    target: str = ""  # a symlink's target


@dataclass(frozen=True, slots=True)
class TreeScan:
    """What `scan_tree` found within its limits: entries in sorted path order."""

    root: Path
    limits: TreeLimits
    entries: tuple[ScannedEntry, ...]
    total_bytes: int
    folders: int


def utf8_name(text: str, where: str) -> str:
    """``text`` when it encodes as UTF-8, else `UnsupportedEntryError` naming ``where``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsupportedEntryError(f"cannot snapshot {where!r}: name is not UTF-8") from None
    return text


class _Walk:
    """The counters of one walk; each `add_*` raises `TreeLimitError` past its cap."""

    def __init__(self, limits: TreeLimits) -> None:
        self.limits = limits
        self.files = self.folders = self.total = 0
        self.entries: list[ScannedEntry] = []

    def check_path(self, relative: str) -> None:
        limits = self.limits
        depth = relative.count("/") + 1
        if depth > limits.max_depth:
            raise TreeLimitError(
                "max_depth",
                f"{_clip(relative)!r} is {depth} levels deep, over the cap of "
                f"{limits.max_depth} (max_depth)",
            )
        if len(relative.encode("utf-8")) > limits.max_path_bytes:
            raise TreeLimitError(
                "max_path_bytes",
                f"a path of over {limits.max_path_bytes} bytes (max_path_bytes): "
                f"{_clip(relative)!r}",
            )

    def listed(self, folder: str, size: int) -> list[os.DirEntry[str]]:
        """The entries of ``folder`` (whose listing is ``size`` bytes) by name; listing stops
        (`TreeLimitError`) as soon as it holds more files or folders than the caps have room
        for, so a folder of a million entries is never listed whole."""
        limits = self.limits
        if limits.max_folder_bytes is not None and size > limits.max_folder_bytes:
            raise TreeLimitError(
                "max_folder_bytes",
                f"folder {_clip(folder)!r} lists {size} bytes, over {limits.max_folder_bytes} "
                "(max_folder_bytes)",
            )
        rooms: dict[Cap, int] = {
            "max_files": limits.max_files - self.files,
            "max_folders": limits.max_folders - self.folders,
        }
        children: list[os.DirEntry[str]] = []
        with os.scandir(folder) as scan:
            for child in scan:
                children.append(child)
                cap: Cap = "max_folders" if child.is_dir(follow_symlinks=False) else "max_files"
                rooms[cap] -= 1
                if rooms[cap] < 0:
                    _raise_unsupported(children)  # what the walk would refuse comes first
                    raise TreeLimitError(cap, _OVER[cap].format(limits=limits))
        children.sort(key=lambda child: child.name)
        return children

    def add_folder(self) -> None:
        self.folders += 1
        if self.folders > self.limits.max_folders:
            raise TreeLimitError("max_folders", _OVER["max_folders"].format(limits=self.limits))

    def add(self, entry: ScannedEntry) -> None:
        self.files += 1
        if self.files > self.limits.max_files:
            raise TreeLimitError("max_files", _OVER["max_files"].format(limits=self.limits))
        self.total += entry.size
        if self.total > self.limits.max_bytes:
            raise TreeLimitError(
                "max_bytes",
                f"over {self.limits.max_bytes} bytes of files (max_bytes), "
                f"reached at {_clip(entry.relative)!r} ({entry.size} bytes)",
            )
        self.entries.append(entry)


_OVER: dict[Cap, str] = {
    "max_files": "over {limits.max_files} files and symlinks (max_files)",
    "max_folders": "over {limits.max_folders} folders (max_folders)",
}


def _raise_unsupported(entries: list[os.DirEntry[str]]) -> None:
    """`UnsupportedEntryError` for the first of ``entries`` with a non-UTF-8 name or that is
    not a folder, regular file or symlink (by its directory entry type)."""
    for entry in entries:
        utf8_name(entry.name, entry.path)
        if not (
            entry.is_dir(follow_symlinks=False)
            or entry.is_file(follow_symlinks=False)
            or entry.is_symlink()
        ):
            raise _unsupported(entry.path)


def _unsupported(path: str) -> UnsupportedEntryError:
    return UnsupportedEntryError(
        f"cannot snapshot {path}: not a regular file, directory or symlink"
    )


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


def scan_tree(
    directory: Path | str,
    limits: TreeLimits | None = None,
    *,
    skip: frozenset[str] = frozenset(),
) -> TreeScan:
    """Walk ``directory`` (no symlink followed, no recursion) and list its files and symlinks.

    An entry named in ``skip`` (at any depth, with everything under it) is left out.
    Raises `TreeLimitError` at the first cap passed, `UnsupportedEntryError` for a device,
    FIFO, socket or non-UTF-8 name, ``NotADirectoryError`` when ``directory`` is not one.
    Nothing is read but directory entries, ``lstat`` results and symlink targets.
    """
    root = Path(directory)
    try:
        info = os.lstat(root)
        is_folder, size = stat.S_ISDIR(info.st_mode), info.st_size  # a symlink is not one
    except OSError:
        is_folder, size = False, 0
    if not is_folder:
        raise NotADirectoryError(f"cannot snapshot {root}: not a directory")
    walk = _Walk(limits or TreeLimits())
    pending = [("", str(root), size)]  # (relative prefix, folder path, its listing's size)
    while pending:
        prefix, folder, size = pending.pop()
        children = walk.listed(folder, size)
        below = []
        for child in children:
            if child.name in skip:
                continue
            relative = prefix + utf8_name(child.name, child.path)
            walk.check_path(relative)
            info = child.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                walk.add_folder()
                below.append((relative + "/", child.path, info.st_size))
            elif stat.S_ISLNK(info.st_mode):
                target = utf8_name(os.readlink(child.path), child.path)
                walk.add(ScannedEntry(relative, child.path, "symlink", 0, False, target))
            elif stat.S_ISREG(info.st_mode):
                executable = bool(info.st_mode & 0o111)
                walk.add(ScannedEntry(relative, child.path, "file", info.st_size, executable))
            else:
                raise _unsupported(child.path)
        pending.extend(reversed(below))
    entries = tuple(sorted(walk.entries, key=lambda entry: entry.relative))
    return TreeScan(root, walk.limits, entries, walk.total, walk.folders)
