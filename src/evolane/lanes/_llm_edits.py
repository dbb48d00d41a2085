"""Edits in a model's answer, parsed and applied inside a workdir only.

The format (told to the model by `EDIT_FORMAT`), each marker a whole line:

    SUMMARY: one line saying what changed
    === FILE: path/inside/the/folder ===
    the whole new content of the file
    === END FILE ===
    === EDIT: path/inside/the/folder ===
    <<<<<<< SEARCH
    lines exactly as they are now
    =======
    the lines to put in their place
    >>>>>>> REPLACE
    === END EDIT ===

An EDIT holds one or more SEARCH/REPLACE blocks; the search text must match whole lines,
exactly once. Text outside the blocks is ignored (the summary is the ``SUMMARY:`` line).
A FILE block's content is taken verbatim (it cannot hold its own end marker line). An answer
holds at most `MAX_EDITS` edits.

Applying is all or none: every edit is checked and computed first, against the disk and
against the tree the whole batch makes, and one that cannot apply (path outside the folder,
through or onto a symlink, a binary file, search text missing or ambiguous, a path that is a
file of one edit and a folder of another) raises `EditError` naming it, with nothing written.
A write that still fails (the disk) is undone: replaced files get their old bytes and mode
back, created files and folders are removed. Edits apply in order, so later edits see earlier
ones. Error messages name paths relative to the folder only.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

from evolane.store import BlobTooLargeError, StoreError, read_regular_file, write_bytes_atomic

MAX_EDIT_FILE_BYTES = 1 << 20
"""The largest file an edit may read (a larger one is refused, not cut)."""
MAX_PATH_CHARS = 512
MAX_EDITS = 256
"""The most edits (whole files and search/replace blocks) one answer may hold: each is a
write with two fsyncs or a scan of a file, in a thread no deadline can cut (found by review:
a 0.5 MB answer of 12,000 one-line files held a 5 s optimizer call for 49 s; the 16 MiB an
answer may be, some 400,000 files, for a quarter of an hour)."""
MAX_BACKUP_BYTES = 64 << 20
"""The largest file a whole-file edit may replace (its old bytes are kept to undo)."""

EDIT_FORMAT = """Answer with edits in exactly this format (each marker alone on its line):

SUMMARY: one line saying what you changed and why
=== FILE: relative/path ===
the complete new content of a file (a new file, or a whole rewrite)
=== END FILE ===
=== EDIT: relative/path ===
<<<<<<< SEARCH
lines copied exactly from the current file (whole lines, found exactly once)
=======
the lines that replace them
>>>>>>> REPLACE
=== END EDIT ===

An EDIT may hold several SEARCH/REPLACE blocks. Paths are relative to the folder you edit,
with no "..". Do not wrap the blocks in code fences. Text outside the blocks is ignored."""


class EditError(ValueError):
    """An answer whose edits cannot be parsed or applied; the message names the edit."""


@dataclass(frozen=True)
class Edit:
    """One edit: a whole file (``kind="file"``: ``content``) or one search/replace."""

    index: int  # 1-based, in the answer's order
    path: str
    kind: Literal["file", "replace"]
    content: str = ""
    search: str = ""
    replace: str = ""

    @property
    def name(self) -> str:
        what = "whole file" if self.kind == "file" else "search/replace"
        return f"edit {self.index} ({what} {self.path!r})"


def check_path(path: str) -> PurePosixPath:
    """``path`` as a relative path inside the folder, or `ValueError` saying why not."""
    if not path or len(path) > MAX_PATH_CHARS:
        raise ValueError("an empty or overlong path")
    if "\x00" in path or "\\" in path:
        raise ValueError("a NUL or backslash in the path")
    pure = PurePosixPath(path)
    if pure.is_absolute():
        raise ValueError("an absolute path")
    parts = [part for part in pure.parts if part != "."]
    if not parts:
        raise ValueError("the folder itself is not a file")
    if ".." in parts:
        raise ValueError("a '..' in the path")
    return PurePosixPath(*parts)


def _header(line: str, tag: str) -> str | None:
    prefix, suffix = f"=== {tag}: ", " ==="
    if line.startswith(prefix) and line.endswith(suffix) and len(line) > len(prefix + suffix):
        return line[len(prefix) : -len(suffix)].strip()
    return None


def parse_edits(answer: str) -> tuple[str, list[Edit]]:
    """The summary line and the edits of ``answer``; `EditError` for a block that is not
    closed, a malformed SEARCH/REPLACE or a path that is not inside the folder."""
    lines = answer.replace("\r\n", "\n").split("\n")
    summary, edits, at = "", [], 0
    while at < len(lines):
        line = lines[at]
        file_path, edit_path = _header(line, "FILE"), _header(line, "EDIT")
        if file_path is not None:
            body, at = _until(lines, at + 1, "=== END FILE ===", len(edits) + 1, file_path)
            content = "\n".join(body) + "\n" if body else ""
            edits.append(_checked(Edit(len(edits) + 1, file_path, "file", content=content)))
        elif edit_path is not None:
            body, at = _until(lines, at + 1, "=== END EDIT ===", len(edits) + 1, edit_path)
            for search, replace in _blocks(body, len(edits) + 1, edit_path):
                edit = Edit(len(edits) + 1, edit_path, "replace", search=search, replace=replace)
                edits.append(_checked(edit))
        elif line.startswith("SUMMARY:") and not summary:
            summary = line[len("SUMMARY:") :].strip()
        if len(edits) > MAX_EDITS:
            raise EditError(
                f"{edits[MAX_EDITS].name} is refused: an answer holds at most {MAX_EDITS} edits"
            )
        at += 1
    return summary[:200], edits


def _until(lines: list[str], start: int, end: str, index: int, path: str) -> tuple[list[str], int]:
    for at in range(start, len(lines)):
        if lines[at] == end:
            return lines[start:at], at
    raise EditError(f"edit {index} ({path!r}) has no '{end}' line")


def _blocks(body: list[str], index: int, path: str) -> list[tuple[str, str]]:
    """The SEARCH/REPLACE pairs of one EDIT block's lines."""
    pairs: list[tuple[str, str]] = []
    at = 0
    while at < len(body):
        if not body[at].strip():
            at += 1
            continue
        name = f"edit {index + len(pairs)} (search/replace {path!r})"
        if body[at] != "<<<<<<< SEARCH":
            raise EditError(f"{name}: expected '<<<<<<< SEARCH', found {body[at][:80]!r}")
        try:
            middle = body.index("=======", at + 1)
            end = body.index(">>>>>>> REPLACE", middle + 1)
        except ValueError:
            why = "a SEARCH block without '=======' and '>>>>>>> REPLACE'"
            raise EditError(f"{name}: {why}") from None
        search, replace = body[at + 1 : middle], body[middle + 1 : end]
        if not search:
            raise EditError(f"{name}: the search text is empty (write a whole FILE instead)")
        pairs.append(("\n".join(search), "\n".join(replace)))
        at = end + 1
    if not pairs:
        raise EditError(f"edit {index} ({path!r}) holds no SEARCH/REPLACE block")
    return pairs


def _checked(edit: Edit) -> Edit:
    try:
        path = check_path(edit.path)
    except ValueError as error:
        raise EditError(f"{edit.name} is refused: {error}") from None
    return Edit(edit.index, str(path), edit.kind, edit.content, edit.search, edit.replace)


def _replace_once(text: str, search: str, replace: str) -> str:
    """``text`` with the one whole-line occurrence of ``search`` replaced; `ValueError`
    when there is none or more than one. Linear in the sizes: a whole-line match is an
    occurrence of ``search`` framed by newlines in ``text`` framed by newlines, and the
    search stops at the second (found by review: a search tried at every place it occurs
    within lines was quadratic, some 5 minutes for a 1 MiB file, in a thread no deadline
    cuts)."""
    framed, needle = f"\n{text}\n", f"\n{search}\n"
    at = framed.find(needle)
    if at < 0:
        raise ValueError("the search text is not in the file (it must match whole lines)")
    if framed.find(needle, at + 1) >= 0:
        raise ValueError("the search text is found more than once (it must be unique)")
    return text[:at] + replace + text[at + len(search) :]


def _target(root: Path, relative: str) -> tuple[Path, int | None]:
    """The file at ``relative`` under ``root`` and its mode (None: absent); `ValueError` when
    a folder on the way is a symlink or not a folder, or the target is not a regular file."""
    path = root
    parts = PurePosixPath(relative).parts
    for part in parts[:-1]:
        path = path / part
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return root / relative, None
        if stat.S_ISLNK(info.st_mode):
            raise ValueError(f"the path goes through a symlink ({path.relative_to(root)})")
        if not stat.S_ISDIR(info.st_mode):
            raise ValueError(f"{path.relative_to(root)} is not a folder")
    path = root / relative
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path, None
    if stat.S_ISLNK(info.st_mode):
        raise ValueError("the target is a symlink")
    if not stat.S_ISREG(info.st_mode):
        raise ValueError("the target is not a regular file")
    return path, stat.S_IMODE(info.st_mode)


@dataclass
class _Pending:
    """One file the batch writes: where, its new text, and what was there (None: absent)."""

    path: Path
    text: str
    mode: int | None
    old: bytes | None
    edit: Edit  # the first edit of the file


@dataclass
class _Batch:
    """The edits computed so far, as the tree they make (checked before anything is written)."""

    workdir: Path
    files: dict[str, _Pending] = field(default_factory=dict)
    folders: dict[str, Edit] = field(default_factory=dict)
    """Every folder on the way to a file of the batch, and the first edit that needs it."""

    def add(self, edit: Edit) -> None:
        """Compute ``edit`` onto the batch; `ValueError` or `OSError` when it cannot apply."""
        relative = str(check_path(edit.path))
        entry = self.files.get(relative)
        if entry is None:
            self._check_tree(edit, relative)
            path, mode = _target(self.workdir, relative)
            old = _read_bytes(path, MAX_BACKUP_BYTES) if mode is not None else None
            text = _decode(old) if old is not None and edit.kind == "replace" else None
            entry = _Pending(path, "", mode, old, edit)
        else:
            text = entry.text
        if edit.kind == "file":
            text = edit.content
        elif text is None:
            raise ValueError("the file does not exist (write a whole FILE to create it)")
        else:
            text = _replace_once(text, edit.search, edit.replace)
        entry.text = text
        if relative not in self.files:
            self.files[relative] = entry
            for parent in PurePosixPath(relative).parents:
                if str(parent) != ".":
                    self.folders.setdefault(str(parent), edit)

    def _check_tree(self, edit: Edit, relative: str) -> None:
        """A new file of the batch may be neither a folder of another edit's file nor inside
        one of its files."""
        if relative in self.folders:
            other = self.folders[relative]
            raise ValueError(f"{relative!r} is a folder of {other.name}, not a file")
        for parent in PurePosixPath(relative).parents:
            if str(parent) in self.files:
                other = self.files[str(parent)].edit
                raise ValueError(f"{str(parent)!r} is a file written by {other.name}")


def _read_bytes(path: Path, limit: int) -> bytes:
    try:
        return read_regular_file(path, limit)
    except BlobTooLargeError:
        raise ValueError(f"the file is over {limit} bytes") from None
    except StoreError:
        raise ValueError("the file cannot be read (not a regular file)") from None


def _decode(data: bytes) -> str:
    if len(data) > MAX_EDIT_FILE_BYTES:
        raise ValueError(f"the file is over {MAX_EDIT_FILE_BYTES} bytes")
    if b"\x00" in data:
        raise ValueError("the file is binary (it holds NUL bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the file is binary (not UTF-8)") from None


def _why(error: Exception) -> str:
    """An error's reason without the absolute paths an `OSError` carries."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error)


def apply_edits(workdir: Path, edits: list[Edit]) -> list[str]:
    """Apply ``edits`` inside ``workdir``: all of them or, when one cannot apply, none
    (`EditError` naming it; a failed write undoes the others). Returns the paths written,
    in order."""
    batch = _Batch(workdir)
    for edit in edits:
        try:
            batch.add(edit)
        except (ValueError, OSError) as error:
            raise EditError(f"{edit.name} cannot apply: {_why(error)}") from None
    done: list[tuple[str, _Pending]] = []
    created: list[Path] = []  # folders made, outermost first
    for relative, entry in batch.files.items():
        try:
            created += _make_folders(workdir, PurePosixPath(relative).parent)
            done.append((relative, entry))
            write_bytes_atomic(entry.path, entry.text.encode())
            if entry.mode is not None:
                os.chmod(entry.path, entry.mode)
        except OSError as error:
            _undo(done, created)
            why = f"writing {relative!r} failed: {_why(error)}; nothing was applied"
            raise EditError(f"{entry.edit.name} cannot apply: {why}") from None
    return list(batch.files)


def _make_folders(workdir: Path, relative: PurePosixPath) -> list[Path]:
    """Make the missing folders of ``relative`` under ``workdir``; those made, outermost first."""
    made, path = [], workdir
    for part in relative.parts:
        path = path / part
        if not os.path.lexists(path):
            os.mkdir(path)
            made.append(path)
    return made


def _undo(done: list[tuple[str, _Pending]], created: list[Path]) -> None:
    """Best effort: put back the old bytes and mode of replaced files, remove created files
    and folders."""
    for _, entry in reversed(done):
        with contextlib.suppress(OSError):
            if entry.old is None:
                entry.path.unlink(missing_ok=True)
            else:
                write_bytes_atomic(entry.path, entry.old)
                if entry.mode is not None:
                    os.chmod(entry.path, entry.mode)
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            folder.rmdir()
