"""Unified diffs between two stored trees: the readable change an apply proposal carries."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Final

from evolane.messages import ArtifactRef
from evolane.store import BlobStore, FileEntry, SymlinkEntry, load_manifest

MAX_DIFF_FILE_BYTES: Final = 1 << 20
"""Files larger than this are named in the diff, not diffed (difflib is quadratic)."""
MAX_DIFF_LINE_PAIRS: Final = 1 << 26
"""difflib's work for one tree's diff, counted as old lines x new lines per file (its worst
case: about 1.5 s of CPU for 8,192 x 8,192 lines each repeated just under difflib's
"popular" share of 1%, which it does not skip). A file past what is left is shown whole,
every old line removed and every new line added: a diff as valid, never minimal (found by
review: two 40,000-line files of repeated lines took 30 s to diff, in the shielded apply
step and in ``evolane diff``, and a tree can hold hundreds of them; at 1 << 28 two
16,384-line files still took 33 s)."""


def unified_tree_diff(
    store: BlobStore, old_ref: ArtifactRef | str, new_ref: ArtifactRef | str
) -> bytes:
    """A unified diff (``a/<path>`` -> ``b/<path>``) of every differing file; binaries named."""
    old, new = load_manifest(store, old_ref), load_manifest(store, new_ref)
    out: list[str] = []
    budget = [MAX_DIFF_LINE_PAIRS]
    for path in sorted(old.keys() | new.keys()):
        before, after = old.get(path), new.get(path)
        if before != after:
            out.extend(_file_diff(store, path, before, after, budget))
    return "".join(out).encode("utf-8")


_Entry = FileEntry | SymlinkEntry | None


def _file_diff(
    store: BlobStore, path: str, before: _Entry, after: _Entry, budget: list[int]
) -> Iterator[str]:
    """One path's part of the diff; ``budget`` (one item) is the difflib work left."""
    a, b = f"a/{path}", f"b/{path}"
    for side, entry in ((a, before), (b, after)):
        if isinstance(entry, SymlinkEntry):
            yield f"Symbolic link {side} -> {entry.target}\n"
    if isinstance(before, FileEntry) and isinstance(after, FileEntry) and before.mode != after.mode:
        yield f"Mode of {path} changed from {before.mode:o} to {after.mode:o}\n"
    old_text, new_text = _text_of(store, before), _text_of(store, after)
    if old_text is None or new_text is None:
        if _digest(before) != _digest(after):  # not a mode-only change
            yield f"Binary files {a} and {b} differ\n"
        return
    if old_text == new_text:
        if before is None and isinstance(after, FileEntry):
            yield f"Empty file added: {b}\n"
        elif after is None and isinstance(before, FileEntry):
            yield f"Empty file removed: {a}\n"
        return
    old_lines, new_lines = _lines(old_text), _lines(new_text)
    pairs = len(old_lines) * len(new_lines)
    if pairs <= budget[0]:
        budget[0] -= pairs
        lines = difflib.unified_diff(old_lines, new_lines, a, b)
    else:
        lines = _whole(old_lines, new_lines, a, b)
    for line in lines:
        yield line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"


def _whole(old: list[str], new: list[str], a: str, b: str) -> Iterator[str]:
    """A unified diff of one hunk that removes every old line and adds every new one."""
    yield f"--- {a}\n"
    yield f"+++ {b}\n"
    yield f"@@ -{_range(len(old))} +{_range(len(new))} @@\n"
    yield from ("-" + line for line in old)
    yield from ("+" + line for line in new)


def _range(count: int) -> str:
    """A hunk's range over a whole file of ``count`` lines, as difflib writes it."""
    return "1" if count == 1 else f"{1 if count else 0},{count}"


def _digest(entry: _Entry) -> str | None:
    return entry.digest if isinstance(entry, FileEntry) else None


def _text_of(store: BlobStore, entry: _Entry) -> str | None:
    """A file's text; "" for no file or a symlink; None for binary or oversized content."""
    if not isinstance(entry, FileEntry):
        return ""
    if entry.size > MAX_DIFF_FILE_BYTES:
        return None
    data = store.read_bytes(entry.ref)
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _lines(text: str) -> list[str]:
    """Split on newlines only (``str.splitlines`` also splits on form feeds and others)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines
