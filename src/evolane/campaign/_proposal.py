"""The proposal artifacts of an accepted candidate: what every apply policy writes first,
so a person can read the change (``proposals/<label>/``) whatever happens to the target."""

from __future__ import annotations

import dataclasses
import os
import stat
import tempfile
from pathlib import Path
from typing import Final

from evolane.campaign._diff import unified_tree_diff
from evolane.campaign._files import materialize_writable, remove_path
from evolane.messages import ArtifactRef
from evolane.store import (
    BlobStore,
    StoreError,
    diff_trees,
    fsync_dir,
    write_bytes_atomic,
    write_json_atomic,
)

DIFF_MEDIA_TYPE: Final = "text/x-diff"


def own_folder(run_dir: Path, name: str) -> Path:
    """``run_dir/name`` as a real folder of the store: a symlink, file or FIFO in its place
    is removed as an entry (never followed: a link there must not send a write, rename or
    removal outside the store), then the folder is made. `StoreError` (one line) when
    ``run_dir`` itself is a symlink or what is in the way cannot be removed."""
    if run_dir.is_symlink():
        raise StoreError(f"{run_dir} is a symlink: a run folder must be a folder of the store")
    run_dir.mkdir(parents=True, exist_ok=True)
    folder = run_dir / name
    try:
        mode = folder.lstat().st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISDIR(mode):
        try:
            os.unlink(folder)  # the entry itself: a symlink is not followed
        except OSError as error:
            raise StoreError(f"{folder} is not a folder and cannot be removed: {error}") from None
    folder.mkdir(exist_ok=True)
    if folder.is_symlink() or not folder.is_dir():  # swapped meanwhile
        raise StoreError(f"{folder} is not a folder of the store")
    return folder


def write_proposal(
    store: BlobStore,
    run_dir: Path,
    label: str,
    policy: str,
    target: Path,
    parent_ref: ArtifactRef,
    candidate_ref: ArtifactRef,
    created: str,
) -> tuple[Path, ArtifactRef]:
    """Build ``run_dir/proposals/<label>/`` under a temp name and rename it into place whole.

    It holds the candidate tree (``candidate/``), the diff from the parent (``changes.diff``,
    also stored as a blob) and ``proposal.json``; returns its path and the diff's ref. A
    corrupt candidate blob raises and leaves no proposal.
    """
    proposals = own_folder(run_dir, "proposals")
    for stale in proposals.glob(f".{label}.tmp-*"):
        remove_path(stale)
    diff_bytes = unified_tree_diff(store, parent_ref, candidate_ref)
    diff_ref = store.put_bytes(diff_bytes, media_type=DIFF_MEDIA_TYPE)
    changes = diff_trees(store, parent_ref, candidate_ref)
    record = {
        "label": label,
        "policy": policy,
        "target": str(target),
        "created": created,
        "parent_ref": parent_ref,
        "candidate_ref": candidate_ref,
        "diff_ref": diff_ref,
        "digests": {
            "parent": parent_ref.digest,
            "candidate": candidate_ref.digest,
            "diff": diff_ref.digest,
        },
        "changes": dataclasses.asdict(changes),
    }
    final = proposals / label
    staging = Path(tempfile.mkdtemp(dir=proposals, prefix=f".{label}.tmp-"))
    try:
        materialize_writable(store, candidate_ref, staging / "candidate")
        write_bytes_atomic(staging / "changes.diff", diff_bytes)
        write_json_atomic(staging / "proposal.json", record)
        os.chmod(staging, 0o755)
        if os.path.lexists(final):
            os.rename(final, staging.with_name(staging.name.replace(".tmp-", ".old-")))
        os.rename(staging, final)
    except BaseException:
        remove_path(staging)
        raise
    fsync_dir(proposals)
    for old in proposals.glob(f".{label}.old-*"):
        remove_path(old)
    return final, diff_ref
