"""The runtime an agent process embeds: actors, plus optimize runs as supervised subtrees.

    async with evolane.open_runtime(store=".evolane") as runtime:
        handle = await runtime.start_optimize(request)
        async for event in handle.events():
            ...
        outcome = await handle.result()

Bad input raises `InputError` from `start_optimize`, before anything is written. Cancelling
a handle (or the caller's scope around `optimize`) kills every process tree of the run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from evolane.actors.progress import ProgressBus, Subscription
from evolane.campaign._run import Backends, RunOutcome, run_campaign
from evolane.embed._request import OptimizeRequest
from evolane.messages import ProgressEvent
from evolane.supervisors import Runtime
from evolane.supervisors import open_runtime as open_actor_runtime

EVENTS_BUFFER = 256
"""Events a handle holds for a consumer that falls behind; beyond it they are dropped (counted)."""


class RunCancelled(Exception):
    """The run was cancelled through its handle; finished work is in its journal."""


class RunHandle:
    """A run in progress: its events, its result, and the means to stop it."""

    def __init__(self, buffer: int) -> None:
        self.run_id: str | None = None
        self._buffer = buffer
        self._scope = trio.CancelScope()
        self._interrupt = trio.Event()
        self._ready = trio.Event()
        self._done = trio.Event()
        self._outcome: RunOutcome | None = None
        self._error: BaseException | None = None
        self._feed: trio.MemoryReceiveChannel[ProgressEvent] | None = None
        self.subscription: Subscription | None = None

    def _attach(self, bus: ProgressBus) -> None:
        self.run_id = bus.run_id
        self._feed, self.subscription = bus.subscribe(self._buffer)
        self._ready.set()

    @property
    def feed(self) -> trio.MemoryReceiveChannel[ProgressEvent] | None:
        """The raw bounded event channel (closed when the run ends); None for a dry run."""
        return self._feed

    @property
    def dropped(self) -> int:
        """Events this handle lost because its consumer fell behind (the run's file has all)."""
        return self.subscription.dropped if self.subscription is not None else 0

    async def events(self) -> AsyncIterator[ProgressEvent]:
        """The run's progress events, until it ends (lossy for a slow consumer: see `dropped`)."""
        if self._feed is None:
            return
        async for event in self._feed:
            yield event

    async def result(self) -> RunOutcome:
        """Wait for the run's outcome (the report is ``outcome.report``)."""
        await self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._outcome is not None
        return self._outcome

    def stop(self) -> None:
        """Stop gracefully: in-flight units are killed, the report says ``interrupted``."""
        self._interrupt.set()

    def cancel(self) -> None:
        """Cancel at once: every tree is killed; `result` raises `RunCancelled`."""
        self._scope.cancel()

    @property
    def done(self) -> bool:
        return self._done.is_set()


class EmbeddedRuntime:
    """The actor runtime of `evolane.supervisors` plus optimize runs, for an agent process."""

    def __init__(self, actors: Runtime, store: Path, nursery: trio.Nursery) -> None:
        self.actors, self.store, self._nursery = actors, store, nursery

    # the actor API, unchanged
    def __getattr__(self, name: str) -> Any:
        return getattr(self.actors, name)

    async def start_optimize(
        self,
        request: OptimizeRequest,
        *,
        backends: Backends | None = None,
        events_buffer: int = EVENTS_BUFFER,
        started: float | None = None,
    ) -> RunHandle:
        """Check ``request`` and start its run; returns once the run has begun (its events
        flow from then on). Raises `InputError` for bad input."""
        run_request = request.run_request(str(self.store), started)  # the runtime's store
        handle = RunHandle(events_buffer)

        async def run() -> None:
            try:
                with handle._scope:
                    handle._outcome = await run_campaign(
                        run_request,
                        runtime=self.actors,
                        interrupt=handle._interrupt,
                        on_bus=handle._attach,
                        backends=backends,
                    )
                if handle._scope.cancelled_caught:
                    handle._error = RunCancelled(f"run {handle.run_id} was cancelled")
            except Exception as error:  # delivered through result() / start_optimize
                handle._error = error
            finally:
                handle._ready.set()
                handle._done.set()

        self._nursery.start_soon(run)
        await handle._ready.wait()
        if handle._error is not None and not isinstance(handle._error, RunCancelled):
            raise handle._error
        return handle

    async def optimize(self, request: OptimizeRequest, *, backends: Backends | None = None) -> Any:
        """Run ``request`` to its report (None for a dry run); cancelling the call cancels
        the run and kills its trees."""
        handle = await self.start_optimize(request, backends=backends)
        try:
            outcome = await handle.result()
        except BaseException:
            handle.cancel()
            with trio.CancelScope(shield=True):
                await handle._done.wait()
            raise
        return outcome.report


@asynccontextmanager
async def open_runtime(
    *, store: str | Path = ".evolane", **options: Any
) -> AsyncIterator[EmbeddedRuntime]:
    """Run evolane for the body of the ``async with`` (``options`` go to the actor runtime:
    ``max_restarts``, ``shutdown_timeout``, ...). Runs still going at exit are cancelled."""
    async with open_actor_runtime(**options) as actors, trio.open_nursery() as nursery:
        runtime = EmbeddedRuntime(actors, Path(store), nursery)
        try:
            yield runtime
        finally:
            nursery.cancel_scope.cancel()
