"""Sealed unit records kept out of memory (issue 22): each record goes to an unlinked scratch
file as its unit ends, and memory keeps only where it ends (8 bytes a record) and, for the
units that may be reused, its number by reuse key (`ReuseIndex`: 24 bytes a key; a failed
baseline's in `FailureStreaks`)."""

from __future__ import annotations

import os
import tempfile
from array import array
from pathlib import Path

import numpy as np

from evolane.store import write_all

FLUSH_BYTES = 256 << 10
"""Records wait in memory until this many bytes are pending, then go to the file at once."""


class SealedRecords:
    """The sealed records of every measurement one scheduler ran, numbered from 0 as they
    are put, the succeeded ones by `reuse_key` (``reuse``: a `ReuseIndex`), and the
    baselines that failed in a way a new try meets again (``failures``: `FailureStreaks`).

    With a ``directory`` the records live in an unlinked file there (gone with the process,
    even after SIGKILL); without one they stay in memory (a plan driven by tests, no IO).
    Put on one thread at a time; reads (`get`) may come from a thread once puts have paused.
    """

    def __init__(self, directory: Path | None = None, *, flush_bytes: int = FLUSH_BYTES) -> None:
        self.flush_bytes = flush_bytes
        self.reuse = ReuseIndex()
        self.failures = FailureStreaks()
        self._ends = array("Q")  # each record's end offset, in put order
        self._memory: list[bytes] | None = [] if directory is None else None
        self._file = None
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            # Open as long as the records live (closed by `close`), not for one block.
            self._file = tempfile.TemporaryFile(  # noqa: SIM115
                dir=directory, prefix="sealed-", buffering=0
            )
        self._written = 0  # bytes in the file; the rest are pending
        self._pending = bytearray()

    def __len__(self) -> int:
        return len(self._ends)

    def put(self, record: bytes) -> int:
        """Keep ``record``; its number (`get` returns it)."""
        number = len(self._ends)
        if self._memory is None and self._file is None:
            raise ValueError("these sealed records were closed")
        if self._memory is not None:
            self._memory.append(record)
        else:
            self._pending += record
            if len(self._pending) >= self.flush_bytes:
                self.flush()
        self._ends.append((self._ends[-1] if number else 0) + len(record))
        return number

    def get(self, number: int) -> bytes:
        """Record ``number``, as it was put (IndexError for one never put)."""
        if self._memory is not None:
            return self._memory[number]
        end = self._ends[number]
        start = self._ends[number - 1] if number else 0
        if start >= self._written:  # still pending: a flush writes whole records
            return bytes(self._pending[start - self._written : end - self._written])
        assert self._file is not None
        return _read_at(self._file.fileno(), start, end - start)

    def flush(self) -> None:
        """Write the pending records to the file (nothing to do in memory)."""
        if self._file is None or not self._pending:
            return
        write_all(self._file.fileno(), self._pending)
        self._written += len(self._pending)
        self._pending.clear()

    def close(self) -> None:
        """Drop every record (the file goes with its descriptor); the reuse keys go too."""
        self.reuse, self.failures = ReuseIndex(), FailureStreaks()
        self._ends = array("Q")
        self._pending.clear()
        self._memory = None
        if self._file is not None:
            self._file.close()
            self._file = None


def _read_at(fd: int, offset: int, size: int) -> bytes:
    """Exactly ``size`` bytes at ``offset`` (a read may return less than asked)."""
    parts = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            raise OSError(f"the sealed records file ended {size} bytes early")
        parts.append(chunk)
        offset += len(chunk)
        size -= len(chunk)
    return b"".join(parts)


KEY_BYTES = 16
"""A reuse key's size: a 128-bit digest (a collision between two experiments is never met)."""
RECENT_KEYS = 1024
"""Keys kept in a dict until they are merged into the sorted columns (or a sixteenth of the
keys there, whichever is more: merges copy O(keys) each, sixteen times the keys in all)."""


class ReuseIndex:
    """Record numbers by reuse key (`KEY_BYTES` bytes): 24 bytes a key in columns (the key's
    two halves and the number) sorted by the high half, searched by bisection, plus a dict of
    the latest keys, merged in when it fills (see `RECENT_KEYS`). The first number added under
    a key stays (any succeeded record of the same experiment serves)."""

    def __init__(self, recent: int = RECENT_KEYS) -> None:
        self.recent = recent
        self._high = np.empty(0, np.uint64)  # sorted (equal halves: any order)
        self._low = np.empty(0, np.uint64)
        self._numbers = np.empty(0, np.int64)
        self._recent: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._numbers) + len(self._recent)

    def get(self, key: bytes) -> int | None:
        """The record number added under ``key``; None when there is none."""
        found = self._recent.get(key)
        if found is not None:
            return found
        high, low = _halves(key)
        at = int(np.searchsorted(self._high, np.uint64(high)))
        while at < len(self._high) and int(self._high[at]) == high:
            if int(self._low[at]) == low:
                return int(self._numbers[at])
            at += 1
        return None

    def add(self, key: bytes, number: int) -> None:
        """Keep ``number`` under ``key`` unless the key has one already."""
        if len(key) != KEY_BYTES:
            raise ValueError(f"a reuse key has {KEY_BYTES} bytes, not {len(key)}")
        if self.get(key) is None:
            self._recent[key] = number
            if len(self._recent) >= max(self.recent, len(self._numbers) >> 4):
                self._merge()

    def _merge(self) -> None:
        """Move the recent keys into the columns: the recent ones sorted alone, then inserted
        where they belong, a column at a time (no sort of the whole index, and one column's
        copy at a time beside the index: +8 bytes a key for a moment, not +40)."""
        halves = np.frombuffer(b"".join(self._recent), dtype="<u8").reshape(-1, 2)
        numbers = np.fromiter(self._recent.values(), np.int64, len(self._recent))
        self._recent = {}
        order = np.argsort(halves[:, 0], kind="stable")
        high = halves[order, 0]
        at = np.searchsorted(self._high, high)
        self._high = np.insert(self._high, at, high)
        self._low = np.insert(self._low, at, halves[order, 1])
        self._numbers = np.insert(self._numbers, at, numbers[order])


REUSE_FAILURE_AFTER = 2
"""How many tries in a row of one baseline experiment (tree, case, repetition, seed) must fail
the same way, for a reason a new try meets again (`evolane.measure._units.repeating_failure`),
before later measurements reuse that failure instead of running it again: one more try
after the first guards against a rare failure that only looked lasting."""


class FailureStreaks:
    """Per reuse key, how a baseline experiment's latest try failed (a repeating failure's
    stage and code), how many tries in a row failed so, and that try's record number. Any
    other end of a try (a success, a failure that may not repeat, another code) breaks the
    streak; a try the run stopped says nothing and leaves it."""

    def __init__(self) -> None:
        self._streaks: dict[bytes, tuple[str, int, int]] = {}

    def reusable(self, key: bytes) -> int | None:
        """The record number of the failure to reuse for ``key``, once `REUSE_FAILURE_AFTER`
        tries in a row failed the same way; else None."""
        streak = self._streaks.get(key)
        return streak[2] if streak is not None and streak[1] >= REUSE_FAILURE_AFTER else None

    def ended(self, key: bytes, way: str | None, number: int) -> None:
        """A try of ``key`` ended, failing ``way`` (None: succeeded, or a failure that may
        not repeat); ``number``: its record."""
        if way is None:
            self._streaks.pop(key, None)
            return
        held = self._streaks.get(key)
        times = held[1] + 1 if held is not None and held[0] == way else 1
        self._streaks[key] = (way, times, number)


def _halves(key: bytes) -> tuple[int, int]:
    return int.from_bytes(key[:8], "little"), int.from_bytes(key[8:KEY_BYTES], "little")
