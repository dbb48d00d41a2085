"""An in-process backend that exits (``sys.exit``, as ``argparse`` does on bad arguments) is
the backend's own failure, like a command's exit code: the run goes on to its report (it
hung before: the SystemExit left the lane, and nothing answered the unit)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

import evolane
from evolane.embed import Backend, BackendCall, Backends, OptimizeRequest
from evolane.sandbox import UnitStop
from tests.campaign_helpers import toy_config, write_toy
from tests.test_embed import PLAN, judge_backend, optimizer_backend


def _bad_arguments() -> None:
    parser = argparse.ArgumentParser(prog="my-agent", exit_on_error=True)
    parser.add_argument("--case", required=True)
    parser.parse_args(["--no-such-option"])


async def argparse_replay(call: BackendCall) -> None:
    """An agent's ``main`` reused in-process: its parser exits on an option it lacks."""
    _bad_arguments()


async def _replay_failures(tmp_path: Path, replay: Backend) -> list[dict[str, Any]]:
    """Run the toy campaign with ``replay`` as its in-process replay backend (argparse's
    usage text to /dev/null) and return each unit's replay failure; the run must report
    ``failed``, never hang (the guard below is a hang detector, not a timing figure)."""
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths, replay="backend:agent", judge="backend:j", optimizer="backend:o")
    backends = Backends(replay=replay, judge=judge_backend, optimizer=optimizer_backend)
    stderr = sys.stderr
    sys.stderr = open("/dev/null", "w")  # noqa: SIM115 - argparse prints its usage there
    try:
        with trio.fail_after(120):
            async with evolane.open_runtime(store=paths["store"]) as runtime:
                report = await runtime.optimize(OptimizeRequest(config=config), backends=backends)
    finally:
        sys.stderr.close()
        sys.stderr = stderr
    assert report is not None and report.status == "failed"
    journal = paths["store"] / "runs" / report.run_id / "journal.jsonl"
    units = [orjson.loads(line) for line in journal.read_bytes().splitlines()]
    failures = [unit["replay"]["failure"] for unit in units if unit["type"] == "unit"]
    assert failures
    return failures


async def test_a_backend_that_exits_fails_its_units_and_the_run_reports(tmp_path: Path) -> None:
    failures = await _replay_failures(tmp_path, argparse_replay)
    assert {failure["code"] for failure in failures} == {"exit_2"}
    assert {failure["owner"] for failure in failures} == {"task"}  # as a command's


class AgentAbort(BaseException):
    """A custom BaseException of an agent's own code: no Exception, no SystemExit."""


async def aborting_replay(call: BackendCall) -> None:
    raise AgentAbort("the agent gave up")


async def test_a_backend_raising_a_base_exception_fails_its_unit_as_the_task_and_the_run_reports(
    tmp_path: Path,
) -> None:
    # Found by review: the lane died of it and nothing answered the unit (run_backend let it
    # out): the tree came down with no policy and the campaign's stop of the measurement
    # waited 120 s on the dead scheduler. Now the backend's failure is its unit's, as an
    # exception's is (exit 1, owned by the task, the error as stderr); a lane that dies of
    # one all the same is restarted by its supervisor (test_supervisors_base_exceptions).
    failures = await _replay_failures(tmp_path, aborting_replay)
    assert {failure["code"] for failure in failures} == {"exit_1"}
    assert {failure["owner"] for failure in failures} == {"task"}


async def nursery_replay(call: BackendCall) -> None:
    """The same exit from a task of the backend's own nursery: trio raises it inside a
    `BaseExceptionGroup`, which is no `Exception` (found by review: the run hung)."""

    async def main() -> None:
        _bad_arguments()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(main)


async def test_an_exit_from_a_backends_own_task_fails_its_units_too(tmp_path: Path) -> None:
    failures = await _replay_failures(tmp_path, nursery_replay)
    assert {failure["code"] for failure in failures} == {"exit_2"}
    assert all("SystemExit: 2" in failure["message"] for failure in failures), failures[0]


async def cleanup_fails_replay(call: BackendCall) -> None:
    """A backend whose task's cleanup raises when it is cancelled."""

    async def worker() -> None:
        try:
            await trio.sleep_forever()
        finally:
            raise RuntimeError("cleanup failed")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker)
        await trio.sleep_forever()


@pytest.mark.parametrize("stop_type", [trio.Event, UnitStop], ids=["event", "unit-stop"])
async def test_a_backend_failing_as_it_is_stopped_or_timed_out_leaves_no_group(
    stop_type: type[trio.Event | UnitStop],
) -> None:
    # Found by review: the deadline's or the stop's Cancelled and the cleanup's error came
    # out of the backend as one group; run_backend let it go (not all the backend's own),
    # the cancel scope took the Cancelled and an ExceptionGroup of the RuntimeError left
    # the lane: a lane crash owned by the framework, not a timed-out or stopped unit.
    from evolane.lanes._backends import run_backend

    call = BackendCall(role="replay", workspace=Path("/nonexistent"), seed=0)
    with trio.fail_after(30):  # a guard against the hang, not a timing figure
        timed_out = await run_backend(cleanup_fails_replay, call, trio.current_time(), trio.Event())
        stop = stop_type()
        stop.set()
        stopped = await run_backend(cleanup_fails_replay, call, trio.current_time() + 3600, stop)
    assert (timed_out.status, timed_out.exit_code) == ("timed_out", None)
    assert (stopped.status, stopped.exit_code) == ("cancelled", None)
    # A cancellation from outside still leaves run_backend, the cleanup's error dropped.
    with trio.CancelScope() as outer:
        outer.cancel()
        await run_backend(cleanup_fails_replay, call, trio.current_time() + 3600, stop_type())
    assert outer.cancelled_caught


async def interrupted_replay(call: BackendCall) -> None:
    """What trio does with a Ctrl-C that arrives while a busy backend runs: it raises
    `KeyboardInterrupt` there."""
    raise KeyboardInterrupt


async def test_a_ctrl_c_in_a_backend_leaves_the_runtime_as_a_keyboard_interrupt(
    tmp_path: Path,
) -> None:
    # Found by review: it came out of open_runtime as a BaseExceptionGroup of the
    # KeyboardInterrupt and what it interrupted (NotAnswered), which a host's
    # ``except KeyboardInterrupt`` missed (the CLI digs it out; an embedding could not).
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths, replay="backend:agent", judge="backend:j", optimizer="backend:o")
    backends = Backends(replay=interrupted_replay, judge=judge_backend, optimizer=optimizer_backend)
    with pytest.raises(KeyboardInterrupt), trio.fail_after(120):
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            await runtime.optimize(OptimizeRequest(config=config), backends=backends)
