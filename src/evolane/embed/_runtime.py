"""The runtime an agent process embeds: actors, plus optimize runs as supervised subtrees.

    async with evolane.open_runtime(store=".evolane") as runtime:
        handle = await runtime.start_optimize(request)
        async for event in handle.events():
            ...
        outcome = await handle.result()

Observers (`evolane.embed.Observer`) given to `start_optimize` hear every event of the run
through their own lossy subscriptions and are closed before `result` returns; observers given
to `open_runtime` hear every run the runtime starts (in addition to each run's own) and are
closed when the runtime closes.

Bad input raises `InputError` from `start_optimize`, before anything is written. Cancelling
a handle (or the caller's scope around `optimize`) kills every process tree of the run.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from evolane.campaign import Backends, CampaignConfig, RunOutcome, run_campaign
from evolane.distributed import check_cluster
from evolane.embed._observers import (
    ObserverLike,
    ObserverReport,
    Observing,
    check_observers,
    close_observers,
)
from evolane.embed._request import OptimizeRequest
from evolane.inputs import InputError
from evolane.measure import ProgressBus, Subscription
from evolane.messages import ProgressEvent
from evolane.supervisors import Runtime, leaf_exceptions
from evolane.supervisors import open_runtime as open_actor_runtime

EVENTS_BUFFER = 256
"""Events a handle holds for a consumer that falls behind; beyond it they are dropped (counted)."""
RUNTIME_CLOSED = "the evolane runtime is closed (its `async with` has ended)"
"""What a call into a runtime whose ``async with`` has ended is told (trio and asyncio alike)."""
CANCEL_WAIT_SECONDS = 60.0
"""How long, beyond the run's kill grace, a cancelled `start_optimize` or `optimize` waits for
its run to end before it re-raises anyway."""


class RunCancelled(Exception):
    """The run was cancelled (through its handle, or by closing its runtime); finished work is
    in its journal."""


class RunHandle:
    """A run in progress: its events, its result, and the means to stop it."""

    def __init__(self, buffer: int, kill_grace: float = 0.0) -> None:
        self.run_id: str | None = None
        self._buffer = buffer
        self._kill_grace = kill_grace
        self._scope = trio.CancelScope()
        self._interrupt = trio.Event()
        self._ready = trio.Event()
        self._done = trio.Event()
        self._outcome: RunOutcome | None = None
        self._error: BaseException | None = None
        self._feed: trio.MemoryReceiveChannel[ProgressEvent] | None = None
        self.subscription: Subscription | None = None
        self._observing: Observing | None = None

    def _attach(self, bus: ProgressBus) -> None:
        self.run_id = bus.run_id
        self._feed, self.subscription = bus.subscribe(self._buffer)
        self._ready.set()

    @property
    def feed(self) -> trio.MemoryReceiveChannel[ProgressEvent] | None:
        """The raw bounded event channel (closed when the run ends); None for a dry run."""
        return self._feed

    @property
    def observers(self) -> list[ObserverReport]:
        """How each of the run's observers fared (final once `result` has returned)."""
        return self._observing.reports if self._observing is not None else []

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
        """Wait for the run's outcome (the report is ``outcome.report``); raises
        `RunCancelled` for a run that was cancelled."""
        await self._done.wait()
        return self.ended()

    def ended(self) -> RunOutcome:
        """`result` without waiting, for a run whose runtime has closed: its outcome, its
        error raised, or `RunCancelled` for a run that never reached its end."""
        if self._error is not None:
            raise self._error
        if self._outcome is None:  # `_finish` leaves one of the two; none: it never ran
            raise RunCancelled(f"run {self.run_id} was cancelled (its runtime closed)")
        return self._outcome

    def stop(self) -> None:
        """Stop gracefully: in-flight units are killed, the report says ``interrupted``."""
        self._interrupt.set()

    def cancel(self) -> None:
        """Cancel at once: every tree is killed; `result` raises `RunCancelled`."""
        self._scope.cancel()

    @property
    def done(self) -> bool:
        """True once the run has ended (its outcome or error is available)."""
        return self._done.is_set()

    def _finish(self) -> None:
        """The run task ended: whatever it left, `result` has an outcome or an error."""
        if self._outcome is None and self._error is None:  # cancelled from outside its scope
            self._error = RunCancelled(f"run {self.run_id} was cancelled (its runtime closed)")
        self._ready.set()
        self._done.set()

    async def _cancel_and_wait(self) -> None:
        """Cancel the run and wait, shielded and bounded (kill grace + `CANCEL_WAIT_SECONDS`),
        until it has ended (its trees killed; a run cancelled before it was written leaves
        nothing, one cancelled after is recorded ``interrupted``)."""
        self.cancel()
        with (
            trio.CancelScope(shield=True),
            trio.move_on_after(self._kill_grace + CANCEL_WAIT_SECONDS),
        ):
            await self._done.wait()


class EmbeddedRuntime:
    """The actor runtime of `evolane.supervisors` plus optimize runs, for an agent process.

    ``observers`` are runtime-wide: every run it starts is heard by them too."""

    def __init__(
        self,
        actors: Runtime,
        store: Path,
        nursery: trio.Nursery,
        observers: Sequence[ObserverLike] = (),
    ) -> None:
        self.actors, self.store, self._nursery = actors, store, nursery
        self.observers: tuple[ObserverLike, ...] = tuple(observers)
        self.closed = False
        """True once its ``async with`` has ended: it starts no run."""

    # the actor API, unchanged
    def __getattr__(self, name: str) -> Any:
        return getattr(self.actors, name)

    async def start_optimize(
        self,
        request: OptimizeRequest,
        *,
        backends: Backends | None = None,
        observers: Sequence[ObserverLike] = (),
        events_buffer: int = EVENTS_BUFFER,
        started: float | None = None,
    ) -> RunHandle:
        """Check ``request`` and start its run; returns once the run has begun (its events
        flow from then on). Raises `InputError` for bad input. Cancelling the call cancels
        the run, and returns only once its trees are gone. ``observers`` hear every event
        of the run (`evolane.embed.Observer`; lossy when slow, disabled when they raise)
        and are closed when it ends, before `RunHandle.result` returns; the runtime's own
        observers (`open_runtime(observers=...)`) hear it too, first, and stay open."""
        check_arguments(request, backends, events_buffer)
        check_observers(observers)
        if self.closed:
            raise RuntimeError(RUNTIME_CLOSED)
        run_request = request.run_request(str(self.store), started)  # the runtime's store
        check_backends(run_request.config, backends)
        handle = RunHandle(events_buffer, run_request.config.commands.kill_grace)
        observing = Observing(observers, shared=self.observers)
        handle._observing = observing

        def on_bus(bus: ProgressBus) -> None:
            handle._attach(bus)
            observing.attach(bus, self._nursery)

        async def run() -> None:
            try:
                with handle._scope:
                    handle._outcome = await run_campaign(
                        run_request,
                        runtime=self.actors,
                        interrupt=handle._interrupt,
                        on_bus=on_bus,
                        backends=backends,
                    )
                if handle._scope.cancelled_caught:
                    handle._error = RunCancelled(f"run {handle.run_id} was cancelled")
            except Exception as error:  # delivered through result() / start_optimize
                handle._error = error
            finally:
                await observing.close()  # shielded and bounded
                handle._finish()

        self._nursery.start_soon(run)
        try:
            await handle._ready.wait()
        except BaseException:  # the caller was cancelled: no run may go on without a handle
            await handle._cancel_and_wait()
            raise
        if handle._error is not None and not isinstance(handle._error, RunCancelled):
            raise handle._error
        return handle

    async def optimize(
        self,
        request: OptimizeRequest,
        *,
        backends: Backends | None = None,
        observers: Sequence[ObserverLike] = (),
    ) -> Any:
        """Run ``request`` to its report (None for a dry run); cancelling the call cancels
        the run and kills its trees."""
        handle = await self.start_optimize(request, backends=backends, observers=observers)
        try:
            outcome = await handle.result()
        except BaseException:
            await handle._cancel_and_wait()
            raise
        return outcome.report


def check_arguments(request: object, backends: object, events_buffer: object) -> None:
    """Refuse, in one `TypeError` or `ValueError` naming it and before anything is written,
    an argument of `EmbeddedRuntime.start_optimize` of the wrong kind (found by review: an
    `AttributeError` from inside, or a negative buffer that left its run ``running``)."""
    if not isinstance(request, OptimizeRequest):
        raise TypeError(
            f"start_optimize takes an OptimizeRequest, not {type(request).__name__} "
            "(OptimizeRequest(config=...))"
        )
    check_backend_kinds(backends)
    if isinstance(events_buffer, bool) or not isinstance(events_buffer, int) or events_buffer < 0:
        raise ValueError(f"events_buffer {events_buffer!r}: a count of events, 0 or more")


def check_backend_kinds(backends: object) -> None:
    """Refuse ``backends`` that are not a `Backends` of callables (one `TypeError`)."""
    if backends is not None and not isinstance(backends, Backends):
        raise TypeError(f"backends: a Backends(replay=..., ...), not {type(backends).__name__}")
    for role in ("replay", "judge", "optimizer"):
        backend = getattr(backends, role, None)
        if backend is not None and not callable(backend):
            raise TypeError(f"backends.{role}: {backend!r} is not callable (an async def)")


def check_backends(config: CampaignConfig, backends: Backends | None) -> None:
    """Refuse, before anything is written, a cluster that cannot be used (a bad value, Dask
    not installed) and an in-process replay backend asked to run on a Dask cluster."""
    cluster = config.measure.cluster
    spec = check_cluster(cluster)
    if spec.uses_dask and backends is not None and backends.replay is not None:
        raise InputError(
            f"--cluster {cluster}: an in-process replay backend runs on --cluster "
            "local only (Dask workers run replay commands)"
        )


@asynccontextmanager
async def open_runtime(
    *,
    store: str | Path = ".evolane",
    observers: Sequence[ObserverLike] = (),
    **options: Any,
) -> AsyncIterator[EmbeddedRuntime]:
    """Run evolane for the body of the ``async with`` (``options`` go to the actor runtime:
    ``max_restarts``, ``shutdown_timeout``, ...). Runs still going at exit are cancelled.

    ``observers`` hear every run the runtime starts, besides each run's own (a run's
    `RunHandle.observers` reports on them too; one that raises is disabled for that run).
    They are closed once, after the last run has ended, each at most
    `OBSERVER_CLOSE_TIMEOUT`; a close that fails is a `RuntimeWarning` naming it. Raises
    `TypeError` for anything in ``observers`` that is no observer. A Ctrl-C that lands in a
    run's task leaves it as a `KeyboardInterrupt` (its group is the ``__cause__``)."""
    check_observers(observers)
    try:
        async with open_actor_runtime(**options) as actors:
            try:
                async with trio.open_nursery() as nursery:
                    runtime = EmbeddedRuntime(actors, Path(store), nursery, observers)
                    try:
                        yield runtime
                    finally:
                        runtime.closed = True
                        nursery.cancel_scope.cancel()
            finally:  # every run has ended (and let its observers drain): close shared ones
                for failure in await close_observers(observers):
                    warnings.warn(failure, RuntimeWarning, stacklevel=2)
    except BaseExceptionGroup as group:
        # A Ctrl-C trio raised in a task of a run (a busy in-process backend) left the runtime
        # as a group of it and what it interrupted: found by review, the host's
        # ``except KeyboardInterrupt`` missed it. It is the user's Ctrl-C, as the CLI reads it.
        interrupt = next(
            (e for e in leaf_exceptions(group) if isinstance(e, KeyboardInterrupt)), None
        )
        if interrupt is None:
            raise
        raise KeyboardInterrupt(*interrupt.args) from group
