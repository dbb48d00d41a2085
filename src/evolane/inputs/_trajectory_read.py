"""Reading trajectory files: paths and folders (walked iteratively, with a cap) into records.

Reads are bounded as a dataset's are (`MAX_FILE_BYTES` per file, `MAX_LINE_BYTES` per line,
`MAX_TRAJECTORY_BYTES` in all); a bad line is a `DatasetError` ``file:line: reason``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import orjson
from pydantic import ValidationError

from evolane.inputs._dataset import (
    _BOM,
    _JSON_SPACE,
    MAX_FILE_BYTES,
    MAX_LINE_BYTES,
    _describe,
    _fail,
    _json_kind,
    _line_spans,
    _read_bounded,
    _size,
    _trim_orjson,
)
from evolane.inputs._errors import DatasetError
from evolane.inputs._trajectory_records import TrajectoryRecord

MAX_TRAJECTORY_FILES = 10_000
"""A walk that finds more trajectory files than this is refused."""
MAX_TRAJECTORY_BYTES = 1024 * 1024 * 1024
"""Trajectory files larger than this in all are refused."""
MAX_WALK_ENTRIES = 200_000
"""A walk that looks at more folder entries than this is refused."""
TRAJECTORY_SUFFIXES = (".jsonl", ".ndjson")
"""The files a folder walk reads (a file named on its own is read whatever its name)."""


@dataclass(frozen=True, slots=True)
class Located:
    """A parsed record and where it came from (``path``, 1-based ``line``)."""

    record: TrajectoryRecord
    path: str
    line: int

    @property
    def where(self) -> str:
        """``path:line``."""
        return f"{self.path}:{self.line}"


def trajectory_files(
    paths: Iterable[str | os.PathLike[str]], *, max_files: int = MAX_TRAJECTORY_FILES
) -> list[str]:
    """The files named by ``paths``: a file as given, a folder's ``*.jsonl``/``*.ndjson``
    files (walked iteratively, sorted, symlinked folders not followed); `DatasetError` for a
    missing path, an empty result or more than ``max_files``."""
    paths = list(paths)
    found: list[str] = []
    seen = 0
    for given in paths:
        shown = os.fspath(given)
        if os.path.isfile(shown):
            found.append(shown)
        elif os.path.isdir(shown):
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
                        found.append(entry.path)
                stack.extend(reversed(folders))
        else:
            _fail(shown, None, "no such file or directory")
        if len(found) > max_files:
            _fail(shown, None, f"more than {max_files} trajectory files")
    if not found:
        _fail(", ".join(os.fspath(p) for p in paths) or "<no paths>", None, "no trajectory files")
    return found


def read_trajectories(
    paths: Iterable[str | os.PathLike[str]],
    *,
    max_file_bytes: int = MAX_FILE_BYTES,
    max_line_bytes: int = MAX_LINE_BYTES,
    max_total_bytes: int = MAX_TRAJECTORY_BYTES,
) -> list[Located]:
    """Every record of the trajectory files under ``paths``, in file and line order; the
    first bad line raises `DatasetError` ``file:line: reason``."""
    records: list[Located] = []
    total = 0
    for path in trajectory_files(paths):
        data = _read_bounded(path, max_file_bytes)
        total += len(data)
        if total > max_total_bytes:
            _fail(path, None, f"trajectory files are over the {_size(max_total_bytes)} limit")
        records.extend(parse_trajectory(data, path=path, max_line_bytes=max_line_bytes))
    return records


def parse_trajectory(
    data: bytes, *, path: str = "<trajectory>", max_line_bytes: int = MAX_LINE_BYTES
) -> list[Located]:
    """The records of trajectory JSONL ``data`` (blank lines skipped); bad lines raise."""
    start = len(_BOM) if data.startswith(_BOM) else 0
    records: list[Located] = []
    for number, first, end in _line_spans(data, start):
        if end - first > max_line_bytes:
            _fail(
                path, number, f"line is {end - first} bytes, over the {_size(max_line_bytes)} limit"
            )
        line = data[first:end]
        if line.strip(_JSON_SPACE):
            records.append(Located(_parse_line(line, path, number), path, number))
    return records


def _parse_line(line: bytes, path: str, number: int) -> TrajectoryRecord:
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        _fail(path, number, f"invalid JSON: {_trim_orjson(str(error))}")
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
        reason = _describe(error).split(": ", 1)[-1]
        raise DatasetError.at(path, number, f"field {where!r}: {reason}") from None
