"""A lane's stop of one unit (`UnitStop`) cuts an in-process backend's call through a cancel
scope bound to it, with no task of its own waiting on the stop (run_backend took a nursery
and a watcher task a call: two of the six tasks a unit cost)."""

from __future__ import annotations

from pathlib import Path

import trio

from evolane.lanes import BackendCall, run_backend
from evolane.lanes._stop import StopSwitches
from evolane.sandbox import UnitStop

CALL = BackendCall(role="replay", workspace=Path("/nonexistent"), seed=0)


class _Tasks(trio.abc.Instrument):
    def __init__(self) -> None:
        self.spawned = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.spawned += 1


async def _forever(call: BackendCall) -> None:
    await trio.sleep_forever()


async def test_a_stop_set_during_the_call_cuts_it_and_starts_no_task() -> None:
    stop, tasks = UnitStop(), _Tasks()
    outcome = None

    async def call() -> None:
        nonlocal outcome
        trio.lowlevel.add_instrument(tasks)
        try:
            outcome = await run_backend(_forever, CALL, trio.current_time() + 3600, stop)
        finally:
            trio.lowlevel.remove_instrument(tasks)

    with trio.fail_after(30):  # a guard against a hang, not a timing figure
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await trio.testing.wait_all_tasks_blocked()
            stop.set()
    assert outcome is not None
    assert (outcome.status, outcome.exit_code) == ("cancelled", None)
    assert tasks.spawned == 0  # the call ran in its caller's task alone


async def test_a_stop_set_before_the_call_cuts_it_at_once() -> None:
    stop = UnitStop()
    stop.set()
    with trio.fail_after(30):
        outcome = await run_backend(_forever, CALL, trio.current_time() + 3600, stop)
    assert outcome.status == "cancelled"


async def test_a_bound_scope_is_let_go_when_it_ends() -> None:
    """A scope that ended is no longer cancelled by a later stop (nothing is kept past it),
    and a stop still wakes its waiters as an event does."""
    stop = UnitStop()
    with stop.cancelling() as scope:
        pass
    stop.set()
    assert not scope.cancel_called
    with trio.fail_after(30):
        await stop.wait()
    assert stop.is_set()


async def test_the_lanes_switches_stop_units_by_name_and_all_at_once() -> None:
    switches = StopSwitches()
    early = "u-early"
    switches.stop((early,))  # its stop overtook its job
    first, second, late = switches.arm("u1"), switches.arm("u2"), switches.arm(early)
    assert late.is_set() and not first.is_set()
    with first.cancelling() as scope:
        switches.stop(("u1",))
        await trio.lowlevel.checkpoint()
    assert scope.cancelled_caught
    switches.stop_all()
    assert second.is_set()
