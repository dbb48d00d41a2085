"""Supervision: each strategy, restart policies, intensity and escalation, ordered shutdown."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

import evolane
from evolane.actors import ActorStopped, NotAnswered
from evolane.messages import Ping, StressWork
from evolane.supervisors import (
    ActorSpec,
    Restart,
    StartFailed,
    Strategy,
    SupervisorEscalation,
    SupervisorSpec,
    leaf_exceptions,
)
from tests.helpers import Recorder, Stubborn

CRASH = StressWork(seq=1, crash=True)


def trio_of(log: list[tuple[str, str]], strategy: Strategy, **limits: Any) -> SupervisorSpec:
    children = [ActorSpec(name=n, actor=Recorder, args=(log,)) for n in ("a", "b", "c")]
    return SupervisorSpec(name="sup", children=children, strategy=strategy, **limits)


async def crash_and_settle(ref: evolane.ActorRef, log: list[tuple[str, str]], events: int) -> None:
    """Crash ``ref``, wait for ``events`` log entries, then a little longer for strays."""
    await ref.tell(CRASH)
    with trio.fail_after(2):
        while len(log) < events:
            await trio.sleep(0.005)
    await trio.sleep(0.05)


@pytest.mark.parametrize(
    ("strategy", "after_crash"),
    [
        ("one_for_one", [("start", "b")]),
        (
            "one_for_all",
            [("stop", "c"), ("stop", "a"), ("start", "a"), ("start", "b"), ("start", "c")],
        ),
        ("rest_for_one", [("stop", "c"), ("start", "b"), ("start", "c")]),
    ],
)
async def test_strategy_restarts_the_right_children_in_order(
    strategy: Strategy, after_crash: list[tuple[str, str]]
) -> None:
    log: list[tuple[str, str]] = []
    async with evolane.open_runtime() as rt:
        sup = await rt.start_supervisor(trio_of(log, strategy))
        assert log == [("start", "a"), ("start", "b"), ("start", "c")]
        log.clear()
        await crash_and_settle(sup.ref("b"), log, len(after_crash))
        assert log == after_crash
        log.clear()
    assert log == [("stop", "c"), ("stop", "b"), ("stop", "a")]


@pytest.mark.parametrize(
    ("restart", "crash", "restarted"),
    [
        ("permanent", True, True),
        ("permanent", False, True),
        ("transient", True, True),
        ("transient", False, False),
        ("temporary", True, False),
        ("temporary", False, False),
    ],
)
async def test_restart_policy(restart: Restart, crash: bool, restarted: bool) -> None:
    log: list[tuple[str, str]] = []
    async with evolane.open_runtime() as rt:
        ref = await rt.spawn(Recorder, log, name="child", restart=restart)
        await ref.tell(CRASH if crash else StressWork(seq=0))  # seq=0: a clean exit
        with trio.fail_after(5):  # until it was restarted or retired for good
            while log.count(("start", "child")) < 2 and not ref.stopped:
                await trio.sleep(0.005)
        assert log.count(("start", "child")) == (2 if restarted else 1)
        if restarted:
            assert await ref.ask(Ping(seq=1), timeout=1)
        else:
            assert ref.stopped
            with pytest.raises(ActorStopped):
                await ref.tell(Ping(seq=1))


async def test_restart_intensity_escalates_to_the_parent_naming_child_and_error() -> None:
    log: list[tuple[str, str]] = []
    with trio.fail_after(5), pytest.raises(SupervisorEscalation) as caught:
        async with evolane.open_runtime(max_restarts=2, within_seconds=5) as rt:
            ref = await rt.spawn(Recorder, log, name="flaky")
            for seq in range(3):
                await ref.tell(StressWork(seq=seq, crash=True))
                await trio.sleep(0.05)
            await trio.sleep(5)
    assert caught.value.child == "flaky"
    assert isinstance(caught.value.last_error, ValueError)
    assert "more than 2 restarts within 5" in str(caught.value)
    assert "boom 2" in str(caught.value)
    assert log.count(("start", "flaky")) == 3


async def test_restarts_spread_beyond_the_window_do_not_escalate(autojump_clock: Any) -> None:
    async with evolane.open_runtime(max_restarts=1, within_seconds=1.0) as rt:
        ref = await rt.spawn(Recorder, [], name="slowflaky")
        for seq in range(4):
            await ref.tell(StressWork(seq=seq, crash=True))
            await trio.sleep(1.5)
        assert rt.root.restarts_of("slowflaky") == 4


async def test_nested_supervisor_escalates_and_its_parent_restarts_it_keeping_refs() -> None:
    log: list[tuple[str, str]] = []
    inner = SupervisorSpec(
        name="inner",
        children=[ActorSpec(name=n, actor=Recorder, args=(log,)) for n in ("x", "y")],
        max_restarts=0,
    )
    outer = SupervisorSpec(name="outer", children=[inner], max_restarts=5)
    async with evolane.open_runtime() as rt:
        sup = await rt.start_supervisor(outer)
        x = sup.child("inner").ref("x")
        log.clear()
        await crash_and_settle(x, log, 3)
        # inner gave up (0 restarts allowed): stopped y; outer restarted inner: x and y anew.
        assert log == [("stop", "y"), ("start", "x"), ("start", "y")]
        assert sup.restarts_of("inner") == 1
        assert sup.child("inner").ref("x") is x


@pytest.mark.parametrize("retired_sibling", [False, True])
async def test_asks_to_a_slot_whose_supervisor_gave_up_fail_at_once_until_it_runs_again(
    retired_sibling: bool,
) -> None:
    # Found by review: a lane pool that gave up left its queued asks (and new ones) waiting
    # out their timeouts while the parent was still stopping its other children, which
    # waited on those very asks: a run stalled 80 s, a Ctrl-C with it. A retired sibling (a
    # temporary child that ended: its mailbox closed) before the slot must not stop that.
    log: list[tuple[str, Any]] = []
    children = [ActorSpec(name="x", actor=Recorder, args=(log,))]
    if retired_sibling:
        children.insert(0, ActorSpec(name="t", actor=Recorder, args=(log,), restart="temporary"))
    inner = SupervisorSpec(name="inner", children=children, max_restarts=0)
    holder = ActorSpec(name="holder", actor=Stubborn, args=(log,), shutdown_grace=0.05)
    outer = SupervisorSpec(name="outer", children=[inner, holder], strategy="one_for_all")
    async with evolane.open_runtime() as rt:
        sup = await rt.start_supervisor(outer)
        if retired_sibling:
            await sup.child("inner").ref("t").tell(StressWork(seq=0))  # ends: retired
            with trio.fail_after(10):
                while ("stop", "t") not in log:
                    await trio.sleep(0.01)
        x = sup.child("inner").ref("x")
        await sup.ref("holder").tell(StressWork(seq=3000))  # holds the restart ~3 s
        await trio.sleep(0.02)
        queued: list[BaseException] = []

        async def ask_behind_the_crash() -> None:
            try:
                await x.ask(StressWork(seq=1), timeout=60)
            except NotAnswered as error:
                queued.append(error)

        with trio.fail_after(10):  # far less than the asks' 60 s
            async with trio.open_nursery() as nursery:
                await x.tell(CRASH)
                nursery.start_soon(ask_behind_the_crash)
            assert queued and "gave up" in str(queued[0])
            with pytest.raises(NotAnswered, match="is down"):
                await x.ask(Ping(seq=1), timeout=60)  # the parent is still restarting
            while True:  # once the parent restarted it, the slot answers again
                with contextlib.suppress(NotAnswered):
                    assert (await x.ask(Ping(seq=2), timeout=60)).seq == 2
                    break
                await trio.sleep(0.05)


async def test_shutdown_gives_grace_then_cancels_a_child_ignoring_cancellation() -> None:
    log: list[tuple[str, Any]] = []
    async with evolane.open_runtime() as rt:
        spec = SupervisorSpec(
            name="s",
            children=[
                ActorSpec(name="first", actor=Recorder, args=(log,)),
                ActorSpec(name="stubborn", actor=Stubborn, args=(log,), shutdown_grace=0.1),
            ],
        )
        sup = await rt.start_supervisor(spec)
        start = trio.current_time()  # before the tell: the shield ends >= 0.4 s after this
        await sup.ref("stubborn").tell(StressWork(seq=400))  # shielded for 400 ms
        await trio.sleep(0.02)
        await rt.root.stop_child("s")
        took = trio.current_time() - start
    # Grace (0.1 s) passed, the cancel waited out the shield (0.4 s), then took effect at once
    # (not after the handler's 10 s sleep).
    assert took > 0.3  # the shield was waited out; that the 10 s sleep was not is the log's
    kinds = [entry[0] for entry in log]
    assert "shield-done" in kinds and "not-cancelled" not in kinds
    # Reverse order: "first" stopped only after the stubborn child was gone.
    assert kinds.index("shield-done") < kinds.index("stop")


async def test_a_busy_child_finishing_within_grace_completes_its_message() -> None:
    log: list[tuple[str, str]] = []
    async with evolane.open_runtime() as rt:
        ref = await rt.spawn(Recorder, log, name="worker")
        await ref.tell(StressWork(seq=100))
        await trio.sleep(0.01)
    assert log[-2:] == [("handled", "worker"), ("stop", "worker")]
    assert ref.stats().processed == 1


async def test_start_failure_is_reported_and_earlier_children_are_stopped() -> None:
    log: list[tuple[str, str]] = []
    spec = SupervisorSpec(
        name="s",
        children=[
            ActorSpec(name="ok", actor=Recorder, args=(log,)),
            ActorSpec(name="bad", actor=Recorder, args=(log,), kwargs={"fail_start": True}),
        ],
    )
    async with evolane.open_runtime() as rt:
        with pytest.raises(StartFailed, match="cannot start"):
            await rt.start_supervisor(spec)
        assert log == [("start", "ok"), ("stop", "ok")]
        assert rt.root.children == []


async def test_cancelled_body_still_shuts_down_in_reverse_order() -> None:
    log: list[tuple[str, str]] = []
    with trio.CancelScope() as scope:
        async with evolane.open_runtime() as rt:
            for name in ("a", "b", "c"):
                await rt.spawn(Recorder, log, name=name)
            scope.deadline = trio.current_time() + 0.1  # the body is cancelled, not the spawns
            await trio.sleep(10)
    assert scope.cancelled_caught
    assert log[-3:] == [("stop", "c"), ("stop", "b"), ("stop", "a")]


def test_leaf_exceptions_flattens_nested_groups_left_to_right() -> None:
    a, b, c, d = (ValueError(name) for name in "abcd")
    group = BaseExceptionGroup("g", [a, BaseExceptionGroup("h", [b, ExceptionGroup("i", [c])]), d])
    assert leaf_exceptions(group) == [a, b, c, d]
    assert leaf_exceptions(a) == [a]
    deep: BaseException = KeyboardInterrupt()
    for _ in range(5000):  # deeper than the recursion limit: the walk is iterative
        deep = BaseExceptionGroup("nested", [deep])
    (leaf,) = leaf_exceptions(deep)
    assert isinstance(leaf, KeyboardInterrupt)


ENTERED_CANCELLED = """
import sys, trio
import evolane, evolane.supervisors

async def main():
    opener = {"embed": evolane.open_runtime, "supervisors": evolane.supervisors.open_runtime}
    arguments = {"store": sys.argv[2]} if sys.argv[1] == "embed" else {}
    with trio.CancelScope() as scope:
        scope.cancel()  # a host whose deadline passed as it opened the runtime
        async with opener[sys.argv[1]](**arguments):
            await trio.sleep(3600)
    print("back", scope.cancelled_caught)

trio.run(main)
"""


@pytest.mark.parametrize("layer", ["embed", "supervisors"])
def test_a_runtime_opened_under_a_cancelled_scope_gives_control_back(
    tmp_path: Path, layer: str
) -> None:
    # The root supervisor starts shielded through `nursery.start`, which, its caller being
    # cancelled, left it in its own nursery and waited for it to end: it never did (a hang).
    code = ENTERED_CANCELLED
    command = [sys.executable, "-c", code, layer, str(tmp_path / "store")]
    try:  # a bound on a hang, not a timing figure
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"open_runtime ({layer}) under a cancelled scope never returned")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "back True"
