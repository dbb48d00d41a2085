"""The actor kernel: typed tell/ask, backpressure, timeouts, crashes, dead letters, stats."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
import trio
from trio.testing import wait_all_tasks_blocked

import evolane
from evolane.actors import (
    ActorCrashed,
    ActorStopped,
    AskTimeout,
    MailboxFull,
    MessageTypeError,
    NotAnswered,
)
from evolane.messages import Message, Ping, Pong, StressWork
from evolane.supervisors import open_runtime as open_actor_runtime
from tests.helpers import Recorder


class Gated(evolane.Actor):
    """Each handler waits for ``gate``: busy for exactly as long as the test needs."""

    accepts = (StressWork,)

    def __init__(self, gate: trio.Event) -> None:
        self.gate = gate

    async def receive(self, message: Message) -> Any:
        assert isinstance(message, StressWork)
        await self.gate.wait()
        return message.seq


async def test_ask_returns_the_handler_value_and_tell_is_handled() -> None:
    log: list[tuple[str, str]] = []
    async with evolane.open_runtime() as rt:
        ref = await rt.spawn(Recorder, log, name="rec")
        assert await ref.ask(Ping(seq=7), timeout=1) == Pong(seq=7, responder="rec")
        await ref.tell(StressWork(seq=1))
        assert await ref.ask(StressWork(seq=2), timeout=1) == 2
        stats = ref.stats()
        assert (stats.received, stats.processed, stats.failed) == (3, 3, 0)
    assert ("handled", "rec") in log


async def test_wrongly_typed_message_is_refused_at_the_sender_and_not_enqueued() -> None:
    async with evolane.open_runtime() as rt:
        ref = await rt.spawn(Recorder, [], name="rec")
        with pytest.raises(MessageTypeError, match="accepts Ping, StressWork"):
            await ref.tell({"kind": "ping", "seq": 1})  # type: ignore[arg-type]
        with pytest.raises(MessageTypeError):
            ref.tell_nowait(Pong(seq=1, responder="x"))
        with pytest.raises(MessageTypeError):
            await ref.ask(Pong(seq=1, responder="x"), timeout=1)
        assert ref.stats().received == 0


def test_oversized_message_cannot_be_built_so_cannot_be_sent() -> None:
    with pytest.raises(pydantic.ValidationError):
        Pong(seq=1, responder="x" * 129)
    with pytest.raises(pydantic.ValidationError):
        Ping(seq=-1)
    with pytest.raises(TypeError, match="must be validated"):
        Pong.model_construct(seq=1, responder="x" * 10_000)


async def test_tell_applies_backpressure_and_tell_nowait_refuses_when_full() -> None:
    gate = trio.Event()
    async with evolane.open_runtime() as rt:
        ref = await rt.spawn(Gated, gate, name="slow", mailbox_size=2)
        await ref.tell(StressWork(seq=1))
        await wait_all_tasks_blocked()  # the handler took it and waits for the gate
        await ref.tell(StressWork(seq=1))
        await ref.tell(StressWork(seq=1))
        with pytest.raises(MailboxFull):
            ref.tell_nowait(StressWork(seq=1))
        with trio.move_on_after(0.05) as blocked:
            await ref.tell(StressWork(seq=1))
        assert blocked.cancelled_caught, "tell must wait while the mailbox is full"
        gate.set()
        with trio.fail_after(2):
            await ref.tell(StressWork(seq=1))  # room appears once the slow handler is done
        assert ref.stats().mailbox_peak == 2


async def test_ask_times_out_with_a_typed_error_instead_of_hanging() -> None:
    async with evolane.open_runtime() as rt:
        ref = await rt.spawn(Recorder, [], name="slow")
        start = trio.current_time()
        with pytest.raises(AskTimeout, match="did not answer"):
            await ref.ask(StressWork(seq=400), timeout=0.1)
        assert trio.current_time() - start < 1.0


async def test_ask_to_a_crashing_actor_gets_actor_crashed_and_the_slot_restarts() -> None:
    log: list[tuple[str, str]] = []
    async with evolane.open_runtime() as rt:
        ref = await rt.spawn(Recorder, log, name="fragile")
        with trio.fail_after(2), pytest.raises(ActorCrashed, match="boom 5") as caught:
            await ref.ask(StressWork(seq=5, crash=True), timeout=1)
        assert isinstance(caught.value.__cause__, ValueError)
        # The same ref works after the restart, and the crash left a dead letter.
        assert await ref.ask(Ping(seq=1), timeout=1) == Pong(seq=1, responder="fragile")
        assert rt.root.restarts_of("fragile") == 1
        assert ref.stats().failed == 1
        letter = rt.dead_letters.recent[-1]
        assert (letter.target, letter.kind, letter.reason) == ("fragile", "stress.work", "crashed")
        assert "boom 5" in letter.detail
    assert log.count(("start", "fragile")) == 2


async def test_ask_to_a_stopped_actor_fails_at_once() -> None:
    async with evolane.open_runtime() as rt:
        ref = await rt.spawn(Recorder, [], name="gone", restart="temporary")
        await rt.root.stop_child("gone")
        assert ref.stopped
        with trio.fail_after(1):
            with pytest.raises(ActorStopped):
                await ref.ask(Ping(seq=1), timeout=30)
            with pytest.raises(ActorStopped):
                await ref.tell(Ping(seq=1))
        with pytest.raises(KeyError):
            rt.lookup("gone")


async def test_queued_asks_fail_and_become_dead_letters_when_the_actor_stops_for_good() -> None:
    gate = trio.Event()
    async with evolane.open_runtime() as rt:
        ref = await rt.spawn(Gated, gate, name="busy", restart="temporary")
        outcomes: list[BaseException | object] = []

        async def asker(seq: int) -> None:
            try:
                outcomes.append(await ref.ask(StressWork(seq=seq), timeout=5))
            except NotAnswered as exc:
                outcomes.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(asker, 200)
            await wait_all_tasks_blocked()  # its handler waits for the gate
            for _ in range(3):
                nursery.start_soon(asker, 1)
            await wait_all_tasks_blocked()  # the three are queued
            with trio.fail_after(3):  # well inside the 5 s grace: not ended by the cancel
                async with trio.open_nursery() as stopper:
                    stopper.start_soon(rt.root.stop_child, "busy")
                    await wait_all_tasks_blocked()  # the stop was asked for; it waits
                    gate.set()
        # The in-flight handler finished within its grace; the three queued asks were refused.
        assert outcomes[0] == 200
        assert sum(isinstance(o, NotAnswered) for o in outcomes) == 3
        assert rt.dead_letters.counts["stopped"] == 3


async def test_names_are_unique_and_lookup_finds_refs() -> None:
    async with evolane.open_runtime() as rt:
        ref = await rt.spawn(Recorder, [], name="one")
        assert rt.lookup("one") is ref
        with pytest.raises(ValueError, match="already taken"):
            await rt.spawn(Recorder, [], name="one")
        assert [s.name for s in rt.stats()] == ["one"]


async def test_user_error_in_the_runtime_body_is_raised_as_itself() -> None:
    with pytest.raises(LookupError, match="mine"):
        async with evolane.open_runtime() as rt:
            await rt.spawn(Recorder, [], name="x")
            raise LookupError("mine")


class Interruptible(evolane.Actor):
    """Its handler waits until a `Ping` signal arrives out of band: a signal must reach it
    while it is busy, since the queued mailbox would deliver it only after the handler."""

    accepts = (StressWork,)
    signals = (Ping,)

    def __init__(self) -> None:
        self.interrupted = trio.Event()
        self.seen: list[int] = []

    def on_signal(self, message: Message) -> None:
        assert isinstance(message, Ping)
        self.seen.append(message.seq)
        self.interrupted.set()

    async def receive(self, message: Message) -> Any:
        await self.interrupted.wait()
        return self.seen


async def test_a_signal_reaches_a_busy_actor_at_once_and_is_typed() -> None:
    async with open_actor_runtime() as rt:
        ref = await rt.spawn(Interruptible, name="busy", restart="temporary")
        async with trio.open_nursery() as nursery:
            answers: list[Any] = []

            async def ask() -> None:
                answers.append(await ref.ask(StressWork(seq=1), timeout=5))

            nursery.start_soon(ask)
            await wait_all_tasks_blocked()
            assert ref.stats().mailbox_depth == 0  # the handler runs: the queue is empty
            with pytest.raises(MessageTypeError, match="takes Ping"):
                ref.signal(StressWork(seq=2))
            assert ref.signal(Ping(seq=9)) is True
        assert answers == [[9]]
        await rt.root.stop_child("busy")
        assert ref.signal(Ping(seq=10)) is False  # nobody to stop: dropped, not raised


async def test_an_ask_without_a_timeout_waits_the_runtimes_ask_timeout() -> None:
    gate = trio.Event()
    async with open_actor_runtime(ask_timeout=0.2) as rt:
        ref = await rt.spawn(Gated, gate, name="slow")
        with trio.fail_after(10), pytest.raises(AskTimeout, match=r"within 0\.2s"):
            await ref.ask(StressWork(seq=1))
        gate.set()
