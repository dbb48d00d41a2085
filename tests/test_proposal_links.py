"""A symlink in place of a run's ``proposals/`` (or ``proposals/best``) is never followed
(hostile review #2): writing a proposal must not write, rename or remove outside the store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evolane.campaign._proposal import write_proposal
from evolane.store import BlobStore, StoreError, snapshot_tree


def _trees(tmp_path: Path, store: BlobStore) -> tuple[object, object]:
    parent, candidate = tmp_path / "parent", tmp_path / "candidate"
    parent.mkdir()
    candidate.mkdir()
    (parent / "skill.md").write_text("old\n")
    (candidate / "skill.md").write_text("new\n")
    return snapshot_tree(store, parent), snapshot_tree(store, candidate)


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    (outside / "best").mkdir(parents=True)
    (outside / "best" / "keep.txt").write_text("keep\n")
    return outside


def _write(store: BlobStore, run_dir: Path, refs: tuple[object, object]) -> Path:
    parent, candidate = refs
    final, _ = write_proposal(
        store,
        run_dir,
        "best",
        "proposal",
        run_dir,
        parent,
        candidate,
        "now",  # type: ignore[arg-type]
    )
    return final


def test_a_symlinked_proposals_folder_is_replaced_not_followed(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "store")
    refs = _trees(tmp_path, store)
    outside = _outside(tmp_path)
    run_dir = tmp_path / "store" / "runs" / "r-1"
    run_dir.mkdir(parents=True)
    os.symlink(outside, run_dir / "proposals")
    final = _write(store, run_dir, refs)
    assert not (run_dir / "proposals").is_symlink()
    assert final == run_dir / "proposals" / "best"
    assert (final / "candidate" / "skill.md").read_text() == "new\n"
    assert sorted(p.name for p in outside.iterdir()) == ["best"]  # untouched
    assert [p.name for p in (outside / "best").iterdir()] == ["keep.txt"]


def test_a_symlinked_best_proposal_is_replaced_as_an_entry(tmp_path: Path) -> None:
    # A guard, not a repro: renaming and removing a linked best/ already acted on the link
    # itself; this fails if a change ever follows it into the folder it names.
    store = BlobStore(tmp_path / "store")
    refs = _trees(tmp_path, store)
    outside = _outside(tmp_path)
    run_dir = tmp_path / "store" / "runs" / "r-1"
    (run_dir / "proposals").mkdir(parents=True)
    os.symlink(outside / "best", run_dir / "proposals" / "best")
    final = _write(store, run_dir, refs)
    assert not final.is_symlink() and (final / "proposal.json").is_file()
    assert [p.name for p in (outside / "best").iterdir()] == ["keep.txt"]


def test_a_file_in_place_of_proposals_is_replaced_and_a_linked_run_folder_refused(
    tmp_path: Path,
) -> None:
    store = BlobStore(tmp_path / "store")
    refs = _trees(tmp_path, store)
    run_dir = tmp_path / "store" / "runs" / "r-1"
    run_dir.mkdir(parents=True)
    (run_dir / "proposals").write_text("not a folder")
    assert (_write(store, run_dir, refs) / "changes.diff").is_file()
    outside = _outside(tmp_path)
    os.symlink(outside, tmp_path / "store" / "runs" / "r-2")
    with pytest.raises(StoreError, match="r-2 is a symlink"):
        _write(store, tmp_path / "store" / "runs" / "r-2", refs)
    assert sorted(p.name for p in outside.iterdir()) == ["best"]
