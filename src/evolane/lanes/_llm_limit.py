"""One adaptive concurrency limit per model endpoint (AIMD), shared by every lane of the
process that calls it: the limit grows by one after each window of ``limit`` successes (up to
a maximum) and halves on HTTP 429 (down to a minimum), and a ``Retry-After`` makes every new
caller wait until then. trio-native: no thread, no lock; a parked caller is cancellable."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

HISTORY_KEPT = 1024
"""Limit changes a limiter remembers (for tests and the live view)."""
MAX_PAUSE_INTERVAL = 60.0
"""The longest pause a server's ``Retry-After`` may impose on new callers (seconds)."""


@dataclass(frozen=True)
class LimiterSettings:
    """How an endpoint's limit adapts: it starts at ``initial`` and stays within
    [``minimum``, ``maximum``]."""

    initial: int = 8
    maximum: int = 64
    minimum: int = 1


@dataclass(frozen=True)
class Ticket:
    """One admitted call: the limiter's decrease epoch when it was admitted (a 429 of a call
    admitted before the last decrease does not halve the limit again)."""

    epoch: int


class AdaptiveLimiter:
    """The AIMD limit of one endpoint. Use ``async with limiter.slot() as ticket`` around one
    request and report its end with `succeeded` or `rate_limited`."""

    def __init__(self, key: str, settings: LimiterSettings) -> None:
        self.key = key
        self.settings = settings
        self.limit = max(settings.minimum, min(settings.initial, settings.maximum))
        self.in_flight = 0
        self.epoch = 0
        self.successes = 0
        self.rate_limits = 0
        self.resume_at = 0.0  # time.monotonic(): no new caller before it (Retry-After)
        self.history: deque[int] = deque([self.limit], maxlen=HISTORY_KEPT)
        self._lot = trio.lowlevel.ParkingLot()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[Ticket]:
        """Wait for a free place (and for any ``Retry-After`` pause), hold it for the body."""
        while True:
            pause = self.resume_at - time.monotonic()
            if pause > 0:
                await trio.sleep(pause)
            elif self.in_flight >= self.limit:
                await self._lot.park()
            else:
                break
        self.in_flight += 1
        try:
            yield Ticket(self.epoch)
        finally:
            self.in_flight -= 1
            self._wake()

    def succeeded(self) -> None:
        """A call answered: after a window of ``limit`` successes the limit grows by one."""
        self.successes += 1
        if self.successes >= self.limit and self.limit < self.settings.maximum:
            self.successes = 0
            self._set(self.limit + 1)

    def rate_limited(self, ticket: Ticket, retry_after: float | None) -> None:
        """A call was answered 429: halve the limit (once per window of calls admitted before
        the last decrease) and pause new callers for ``retry_after`` seconds."""
        self.rate_limits += 1
        if retry_after is not None and retry_after > 0:
            until = time.monotonic() + min(retry_after, MAX_PAUSE_INTERVAL)
            self.resume_at = max(self.resume_at, until)
        if ticket.epoch == self.epoch:
            self.epoch += 1
            self.successes = 0
            self._set(max(self.settings.minimum, self.limit // 2))

    def snapshot(self) -> dict[str, Any]:
        """The limiter's state for the live view."""
        return {
            "limit": self.limit,
            "in_flight": self.in_flight,
            "rate_limited": self.rate_limits,
            "min_limit": min(self.history),
            "max_limit": max(self.history),
            "paused_for": max(0.0, round(self.resume_at - time.monotonic(), 3)),
        }

    def _set(self, limit: int) -> None:
        if limit != self.limit:
            self.limit = limit
            self.history.append(limit)
        self._wake()

    def _wake(self) -> None:
        free = self.limit - self.in_flight
        if free > 0:
            self._lot.unpark(count=free)


_LIMITERS: dict[str, AdaptiveLimiter] = {}


def limiter_for(key: str, settings: LimiterSettings) -> AdaptiveLimiter:
    """The process's limiter of endpoint ``key`` (its base URL); the first caller's
    ``settings`` make it, later ones share it as it is."""
    limiter = _LIMITERS.get(key)
    if limiter is None:
        limiter = _LIMITERS[key] = AdaptiveLimiter(key, settings)
    return limiter


def limiter_snapshot() -> dict[str, dict[str, Any]]:
    """Every endpoint's limit, calls in flight and 429 count, by endpoint key (base URL)."""
    return {key: limiter.snapshot() for key, limiter in _LIMITERS.items()}
