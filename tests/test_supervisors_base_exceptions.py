"""An actor that dies of a BaseException that is no Exception (``SystemExit``,
``GeneratorExit``, a custom subclass raised by user code in an in-process backend, observer or
plugin) crashed: its ask fails at once and its supervisor restarts or escalates. Found by
review: only an Exception was a crash, so such an error left the actor's task, tore the tree
down with no policy, and an ask pending on the dead actor waited out its timeout (a hung run).
``trio.Cancelled`` and ``KeyboardInterrupt`` are no actor's crash: they propagate untouched.

Every ``fail_after`` here is a guard against the hang, not a timing figure.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

import evolane
from evolane.actors import Actor, ActorCrashed, ActorError, NotAnswered, is_crash
from evolane.messages import Message, Ping, Pong, StressWork
from evolane.supervisors import ActorSpec, StartFailed, SupervisorEscalation, SupervisorSpec

FATAL = StressWork(seq=1, crash=True)


class Fatal(BaseException):
    """What user code may raise that is no Exception."""


DEATHS = [Fatal, SystemExit, GeneratorExit]


class Dies(Actor):
    """Logs its starts, answers Ping, raises ``error`` on StressWork(crash=True) (at start
    when ``at_start``)."""

    accepts = (Ping, StressWork)

    def __init__(self, log: list[Any], error: type[BaseException], at_start: bool = False) -> None:
        self.log, self.error, self.at_start = log, error, at_start

    async def started(self) -> None:
        if self.at_start:
            raise self.error("died at start")
        self.log.append("start")

    async def receive(self, message: Message) -> Any:
        if isinstance(message, StressWork) and message.crash:
            raise self.error(f"died on {message.seq}")
        return Pong(seq=message.seq, responder=self.context.name)


class Cleaner(Actor):
    """On StressWork: waits until cancelled, then (shielded, as a measurement's stop is)
    asks ``peer`` a Ping and logs the error it gets."""

    accepts = (StressWork,)

    def __init__(self, log: list[Any], peer: str) -> None:
        self.log, self.peer = log, peer

    async def receive(self, message: Message) -> None:
        self.log.append("waiting")
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):  # no outer scope reaches in: the ask's own
                try:  # timeout is the hang detector
                    await self.context.lookup(self.peer).ask(Ping(seq=9), timeout=30)
                except ActorError as error:
                    self.log.append(error)


@pytest.mark.parametrize("death", DEATHS)
async def test_an_actor_dead_of_a_base_exception_fails_its_ask_and_is_restarted(
    death: type[BaseException],
) -> None:
    log: list[Any] = []
    with trio.fail_after(30):
        async with evolane.open_runtime() as rt:
            ref = await rt.spawn(Dies, log, death, name="dies")
            with pytest.raises(ActorCrashed, match=r"crashed handling stress\.work") as caught:
                await ref.ask(FATAL, timeout=60)
            assert isinstance(caught.value.__cause__, death)
            assert (await ref.ask(Ping(seq=2), timeout=60)).seq == 2  # the next incarnation
            assert log == ["start", "start"]
            assert rt.root.restarts_of("dies") == 1
            assert ref.stats().failed == 1 and rt.dead_letters.counts["crashed"] == 1


@pytest.mark.parametrize("death", DEATHS)
async def test_a_base_exception_past_the_restart_intensity_escalates_and_fails_queued_asks(
    death: type[BaseException],
) -> None:
    log: list[Any] = []
    with trio.fail_after(30), pytest.raises(SupervisorEscalation) as caught:
        async with evolane.open_runtime(max_restarts=0) as rt:
            ref = await rt.spawn(Dies, log, death, name="dies")
            await ref.tell(FATAL)
            with pytest.raises(NotAnswered, match="gave up"):  # queued behind the fatal one
                await ref.ask(Ping(seq=2), timeout=60)
            await trio.sleep_forever()  # the escalation ends the runtime
    assert caught.value.child == "dies"
    assert isinstance(caught.value.last_error, death)
    assert log == ["start"]


@pytest.mark.parametrize("death", DEATHS)
async def test_a_base_exception_at_start_is_a_start_failure(death: type[BaseException]) -> None:
    with trio.fail_after(30):
        async with evolane.open_runtime() as rt:
            with pytest.raises(StartFailed, match="died at start") as caught:
                await rt.spawn(Dies, [], death, name="dies", kwargs={"at_start": True})
            assert isinstance(caught.value.error, death)
            assert rt.root.children == []


async def test_an_interrupt_in_an_actor_ends_the_runtime_and_no_ask_waits_on_it() -> None:
    # KeyboardInterrupt (trio raises it in whatever task runs when SIGINT comes) is no crash
    # of the actor: restarting would swallow the Ctrl-C. It propagates; the interrupted
    # actor's asks fail at once, also the one a sibling asks in its shielded stop.
    log: list[Any] = []
    spec = SupervisorSpec(
        name="pair",
        children=[
            ActorSpec(name="victim", actor=Dies, args=(log, KeyboardInterrupt)),
            ActorSpec(name="cleaner", actor=Cleaner, args=(log, "victim")),
        ],
    )
    with trio.fail_after(30), pytest.raises(KeyboardInterrupt):
        async with evolane.open_runtime() as rt:
            sup = await rt.start_supervisor(spec)
            await sup.ref("cleaner").tell(StressWork(seq=1))
            while "waiting" not in log:
                await trio.sleep(0.01)
            with pytest.raises(NotAnswered, match="interrupted while handling it"):
                await sup.ref("victim").ask(FATAL, timeout=60)
            await trio.sleep_forever()  # the interrupt ends the runtime
    assert log.count("start") == 1  # never restarted
    (answer,) = [entry for entry in log if isinstance(entry, BaseException)]
    assert isinstance(answer, NotAnswered) and "is down" in str(answer)


async def test_is_crash_tells_an_actors_own_failure_from_a_stop_or_an_interrupt() -> None:
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.sleep(1)
        except trio.Cancelled as caught:
            cancelled = caught
    for crash in (Fatal(), SystemExit(2), GeneratorExit(), ValueError()):
        assert is_crash(crash)
    assert is_crash(BaseExceptionGroup("g", [Fatal(), ExceptionGroup("h", [ValueError()])]))
    assert not is_crash(cancelled) and not is_crash(KeyboardInterrupt())
    for inner in (cancelled, KeyboardInterrupt()):
        assert not is_crash(BaseExceptionGroup("g", [Fatal(), BaseExceptionGroup("h", [inner])]))
