"""Version-control metadata in a tree: paths no candidate may add, change or remove.

A repository's own folder is configuration that tools run on sight: git runs
``core.fsmonitor`` on a plain ``git status``, its hooks on a commit, and a shell prompt that
shows the branch runs git in every folder it enters. A candidate that edits ``.git/config``
in a target that is a work tree, or that adds a folder git takes for a repository (a
``.git`` of its own, or a bare repository's layout), runs its command outside every sandbox
once the candidate is published or its proposal folder is entered, and ``git diff`` never
shows the change (found by review). Such paths are protected whatever ``--protected`` says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath
from typing import Final

VCS_FOLDERS: Final = frozenset({".git", ".hg", ".svn", ".bzr", "_darcs", ".jj", ".pijul"})
"""Names of version-control metadata (a folder, or git's ``.git`` file naming one)."""


def repository_folders(paths: Iterable[str]) -> set[str]:
    """The folders of a tree (given by its file paths; ``""`` is the root) that git would
    take for a repository's own folder: a ``HEAD`` file with ``objects`` and ``refs``
    beside it, or with a ``commondir`` file naming where they are. ``objects`` and ``refs``
    count as a folder, a file or a symlink: git only asks ``access(X_OK)`` of them, which
    an executable file or a symlink to a folder passes (found by review: ``HEAD`` with two
    executable files beside it was a repository whose ``config`` ran ``core.fsmonitor``)."""
    files = set(paths)
    folders = {str(parent) for path in files for parent in PurePosixPath(path).parents}
    entries = files | folders
    found: set[str] = set()
    for path in files:
        pure = PurePosixPath(path)
        if pure.name != "HEAD":
            continue
        folder = "" if str(pure.parent) == "." else str(pure.parent)
        prefix = f"{folder}/" if folder else ""
        layout = f"{prefix}objects" in entries and f"{prefix}refs" in entries
        if layout or f"{prefix}commondir" in files:
            found.add(folder)
    return found


def vcs_paths(touched: Iterable[str], *trees: Mapping[str, object]) -> list[str]:
    """The ``touched`` paths that are version-control metadata: a path through a folder
    named in `VCS_FOLDERS` in any case (as git refuses ``.Git`` in a tree everywhere: on a
    case-insensitive file system, ``vfat``, SMB or an ``ext4`` casefold folder, a publish
    of ``.GIT/config`` writes ``.git/config``), or inside a folder that any of ``trees``
    (the parent, the candidate) lays out as a repository (`repository_folders`)."""
    repositories = set().union(*(repository_folders(tree) for tree in trees))
    offending = []
    for path in touched:
        parts = {part.casefold() for part in PurePosixPath(path).parts}
        inside = any(
            folder == "" or path == folder or path.startswith(folder + "/")
            for folder in repositories
        )
        if inside or VCS_FOLDERS.intersection(parts):
            offending.append(path)
    return offending
