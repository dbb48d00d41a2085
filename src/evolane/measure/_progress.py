"""The progress bus: every event goes to ``events.jsonl`` in full, and to observers lossily.

A slow observer (a terminal, a socket) never slows the run: its bounded channel drops what
it cannot take and counts the loss; the file is written for every event.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import trio

from evolane.messages import ProgressEvent
from evolane.store import Journal


@dataclass
class Subscription:
    """One observer: its channel and how many events it lost."""

    channel: trio.MemorySendChannel[ProgressEvent]
    dropped: int = 0


class ProgressBus:
    """Stamps events (run id, sequence number, seconds since start), journals, fans out."""

    def __init__(self, path: Path | None, run_id: str) -> None:
        self.run_id = run_id
        self.started = time.monotonic()
        self.seq = 0
        self._file = Journal(path) if path is not None else None
        self._subscribers: list[Subscription] = []
        self.last: dict[str, ProgressEvent] = {}  # the newest event of each kind
        self.closed = False
        """True once `close` ran: nothing may be published any more."""

    def subscribe(
        self, capacity: int = 256
    ) -> tuple[trio.MemoryReceiveChannel[ProgressEvent], Subscription]:
        """A bounded, lossy feed of every event published from now on."""
        send, receive = trio.open_memory_channel[ProgressEvent](capacity)
        subscription = Subscription(send)
        self._subscribers.append(subscription)
        return receive, subscription

    def publish(self, event: ProgressEvent) -> ProgressEvent:
        """Stamp and record ``event``; never blocks on an observer."""
        self.seq += 1
        stamped = event.model_copy(
            update={"run_id": self.run_id, "seq": self.seq, "t": time.monotonic() - self.started}
        )
        if self._file is not None:
            self._file.append(stamped)
        self.last[stamped.kind] = stamped
        for subscription in self._subscribers:
            try:
                subscription.channel.send_nowait(stamped)
            except trio.WouldBlock:
                subscription.dropped += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        return stamped

    def close(self) -> None:
        """Flush the file and end every observer's feed."""
        self.closed = True
        for subscription in self._subscribers:
            subscription.channel.close()
        if self._file is not None:
            self._file.sync()
            self._file.close()
