"""evolane on asyncio: the trio runtime runs as a guest in the caller's running asyncio loop
(`trio.lowlevel.start_guest_run`), on the same thread, and is driven through asyncio-native
awaitables and async iterators.

    async with evolane.aio.open_runtime(store=".evolane") as runtime:
        report = await runtime.optimize(request)

Cancelling the asyncio task that awaits `optimize` (or `AioRunHandle.result`) cancels the
run; the cancellation completes only once every process tree of the run is gone.

Observers (`evolane.embed.Observer`, or a plain ``async def observer(event)``) are written
for asyncio: ``open_runtime(observers=...)`` (every run) and ``start_optimize(...,
observers=...)`` (one run) take them, and each call (``on_event``, ``close``) runs as a task
on the asyncio loop, in the context of the call that handed them over, while the trio side
awaits it. Their contract is the trio API's: a slow one loses events (counted), one that
raises is disabled for the run with one warning event, and a run's own are closed when it
ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import trio

from evolane.campaign import Backends, CampaignConfig, RunOutcome
from evolane.embed import (
    RUNTIME_CLOSED,
    EmbeddedRuntime,
    EvolveService,
    ObserverLike,
    ObserverReport,
    OptimizeRequest,
    PendingJob,
    RunHandle,
    ServiceSettings,
    check_arguments,
    observer_name,
    open_evolve_service,
)
from evolane.embed import open_runtime as open_trio_runtime
from evolane.sandbox import INLINE_WORK

EVENTS_BUFFER = 256
_END = object()


class RuntimeClosed(RuntimeError):
    """A call into the runtime that its close cut short (or that came after it)."""


class _Bridge:
    """Calls from asyncio into the trio guest, answered through asyncio futures."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.token: trio.lowlevel.TrioToken | None = None
        self.nursery: trio.Nursery | None = None
        self.closing: trio.Event | None = None
        self.closed = False  # asked to close: a guest still starting closes once it has started
        self.ended: asyncio.Future[Any] = loop.create_future()  # the guest has ended

    def close(self) -> None:
        """Ask the guest to close (now, or as soon as it has started)."""
        self.closed = True
        if self.closing is not None:
            self.soon(self.closing.set)

    def opened(self, nursery: trio.Nursery) -> trio.Event:
        """Called by the guest once it runs: the event it waits on until asked to close."""
        self.token = trio.lowlevel.current_trio_token()
        self.nursery, self.closing = nursery, trio.Event()
        if self.closed:  # the host gave up while the guest was starting
            self.closing.set()
        return self.closing

    def call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> asyncio.Future[Any]:
        """Run ``await fn(*args)`` in trio; the future gets its result or error. Raises
        `RuntimeError`, with nothing sent to the guest, from another loop than the one that
        opened the runtime (another thread's: found by review, asyncio's "attached to a
        different loop" came after the run had started, which went on without a handle)
        and once the runtime is closing or closed (trio's `RunFinishedError` before)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not self.loop:
            raise RuntimeError(
                "an evolane.aio runtime is used from another event loop (or thread) than the "
                "one that opened it"
            )
        if self.closed:
            raise RuntimeClosed(RUNTIME_CLOSED)
        future: asyncio.Future[Any] = self.loop.create_future()
        assert self.token is not None
        try:
            self.token.run_sync_soon(self._spawn, future, fn, args)
        except trio.RunFinishedError:
            raise RuntimeClosed(RUNTIME_CLOSED) from None
        return future

    def soon(self, fn: Callable[[], object]) -> None:
        """Run a plain function in the trio guest soon; nothing once the guest has ended (a
        stop or cancel of a run that ended with its runtime is a no-op, as in trio)."""
        assert self.token is not None
        with contextlib.suppress(trio.RunFinishedError):
            self.token.run_sync_soon(fn)

    def _spawn(self, future: asyncio.Future[Any], fn: Callable[..., Any], args: tuple) -> None:
        assert self.nursery is not None
        try:
            self.nursery.start_soon(self._run, future, fn, args)
        except RuntimeError:  # the guest is closing: its nursery takes no more
            self._settle(future, None, RuntimeClosed(RUNTIME_CLOSED))

    async def _run(self, future: asyncio.Future[Any], fn: Callable[..., Any], args: tuple) -> None:
        try:
            value = await fn(*args)
        except trio.Cancelled:  # only the runtime's close cancels a call in the guest
            # Found by review: the awaiting asyncio task got CancelledError, as if it had been
            # cancelled itself (an asyncio.TaskGroup then swallowed it).
            self._settle(future, None, RuntimeClosed(RUNTIME_CLOSED))
            raise
        except BaseException as error:  # delivered to the awaiting asyncio task
            self._settle(future, None, error)
        else:
            self._settle(future, value, None)

    def _settle(self, future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
        def settle() -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

        self.loop.call_soon_threadsafe(settle)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class _HostObserver:
    """An asyncio observer as the trio runtime calls it: each ``on_event`` and ``close`` runs
    as a task on the host loop (in ``context``, a copy per call) and the guest awaits it."""

    wraps_observer: ClassVar[bool] = True  # observers are told apart by ``inner``

    def __init__(
        self, observer: ObserverLike, loop: asyncio.AbstractEventLoop, context: contextvars.Context
    ) -> None:
        if not (hasattr(observer, "on_event") or callable(observer)):
            raise TypeError(f"{observer!r} is no observer (on_event or an async callable)")
        self.inner, self.loop, self.context = observer, loop, context
        self.name = observer_name(observer)

    async def on_event(self, event: Any) -> None:
        handler = getattr(self.inner, "on_event", None)
        await self._on_host(handler if handler is not None else self.inner, event)

    async def close(self) -> None:
        closer = getattr(self.inner, "close", None) if hasattr(self.inner, "on_event") else None
        if closer is not None:
            await self._on_host(closer)

    async def _on_host(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """``await fn(*args)`` as an asyncio task, awaited from trio: its result or error is
        this call's; cancelling this call cancels the task."""
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()

        async def call() -> Any:
            try:
                return await fn(*args)
            except SystemExit as error:  # asyncio raises it out of the host loop: hand it
                return _Exited(error)  # to the guest, whose caller disables the observer

        def wake(_: asyncio.Task[Any]) -> None:
            with contextlib.suppress(trio.RunFinishedError):  # the guest is gone: nobody waits
                token.run_sync_soon(done.set)

        # The guest runs on the host loop's thread, between its callbacks: a task may start.
        task = self.loop.create_task(call(), context=self.context.copy())
        task.add_done_callback(wake)
        try:
            await done.wait()
        except BaseException:
            task.cancel()
            task.add_done_callback(_retrieve)
            raise
        if task.cancelled():  # not ours: never let asyncio's CancelledError into trio
            raise RuntimeError("its asyncio task was cancelled")
        result = task.result()
        if isinstance(result, _Exited):
            raise result.error
        return result


@dataclass(frozen=True)
class _Exited:
    """A ``sys.exit`` in an observer's asyncio task, carried out of asyncio (found by
    review: asyncio re-raises it out of the host's loop, which ended the process)."""

    error: SystemExit


class AioRunHandle:
    """A run in progress, seen from asyncio: events, result, stop and cancel."""

    def __init__(self, bridge: _Bridge, handle: RunHandle, buffer: int) -> None:
        self._bridge, self._handle = bridge, handle
        self.run_id = handle.run_id
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=buffer)
        self.dropped = 0
        self._result = bridge.call(handle.result)
        self._pump = bridge.call(self._forward)
        self._pump.add_done_callback(_retrieve)

    async def _forward(self) -> None:
        try:
            async for event in self._handle.events():
                self._bridge.loop.call_soon_threadsafe(self._offer, event)
        finally:  # also when the runtime's close cuts it (found by review: a reader hung)
            self._bridge.loop.call_soon_threadsafe(self._offer, _END)

    def _offer(self, item: Any) -> None:
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:  # a slow asyncio consumer loses events, counted
            if item is _END:
                self._queue.get_nowait()
                self._queue.put_nowait(item)
            self.dropped += 1

    @property
    def observers(self) -> list[ObserverReport]:
        """How each observer of the run fared (final once `result` has returned)."""
        return self._handle.observers

    async def events(self) -> AsyncIterator[Any]:
        """The run's progress events until it ends (lossy for a slow consumer)."""
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            yield item

    async def result(self) -> RunOutcome:
        """The run's outcome; cancelling this await cancels the run (trees killed first).
        Raises `RunCancelled` for a run cancelled through its handle or by the runtime's close."""
        try:
            return await asyncio.shield(self._result)
        except asyncio.CancelledError:
            self.cancel()
            await asyncio.wait([self._result])  # the run's trees are gone when this returns
            if not self._result.cancelled():
                self._result.exception()  # retrieved: the run was cancelled on purpose
            raise
        except RuntimeClosed:  # the close cut the wait: the run's end is known once it is over
            await asyncio.shield(self._bridge.ended)
            return self._handle.ended()

    def stop(self) -> None:
        """Stop gracefully (the report says ``interrupted``)."""
        self._bridge.soon(self._handle.stop)

    def cancel(self) -> None:
        """Cancel at once; every tree of the run is killed."""
        self._bridge.soon(self._handle.cancel)


class AioRuntime:
    """The embedded runtime, driven from asyncio."""

    def __init__(self, bridge: _Bridge, runtime: EmbeddedRuntime) -> None:
        self._bridge, self._runtime = bridge, runtime

    async def start_optimize(
        self,
        request: OptimizeRequest,
        *,
        backends: Backends | None = None,
        observers: Sequence[ObserverLike] = (),
        events_buffer: int = EVENTS_BUFFER,
    ) -> AioRunHandle:
        """Check ``request`` and start its run (raises `InputError` for bad input). Cancelling
        the await cancels the run; the cancellation completes once its trees are gone.
        ``observers`` (asyncio code: see the module docstring) hear every event of this run
        and are closed when it ends; the runtime's own hear it too."""
        check_arguments(request, backends, events_buffer)
        hosted = _hosted(observers)
        scope = trio.CancelScope()
        started = self._bridge.call(self._start, request, backends, hosted, scope)
        try:
            handle = await asyncio.shield(started)
        except asyncio.CancelledError:
            await self._abandon(started, scope)
            raise
        assert handle is not None  # None only when `_abandon` cancelled the start
        return AioRunHandle(self._bridge, handle, events_buffer)

    async def _abandon(self, started: asyncio.Future[Any], scope: trio.CancelScope) -> None:
        """The caller left while its run was starting: cancel the start in trio (which cancels
        the run once it began) and, should the run have started anyway, cancel it too."""
        self._bridge.soon(scope.cancel)
        await asyncio.wait([started])
        if started.cancelled() or started.exception() is not None:
            return
        handle = started.result()
        if handle is not None:
            await asyncio.wait([self._bridge.call(handle._cancel_and_wait)])

    async def _start(
        self,
        request: OptimizeRequest,
        backends: Backends | None,
        observers: list[_HostObserver],
        scope: trio.CancelScope,
    ) -> RunHandle | None:
        with scope:  # start_optimize cancels the run (and waits for it) when cancelled
            return await self._runtime.start_optimize(
                request, backends=backends, observers=observers
            )
        return None

    async def optimize(
        self,
        request: OptimizeRequest,
        *,
        backends: Backends | None = None,
        observers: Sequence[ObserverLike] = (),
    ) -> Any:
        """Run ``request`` to its report; cancelling the await cancels the run."""
        handle = await self.start_optimize(request, backends=backends, observers=observers)
        return (await handle.result()).report

    @asynccontextmanager
    async def evolve_service(
        self,
        config: CampaignConfig | Mapping[str, Any],
        settings: ServiceSettings | None = None,
        *,
        backends: Backends | None = None,
    ) -> AsyncIterator[AioEvolveService]:
        """`evolane.embed.open_evolve_service` in the guest for the ``async with``; at exit
        its running job is cancelled (its trees killed; the job stays pending). Cancelling
        the entry closes the service it was opening before the cancellation goes on."""
        closing, closed = trio.Event(), trio.Event()

        async def start() -> EvolveService:
            assert self._bridge.nursery is not None
            return await self._bridge.nursery.start(
                _serve_evolve, self._runtime, config, settings, backends, closing, closed
            )

        started = self._bridge.call(start)
        try:
            service = await asyncio.shield(started)
        except asyncio.CancelledError:
            # Found by review: the service went on starting in the guest and ran there with
            # no owner, its store's queue held (a second one refused) until the runtime closed.
            await asyncio.wait([started])
            _retrieve(started)
            self._bridge.soon(closing.set)
            await asyncio.wait([self._bridge.call(closed.wait)])
            raise
        try:
            yield AioEvolveService(self._bridge, service)
        finally:
            self._bridge.soon(closing.set)
            await asyncio.shield(self._bridge.call(closed.wait))


class AioEvolveService:
    """`evolane.embed.EvolveService` driven from asyncio: ``await record(trajectory)``
    after each agent task; jobs run in the trio guest, in the background."""

    def __init__(self, bridge: _Bridge, service: EvolveService) -> None:
        self._bridge, self.service = bridge, service

    async def record(self, trajectory: Any) -> None:
        """`EvolveService.record` (raises `QueueFull` at the queue's bound)."""
        await self._bridge.call(self.service.record, trajectory)

    async def flush(self) -> PendingJob | None:
        """`EvolveService.flush`: queued records become a pending job now."""
        return await self._bridge.call(self.service.flush)

    @property
    def finished(self) -> list[PendingJob]:
        """Jobs the service ran to an end, in order."""
        return self.service.finished

    @property
    def faults(self) -> list[str]:
        """Background steps that failed and will be tried again (`EvolveService.faults`)."""
        return self.service.faults


async def _serve_evolve(
    runtime: EmbeddedRuntime,
    config: CampaignConfig | Mapping[str, Any],
    settings: ServiceSettings | None,
    backends: Backends | None,
    closing: trio.Event,
    closed: trio.Event,
    *,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    try:
        async with open_evolve_service(runtime, config, settings, backends=backends) as service:
            task_status.started(service)
            await closing.wait()
    finally:
        closed.set()


def _hosted(observers: Sequence[ObserverLike]) -> list[_HostObserver]:
    """``observers`` run on the running asyncio loop, in the caller's context (`TypeError`
    for anything that is no observer)."""
    loop, context = asyncio.get_running_loop(), contextvars.copy_context()
    return [_HostObserver(observer, loop, context) for observer in observers]


@asynccontextmanager
async def open_runtime(
    *, store: str = ".evolane", observers: Sequence[ObserverLike] = (), **options: Any
) -> AsyncIterator[AioRuntime]:
    """Start the trio runtime as a guest of the running asyncio loop for the ``async with``.
    ``observers`` (asyncio code: see the module docstring) hear every run it starts and are
    closed when it closes (`evolane.embed.open_runtime`)."""
    hosted = _hosted(observers)
    loop = asyncio.get_running_loop()
    bridge = _Bridge(loop)
    ready: asyncio.Future[AioRuntime] = loop.create_future()
    finished: asyncio.Future[Any] = loop.create_future()

    async def trio_main() -> None:
        async with (
            open_trio_runtime(store=store, observers=hosted, **options) as runtime,
            trio.open_nursery() as nursery,
        ):
            closing = bridge.opened(nursery)
            loop.call_soon_threadsafe(ready.set_result, AioRuntime(bridge, runtime))
            await closing.wait()
            nursery.cancel_scope.cancel()

    def done(outcome: Any) -> None:
        def settle() -> None:
            finished.set_result(outcome)
            bridge.ended.set_result(None)
            if not ready.done():  # the guest failed while starting
                ready.set_exception(RuntimeError(f"the evolane runtime did not start: {outcome}"))

        loop.call_soon_threadsafe(settle)

    if trio.lowlevel.in_trio_run():  # a runtime already open here (found by review)
        raise RuntimeError(
            "an evolane runtime is already open in this thread: one loop holds one runtime, "
            "share it (it runs many campaigns at once)"
        )
    # The guest's tasks (runs begin in its system tasks) inherit the context it starts in:
    # there, no sandbox host does file work on the loop the host's asyncio shares.
    guest = contextvars.copy_context()
    guest.run(INLINE_WORK.set, False)
    guest.run(
        trio.lowlevel.start_guest_run,
        trio_main,
        run_sync_soon_threadsafe=loop.call_soon_threadsafe,
        done_callback=done,
        host_uses_signal_set_wakeup_fd=_host_wakeup_fd_in_use(),
    )
    ready.add_done_callback(_retrieve)  # a start failure is raised from `finished` too
    try:
        yield await asyncio.shield(ready)
    finally:
        bridge.close()  # also when the caller was cancelled while the guest was starting
        outcome = await asyncio.shield(finished)
        outcome.unwrap()


def _host_wakeup_fd_in_use() -> bool:
    """Whether asyncio already set a signal wakeup fd (then trio must leave it alone)."""
    if threading.current_thread() is not threading.main_thread():
        return True  # only the main thread may touch it; leave it to the host
    previous = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(previous)
    return previous != -1
