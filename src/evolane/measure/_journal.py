"""The run's journal as one shared writer: durable appends of typed records (`JournalRecord`)
serialised across every actor of a run. It is an object rather than an actor because a record
(a unit with its replay and judge results) may exceed a message's size bound."""

from __future__ import annotations

from pathlib import Path

import trio

from evolane.messages import JournalRecord
from evolane.store import Journal


class RunJournal:
    """Serialised, durable, cancellation-proof appends to ``runs/<id>/journal.jsonl``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._journal = Journal(path)
        self._lock = trio.Lock()

    async def append(self, record: JournalRecord, *, durable: bool = True) -> None:
        """Write ``record`` as one line (and fsync it, when ``durable``); once started, an
        append completes even if cancelled."""
        with trio.CancelScope(shield=True):
            async with self._lock:
                await trio.to_thread.run_sync(lambda: self._journal.append(record, durable=durable))

    def close(self) -> None:
        """Release the file and its lock (idempotent)."""
        self._journal.close()
