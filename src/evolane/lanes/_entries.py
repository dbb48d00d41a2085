"""The `disallowed_entries` gate: an optimizer's workdir may hold only plain files and folders.

The walk never follows a symlink. Refused: symlinks (except those the parent tree already had,
unchanged: the candidate inherits them), devices, FIFOs, sockets, names that are
not valid UTF-8 or hold a line break, mount points (another filesystem under the root),
hard-linked files (their inode may be shared with a file outside the root) and folders or
files that cannot be read (a non-root evolane's optimizer may chmod its own files 000: found
by review, such a file was an infrastructure ``snapshot_failed`` of the slot, not the
candidate's refused edit). Any of these could reach outside the root or break a snapshot of
the tree.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from evolane.messages import LocalGateResult

MAX_PATHS = 4
_SHORT = 256


def _display(relative: str) -> str:
    """A printable, bounded form of a relative path (bad bytes and line breaks escaped)."""
    raw = os.fsencode(relative)
    text = raw.decode("utf-8", "backslashreplace")
    text = text.replace("\n", "\\n").replace("\r", "\\r")
    return text[:_SHORT]


def _bad_name(name: str) -> str | None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "name is not UTF-8"
    if "\n" in name or "\r" in name:
        return "name holds a line break"
    return None


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"


def _offences(
    root: Path, kept_links: Mapping[str, str], max_entries: int | None
) -> list[tuple[str, str]]:
    """Every offending entry under ``root`` as (relative path, why), in sorted walk order;
    past ``max_entries`` entries the walk stops with one more offence saying so."""
    found: list[tuple[str, str]] = []
    try:
        info = os.lstat(root)
    except OSError as error:
        return [(".", f"cannot read the workdir: {error.strerror}")]
    if not stat.S_ISDIR(info.st_mode):
        return [(".", f"the workdir itself is a {_kind(info.st_mode)}")]
    root_dev = info.st_dev
    pending = [("", root)]
    seen = 0
    while pending:
        prefix, folder = pending.pop()
        try:
            with os.scandir(folder) as scan:
                children = sorted(scan, key=lambda child: os.fsencode(child.name))
        except OSError as error:
            found.append((prefix or ".", f"cannot read the folder: {error.strerror}"))
            continue
        below = []
        seen += len(children)
        if max_entries is not None and seen > max_entries:
            found.append((prefix or ".", f"over {max_entries} entries in the tree"))
            return found
        for child in children:
            relative = f"{prefix}{child.name}"
            why = _bad_name(child.name) or _entry_problem(child, root_dev)
            if why == "symlink" and _kept_link(child, kept_links.get(relative)):
                why = None
            if why is not None:
                found.append((relative, why))
            elif child.is_dir(follow_symlinks=False):
                below.append((f"{relative}/", Path(child.path)))
        pending.extend(reversed(below))
    return found


def _kept_link(child: os.DirEntry[str], parent_target: str | None) -> bool:
    """Whether this symlink is the parent tree's own, pointing where it pointed."""
    if parent_target is None:
        return False
    try:
        return os.readlink(child.path) == parent_target
    except OSError:
        return False


def _entry_problem(child: os.DirEntry[str], root_dev: int) -> str | None:
    try:
        info = child.stat(follow_symlinks=False)
    except OSError as error:
        return f"cannot stat: {error.strerror}"
    if stat.S_ISDIR(info.st_mode):
        return "a mount point (another filesystem)" if info.st_dev != root_dev else None
    if not stat.S_ISREG(info.st_mode):
        return _kind(info.st_mode)
    if info.st_nlink > 1:
        return "a hard link (its inode is shared)"
    if not info.st_mode & stat.S_IRUSR and not os.access(child.path, os.R_OK):
        return "cannot read the file: its owner may not"
    return None


def check_entries(
    directory: Path,
    kept_links: Mapping[str, str] | None = None,
    *,
    max_entries: int | None = None,
) -> LocalGateResult:
    """Gate `disallowed_entries`: ``reject`` naming up to four offending relative paths,
    else ``pass``. ``kept_links`` maps the parent tree's symlinks (relative path -> target);
    those, unchanged, pass. The walk never recurses and stops past ``max_entries`` entries
    (a reject). Blocking file I/O: call it from a thread."""
    found = _offences(Path(directory), kept_links or {}, max_entries)
    if not found:
        return LocalGateResult(gate="disallowed_entries", outcome="pass")
    first_path, first_why = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    reason = f"{_display(first_path)}: {first_why}{more}"
    return LocalGateResult(
        gate="disallowed_entries",
        outcome="reject",
        reason=reason[:_SHORT],
        paths=tuple(_display(path) for path, _ in found[:MAX_PATHS]),
    )
