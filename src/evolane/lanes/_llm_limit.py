"""One adaptive concurrency limit per model endpoint (AIMD), shared by every lane of the
process that calls it: the limit grows by one after each window of ``limit`` successes (up to
a maximum) and halves on HTTP 429 (down to a minimum), and a ``Retry-After`` makes every new
caller wait until then. trio-native: no thread, no lock; a parked caller is cancellable.

A caller may say by when it must be admitted (``slot(by)``): a wait the endpoint's rate
limit imposes that would run past it ends in `NoSlot` before it, so that the caller can
report the endpoint's failure rather than be cut by its deadline (a 429 storm counted as a
candidate's timeout: found by review)."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
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


class NoSlot(Exception):
    """A call the endpoint's rate limit could not admit by its ``by`` time (`slot`)."""


class AdaptiveLimiter:
    """The AIMD limit of one endpoint. Use ``async with limiter.slot() as ticket`` around one
    request and report its end with `succeeded` or `rate_limited`. ``clock``: the time
    ``resume_at`` is on (monotonic: a limiter outlives a trio run; a test may pass
    ``trio.current_time`` to run it on a fake clock)."""

    def __init__(
        self, key: str, settings: LimiterSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.key = key
        self.settings = settings
        self.clock = clock
        self.limit = max(settings.minimum, min(settings.initial, settings.maximum))
        self.in_flight = 0
        self.epoch = 0
        self.successes = 0
        self.rate_limits = 0
        self.resume_at = 0.0  # on `clock`: no new caller before it (Retry-After)
        self.history: deque[int] = deque([self.limit], maxlen=HISTORY_KEPT)
        self._lot = trio.lowlevel.ParkingLot()

    @asynccontextmanager
    async def slot(
        self, by: float = math.inf, *, past_pause: bool = False
    ) -> AsyncIterator[Ticket]:
        """Wait for a free place (and for any ``Retry-After`` pause unless ``past_pause``),
        hold it for the body. ``by`` (trio clock) bounds a wait the rate limit imposes:
        `NoSlot` at once when the pause runs to ``by`` or past it, and at ``by`` (or at the
        first 429 after it) when the endpoint answered 429 to any call while this one waited
        for a place. A wait behind calls in flight alone, no 429 meanwhile, is not bounded (a
        slow endpoint is not a rate-limited one: the caller's own deadline ends it)."""
        seen = self.rate_limits
        while True:
            now = trio.current_time()
            pause = 0.0 if past_pause else self.resume_at - self.clock()
            if pause <= 0 and self.in_flight < self.limit:
                break
            if pause > 0:
                if now + pause >= by:
                    raise NoSlot(f"the endpoint's Retry-After holds calls for {pause:.1f} s more")
                await trio.sleep(pause)
            elif now >= by and self.rate_limits > seen:
                raise NoSlot(f"{self.in_flight} calls in flight fill its limit of {self.limit}")
            else:
                with trio.move_on_at(by if now < by else math.inf):
                    await self._lot.park()
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
            until = self.clock() + min(retry_after, MAX_PAUSE_INTERVAL)
            self.resume_at = max(self.resume_at, until)
        if ticket.epoch == self.epoch:
            self.epoch += 1
            self.successes = 0
            self._set(max(self.settings.minimum, self.limit // 2))
        self._lot.unpark_all()  # a parked caller past its ``by`` gives up on a 429 (`slot`)

    def snapshot(self) -> dict[str, Any]:
        """The limiter's state for the live view."""
        return {
            "limit": self.limit,
            "in_flight": self.in_flight,
            "rate_limited": self.rate_limits,
            "min_limit": min(self.history),
            "max_limit": max(self.history),
            "paused_for": max(0.0, round(self.resume_at - self.clock(), 3)),
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
