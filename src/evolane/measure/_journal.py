"""The run's journal as one shared writer: typed records (`JournalRecord`) appended across
every actor of a run, with group commit. It is an object rather than an actor because a record
(a unit with its replay and judge results) may exceed a message's size bound.

Group commit: a durable append joins the batch being collected and returns once that batch's
single fsync is done, so a record counts (its caller goes on) only when it is on disk. While
one batch is written and fsynced in a worker thread, the next collects; a batch holds at most
`MAX_BATCH_RECORDS` records. The blobs stored with a deferred fsync (`BlobStore.deferring`)
are flushed in the same thread before the journal's fsync, so no durable record names a
blob that is not. A non-durable replay record (a replay before its judgement) is held up to
`HOLD_SECONDS` and dropped if its unit's own record (which carries the same replay) comes
first; else it is written with the next batch (before its unit's record). A crash loses only
such held replays, never an acknowledged unit: a resume replays those units again."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import trio

from evolane.messages import JournalRecord, ReplayRecord, UnitRecord
from evolane.store import MAX_RECORD_BYTES, Journal, JournalError, encode_record, sync_deferred

RESTORABLE = frozenset({"succeeded", "failed", "timed_out"})
"""Unit statuses a resume takes from the journal (as `_units.RESTORABLE`: not imported, the
units module depends on this one through the scheduler settings)."""

MAX_BATCH_RECORDS = 512
"""Records one group commit writes at most (one write and one fsync)."""

HOLD_SECONDS = 0.5
"""How long a non-durable replay record waits for its unit's record to supersede it."""

MAX_HELD = 4096
"""Replay records held at most; the oldest beyond it go with the next batch."""


@dataclass
class _Batch:
    """Records waiting for one write (and fsync, when one of them is durable)."""

    lines: list[bytes] = field(default_factory=list)
    durable: bool = False
    committed: bool = False
    error: BaseException | None = None


class RunJournal:
    """Serialised, group-committed, cancellation-proof appends to ``runs/<id>/journal.jsonl``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._journal = Journal(path)
        self._lock = trio.Lock()  # one batch written at a time, in order
        self._batch = _Batch()
        # Replay records held, encoded only if written (most are superseded first).
        self._held: dict[tuple[str, str], tuple[ReplayRecord, float]] = {}
        self.commits = 0
        """Batches written so far (fsyncs, for the durable ones)."""

    async def append(self, record: JournalRecord, *, durable: bool = True) -> None:
        """Add ``record`` as one line; when ``durable``, return once it is fsynced (with its
        batch). Once started, an append completes even if cancelled."""
        if not durable and isinstance(record, ReplayRecord):
            self.hold(record)
            return
        line = _line(record)
        with trio.CancelScope(shield=True):
            if len(self._batch.lines) >= MAX_BATCH_RECORDS:
                self._batch = _Batch()  # a full batch commits as it is
            batch = self._batch
            if isinstance(record, UnitRecord):
                replay = self._held.pop((record.measurement, record.unit), None)
                if replay is not None and record.status not in RESTORABLE:
                    batch.lines.append(_line(replay[0]))  # a resume may judge it again
            batch.lines.append(line)
            if not durable:
                if not self._lock.locked():  # no batch in flight: write it now (no fsync)
                    self._write(self._take(batch))
                return
            batch.durable = True
            async with self._lock:  # the first of a batch to get it commits the batch
                if not batch.committed:
                    await trio.to_thread.run_sync(self._write, self._take(batch))
            if batch.error is not None:
                raise batch.error

    def hold(self, record: ReplayRecord) -> None:
        """Keep ``record`` (a replay before its judgement: not durable) up to `HOLD_SECONDS`
        for its unit's record to supersede it; else it goes with the next batch."""
        self._held[(record.measurement, record.unit)] = (record, trio.current_time())

    def _take(self, batch: _Batch) -> _Batch:
        """``batch`` stops collecting and is written next, with the replay records held
        longer than `HOLD_SECONDS` before its own records."""
        batch.committed = True
        if self._batch is batch:
            self._batch = _Batch()
        if self._held:
            cutoff = trio.current_time() - HOLD_SECONDS
            extra = len(self._held) - MAX_HELD
            old: list[tuple[str, str]] = []
            for key, (_, held) in self._held.items():  # in arrival order: the oldest first
                if held > cutoff and len(old) >= extra:
                    break
                old.append(key)
            batch.lines[:0] = [_line(self._held.pop(key)[0]) for key in old]
        return batch

    def _write(self, batch: _Batch) -> None:
        """Write ``batch`` in one go; fsync it (deferred blobs first) when it is durable."""
        try:
            if batch.durable:
                sync_deferred()
            self._journal.append_lines(batch.lines, durable=batch.durable)
            self.commits += 1
        except BaseException as error:
            batch.error = error
            if not batch.durable:
                raise

    def close(self) -> None:
        """Write what is still queued or held (durably), release the file and its lock
        (idempotent)."""
        pending, self._batch = self._batch, _Batch()
        pending.lines[:0] = [_line(record) for record, _ in self._held.values()]
        self._held.clear()
        if pending.lines and not self._journal.closed:
            pending.durable = True
            self._write(pending)
        self._journal.close()


def _line(record: JournalRecord) -> bytes:
    """``record`` as one journal line, within `MAX_RECORD_BYTES`."""
    line = encode_record(record)
    if len(line) > MAX_RECORD_BYTES:
        raise JournalError(
            f"journal record of {len(line)} bytes exceeds {MAX_RECORD_BYTES}: "
            "store payloads as blobs and journal their refs"
        )
    return line
