"""What the target is: its tree as a run starts from it (`target_tree`), and, for a target
that is a symlink to a version folder (``current -> releases/v3``), that folder."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from evolane.campaign._vcs import VCS_FOLDERS
from evolane.inputs import InputError
from evolane.messages import ArtifactRef
from evolane.store import (
    BlobStore,
    FileEntry,
    TreeLimitError,
    TreeManifest,
    UnsafeEntryError,
    UnsupportedEntryError,
    snapshot_tree,
    store_manifest,
)


def target_tree(store: BlobStore, target: Path) -> ArtifactRef:
    """Snapshot the target: a directory as is, a single file as a tree of exactly that file.

    Version-control metadata (`VCS_FOLDERS`: a ``.git`` folder or file, at any depth) is
    left out: it is not what a campaign improves, every optimizer and replay gets a copy of
    the tree (found by review: a remote's token in ``.git/config`` and the whole history
    went to each of them), and a publish never touches what the tree does not hold.
    `InputError` (one line naming ``--target``) for a target that is neither a regular file
    nor a directory, a tree holding an entry it cannot record (a device, FIFO, socket, a name
    that is not UTF-8), over a tree cap, or holding a symlink that points outside it: each
    refused before anything of the tree is stored. A symlink target's tree is its version
    folder's (`link_version`: refused the same way unless it points to a folder beside it)."""
    target = tree_root(Path(target))
    try:
        if target.is_dir():
            return snapshot_tree(store, target, contained=True, skip=VCS_FOLDERS)
    except (UnsafeEntryError, UnsupportedEntryError, TreeLimitError) as error:
        raise InputError(f"--target {target}: {error}") from None
    if not target.is_file():
        why = "not a regular file or a directory" if target.exists() else "no such file"
        raise InputError(f"--target {target}: {why}")
    ref = store.put_file(target)
    mode = 0o755 if target.stat().st_mode & 0o111 else 0o644
    entry = FileEntry(digest=ref.digest, mode=mode, size=ref.size)
    return store_manifest(store, TreeManifest({target.name: entry}))


def link_version(target: Path) -> Path | None:
    """The version folder a symlink ``target`` points to (None when ``target`` is not a
    symlink). `InputError` (one line naming ``--target``) for a link that does not point to
    a real folder (a file, another symlink, nothing) or to one outside the link's own folder:
    the publish writes the new version beside it."""
    if not target.is_symlink():
        return None
    text = os.readlink(target)
    version = Path(os.path.normpath(target.parent / text))
    try:
        info = os.lstat(version)
    except OSError:
        why = "which does not exist"
        raise InputError(f"--target {target}: a symlink to {text!r}, {why}") from None
    if not stat.S_ISDIR(info.st_mode):
        kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a folder"
        raise InputError(
            f"--target {target}: a symlink to {text!r}, which is {kind}; a symlink target "
            "must point straight to a version folder (releases/v3)"
        )
    home, there = os.path.realpath(target.parent), os.path.realpath(version.parent)
    if version.name in ("", ".", "..") or not (there == home or there.startswith(home + os.sep)):
        raise InputError(
            f"--target {target}: a symlink to {text!r}, outside the link's folder {home}; "
            "evolane writes each new version beside the current one, so it must be there"
        )
    return version


def tree_root(target: Path) -> Path:
    """The folder (or file) whose content is the target: a symlink's version folder."""
    return link_version(target) or target


def check_store_placement(store: Path, target: Path) -> None:
    """Refuse a store inside the target, or a target inside the store but out of its
    ``examples/`` (`InputError`), once symlinks and ``..`` are resolved: a candidate would be
    snapshotted with evolane's own state in it, and a publish could rewrite the store."""
    real_store, real_target = store.resolve(), target.resolve()
    if real_store == real_target or real_target in real_store.parents:
        raise InputError(
            f"--store {store} is inside --target {target} ({real_store} in {real_target});"
            " put the store outside the target"
        )
    if real_store in real_target.parents and real_store / "examples" not in real_target.parents:
        raise InputError(
            f"--target {target} is inside --store {store} ({real_target} in {real_store});"
            " put the target outside the store"
        )


def store_root(store: Path) -> Path:
    """The store's absolute path; `InputError` when it (or the nearest existing folder above
    it) is not a directory, or is one evolane cannot write in (found by review: ``--store
    /proc/self`` or ``/sys/x`` was "internal error: FileNotFoundError", exit 1). The write
    is probed with a folder made and removed there: nothing is left behind."""
    root = store.absolute()
    existing = next((p for p in (root, *root.parents) if p.exists()), None)
    if existing is None:
        return root
    if not existing.is_dir():
        where = "" if existing == root else f" ({existing} is a file)"
        raise InputError(f"--store {store}: not a directory{where}")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".evolane-probe-", dir=existing))
    except OSError as error:
        where = "" if existing == root else f" ({existing})"
        reason = error.strerror or type(error).__name__
        raise InputError(f"--store {store}: cannot make a store there{where}: {reason}") from None
    return root
