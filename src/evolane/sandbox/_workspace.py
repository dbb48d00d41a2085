"""Workspaces: a fresh directory per run, materialised from a seed tree plus overlays."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from evolane.messages import ArtifactRef
from evolane.sandbox._spec import Overlay
from evolane.store import BlobStore, TreeManifest, load_manifest, materialize_tree, store_manifest


class WorkspaceError(ValueError):
    """A workspace the sandbox refuses: outside the runtime's root, or unusable input."""


def inside(root: Path, candidate: Path) -> bool:
    """True when ``candidate`` resolves to ``root`` (a resolved path, as a host's root is)
    or below it."""
    return candidate.resolve().is_relative_to(root)


def combined_tree(
    store: BlobStore, seed: ArtifactRef | None, overlays: tuple[Overlay, ...]
) -> ArtifactRef | None:
    """One manifest of the seed with each overlay laid over it (an overlay wins conflicts)."""
    if seed is not None and not overlays:
        return seed
    entries = dict(load_manifest(store, seed)) if seed is not None else {}
    for overlay in overlays:
        base = PurePosixPath(overlay.path)
        if base.is_absolute() or ".." in base.parts:
            raise WorkspaceError(f"overlay path {overlay.path!r} must stay inside the workspace")
        prefix = "" if str(base) == "." else f"{base}/"
        for path, entry in load_manifest(store, overlay.tree).items():
            full = prefix + path
            # Drop seed entries that would sit above or below an overlay entry.
            for existing in [p for p in entries if p.startswith(full + "/")]:
                del entries[existing]
            parts = full.split("/")
            for depth in range(1, len(parts)):
                entries.pop("/".join(parts[:depth]), None)
            entries[full] = entry
    return store_manifest(store, TreeManifest(entries))


def materialize_workspace(
    store: BlobStore | None,
    seed: ArtifactRef | None,
    overlays: tuple[Overlay, ...],
    destination: Path,
) -> None:
    """Create ``destination`` with the combined tree as writable copies (never hard links:
    a sandboxed process running as root could write through a link into the store)."""
    if seed is None and not overlays:
        destination.mkdir()
        return
    if store is None:
        raise WorkspaceError("a workspace seed or overlay needs a store")
    tree = combined_tree(store, seed, overlays)
    assert tree is not None
    # A throwaway, writable copy (no second walk: Path.rglob recurses once per level).
    materialize_tree(store, tree, destination, link=False, durable=False, writable=True)


HAND_OVER_MAX_ENTRIES = 200_000
"""Entries `hand_over` changes at most (the trees are ones evolane laid out itself, bounded
by the tree limits; this only bounds a walk gone wrong)."""


def hand_over(paths: Iterable[Path], uid: int) -> None:
    """Make ``uid`` the owner of every entry under ``paths`` (a unit's own directories),
    walking iteratively without following symlinks."""
    pending = list(paths)
    changed = 0
    while pending and changed < HAND_OVER_MAX_ENTRIES:
        path = pending.pop()
        try:
            mode = path.lstat().st_mode
            os.lchown(path, uid, uid)
        except OSError:
            continue
        changed += 1
        if stat.S_ISDIR(mode):
            try:
                pending.extend(Path(entry.path) for entry in os.scandir(path))
            except OSError:
                continue


def take_back(paths: Iterable[Path], uid: int, limit: int = HAND_OVER_MAX_ENTRIES) -> bool:
    """Make every entry under ``paths`` that ``uid`` owns (what `hand_over` gave it, and
    what its command made) this process's again, walking iteratively without following
    symlinks; True once whole, False past ``limit`` entries (the rest still the uid's).
    Entries of other owners are left as they are (a hard link the unit made to another's
    file is never changed). Units keep CAP_DAC_READ_SEARCH, so a folder closed to them
    would not do. Found by review: they stayed the uid's, so the next unit given it
    (another host's, whose count walked onto it) rewrote a replay's output before its
    lane read it, and a kept unit's files."""
    owner, group = os.geteuid(), os.getegid()
    given = list(paths)
    pending: list[str] = []
    for path in given:  # each given path once, then what is below it
        if any(path != other and path.is_relative_to(other) for other in given):
            continue  # walked with the folder it is in
        with contextlib.suppress(OSError):
            info = os.lstat(path)
            if info.st_uid == uid:
                os.lchown(path, owner, group)
            if stat.S_ISDIR(info.st_mode):
                pending.append(str(path))
    seen = 0
    while pending:  # strings, and each entry's type as read (no Path, no stat a folder)
        with contextlib.suppress(OSError), os.scandir(pending.pop()) as entries:
            for entry in entries:
                seen += 1
                if seen > limit:
                    return False
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid == uid:
                        os.lchown(entry.path, owner, group)
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
    return True
