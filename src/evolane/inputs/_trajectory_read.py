"""Reading trajectory files: paths and folders (walked iteratively, with a cap) into records.

Reads are bounded as a dataset's are (`MAX_FILE_BYTES` per file, `MAX_LINE_BYTES` per line,
`MAX_TRAJECTORY_BYTES` in all) and by `MAX_TRAJECTORY_RECORDS` records in all; a bad line
is a `DatasetError` ``file:line: reason``. Each line is validated as a `TrajectoryRecord`
and kept as a compact `Entry` (~0.3 KB for a tiny record), the model and the JSON dropped.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Iterator

import orjson
from pydantic import ValidationError

from evolane.inputs._dataset import (
    _BOM,
    MAX_FILE_BYTES,
    MAX_LINE_BYTES,
    _describe,
    _fail,
    _invalid_json,
    _json_kind,
    _read_bounded,
    _size,
)
from evolane.inputs._errors import DatasetError
from evolane.inputs._trajectory_entry import Entry, entry_of
from evolane.inputs._trajectory_records import TrajectoryRecord

MAX_TRAJECTORY_FILES = 10_000
"""A walk that finds more trajectory files than this is refused."""
MAX_TRAJECTORY_BYTES = 1024 * 1024 * 1024
"""Trajectory files larger than this in all are refused."""
MAX_WALK_ENTRIES = 200_000
"""A walk that looks at more folder entries than this is refused."""
MAX_TRAJECTORY_RECORDS = 1_000_000
"""Trajectory records (non-blank lines) beyond this many in all are refused at the first
one over, by file:line, before any line is parsed: this many tiny records peak at 0.75-
1.3 GiB of memory (README, "Trajectory files")."""
MAX_FIELD_PATH_CHARS = 80
"""A bad field's dotted path (``messages.0.content``) longer than this is cut in the error."""
TRAJECTORY_SUFFIXES = (".jsonl", ".ndjson")
_NOT_SPACE = re.compile(rb"[^ \t\r\n]")
"""The files a folder walk reads (a file named on its own is read whatever its name)."""


def trajectory_files(
    paths: Iterable[str | os.PathLike[str]], *, max_files: int = MAX_TRAJECTORY_FILES
) -> list[str]:
    """The files named by ``paths``: a file (or a pipe: ``/dev/stdin``, ``<(zcat ...)``) as
    given, a folder's ``*.jsonl``/``*.ndjson`` files (walked iteratively, sorted, symlinked
    folders not followed), each file once however often it is named (a file given twice,
    or a folder and a file in it, was read twice and refused as its own turns again:
    found by review); `DatasetError` for a missing path or one of another kind (a device),
    an empty result or more than ``max_files``."""
    paths = list(paths)
    found: list[str] = []
    known: set[tuple[int, int]] = set()
    seen = 0
    for given in paths:
        shown = os.fspath(given)
        info = _stat(shown)
        mode = info.st_mode
        if stat.S_ISREG(mode) or stat.S_ISFIFO(mode):
            _add(found, known, shown, info)
        elif stat.S_ISDIR(mode):
            stack = [shown]
            while stack:
                folder = stack.pop()
                try:
                    entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
                except OSError as error:
                    _fail(folder, None, f"cannot list: {error.strerror or error}")
                seen += len(entries)
                if seen > MAX_WALK_ENTRIES:
                    _fail(shown, None, f"more than {MAX_WALK_ENTRIES} entries under it")
                folders = []
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(entry.path)
                    elif entry.name.endswith(TRAJECTORY_SUFFIXES) and entry.is_file():
                        _add(found, known, entry.path, _stat(entry.path))
                stack.extend(reversed(folders))
        else:
            _fail(shown, None, "not a file, a pipe or a folder")
        if len(found) > max_files:
            _fail(shown, None, f"more than {max_files} trajectory files")
    if not found:
        _fail(", ".join(os.fspath(p) for p in paths) or "<no paths>", None, "no trajectory files")
    return found


def _stat(path: str) -> os.stat_result:
    """The status of the file ``path`` names (symlinks followed); `DatasetError` when it
    cannot be had (the path was said to be missing whatever the reason: found by review)."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        _fail(path, None, "no such file or directory")
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        _fail(path, None, f"cannot read: {reason[:1].lower()}{reason[1:]}")


def _add(found: list[str], known: set[tuple[int, int]], path: str, info: os.stat_result) -> None:
    """Add ``path`` to ``found`` unless the file it names (``info``) is there already."""
    if (info.st_dev, info.st_ino) not in known:
        known.add((info.st_dev, info.st_ino))
        found.append(path)


def read_trajectories(
    paths: Iterable[str | os.PathLike[str]],
    *,
    max_file_bytes: int = MAX_FILE_BYTES,
    max_line_bytes: int = MAX_LINE_BYTES,
    max_total_bytes: int = MAX_TRAJECTORY_BYTES,
    max_records: int | None = None,
) -> list[Entry]:
    """Every record of the trajectory files under ``paths``, in file and line order; the
    first bad line raises `DatasetError` ``file:line: reason``, as does the first record
    past ``max_records`` (`MAX_TRAJECTORY_RECORDS` when None) in all."""
    limit = MAX_TRAJECTORY_RECORDS if max_records is None else max_records
    records: list[Entry] = []
    shared: dict[str, str] = {}
    total = 0
    for path in trajectory_files(paths):
        data = _read_bounded(path, max_file_bytes)
        total += len(data)
        if total > max_total_bytes:
            _fail(path, None, f"trajectory files are over the {_size(max_total_bytes)} limit")
        records.extend(
            parse_trajectory(
                data,
                path=shown_path(path),
                max_line_bytes=max_line_bytes,
                max_records=limit,
                before=len(records),
                shared=shared,
            )
        )
        del data
    return records


def shown_path(path: str) -> str:
    """``path`` as text that JSON can hold: a name's bytes that are not UTF-8 (read by
    Python as lone surrogates) become ``\\xff`` escapes. A file named so in a folder broke
    ingestion with a traceback: its name, in each case's ``source``, could not be written
    (found by review)."""
    try:
        raw = path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no file system name decodes to
        raw = path.encode("utf-8", "backslashreplace")
    return raw.decode("utf-8", "backslashreplace")


def parse_trajectory(
    data: bytes,
    *,
    path: str = "<trajectory>",
    max_line_bytes: int = MAX_LINE_BYTES,
    max_records: int | None = None,
    before: int = 0,
    shared: dict[str, str] | None = None,
) -> list[Entry]:
    """The records of trajectory JSONL ``data`` (blank lines skipped); bad lines raise, and
    so does the record past ``max_records`` (`MAX_TRAJECTORY_RECORDS` when None) counting
    ``before`` records read earlier, found before any line is parsed. ``shared`` maps each
    session id and target to one string object (across files too, when given)."""
    limit = MAX_TRAJECTORY_RECORDS if max_records is None else max_records
    start = len(_BOM) if data.startswith(_BOM) else 0
    if before + data.count(b"\n", start) + 1 > limit:  # maybe over: count the records
        _refuse_past(data, start, path, before, limit)
    shared = {} if shared is None else shared
    records: list[Entry] = []
    for number, first, end in _record_spans(data, start):
        if end - first > max_line_bytes:
            _fail(
                path, number, f"line is {end - first} bytes, over the {_size(max_line_bytes)} limit"
            )
        line = data[first:end]
        records.append(entry_of(_parse_line(line, path, number), path, number, shared))
    return records


def _record_spans(data: bytes, start: int) -> Iterator[tuple[int, int, int]]:
    """``(line number, start, end)`` of every non-blank line of ``data`` from ``start`` (the
    newline excluded). Blank lines are passed over in bulk, not one by one: 32 MiB of
    newlines took 30 s, one line at a time (found by review)."""
    number, counted, where = 1, start, start
    while (found := _NOT_SPACE.search(data, where)) is not None:
        first = max(data.rfind(b"\n", start, found.start()) + 1, start)
        number += data.count(b"\n", counted, first)
        counted = first
        end = data.find(b"\n", found.start())
        end = len(data) if end < 0 else end
        yield number, first, end
        where = end + 1


def _refuse_past(data: bytes, start: int, path: str, seen: int, limit: int) -> None:
    """Raise `DatasetError` at the line of the record (non-blank line) past ``limit``, if
    ``data`` has one (``seen`` records were read before it)."""
    for number, _, _ in _record_spans(data, start):
        seen += 1
        if seen > limit:
            _fail(
                path,
                number,
                f"more than {limit:,} trajectory records in all "
                "(the limit: give fewer files, or split them across runs)",
            )


def _parse_line(line: bytes, path: str, number: int) -> TrajectoryRecord:
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        _fail(path, number, _invalid_json(line, error))
    if not isinstance(row, dict):
        _fail(path, number, f"a record must be a JSON object, got {_json_kind(row)}")
    try:
        return TrajectoryRecord.model_validate(row)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        if not first["loc"]:
            reason = str(first["msg"]).removeprefix("Value error, ")
            raise DatasetError.at(path, number, reason) from None
        if first["type"] == "extra_forbidden":
            allowed = ", ".join(TrajectoryRecord.model_fields)
            raise DatasetError.at(
                path, number, f"unknown key {str(first['loc'][0])!r} (allowed: {allowed})"
            ) from None
        where = ".".join(str(part) for part in first["loc"])
        if len(where) > MAX_FIELD_PATH_CHARS:  # deep nesting: ~1.6 KB of path (review)
            where = where[: MAX_FIELD_PATH_CHARS - 3] + "..."
        reason = _describe(error).split(": ", 1)[-1]
        raise DatasetError.at(path, number, f"field {where!r}: {reason}") from None
