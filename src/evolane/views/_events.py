"""Reading a run's ``events.jsonl``: whole lines in bounded chunks, each decoded to its event.

`EventTail` follows a file that may still grow (``evolane watch``); `read_events` takes a
finished file whole, within a byte cap (the HTML report). A malformed line is skipped with
a warning naming ``events.jsonl:LINE``; an event of a kind this version does not know is
skipped silently (a newer writer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
from pydantic import ValidationError

from evolane import messages
from evolane.store import NotRegularFileError, open_regular_file

READ_CHUNK = 64 * 1024
"""Bytes of ``events.jsonl`` read per poll at most; a backlog is read a chunk at a time."""
MAX_LINE = 64 * 1024
"""A line longer than this is no event (events are bounded by schema): it is skipped."""
MAX_EVENTS_BYTES = 256 << 20
"""`read_events` reads at most this much of a file (a run with more says so)."""
MAX_WARNINGS = 5
"""Malformed lines warned about one by one; the rest are only counted."""


@dataclass
class EventTail:
    """The complete lines appended to a file since the last read, at most ``chunk`` bytes
    per read; a partial last line waits for its newline, a line longer than ``max_line``
    is dropped (reported by `read` as None)."""

    path: Path
    chunk: int = READ_CHUNK
    max_line: int = MAX_LINE
    offset: int = 0
    line_number: int = 0  # of the last line returned
    _partial: bytes = b""
    _dropping: bool = False  # inside an overlong line, until its newline

    def read(self) -> tuple[list[bytes | None], bool]:
        """The complete lines read now (None for an overlong one) and whether the end of
        the file was reached (a missing file is an empty one). Anything but a regular file
        is `NotRegularFileError` (found by review: ``evolane watch`` of a run whose events
        file was a FIFO hung in its open, deaf to Ctrl-C; ``/dev/zero`` was read for ever)."""
        try:  # a FIFO or device in its place is never waited on nor read: NotRegularFileError
            with open_regular_file(self.path, follow_symlinks=True) as source:
                source.seek(self.offset)
                data = source.read(self.chunk)
        except FileNotFoundError:
            return [], True
        self.offset += len(data)
        *complete, rest = (self._partial + data).split(b"\n")
        lines: list[bytes | None] = []
        for line in complete:
            self.line_number += 1
            lines.append(None if self._dropping else line)
            self._dropping = False
        self._partial = b"" if self._dropping else rest
        if len(self._partial) > self.max_line:
            self._partial, self._dropping = b"", True
        return lines, len(data) < self.chunk


def _event_types() -> dict[str, type[messages.ProgressEvent]]:
    return {cls.model_fields["kind"].default: cls for cls in messages.EVENT_TYPES}


class EventDecoder:
    """One line of ``events.jsonl`` as its event; a malformed line is skipped with a warning
    (the first `MAX_WARNINGS` one by one through ``warn``), an event of an unknown kind
    silently."""

    def __init__(self, path: Path, warn: Callable[[str], None]) -> None:
        self.path, self.warn = path, warn
        self.types = _event_types()
        self.skipped = 0

    def decode(self, line: bytes | None, number: int) -> messages.ProgressEvent | None:
        """The event on ``line`` (line ``number`` of the file), or None when there is none."""
        if line is not None and not line.strip():
            return None
        try:
            if line is None:
                raise ValueError("the line is longer than any event")
            data = orjson.loads(line)
            kind = data.get("kind") if isinstance(data, dict) else None
            if not isinstance(kind, str):
                raise ValueError("not an event object")
            event_type = self.types.get(kind)
            return None if event_type is None else event_type.model_validate(data)
        except (ValueError, ValidationError) as error:  # JSONDecodeError is a ValueError
            self._warn(number, error)
            return None

    def _warn(self, number: int, error: Exception) -> None:
        self.skipped += 1
        if self.skipped <= MAX_WARNINGS:
            why = str(error).strip().splitlines()[0] if str(error).strip() else "malformed"
            self.warn(f"{self.path}:{number}: skipped a bad event ({why})")
        if self.skipped == MAX_WARNINGS:
            self.warn("further bad events are skipped silently")


def read_events(
    path: Path, warn: Callable[[str], None], max_bytes: int = MAX_EVENTS_BYTES
) -> Iterator[messages.ProgressEvent]:
    """Every event of a (finished) ``events.jsonl``, in file order, one at a time (a fold
    holds no list of them), reading at most ``max_bytes`` (a longer file is cut there,
    with a warning). Anything but a regular file is no event stream."""
    tail, decoder = EventTail(path), EventDecoder(path, warn)
    while True:
        try:
            lines, at_end = tail.read()
        except NotRegularFileError:
            warn(f"{path}: not a regular file; no events read")
            return
        first = tail.line_number - len(lines) + 1
        for number, line in enumerate(lines, start=first):
            event = decoder.decode(line, number)
            if event is not None:
                yield event
        if at_end:
            return
        if tail.offset >= max_bytes:
            warn(f"{path}: only the first {max_bytes} bytes were read")
            return
