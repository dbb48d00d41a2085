"""The proposal artifacts of an accepted candidate: what every apply policy writes first,
so a person can read the change (``proposals/<label>/``) whatever happens to the target."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Final

from evolane.campaign._diff import unified_tree_diff
from evolane.campaign._files import materialize_writable, remove_path
from evolane.messages import ArtifactRef
from evolane.store import BlobStore, diff_trees, fsync_dir, write_bytes_atomic, write_json_atomic

DIFF_MEDIA_TYPE: Final = "text/x-diff"


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
    proposals = run_dir / "proposals"
    proposals.mkdir(parents=True, exist_ok=True)
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
