"""File mechanics of apply: copy trees and files out of the store (verified, writable), keep a
file's backup, remove anything. Each step is durable (fsync) but journals nothing: callers
record what they did (`evolane.campaign._apply`)."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
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


def materialize_writable(store: BlobStore, ref: ArtifactRef, destination: Path) -> None:
    """Copy a tree out of the store (never hard links) with ordinary writable file modes."""
    materialize_tree(store, ref, destination, link=False, verify=True)
    for relative, entry in load_manifest(store, ref).items():
        if isinstance(entry, FileEntry):
            os.chmod(destination / relative, 0o755 if entry.executable else 0o644)


def copy_verified(store: BlobStore, entry: FileEntry, destination: Path, mode: int) -> None:
    """Copy one blob to a new file, hashing on the way, fsync it and set its mode."""
    hasher, size = hashlib.sha256(), 0
    try:
        with store.open(entry.digest) as source, destination.open("xb") as out:
            while chunk := source.read(CHUNK_SIZE):
                hasher.update(chunk)
                size += len(chunk)
                out.write(chunk)
            out.flush()
            os.fchmod(out.fileno(), mode)
            os.fsync(out.fileno())
        if "sha256:" + hasher.hexdigest() != entry.digest or size != entry.size:
            raise CorruptBlobError(f"corrupt blob {entry.digest} in {store.root}")
    except BaseException:
        remove_path(destination)
        raise


def keep_file_backup(target: Path, old: Path) -> None:
    """Keep the original file at ``old``: a hard link (atomic, exact), else a copy renamed in."""
    try:
        os.link(target, old)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        part = old.with_name(old.name + ".part")
        shutil.copy2(target, part)
        with part.open("rb") as copied:
            os.fsync(copied.fileno())
        os.rename(part, old)
    fsync_dir(target.parent)


def remove_path(path: Path) -> None:
    """Remove a file, symlink or tree if present, including read-only directories (no
    recursion: a tree of any depth goes)."""
    remove_tree(path)
