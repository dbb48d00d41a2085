"""The actor kernel: bounded mailboxes, refs with tell/ask, and the per-actor serve loop."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import trio

from evolane._faults import INSTALLED
from evolane.actors._errors import (
    ActorCrashed,
    ActorStopped,
    AskTimeout,
    MailboxFull,
    MessageTypeError,
    NotAnswered,
)
from evolane.messages import Message, Record

if TYPE_CHECKING:
    from evolane.actors._deadletters import DeadLetterOffice

DEFAULT_MAILBOX_SIZE = 64
DEFAULT_ASK_TIMEOUT = 30.0
"""How long an `ask` without its own timeout waits for an answer: long enough for any
bookkeeping actor (budget, journal, progress) on a loaded 2-core host, short enough that a
lost reply surfaces as an `AskTimeout` instead of a hang. A runtime may set its own."""

_Envelope = tuple[Message, "_Reply | None"]
_NOT_CRASHES = (trio.Cancelled, KeyboardInterrupt)  # see `is_crash`


class ActorStats(Record):
    """A snapshot of one actor slot's counters (they survive restarts)."""

    name: str
    received: int
    processed: int
    failed: int
    mailbox_depth: int
    mailbox_peak: int
    mailbox_size: int
    restarts: int
    handler_seconds: float


class _Reply:
    """The reply slot of one `ask`: set once by the handler side, awaited by the caller."""

    __slots__ = ("error", "event", "value")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def succeed(self, value: Any) -> None:
        if not self.event.is_set():
            self.value = value
            self.event.set()

    def fail(self, error: BaseException) -> None:
        if not self.event.is_set():
            self.error = error
            self.event.set()


class Mailbox:
    """A bounded trio memory channel owned by an actor slot, with the slot's counters.

    It outlives incarnations of the actor, so refs stay valid across restarts; closing it
    refuses new messages and turns the queued ones into dead letters.
    """

    def __init__(
        self,
        name: str,
        accepts: tuple[type[Message], ...],
        dead_letters: DeadLetterOffice,
        size: int = DEFAULT_MAILBOX_SIZE,
        ask_timeout: float = DEFAULT_ASK_TIMEOUT,
    ) -> None:
        if not 1 <= size < math.inf:
            raise ValueError(f"mailbox size must be a positive whole number, got {size}")
        self.name = name
        self.size = size
        self.ask_timeout = ask_timeout
        self.accepts = accepts
        self.accepted: set[type] = set()
        self.dead_letters = dead_letters
        self.send_channel, self.receive_channel = trio.open_memory_channel[_Envelope](size)
        self.received = 0
        self.dequeued = 0
        self.processed = 0
        self.failed = 0
        self.peak = 0
        self.restarts = 0
        self.handler_seconds = 0.0
        self.closed = False
        self.down = False  # no incarnation will run soon: asks fail at once until one does
        self.down_reason = ""
        self.signal_types: tuple[type[Message], ...] = ()
        self.on_signal: Callable[[Message], None] | None = None  # the live incarnation's
        self.signals_dropped = 0

    def check_type(self, message: object) -> None:
        """Admit ``message`` if its type is one the actor accepts; else raise, enqueue nothing."""
        if isinstance(message, self.accepts):
            self.accepted.add(type(message))
            return
        wanted = ", ".join(cls.__name__ for cls in self.accepts)
        raise MessageTypeError(
            f"actor {self.name!r} accepts {wanted}; got {type(message).__name__}"
        )

    def note_enqueued(self) -> None:
        self.received += 1
        depth = self.received - self.dequeued
        if depth > self.peak:
            self.peak = depth

    def close(self) -> int:
        """Refuse new messages and dead-letter the queued ones; returns how many were queued."""
        self.closed = True
        self.send_channel.close()
        drained = 0
        while True:
            try:
                message, reply = self.receive_channel.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            drained += 1
            self.dequeued += 1
            self.dead_letters.post(self.name, message.kind, "stopped")
            if reply is not None:
                reply.fail(NotAnswered(f"actor {self.name!r} stopped before answering"))
        self.receive_channel.close()
        return drained

    def go_down(self, reason: str = "its supervisor gave up") -> int:
        """No incarnation will serve it soon (its supervisor gave up, or it ended with its
        supervisor cancelled or interrupted): fail every queued ask (`NotAnswered`, naming
        ``reason``), and every new one until an incarnation runs again (a caller waited out
        its ask's timeout for an answer no one would give: found by review, a lane pool that
        crashed stalled the run 80 s and a Ctrl-C with it). Queued tells stay for a next
        incarnation. Returns how many asks were failed."""
        self.down, self.down_reason = True, reason
        kept, failed = [], 0
        while not self.closed:  # a closed box failed its asks when it closed
            try:
                message, reply = self.receive_channel.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            if reply is None:
                kept.append((message, reply))
                continue
            failed += 1
            self.dequeued += 1
            self.dead_letters.post(self.name, message.kind, "stopped")
            reply.fail(NotAnswered(f"actor {self.name!r} is down: {reason}"))
        for envelope in kept:  # they fit: they were just taken out
            self.send_channel.send_nowait(envelope)
        return failed

    def stats(self) -> ActorStats:
        """The current counters as a frozen record."""
        return ActorStats(
            name=self.name,
            received=self.received,
            processed=self.processed,
            failed=self.failed,
            mailbox_depth=max(0, self.received - self.dequeued),
            mailbox_peak=self.peak,
            mailbox_size=self.size,
            restarts=self.restarts,
            handler_seconds=self.handler_seconds,
        )


async def _enqueue(box: Mailbox, envelope: _Envelope) -> None:
    """Queue ``envelope``: at once when there is room, else wait for room (backpressure)."""
    try:
        try:
            box.send_channel.send_nowait(envelope)
        except trio.WouldBlock:
            await box.send_channel.send(envelope)
    except (trio.ClosedResourceError, trio.BrokenResourceError):
        raise ActorStopped(f"actor {box.name!r} has stopped") from None
    box.note_enqueued()


class ActorRef:
    """The only handle on an actor: send it messages, ask it questions, read its stats."""

    __slots__ = ("_box",)

    def __init__(self, mailbox: Mailbox) -> None:
        self._box = mailbox

    @property
    def name(self) -> str:
        return self._box.name

    @property
    def stopped(self) -> bool:
        """True once the actor has stopped for good (its mailbox is closed)."""
        return self._box.closed

    def __repr__(self) -> str:
        return f"ActorRef({self._box.name!r})"

    async def tell(self, message: Message) -> None:
        """Enqueue ``message``, waiting for room when the mailbox is full (backpressure)."""
        box = self._box
        if type(message) not in box.accepted:
            box.check_type(message)
        await _enqueue(box, (message, None))

    def tell_nowait(self, message: Message) -> None:
        """Enqueue ``message`` now or raise `MailboxFull`; never waits."""
        box = self._box
        if type(message) not in box.accepted:
            box.check_type(message)
        try:
            box.send_channel.send_nowait((message, None))
        except trio.WouldBlock:
            raise MailboxFull(f"actor {box.name!r} mailbox is full ({box.size})") from None
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ActorStopped(f"actor {box.name!r} has stopped") from None
        box.note_enqueued()

    async def ask(self, message: Message, timeout: float | None = None) -> Any:
        """Send ``message`` and wait at most ``timeout`` seconds (default: the runtime's
        ``ask_timeout``, see `DEFAULT_ASK_TIMEOUT`) for the handler's return value.

        Raises `AskTimeout`, `ActorStopped` (refused), `NotAnswered` (enqueued, then the actor
        stopped, or it is down) or `ActorCrashed` (the handler raised: any error that
        `is_crash`, a `BaseException` that is no `Exception` included).
        """
        box = self._box
        if type(message) not in box.accepted:
            box.check_type(message)
        if timeout is None:
            timeout = box.ask_timeout
        if box.down:
            raise NotAnswered(f"actor {box.name!r} is down: {box.down_reason}")
        reply = _Reply()
        envelope = (message, reply)
        with trio.move_on_after(timeout):
            await _enqueue(box, envelope)
            await reply.event.wait()
        if not reply.event.is_set():
            raise AskTimeout(f"actor {box.name!r} did not answer {message.kind} within {timeout}s")
        if reply.error is not None:
            raise reply.error
        return reply.value

    def signal(self, message: Message) -> bool:
        """Deliver a control message out of band, now: the live incarnation's `Actor.on_signal`
        handles it even while a `receive` runs (a stop for the unit in flight cannot queue
        behind that unit). Returns False when no incarnation is live (stopped, restarting):
        the signal is dropped and counted, since its target work is gone with the incarnation.
        Raises `MessageTypeError` for a type the actor does not list in ``signals``.
        """
        box = self._box
        if not isinstance(message, box.signal_types) and box.on_signal is not None:
            wanted = ", ".join(cls.__name__ for cls in box.signal_types) or "no signals"
            raise MessageTypeError(
                f"actor {box.name!r} takes {wanted}; got signal {type(message).__name__}"
            )
        handler = box.on_signal
        if handler is None or box.closed:
            box.signals_dropped += 1
            return False
        handler(message)
        return True

    def stats(self) -> ActorStats:
        """A snapshot of this actor slot's counters."""
        return self._box.stats()


class ActorContext:
    """What a running actor knows of the world: its own ref and the runtime's name registry."""

    __slots__ = ("_registry", "ref")

    def __init__(self, ref: ActorRef, registry: dict[str, ActorRef]) -> None:
        self.ref = ref
        self._registry = registry

    @property
    def name(self) -> str:
        return self.ref.name

    def lookup(self, name: str) -> ActorRef:
        """The ref registered under ``name`` in this runtime; KeyError if there is none."""
        return self._registry[name]


class Actor:
    """Base class of every actor: subclass, set ``accepts`` and implement `receive`.

    One instance per incarnation: a restart builds a fresh instance with fresh state, while
    the slot's mailbox, ref and counters carry over.
    """

    accepts: ClassVar[tuple[type[Message], ...]] = (Message,)
    signals: ClassVar[tuple[type[Message], ...]] = ()
    """Control messages handled out of band by `on_signal` (see `ActorRef.signal`)."""
    context: ActorContext
    _stop_requested: bool = False

    async def started(self) -> None:
        """Called before the first message; a failure here is a failure to start."""

    async def receive(self, message: Message) -> Any:
        """Handle one message; the return value answers an `ask`."""
        raise NotImplementedError

    async def stopped(self) -> None:
        """Called once the actor leaves its loop normally (not after a crash)."""

    def on_signal(self, message: Message) -> None:
        """Handle one of ``signals`` at once, beside a running `receive`. It must not block
        (it is not async): it sets this actor's own flags or events and returns."""

    def stop(self) -> None:
        """Leave the loop normally after the current message (a clean exit for `transient`)."""
        self._stop_requested = True


class ServeControl:
    """Flags shared by a serve loop and its supervisor cell to stop it at a safe point."""

    __slots__ = ("busy", "idle_scope", "stopping")

    def __init__(self) -> None:
        self.busy = False
        self.stopping = False
        self.idle_scope: trio.CancelScope | None = None

    def request_stop(self) -> None:
        """Leave the loop after the current message, or at once when waiting for one."""
        self.stopping = True
        if self.idle_scope is not None:
            self.idle_scope.cancel()


async def serve(actor: Actor, box: Mailbox, control: ServeControl) -> None:
    """Run ``actor`` on ``box`` until stopped, re-raising a handler's exception after filing it.

    A graceful stop never interrupts a handler and never drops a queued message: the loop
    leaves only from an empty wait or between two messages.
    """
    box.signal_types, box.on_signal = type(actor).signals, actor.on_signal
    try:
        await _serve_loop(actor, box, control)
    finally:
        box.on_signal = None
    await actor.stopped()


async def _serve_loop(actor: Actor, box: Mailbox, control: ServeControl) -> None:
    """The loop of `serve`: one message at a time, stopping only at a safe point."""
    channel = box.receive_channel
    handle = actor.receive
    clock = time.perf_counter
    while True:
        await trio.lowlevel.cancel_shielded_checkpoint()
        if control.stopping or actor._stop_requested:
            break
        try:
            message, reply = channel.receive_nowait()
        except trio.WouldBlock:
            with trio.CancelScope() as idle:
                control.idle_scope = idle
                message, reply = await channel.receive()
            control.idle_scope = None
            if idle.cancelled_caught:
                break
        control.busy = True
        box.dequeued += 1
        started = clock()
        try:
            if INSTALLED:
                await INSTALLED[0].before_handler(box.name, message.kind)
            result = await handle(message)
        except BaseException as error:  # filed, then raised as itself: Cancelled untouched
            _file_failure(box, message, reply, error)
            raise
        finally:
            control.busy = False
        box.handler_seconds += clock() - started
        box.processed += 1
        if reply is not None:
            reply.succeed(result)


def is_crash(error: BaseException) -> bool:
    """Whether ``error``, raised out of an actor's own code, is that actor's crash.

    Anything is, `SystemExit`, `GeneratorExit` and any other `BaseException` included (user
    code in an in-process backend, observer or plugin may raise them: the actor died of it,
    its supervisor restarts or escalates), except two that are no actor's failure and must
    propagate untouched: `trio.Cancelled` (a stop from outside) and `KeyboardInterrupt` (the
    user's interrupt of the whole process, which trio raises in whatever task runs when
    SIGINT arrives: restarting there would swallow the Ctrl-C). A group is a crash only when
    neither is anywhere inside it.
    """
    if isinstance(error, BaseExceptionGroup):
        return error.subgroup(_NOT_CRASHES) is None
    return not isinstance(error, _NOT_CRASHES)


def _file_failure(
    box: Mailbox, message: Message, reply: _Reply | None, error: BaseException
) -> None:
    """A handler raised ``error``: count it, post the dead letter and fail the ask it was
    answering, at once: `ActorCrashed` (``__cause__`` is ``error``) for a crash (`is_crash`),
    else `NotAnswered` (stopped or interrupted while handling it)."""
    if is_crash(error):
        box.failed += 1
        box.dead_letters.post(box.name, message.kind, "crashed", repr(error))
        if reply is not None:
            crashed = ActorCrashed(f"actor {box.name!r} crashed handling {message.kind}: {error!r}")
            crashed.__cause__ = error
            reply.fail(crashed)
        return
    interrupted = not isinstance(error, trio.Cancelled)
    box.dead_letters.post(box.name, message.kind, "cancelled", repr(error) if interrupted else "")
    if reply is not None:
        how = "interrupted" if interrupted else "stopped"
        reply.fail(NotAnswered(f"actor {box.name!r} was {how} while handling it"))
