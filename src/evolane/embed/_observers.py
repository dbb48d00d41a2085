"""Observers: code that hears every progress event of a run (a tracker, a dashboard, a log).

An observer is either an object with ``async def on_event(self, event) -> None`` (and, if
it holds resources, ``async def close(self) -> None``), or a plain async callable
``async def observer(event) -> None``. Attach observers to one run with
``runtime.start_optimize(request, observers=[...])``, or to every run of a runtime with
``open_runtime(observers=[...])`` (runtime-wide: they hear each run, events carry its
``run_id``, and are closed once, when the runtime closes); the CLI's ``--observer NAME``
loads one from the ``evolane.observers`` entry-point group (a factory taking no argument).

Each observer gets every event through its own bounded subscription of the run's progress
bus, so a slow one never slows the run: what it cannot take is dropped and counted (the
run's ``events.jsonl`` has every event), and reported once, when the run ends
(`ObserverReport.note`). An observer that raises is disabled: the run publishes one
`WarningEvent` naming it and goes on. When the run ends the observers take the events they
still hold (at most `OBSERVER_DRAIN_TIMEOUT`) and the run's own are closed (each at most
`OBSERVER_CLOSE_TIMEOUT`). A runtime-wide observer that raises is disabled for that run
only: the next run feeds it again. An observer may also have a synchronous
``run_ended(run_id)`` (`RUN_ENDED`): it is called when each run it heard ends (a cancelled
run publishes no ``event.run_finished``), before the run's own observers are closed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import trio

from evolane.actors import is_crash
from evolane.lanes import OBSERVER_GROUP, PluginError, load_entry, plugin_points
from evolane.measure import ProgressBus, Subscription
from evolane.messages import ProgressEvent, WarningEvent, printable

OBSERVER_BUFFER = 256
"""Events an observer's subscription holds for it; beyond that they are dropped (counted)."""
OBSERVER_DRAIN_TIMEOUT = 10.0
"""Seconds a finished run waits for its observers to take the events they still hold."""
OBSERVER_CLOSE_TIMEOUT = 5.0
"""Seconds a finished run (or, for runtime-wide observers, a closing runtime) waits for each
observer's ``close()``."""
MAX_WARNING_CHARS = 256
MAX_NOTE_CHARS = 1024
"""The longest `ObserverReport.note` (an observer's error can be any length)."""


@runtime_checkable
class Observer(Protocol):
    """Hears each progress event of a run; ``close()`` (optional) is awaited at its end."""

    async def on_event(self, event: ProgressEvent) -> None:
        """Take one event (it must not block for long: a slow observer loses events)."""
        ...


ObserverLike = Observer | Callable[[ProgressEvent], Awaitable[None]]
"""What a run accepts as an observer: an `Observer` or a plain async callable."""


@dataclass
class ObserverReport:
    """How one observer fared in a run."""

    name: str
    delivered: int = 0
    """Events it took."""
    dropped: int = 0
    """Events it lost because it was too slow (``events.jsonl`` has them)."""
    failed: str | None = None
    """Why it was disabled (it raised), or None."""
    announced: bool = False
    """Whether its failure was published as a `WarningEvent` (the run was still going)."""

    def note(self) -> str | None:
        """One line for a person when something was lost or failed, else None (at most
        `MAX_NOTE_CHARS`, shown as text: the name and the error are the observer's words,
        found by review printed whole, escape sequences and all)."""
        if self.failed is not None:
            return _line(f"observer {self.name} was disabled: {self.failed}")
        if self.dropped:
            return _line(
                f"observer {self.name} missed {self.dropped} events (too slow); the run's "
                "events.jsonl has them all"
            )
        return None


def _line(text: str) -> str:
    """``text`` as one bounded line of text (no terminal control, no line break)."""
    return " ".join(printable(text).split())[:MAX_NOTE_CHARS]


def observer_plugin(name: str) -> Any:
    """A new observer from the ``evolane.observers`` plugin ``name`` (its factory called
    with no argument; the observer is named after the entry point). `PluginError` (one
    line naming the plugin) for an unknown name, a failed load or a raising factory."""
    points = plugin_points(OBSERVER_GROUP)
    if name not in points:
        known = ", ".join(sorted(points)) or "none installed"
        raise PluginError(f"--observer {name}: unknown observer (installed: {known})")
    where = f"--observer {name} (plugin {points[name].value})"
    factory = load_entry(points[name], where)
    try:
        observer = factory()
    except BaseException as error:  # sys.exit too: one line naming it (found by review)
        if not is_crash(error):
            raise
        raise PluginError(f"{where}: the factory raised {type(error).__name__}: {error}") from None
    if not (hasattr(observer, "on_event") or callable(observer)):
        raise PluginError(f"{where}: the factory returned {type(observer).__name__}, no observer")
    return _Named(observer, name)


WRAPS_OBSERVER = "wraps_observer"
"""The class attribute (True) of evolane's wrappers of an observer, held as ``inner``."""
RUN_ENDED = "run_ended"
"""An observer's optional synchronous method ``run_ended(run_id)``, called when a run it
heard has ended: a runtime-wide `OpenTelemetryObserver` ends that run's spans there (found by
review: a cancelled run's spans stayed open, unexported, until the runtime closed)."""


def unwrapped(observer: Any) -> Any:
    """The user's observer inside evolane's wrappers of it (`WRAPS_OBSERVER`)."""
    while getattr(type(observer), WRAPS_OBSERVER, False) is True:
        observer = observer.inner
    return observer


@dataclass
class _Named:
    """A plugin observer under its entry point's name."""

    inner: Any
    name: str
    wraps_observer: ClassVar[bool] = True

    async def on_event(self, event: ProgressEvent) -> None:
        handler = getattr(self.inner, "on_event", None)
        await (handler(event) if handler is not None else self.inner(event))

    async def close(self) -> None:
        closer = getattr(self.inner, "close", None) if hasattr(self.inner, "on_event") else None
        if closer is not None:
            await closer()


def observer_name(observer: Any) -> str:
    """How messages name ``observer``: its ``name`` attribute, else its type or function."""
    name = getattr(observer, "name", None)
    if isinstance(name, str) and name:
        return name
    if hasattr(observer, "on_event"):
        return type(observer).__name__
    return str(getattr(observer, "__name__", type(observer).__name__))


@dataclass
class _Entry:
    """One observer of a run, its relay's scope and how it fared."""

    observer: Any
    report: ObserverReport
    owned: bool = True
    """Closed when the run ends (False: a runtime-wide observer, closed with its runtime)."""
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    relayed: trio.Event = field(default_factory=trio.Event)
    attached: bool = False

    async def deliver(self, event: ProgressEvent) -> None:
        handler = getattr(self.observer, "on_event", None)
        await (handler(event) if handler is not None else self.observer(event))


def distinct(observers: Sequence[ObserverLike]) -> list[ObserverLike]:
    """``observers`` with each one once, in order: one given twice, or to both
    ``open_runtime`` and ``start_optimize``, hears each event once and is closed once, as
    the runtime-wide one it is (found by review: it heard every event once per mention and
    was closed by each run besides its runtime). An `evolane.aio` or plugin wrapper counts
    as the observer it wraps (its ``inner``; a class says it is one with `WRAPS_OBSERVER`:
    a user's observer may have an ``inner`` of its own, found by review)."""
    seen: set[int] = set()
    kept = []
    for observer in observers:
        wraps = getattr(type(observer), WRAPS_OBSERVER, False) is True
        key = id(observer.inner if wraps else observer)
        if key not in seen:
            seen.add(key)
            kept.append(observer)
    return kept


def check_observers(observers: Sequence[ObserverLike]) -> None:
    """Raise `TypeError` for anything in ``observers`` that is no observer."""
    for observer in observers:
        if not (hasattr(observer, "on_event") or callable(observer)):
            raise TypeError(f"{observer!r} is no observer (on_event or an async callable)")


class Observing:
    """The observers of one run: `attach` them to its bus, `close` them when it ends.

    ``shared`` observers (runtime-wide ones) hear the run like the run's own ``observers``
    (they come first) but are not closed with it: their runtime closes them
    (`close_observers`)."""

    def __init__(
        self,
        observers: Sequence[ObserverLike],
        buffer: int = OBSERVER_BUFFER,
        shared: Sequence[ObserverLike] = (),
    ) -> None:
        check_observers([*shared, *observers])
        mine = [(o, False) for o in distinct(shared)]
        mine += [(o, True) for o in distinct([*shared, *observers])[len(mine) :]]
        self._entries = [_Entry(o, ObserverReport(observer_name(o)), owned) for o, owned in mine]
        self._buffer = buffer
        self._run_id: str | None = None

    @property
    def reports(self) -> list[ObserverReport]:
        """How each observer fared (final once `close` returned)."""
        return [entry.report for entry in self._entries]

    def attach(self, bus: ProgressBus, nursery: trio.Nursery) -> None:
        """Subscribe every observer to ``bus`` and start its relay in ``nursery``."""
        self._run_id = bus.run_id
        for entry in self._entries:
            feed, subscription = bus.subscribe(self._buffer)
            entry.attached = True
            nursery.start_soon(self._relay, entry, feed, subscription, bus)

    async def _relay(
        self,
        entry: _Entry,
        feed: trio.MemoryReceiveChannel[ProgressEvent],
        subscription: Subscription,
        bus: ProgressBus,
    ) -> None:
        """Hand ``entry`` each event until the feed ends, the relay is cut, or it raises."""
        report = entry.report
        try:
            with entry.scope:
                async for event in feed:
                    try:
                        await entry.deliver(event)
                    except BaseException as error:  # the observer's bug, never the run's
                        if not is_crash(error):  # a cancellation, the user's Ctrl-C
                            raise
                        report.failed = f"it raised {type(error).__name__}: {error}"
                        feed.close()  # the bus stops feeding it
                        _warn(bus, report)
                        return
                    report.delivered += 1
        finally:
            left = feed.statistics().current_buffer_used if not report.failed else 0
            feed.close()
            report.dropped = subscription.dropped + left
            entry.relayed.set()

    async def close(self) -> None:
        """Let the observers take what they hold (bounded), then close each of the run's own
        (bounded); runs shielded, so a cancelled run still closes its observers."""
        with trio.CancelScope(shield=True):
            with trio.move_on_after(OBSERVER_DRAIN_TIMEOUT):
                for entry in self._entries:
                    if entry.attached:
                        await entry.relayed.wait()
            for entry in self._entries:
                entry.scope.cancel()
                if entry.attached:
                    with trio.move_on_after(OBSERVER_CLOSE_TIMEOUT):  # one that ignores it
                        await entry.relayed.wait()
                    if not entry.relayed.is_set() and entry.report.failed is None:
                        entry.report.failed = (
                            "on_event() did not stop when cancelled at the run's end (a "
                            "shielded wait): the runtime waits for it as it closes"
                        )  # said, at least (found by review: the process hung without a word)
                    _run_ended(entry, self._run_id)
                if entry.owned:
                    failed = await close_observer(entry.observer)
                    if entry.report.failed is None:
                        entry.report.failed = failed


def _run_ended(entry: _Entry, run_id: str | None) -> None:
    """Tell ``entry``'s observer that run ``run_id`` ended (`RUN_ENDED`), if it asks."""
    ended = getattr(unwrapped(entry.observer), RUN_ENDED, None)
    if ended is None or run_id is None:
        return
    try:
        ended(run_id)
    except BaseException as error:  # the observer's bug, never the run's
        if not is_crash(error):
            raise
        if entry.report.failed is None:
            entry.report.failed = f"{RUN_ENDED}() raised {type(error).__name__}: {error}"


async def close_observer(observer: Any) -> str | None:
    """Await ``observer.close()`` if it has one (at most `OBSERVER_CLOSE_TIMEOUT`); returns
    why that failed (it raised, it took too long), else None. Never raises."""
    closer = getattr(observer, "close", None)
    if closer is None or not hasattr(observer, "on_event"):
        return None
    failed = None
    started = trio.current_time()
    with trio.move_on_after(OBSERVER_CLOSE_TIMEOUT) as scope:
        try:
            await closer()
        except BaseException as error:  # a sys.exit too (found by review)
            if not is_crash(error):
                raise
            failed = f"close() raised {type(error).__name__}: {error}"
    took = trio.current_time() - started
    if scope.cancelled_caught and failed is None:
        failed = f"close() took over {OBSERVER_CLOSE_TIMEOUT:g} s"
    elif took > OBSERVER_CLOSE_TIMEOUT and failed is None:  # a blocking call: cannot be cut
        failed = (
            f"close() took {took:.1f} s, over {OBSERVER_CLOSE_TIMEOUT:g} s, without yielding to "
            "cancellation (a blocking call or a shielded wait)"
        )  # found by review: said nothing
    return failed


async def close_observers(observers: Sequence[ObserverLike]) -> list[str]:
    """Close runtime-wide ``observers`` one by one (each bounded, shielded); returns one
    line per observer whose close failed, naming it."""
    failures = []
    with trio.CancelScope(shield=True):
        for observer in distinct(observers):
            failed = await close_observer(observer)
            if failed is not None:
                failures.append(f"observer {observer_name(observer)}: {failed}")
    return failures


def _warn(bus: ProgressBus, report: ObserverReport) -> None:
    """One warning event for a disabled observer (while the run can still publish)."""
    if bus.closed:
        return
    message = f"{report.note()}; the run goes on"
    bus.publish(WarningEvent(run_id=bus.run_id, message=message[:MAX_WARNING_CHARS]))
    report.announced = True
