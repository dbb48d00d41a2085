"""Found by review: difflib is quadratic, and a candidate rewriting a 40,000-line file of
repeated lines made the diff of the proposal (computed in the shielded apply step, and by
``evolane diff``) take 30 s, for each such file of a tree. Past its budget a file is shown
whole: one hunk removing every old line and adding every new one, still a diff that
applies."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from evolane.campaign import unified_tree_diff
from evolane.store import BlobStore, snapshot_tree

ROWS = 40_000


def _tree(store: BlobStore, folder: Path, files: dict[str, str]) -> object:
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    return snapshot_tree(store, folder)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git apply")
def test_a_diff_too_costly_for_difflib_shows_the_file_whole_and_still_applies(
    tmp_path: Path,
) -> None:
    store = BlobStore(tmp_path / "store")
    old = "".join(f"{i % 400}\n" for i in range(ROWS))
    new = "".join(f"{(i * 7) % 400}\n" for i in range(ROWS))
    small_old, small_new = "a\nb\nc\n", "a\nB\nc"
    parent = _tree(store, tmp_path / "parent", {"table.txt": old, "note.txt": small_old})
    candidate = _tree(store, tmp_path / "candidate", {"table.txt": new, "note.txt": small_new})
    diff = unified_tree_diff(store, parent, candidate)
    table = diff[diff.index(b"--- a/table.txt") :].decode().splitlines()
    assert table[2] == f"@@ -1,{ROWS} +1,{ROWS} @@"  # the whole file, one hunk
    assert len(table) == 3 + 2 * ROWS and not any(line.startswith(" ") for line in table)
    assert b" a\n-b\n-c\n+B\n+c\n" in diff  # a small file still diffed line by line
    work = tmp_path / "work"
    shutil.copytree(tmp_path / "parent", work)
    (tmp_path / "changes.diff").write_bytes(diff)
    subprocess.run(
        ["git", "apply", "--unsafe-paths", "-p1", str(tmp_path / "changes.diff")],
        cwd=work,
        check=True,
        timeout=120,
    )
    assert (work / "table.txt").read_text() == new
    assert (work / "note.txt").read_text() == small_new


def test_lines_repeated_just_under_difflibs_popular_share_are_shown_whole(
    tmp_path: Path,
) -> None:
    """Found by review: difflib skips a line that makes up over 1% of a file, so the slowest
    files repeat each line just under that; two of 16,384 lines (each repeated 109 times)
    were within the first budget (1 << 28) and took 33 s to diff. The budget now shows
    them whole."""
    rows, kinds = 16_384, 151
    store = BlobStore(tmp_path / "store")
    old = "".join(f"x{i % kinds}\n" for i in range(rows))
    new = "".join(f"x{(i * 7) % kinds}\n" for i in range(rows))
    parent = _tree(store, tmp_path / "parent", {"table.txt": old})
    candidate = _tree(store, tmp_path / "candidate", {"table.txt": new})
    diff = unified_tree_diff(store, parent, candidate).decode().splitlines()
    assert diff[2] == f"@@ -1,{rows} +1,{rows} @@"
    assert len(diff) == 3 + 2 * rows  # every line removed and added: not run through difflib
