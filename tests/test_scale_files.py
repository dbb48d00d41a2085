"""The cheaper per-unit file work of issue 22 keeps its promises: a tree is removed whole
(read-only folders included, even by a user that must make them writable first), never
through a symlink; blobs read unbuffered and small files stored from one read are what the
streaming paths give; the units blob streamed in chunks is the blob built whole; the case
rows kept in memory are fresh dicts."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given

from evolane.lanes._inproc import make_unit_dir, read_case
from evolane.lanes._recycle import recycle
from evolane.measure._units import unit_records_chunks
from evolane.store import BlobStore, BlobTooLargeError, remove_tree
from tests.test_measure_plan import FAST, Driver, build, shapes


def _hostile_tree(root: Path) -> Path:
    """A unit-like folder: an empty workspace, an output with files, nested and read-only
    folders, read-only files and a symlink leading out of the tree."""
    unit = root / "unit"
    (unit / "work").mkdir(parents=True)
    (unit / "out" / "deep" / "er").mkdir(parents=True)
    (unit / "out" / "output.json").write_bytes(b"1")
    (unit / "out" / "deep" / "er" / "f").write_bytes(b"x")
    (unit / "judge-usage.json").write_bytes(b"{}")
    (unit / "escape").symlink_to(root / "outside")
    (root / "outside").mkdir()
    (root / "outside" / "keep").write_bytes(b"k")
    for folder in (unit / "out" / "deep" / "er", unit / "out", unit):
        (folder / "ro").write_bytes(b"r")
        (folder / "ro").chmod(0o444)
    for folder in (unit / "out", unit):
        folder.chmod(0o555)  # read-only: its entries cannot go until it is made writable
    # (A read-only folder two levels down stays for a user other than root, as it always
    # did: moving a folder to another parent needs write permission on it.)
    return unit


def test_remove_tree_removes_a_unit_folder_and_never_follows_a_link(tmp_path: Path) -> None:
    unit = _hostile_tree(tmp_path)
    assert remove_tree(unit)
    assert not os.path.lexists(unit)
    assert (tmp_path / "outside" / "keep").read_bytes() == b"k"
    assert remove_tree(unit)  # already gone: True
    (tmp_path / "file").write_bytes(b"f")
    (tmp_path / "link").symlink_to(tmp_path / "outside")
    assert remove_tree(tmp_path / "file") and remove_tree(tmp_path / "link")
    assert (tmp_path / "outside" / "keep").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")
def test_remove_tree_makes_read_only_folders_writable_when_refused() -> None:
    """As a user other than root, removing from a read-only folder is refused until it is
    made writable: the tree still goes whole."""
    with tempfile.TemporaryDirectory(prefix="evolane-rm-test-") as where:
        _remove_as_another_user(Path(where))


def _remove_as_another_user(root: Path) -> None:
    root.chmod(0o755)  # a folder the other user can reach (pytest's own is root's alone)
    unit = _hostile_tree(root)
    for path in [root, *root.rglob("*")]:
        os.chown(path, 65534, 65534, follow_symlinks=False)
    pid = os.fork()
    if pid == 0:  # the child: drop to the other user, remove, report by exit code
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            code = 0 if remove_tree(unit) else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not os.path.lexists(unit)
    assert (root / "outside" / "keep").read_bytes() == b"k"


def test_blob_reads_and_small_file_puts_match_the_streaming_paths(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "store")
    for size in (0, 1, 4095, 70_000):
        data = random.Random(size).randbytes(size)
        path = tmp_path / f"f{size}"
        path.write_bytes(data)
        ref = store.put_regular_file(path, max_bytes=1 << 20)
        assert ref == store.put_bytes(data)
        assert store.read_bytes(ref) == data
        assert store.stored(data) == ref
    assert store.stored(b"never stored") is None
    big = tmp_path / "big"
    big.write_bytes(b"y" * 101)
    with pytest.raises(BlobTooLargeError):
        store.put_regular_file(big, max_bytes=100)


def test_case_rows_kept_in_memory_are_fresh_dicts(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "store")
    ref = store.put_bytes(b'{"id": "c1", "input": [1, 2]}')
    first = read_case(store, ref)
    first["input"].append(3)  # a backend that edits its case
    assert read_case(store, ref) == {"id": "c1", "input": [1, 2]}


@FAST
@given(shapes)
def test_units_blob_streamed_in_chunks_is_the_blob_built_whole(shape: dict[str, Any]) -> None:
    plan, outcomes = build(shape, sequential=True)
    Driver(plan, outcomes).run(random.Random(shape["seed"]))
    whole = plan.records_json()
    assert b"".join(unit_records_chunks(plan.units, chunk_bytes=700)) == whole
    assert b"".join(plan.records_chunks()) == whole


def test_unit_folders_are_recycled_empty_or_removed(tmp_path: Path) -> None:
    """A finished unit's folder becomes the next unit's, empty; one holding anything else
    than files in its skeleton, or with a changed mode, is removed instead."""
    units = tmp_path / "units"
    first = units / "u1.1"
    make_unit_dir(first, "work", "out")
    (first / "out" / "output.json").write_bytes(b"1")
    (first / "judge-usage.json").write_bytes(b"{}")
    (first / "work" / "scratch").write_bytes(b"w")
    recycle(first)
    assert not first.exists() and len(list(units.iterdir())) == 1  # one spare
    second = units / "u2.1"
    make_unit_dir(second, "work", "out")
    assert sorted(second.rglob("*")) == [second / "out", second / "work"]
    assert list(units.iterdir()) == [second]  # the spare became the unit's folder
    (second / "out" / "nested").mkdir()  # more than files: not recycled
    recycle(second)
    third = units / "u3.1"
    make_unit_dir(third, "work", "out")
    third.chmod(0o700)  # a mode a new folder does not have: not recycled
    recycle(third)
    assert list(units.iterdir()) == []
