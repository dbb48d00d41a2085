"""File mechanics of apply: copy trees and files out of the store (verified, writable), keep
an original beside its path, hash a file, remove anything. Each step is durable (fsync) but
journals nothing: callers record what they did (`evolane.campaign._apply`,
`evolane.campaign._publish`)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
from pathlib import Path

from evolane.messages import ArtifactRef
from evolane.store import (
    CHUNK_SIZE,
    BlobStore,
    CorruptBlobError,
    FileEntry,
    fsync_dir,
    load_manifest,
    materialize_tree,
    remove_tree,
)

Owner = tuple[int, int]
"""A file's (uid, gid)."""
_NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP)


def materialize_writable(store: BlobStore, ref: ArtifactRef, destination: Path) -> None:
    """Copy a tree out of the store (never hard links) with ordinary writable file modes."""
    materialize_tree(store, ref, destination, link=False, verify=True)
    for relative, entry in load_manifest(store, ref).items():
        if isinstance(entry, FileEntry):
            os.chmod(destination / relative, 0o755 if entry.executable else 0o644)


def copy_verified(
    store: BlobStore, entry: FileEntry, destination: Path, mode: int, owner: Owner | None = None
) -> None:
    """Copy one blob to a new file, hashing on the way, give it ``owner`` (as far as the
    process may: see `set_owner`) and ``mode``, and fsync it. A bad blob raises
    `CorruptBlobError` and leaves no file."""
    hasher, size = hashlib.sha256(), 0
    try:
        with store.open(entry.digest) as source, destination.open("xb") as out:
            while chunk := source.read(CHUNK_SIZE):
                hasher.update(chunk)
                size += len(chunk)
                out.write(chunk)
            out.flush()
            if owner is not None:  # before the mode: a chown may clear set-id bits
                set_owner(out.fileno(), owner)
            os.fchmod(out.fileno(), mode)
            os.fsync(out.fileno())
        if "sha256:" + hasher.hexdigest() != entry.digest or size != entry.size:
            raise CorruptBlobError(f"corrupt blob {entry.digest} in {store.root}")
    except BaseException:
        remove_path(destination)
        raise


def set_owner(where: int | Path, owner: Owner) -> None:
    """Give a file (an open descriptor, or a path: a symlink itself, not what it points to)
    ``owner``, else its group alone, else leave it: only root may give a file away."""
    uid, gid = owner
    for wanted in ((uid, gid), (-1, gid)):
        try:
            if isinstance(where, int):
                os.fchown(where, *wanted)
            else:
                os.lchown(where, *wanted)
            return
        except PermissionError:
            continue


def keep_original(path: Path, keep: Path) -> None:
    """Keep the file or symlink at ``path`` as ``keep``: a hard link (the very inode, so
    content, mode, owner and times, atomically), else a copy with the same mode, owner and
    times, renamed in once whole."""
    try:
        os.link(path, keep, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
        part = keep.with_name(keep.name + ".part")
        remove_path(part)
        info = os.lstat(path)
        shutil.copy2(path, part, follow_symlinks=False)
        set_owner(part, (info.st_uid, info.st_gid))
        if not stat.S_ISLNK(info.st_mode):
            os.chmod(part, stat.S_IMODE(info.st_mode))
            with part.open("rb") as copied:
                os.fsync(copied.fileno())
        os.utime(part, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)
        os.rename(part, keep)
    fsync_dir(keep.parent)


def file_digest(path: Path) -> str:
    """The ``sha256:<hex>`` digest of a file's content (as the store names blobs)."""
    hasher = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(CHUNK_SIZE):
            hasher.update(chunk)
    return "sha256:" + hasher.hexdigest()


def fsync_folders(folders: set[Path]) -> None:
    """fsync each folder that still exists (a best effort, for cleanup paths)."""
    for folder in sorted(folders):
        with contextlib.suppress(OSError):
            fsync_dir(folder)


def remove_path(path: Path) -> None:
    """Remove a file, symlink or tree if present, including read-only directories (no
    recursion: a tree of any depth goes)."""
    remove_tree(path)
