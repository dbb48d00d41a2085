"""The dead-letter office: a bounded record of messages that reached no handler."""

from __future__ import annotations

from collections import Counter, deque

from evolane.messages import DeadLetter


class DeadLetterOffice:
    """Counts every dead letter by reason and keeps the most recent ones for inspection."""

    def __init__(self, keep: int = 1000) -> None:
        self.recent: deque[DeadLetter] = deque(maxlen=keep)
        self.counts: Counter[str] = Counter()

    def post(self, target: str, kind: str, reason: str, detail: str = "") -> None:
        """Record one message that ``target`` will never handle, with the reason."""
        self.counts[reason] += 1
        self.recent.append(
            DeadLetter(target=target, kind=kind[:256], reason=reason, detail=detail[:2048])  # type: ignore[arg-type]
        )

    @property
    def total(self) -> int:
        """How many dead letters were posted since the office opened."""
        return sum(self.counts.values())
