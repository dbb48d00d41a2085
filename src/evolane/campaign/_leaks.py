"""Evaluation cases the target itself holds, refused before a campaign's seed is stored.

The optimizer edits a copy of the target and every replay runs one, so a val or test case
kept anywhere in it (a copy of the dataset left behind once the dataset was moved out, a
fixtures file, few-shot examples pasted from val) hands a candidate the answers the gate
and the confirmation judge: "accepted" would mean "read the answers". A refusal names the
file, the line and the case (`InputError`, exit 2). Train cases are the optimizer's to
see and are left alone.

What is recognised: a JSON object, on one line (JSONL, or a line of any text file, with
whatever comes before its ``{`` and after its ``}`` on that line: a list's comma, code) or
anywhere in a file that is one JSON document, holding a val or test case's ``input`` and
its ``expected_output`` (both absent or both equal), whatever its other keys; and a file
whose bytes are a ``--from-trajectory`` file's. Rows rewritten in another format (CSV,
YAML, a Python dict's repr, prose) are not.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from evolane.campaign._target import tree_root
from evolane.campaign._vcs import VCS_FOLDERS
from evolane.inputs import Dataset, InputError, quote
from evolane.store import (
    NotRegularFileError,
    TreeLimitError,
    UnsupportedEntryError,
    open_regular_file,
    read_at_most,
    scan_tree,
)

MAX_DOCUMENT_BYTES = 64 * 1024 * 1024
"""A file read whole as one JSON document at most (a larger one is checked line by line)."""
BLOCK_BYTES = 16 * 1024 * 1024
"""Bytes of a file read at a time when its lines are checked (a dataset line's own cap)."""
MAX_OBJECTS = 1_000_000
"""JSON values of one document parsed and walked at most: a document that may hold more
(by its commas, braces and brackets) is checked line by line only. Parsed, each value is a
Python object: 60 MiB of ``{},`` took 2 GiB (found by review)."""
_DOCUMENT = re.compile(rb"\s*[\[{]")
_BOM = b"\xef\xbb\xbf"
"""The UTF-8 byte order mark a Windows tool may start a JSON file with (orjson refuses it)."""
_ROW_LINE = re.compile(rb'^[^\n{]*\{[^\n]*"input"[^\n]*$', re.MULTILINE)
"""A line that may hold a row: its object is from its first ``{`` to its last ``}`` (a row
pasted into a list keeps its comma, into code its ``x = `` and ``;``: found by review)."""
_HELD_OUT = ("val", "test")
_NEWLINE = b"\n"
_BLANK = "blank"
"""`_sha256`'s digest of a file of whitespace only: it holds no session, and a target's
empty ``__init__.py`` or ``.gitkeep`` is no copy of an empty session log (found by review:
an empty file among the trajectories refused every target holding one)."""


@dataclass(frozen=True)
class _Held:
    """A val or test case: its split, id and whether it has an expected output."""

    split: str
    id: str
    answered: bool = True


def check_target_holds_no_cases(target: Path, dataset: Dataset) -> None:
    """`InputError` when a file of ``target`` (a folder, or one file) holds a val or test
    case of ``dataset`` (see the module)."""
    keys = _held_out_keys(dataset)
    if not keys:
        return
    for relative, path, size in _target_files(target):
        found = _found_in_file(path, size, keys)
        if not found:
            continue
        line, held = found[0]
        where = relative if line is None else f"{relative}:{line}"
        more = len({case for _, case in found}) - 1
        others = f" (and {more} more val/test case{'s' if more != 1 else ''})" if more > 0 else ""
        what = "its input and expected output" if held.answered else "its input"
        raise InputError(
            f"--target {target}: {where} holds {held.split} case {quote(held.id)}: {what}"
            f"{others}; every candidate gets a copy of the target, so the gate and the "
            "confirmation would judge answers it can read: remove them (train cases may stay)"
        )


def check_target_copies_no_trajectory(target: Path, trajectories: Sequence[str]) -> None:
    """`InputError` when a file of ``target`` is a copy of one of the ``trajectories`` files
    (its bytes: a copy under any name), checked before anything of them is stored."""
    copies: dict[tuple[int, str], str] = {}
    for path in trajectories:
        digest = _sha256(path, follow=True)
        if digest is not None and digest[1] != _BLANK:
            copies.setdefault(digest, path)
    sizes = {size for size, _ in copies}
    for relative, path, size in _target_files(target):
        digest = _sha256(path) if size in sizes else None
        copied = copies.get(digest) if digest is not None else None
        if copied is not None:
            raise InputError(
                f"--target {target}: {relative} is a copy of --from-trajectory {copied}: every "
                "candidate would carry the sessions its cases come from; remove it from the target"
            )


def _sha256(path: str, *, follow: bool = False) -> tuple[int, str] | None:
    """A regular file's size and sha256, read in blocks (None when it cannot be read: the
    snapshot or ingestion that follows says what is wrong with it). A file of whitespace
    only has the digest `_BLANK`, whatever its bytes."""
    hasher, size, blank = hashlib.sha256(), 0, True
    try:
        with open_regular_file(path, follow_symlinks=follow) as handle:
            while chunk := handle.read(1 << 20):
                hasher.update(chunk)
                size += len(chunk)
                blank = blank and not chunk.strip()
    except (OSError, NotRegularFileError):  # a FIFO or socket is never waited on
        return None
    return size, _BLANK if blank else hasher.hexdigest()


def _held_out_keys(dataset: Dataset) -> dict[bytes, _Held]:
    """Each val and test case by `_key` of its input and expected output."""
    keys: dict[bytes, _Held] = {}
    for split in _HELD_OUT:
        for case in dataset.split(split):
            key = _key(case.input, case.expected_output)
            if key is not None:
                keys.setdefault(key, _Held(split, case.id, case.expected_output is not None))
    return keys


def _key(value: Any, expected: Any) -> bytes | None:
    """The canonical JSON of an input and its expected output (None: cannot be written)."""
    try:
        return orjson.dumps([value, expected], option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):
        return None


def _target_files(target: Path) -> Iterator[tuple[str, str, int]]:
    """(name shown, path, size) of each regular file of the target, as its snapshot walks
    it (VCS metadata left out; a symlink target's version folder)."""
    with contextlib.suppress(InputError):  # a bad link is refused, in its own words, later
        target = tree_root(target)
    if not target.is_dir():
        with contextlib.suppress(OSError):
            if target.is_file():
                yield target.name, str(target), target.stat().st_size
        return
    try:
        scan = scan_tree(target, skip=VCS_FOLDERS)
    except (OSError, ValueError, UnsupportedEntryError, TreeLimitError):
        return  # the snapshot that follows refuses it, in its own words
    for entry in scan.entries:
        if entry.kind == "file":
            yield entry.relative, entry.path, entry.size


def _found_in_file(
    path: str, size: int, keys: dict[bytes, _Held]
) -> list[tuple[int | None, _Held]]:
    """The held-out cases of one file with their lines: found on its lines (read in blocks,
    so memory stays bounded), else in the file read as one JSON document."""
    found: list[tuple[int | None, _Held]] = []
    try:
        with open_regular_file(path) as handle:
            line = 1
            for block in _blocks(handle, size):
                counted = 0  # the newlines before ``counted`` are in ``line``
                for match in _ROW_LINE.finditer(block):
                    line += block.count(_NEWLINE, counted, match.start())
                    counted = match.start()
                    row = match.group()
                    row = row[row.find(b"{") : row.rfind(b"}") + 1]
                    found += [(line, held) for held in _cases_in(row, keys)]
                line += block.count(_NEWLINE, counted)
            if found or size > MAX_DOCUMENT_BYTES:
                return found
            handle.seek(0)
            data = read_at_most(handle, MAX_DOCUMENT_BYTES).removeprefix(_BOM)
    except (OSError, NotRegularFileError):
        return found  # the snapshot that follows says what is wrong with it
    if _DOCUMENT.match(data) and b'"input"' in data and _values(data) <= MAX_OBJECTS:
        found += [(None, held) for held in _cases_in(data, keys)]
    return found


def _values(data: bytes) -> int:
    """At least as many as the JSON values of the document ``data`` (one per comma, brace
    and bracket, those in strings too)."""
    return data.count(b",") + data.count(b"{") + data.count(b"[") + 1


def _blocks(handle: BinaryIO, size: int) -> Iterator[bytes]:
    """The file's first ``size`` bytes (its size when walked: what is appended since is not
    read) in blocks of whole lines; a line longer than `BLOCK_BYTES` is cut."""
    rest, left = b"", size
    while left > 0 and (chunk := handle.read(min(BLOCK_BYTES, left))):
        left -= len(chunk)
        block = rest + chunk
        end = block.rfind(_NEWLINE) + 1
        if end == 0 and len(block) < BLOCK_BYTES:
            rest = block
            continue
        end = end or len(block)
        rest = block[end:]
        yield block[:end]
    if rest:
        yield rest


def _cases_in(text: bytes, keys: dict[bytes, _Held]) -> Iterator[_Held]:
    """Every held-out case among the objects of ``text`` (walked iteratively, capped)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return
    pending, walked = [value], 0
    while pending and walked < MAX_OBJECTS:
        item = pending.pop()
        walked += 1
        if isinstance(item, dict):
            if "input" in item:
                key = _key(item["input"], item.get("expected_output"))
                held = keys.get(key) if key is not None else None
                if held is not None:
                    yield held
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(reversed(item))
