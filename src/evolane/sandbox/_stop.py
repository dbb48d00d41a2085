"""A unit's stop (`UnitStop`): what a lane sets to stop one unit, and what a sandboxed
command's watch or an in-process backend's call is cut by, through a cancel scope bound to
it rather than a task of their own waiting on an event."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import trio


class UnitStop:
    """One unit's stop, as a `trio.Event` is (`set`, `is_set`, `wait`), and the cancel scopes
    bound to it (`cancelling`), which `set` cancels at once: a call it must cut needs no
    task of its own waiting on the event (an in-process backend's call took one)."""

    __slots__ = ("_event", "_scopes")

    def __init__(self) -> None:
        self._event = trio.Event()
        self._scopes: list[trio.CancelScope] = []

    def set(self) -> None:
        """Stop: wake every waiter and cancel every bound scope."""
        self._event.set()
        for scope in self._scopes:
            scope.cancel()

    def is_set(self) -> bool:
        """Whether the unit was stopped."""
        return self._event.is_set()

    async def wait(self) -> None:
        """Wait until the unit is stopped."""
        await self._event.wait()

    @contextmanager
    def cancelling(self) -> Iterator[trio.CancelScope]:
        """A cancel scope that the stop cancels (at once when already stopped)."""
        with trio.CancelScope() as scope:
            if self._event.is_set():
                scope.cancel()
            self._scopes.append(scope)
            try:
                yield scope
            finally:
                self._scopes.remove(scope)


Stop = trio.Event | UnitStop
"""What a command or a call may be stopped by: a lane's `UnitStop` (cut through a bound
scope) or any `trio.Event` (watched by a task of its own)."""


@asynccontextmanager
async def cut_by(stop: Stop | None) -> AsyncIterator[trio.CancelScope]:
    """A cancel scope around the body that ``stop`` cancels once set (its
    ``cancelled_caught`` says the stop cut the body): bound to a `UnitStop`, no task; a
    plain `trio.Event` is waited for by a task of its own; None never cancels it."""
    if stop is None or isinstance(stop, UnitStop):
        with stop.cancelling() if stop is not None else trio.CancelScope() as scope:
            yield scope
        return
    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as scope:
            nursery.start_soon(_cancel_when_set, stop, scope)
            yield scope
        nursery.cancel_scope.cancel()


async def _cancel_when_set(stop: trio.Event, scope: trio.CancelScope) -> None:
    await stop.wait()
    scope.cancel()
