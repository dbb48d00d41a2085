"""Bounded text views of a folder for a model: the judge's view of a replay's output and the
optimizer's view of the target. The walk is iterative and capped in files, never follows
a symlink, reads at most a few KiB of each file and skips binary content."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

SKIPPED_FOLDERS = frozenset({".git", "__pycache__", ".evolane"})


@dataclass(frozen=True)
class FileText:
    """One file's text as shown to a model (``text`` None: binary, or past the budget)."""

    path: str  # relative, POSIX
    size: int
    text: str | None
    truncated: bool = False


def _walk(root: Path, max_files: int) -> list[Path]:
    """Regular files under ``root`` (symlinks never followed), at most ``max_files``."""
    found: list[Path] = []
    pending = [root]
    while pending and len(found) < max_files:
        folder = pending.pop()
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.is_symlink():
                continue
            if entry.is_dir():
                if entry.name not in SKIPPED_FOLDERS:
                    pending.append(entry)
            elif entry.is_file() and len(found) < max_files:
                found.append(entry)
    return found


def read_head(path: Path, max_bytes: int) -> tuple[bytes, int]:
    """The first ``max_bytes`` of the regular file at ``path`` and its size; `OSError` for a
    symlink (never followed), a FIFO or device, or a file that is gone."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        chunks, left = [], max_bytes
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 16))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), info.st_size
    finally:
        os.close(fd)


def _decode(data: bytes, cut: bool) -> str | None:
    """``data`` as UTF-8 text, None when binary; a character split by the cut is dropped."""
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        if cut and error.start >= len(data) - 3:
            return data[: error.start].decode("utf-8", "replace")
        return None


def folder_texts(
    root: Path,
    *,
    max_files: int,
    max_file_bytes: int,
    max_total_bytes: int,
    first: tuple[str, ...] = (),
) -> list[FileText]:
    """The files under ``root`` in path order (names in ``first`` first): each one's text cut
    to ``max_file_bytes``, while the total stays within ``max_total_bytes``; the others are
    listed with ``text=None``."""
    paths = _walk(root, max_files)
    paths.sort(key=lambda p: (p.relative_to(root).as_posix() not in first, str(p)))
    budget, shown = max_total_bytes, []
    for path in paths:
        relative = path.relative_to(root).as_posix()
        try:
            data, size = read_head(path, max(0, min(max_file_bytes, budget)))
        except OSError:  # gone, or not a regular file any more
            continue
        cut = len(data) < size
        text = _decode(data, cut) if data or size == 0 else None
        if text is not None:
            budget -= len(text.encode())
        shown.append(FileText(relative, size, text, truncated=cut and text is not None))
    return shown


def render_texts(files: list[FileText], what: str) -> str:
    """``files`` as plain text: a header line per file, then its (possibly cut) text."""
    parts = []
    for item in files:
        if item.text is None:
            parts.append(f"--- {what}: {item.path} ({item.size} bytes, not shown) ---")
            continue
        note = f" (first {len(item.text.encode())} of {item.size} bytes)" if item.truncated else ""
        parts.append(f"--- {what}: {item.path}{note} ---\n{item.text}")
    return "\n".join(parts)
