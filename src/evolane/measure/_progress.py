"""The progress bus: every event goes to ``events.jsonl`` in full, and to observers lossily.

A slow observer (a terminal, a socket) never slows the run: its bounded channel drops what
it cannot take and counts the loss; the file is written for every event.
"""

from __future__ import annotations

import copy
import functools
import time
import typing
from dataclasses import dataclass
from pathlib import Path

import trio

from evolane.messages import ProgressEvent
from evolane.store import Journal


@functools.cache
def holds_containers(kind: type[ProgressEvent]) -> bool:
    """Whether events of ``kind`` hold a mutable container (a dict, a list): each observer
    gets its own copy of those (found by review: an observer that changed an event's
    ``by_role`` changed it for the live view and every other observer)."""
    types = [(f.annotation, *typing.get_args(f.annotation)) for f in kind.model_fields.values()]
    return any(typing.get_origin(t) in (dict, list) for each in types for t in each)


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
        """Stamp and record ``event``; never blocks on an observer. Each observer gets its
        own copy of an event with a mutable container (`holds_containers`)."""
        self.seq += 1
        stamped = event.model_copy(
            update={"run_id": self.run_id, "seq": self.seq, "t": time.monotonic() - self.started}
        )
        if self._file is not None:
            self._file.append(stamped)
        self.last[stamped.kind] = stamped
        own_copies = holds_containers(type(stamped))
        for subscription in self._subscribers:
            try:
                subscription.channel.send_nowait(copy.deepcopy(stamped) if own_copies else stamped)
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
