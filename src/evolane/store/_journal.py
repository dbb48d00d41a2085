"""Append-only JSONL journals: one bounded record per line, torn tails detected and repaired.

Each record is written with a single ``os.write`` on an ``O_APPEND`` descriptor, so a crash
can only leave the *last* line partial (or, after power loss, garbage without a newline).
Readers report such a tail as `TornLine` instead of failing; a writer truncates it away
on open. Any damage before the last line is real corruption and raises.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Self

import orjson
from pydantic import BaseModel

from evolane.store._atomic import json_default
from evolane.store._blobs import (
    NotRegularFileError,
    StoreError,
    fsync_dir,
    open_regular_file,
    with_path,
)
from evolane.store._forks import close_fd, close_in_forks

MAX_RECORD_BYTES = 64 * 1024
"""Largest journal line accepted, newline included; payloads belong in the blob store."""

_HEAD_BYTES = 64
_SCAN_CHUNK = 64 * 1024


class JournalError(StoreError):
    """A journal cannot be written (record too large, locked, short write)."""


class JournalWriteError(JournalError):
    """A journal could not be written whole (a short write: a full disk), or is refused
    since one left its tail torn: the store cannot take the run's records."""


class JournalCorruptError(JournalError):
    """A journal line other than the last is not a valid JSON object, a line is longer than
    any record (`MAX_RECORD_BYTES`), or the journal is not a regular file."""


@dataclass(frozen=True, slots=True)
class TornLine:
    """A partial or unparsable final line: where it starts and how it begins."""

    line: int
    offset: int
    size: int
    head: bytes


@dataclass(frozen=True, slots=True)
class JournalRead:
    """Every whole record of a journal, plus the torn tail if there was one."""

    records: list[dict[str, Any]]
    torn: TornLine | None


def encode_record(record: BaseModel | dict[str, Any]) -> bytes:
    """One journal line (newline included) for a pydantic model or a JSON-able dict."""
    value = record.model_dump(mode="json") if isinstance(record, BaseModel) else record
    if not isinstance(value, dict):
        raise JournalError(f"a journal record must be an object, not {type(value).__name__}")
    return orjson.dumps(value, default=json_default, option=orjson.OPT_APPEND_NEWLINE)


def _parse_line(line: bytes) -> dict[str, Any] | None:
    """The record on a whole line, or None when it is not a JSON object."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def read_journal(path: Path | str) -> JournalRead:
    """Read every whole record; a bad final line is reported as torn, a bad earlier one raises
    `JournalCorruptError`. No line is held past `MAX_RECORD_BYTES` (a longer one is no
    record: the rest of it is skipped unread), and a journal that is not a regular file is
    `JournalCorruptError` (a FIFO is never waited on)."""
    records: list[dict[str, Any]] = []
    scan = scan_journal(path)
    while True:
        try:
            records.append(next(scan)[1])
        except StopIteration as end:
            return JournalRead(records=records, torn=end.value)


def torn_tail(path: Path | str) -> TornLine | None:
    """The torn final line of a journal, if any, read through a line at a time (damage
    raises as in `read_journal`; no record is kept)."""
    scan = scan_journal(path)
    while True:
        try:
            next(scan)
        except StopIteration as end:
            return end.value


def scan_journal(path: Path | str) -> Generator[tuple[int, dict[str, Any]], None, TornLine | None]:
    """Each whole record of a journal with its line number, one at a time (memory: one
    line, whatever the file's size); the generator's return value is the torn final line,
    if any. Damage as `read_journal` raises it (found by review: ``evolane fsck`` held
    every record of a 267 MB ``events.jsonl``, 1.6 GB)."""
    path = Path(path)
    try:
        source = open_regular_file(path, follow_symlinks=True)
    except FileNotFoundError:
        return None
    except NotRegularFileError as error:
        raise JournalCorruptError(str(error)) from None
    with source:
        offset, number = 0, 0
        pending: tuple[int, int, int, bytes] | None = None  # line, offset, size, head
        while line := source.readline(MAX_RECORD_BYTES + 1):
            number += 1
            if pending is not None:
                raise _corrupt(path, *pending)
            size = len(line)
            if size > MAX_RECORD_BYTES:  # no record is this long: skip the rest of it
                size += _skip_line(source)
                line = line[:_HEAD_BYTES]
            record = _parse_line(line) if line.endswith(b"\n") and size == len(line) else None
            if record is None:
                pending = (number, offset, size, line[:_HEAD_BYTES])
            else:
                yield number, record
            offset += size
    if pending is None:
        return None
    number, start, size, head = pending
    return TornLine(line=number, offset=start, size=size, head=head)


def _skip_line(source: BinaryIO) -> int:
    """Read past the rest of the current line (through its newline) a chunk at a time;
    how many bytes that was."""
    skipped = 0
    while chunk := source.readline(_SCAN_CHUNK):
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


def _corrupt(path: Path, number: int, offset: int, size: int, head: bytes) -> JournalCorruptError:
    long = f" of {size} bytes (longer than any record)" if size > MAX_RECORD_BYTES else ""
    return JournalCorruptError(
        f"{path}:{number}: corrupt journal line at byte {offset}{long} "
        f"(not the last line, so not a torn write): {head!r}"
    )


class Journal:
    """An open journal for appending; repairs a torn tail on open and holds an exclusive lock.

    The `flock` keeps a second writer (in this or another process) from appending or
    truncating concurrently; `read_journal` needs no lock.
    """

    def __init__(self, path: Path | str, *, lock: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._broken = False
        created = not self.path.exists()
        self._fd: int | None = close_in_forks(  # its lock says a run is live: not a child's
            os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        )
        try:
            if lock:
                self._lock()
            self.repaired_tear: TornLine | None = self._repair()
            if created:
                fsync_dir(self.path.parent)
        except BaseException:
            self.close()
            raise

    def _lock(self) -> None:
        assert self._fd is not None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise JournalError(f"{self.path} is already open for appending") from None
            raise

    def _repair(self) -> TornLine | None:
        """Truncate a torn or unparsable final line so new records start on a clean line."""
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size == 0:
            return None
        with self.path.open("rb") as source:
            end = _last_line_start(source, size)
            source.seek(end)
            tail = source.read(MAX_RECORD_BYTES + 1)  # a longer tail is no record: torn
            whole = len(tail) <= MAX_RECORD_BYTES and tail.endswith(b"\n")
            if whole and _parse_line(tail) is not None:
                return None
            source.seek(0)
            line_number = _count_newlines(source, end) + 1
        os.ftruncate(self._fd, end)
        os.fsync(self._fd)
        return TornLine(line=line_number, offset=end, size=size - end, head=tail[:_HEAD_BYTES])

    def append(self, record: BaseModel | dict[str, Any], *, durable: bool = False) -> None:
        """Append one record as one line; with ``durable`` it is on disk when this returns."""
        line = encode_record(record)
        if len(line) > MAX_RECORD_BYTES:
            raise JournalError(
                f"journal record of {len(line)} bytes exceeds {MAX_RECORD_BYTES}: "
                "store payloads as blobs and journal their refs"
            )
        fd = self._require_open()
        try:
            written = os.write(fd, line)
            if durable and written == len(line):
                os.fsync(fd)
        except OSError as error:
            raise with_path(error, self.path) from None
        if written != len(line):
            # The tail is now torn; refuse more appends so it stays the last line.
            self._broken = True
            raise JournalWriteError(
                f"cannot write {self.path}: a short write ({written} of {len(line)} bytes; a "
                "full disk?); reopen to repair"
            )

    def append_lines(self, lines: list[bytes], *, durable: bool = False) -> None:
        """Append already encoded lines (`encode_record`, each within `MAX_RECORD_BYTES`) in
        one write; with ``durable`` they are on disk when this returns (group commit). A crash
        can still only tear the last line on disk."""
        if not lines:
            if durable:
                self.sync()
            return
        data = b"".join(lines)
        fd = self._require_open()
        view, done = memoryview(data), 0
        try:
            while done < len(data):
                written = os.write(fd, view[done:])
                if written <= 0:
                    break
                done += written
            if durable and done == len(data):
                os.fsync(fd)
        except OSError as error:
            self._broken = done > 0  # a part of the batch may be on disk: it is the tail now
            raise with_path(error, self.path) from None
        if done != len(data):
            self._broken = True
            raise JournalWriteError(
                f"cannot write {self.path}: a short write ({done} of {len(data)} bytes; a "
                "full disk?); reopen to repair"
            )

    def sync(self) -> None:
        """Flush every record appended so far to disk (for batching non-durable appends)."""
        os.fsync(self._require_open())

    def _require_open(self) -> int:
        if self._fd is None:
            raise JournalError(f"journal {self.path} is closed")
        if self._broken:
            raise JournalWriteError(
                f"cannot write {self.path}: an earlier write failed and left its tail torn "
                "(a full disk?); reopen to repair"
            )
        return self._fd

    @property
    def closed(self) -> bool:
        """Whether `close` has been called."""
        return self._fd is None

    def close(self) -> None:
        """Release the descriptor and lock (idempotent); does not fsync."""
        fd, self._fd = self._fd, None
        if fd is not None:
            close_fd(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _last_line_start(source: BinaryIO, size: int) -> int:
    """Byte offset where the final line starts (ignoring the file's closing newline)."""
    position = size - 1  # skip a trailing newline: it ends the last line, not starts one
    while position > 0:
        start = max(0, position - _SCAN_CHUNK)
        source.seek(start)
        chunk = source.read(position - start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        position = start
    return 0


def _count_newlines(source: BinaryIO, limit: int) -> int:
    count = 0
    remaining = limit
    while remaining > 0:
        chunk = source.read(min(_SCAN_CHUNK, remaining))
        if not chunk:
            break
        count += chunk.count(b"\n")
        remaining -= len(chunk)
    return count
