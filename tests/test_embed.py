"""The embedding API: `evolane.open_runtime` with `start_optimize`/`optimize`, in-process
Python backends, events, cancellation; and the asyncio host (`evolane.aio`)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
import trio

import evolane
import evolane.aio
from evolane.embed import Backend, BackendCall, Backends, OptimizeRequest
from evolane.inputs import InputError
from evolane.messages import RunFinished
from evolane.sandbox import LEASE_VARIABLE, lease_holders
from tests.campaign_helpers import toy_config, write_toy

PLAN = {"0.0": "fix:2", "0.1": "harm:1", "1.0": "fix:1"}


async def replay_backend(call: BackendCall) -> dict:
    """Answer from the candidate's file, in-process (what an agent replaying itself does)."""
    assert call.candidate is not None and call.output_dir is not None and call.case is not None
    answer = (call.candidate / call.case["id"]).read_text()
    (call.output_dir / "output.json").write_text(answer)
    return {"tokens": 10, "cost_usd": 0.001}


async def judge_backend(call: BackendCall) -> float:
    assert call.output_dir is not None and call.case is not None
    return 1.0 if json.loads((call.output_dir / "output.json").read_text()) == "yes" else 0.0


async def optimizer_backend(call: BackendCall) -> str:
    """Fix the first failing case the prompt names."""
    assert call.workdir is not None and call.prompt is not None
    failing = [f["id"] for f in call.prompt["failing"]]
    if failing:
        (call.workdir / failing[0]).write_text('"yes"')
    return f"fixed {failing[:1]}"


async def test_optimize_with_python_backends_runs_nothing_outside(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(
        paths, replay="backend:replay", judge="backend:judge", optimizer="backend:optimizer"
    )
    backends = Backends(replay=replay_backend, judge=judge_backend, optimizer=optimizer_backend)
    with trio.fail_after(60):
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            handle = await runtime.start_optimize(OptimizeRequest(config=config), backends=backends)
            events = [event async for event in handle.events()]
            outcome = await handle.result()
    report = outcome.report
    assert report is not None and report.status == "finished"
    assert isinstance(events[-1], RunFinished) and events[-1].run_id == handle.run_id
    assert report.scores.best_val is not None and report.scores.baseline_val is not None
    assert report.scores.best_val.mean > report.scores.baseline_val.mean
    assert report.budget.spent.tokens and report.budget.spent.tokens > 0  # usage from the backend
    assert all(f.optimizer.startswith("fixed") for f in report.funnel)


async def test_bad_input_raises_from_start_optimize(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths).model_copy(update={"target": str(tmp_path / "missing")})
    async with evolane.open_runtime(store=paths["store"]) as runtime:
        with pytest.raises(InputError, match="--target"):
            await runtime.start_optimize(OptimizeRequest(config=config))


async def test_bad_arguments_raise_one_clear_error_and_write_nothing(tmp_path: Path) -> None:
    # Found by review: AttributeErrors from inside, "Nursery is closed to new arrivals", and
    # a negative events_buffer raised only after the run was written, left `running`.
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths)
    request = OptimizeRequest(config=config)
    async with evolane.open_runtime(store=paths["store"]) as runtime:
        with pytest.raises(TypeError, match="takes an OptimizeRequest, not CampaignConfig"):
            await runtime.start_optimize(config)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="backends: a Backends"):
            await runtime.start_optimize(request, backends={"replay": replay_backend})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"backends\.judge: 'judge\.py' is not callable"):
            await runtime.start_optimize(request, backends=Backends(judge="judge.py"))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="events_buffer -1"):
            await runtime.start_optimize(request, events_buffer=-1)
    with pytest.raises(RuntimeError, match="runtime is closed"):
        await runtime.start_optimize(request)
    assert not list((paths["store"] / "runs").glob("*"))


def _hanging_backend() -> tuple[trio.Event, Backend]:
    """A replay backend that never returns, and the event it sets once it has begun."""
    entered = trio.Event()

    async def hanging(call: BackendCall) -> None:
        entered.set()
        await trio.sleep_forever()

    return entered, hanging


async def test_cancelling_cancels_an_in_process_backend_at_once(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    entered, hanging = _hanging_backend()
    config = toy_config(paths, replay="backend:hang")
    with trio.fail_after(30):
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            handle = await runtime.start_optimize(
                OptimizeRequest(config=config), backends=Backends(replay=hanging)
            )
            await entered.wait()
            handle.cancel()
            with pytest.raises(evolane.RunCancelled):
                await handle.result()
    (run_dir,) = (paths["store"] / "runs").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"


async def test_optimize_cancelled_by_the_caller_kills_every_tree(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths, replay="sleep 3600", kill_grace=0.2)
    lease = os.environ[LEASE_VARIABLE]
    before = lease_holders(lease)  # e.g. a library's helper process started earlier
    with trio.fail_after(30):
        async with (
            evolane.open_runtime(store=paths["store"]) as runtime,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(runtime.optimize, OptimizeRequest(config=config))
            while not lease_holders(lease) - before:  # the replays are running
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    assert not lease_holders(lease) - before  # every tree was killed before the cancel returned


def test_asyncio_host_runs_a_campaign_and_keeps_the_loop_responsive(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    replay = 'sh -c \'sleep 0.02; cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\' r'
    config = toy_config(paths, replay=replay + " {candidate} {output_dir}")

    async def main() -> tuple[object, list[object], float]:
        delays: list[float] = []

        async def ticker() -> None:
            while True:
                before = time.monotonic()
                await asyncio.sleep(0.01)
                delays.append(time.monotonic() - before - 0.01)

        tick = asyncio.create_task(ticker())
        async with evolane.aio.open_runtime(store=str(paths["store"])) as runtime:
            handle = await runtime.start_optimize(OptimizeRequest(config=config))
            events = [event async for event in handle.events()]
            outcome = await handle.result()
        tick.cancel()
        assert len(delays) > 20  # the ticker kept running beside the campaign
        return outcome, events, max(delays)

    outcome, events, worst = asyncio.run(main())
    assert outcome.report is not None and outcome.report.status == "finished"  # type: ignore[attr-defined]
    assert isinstance(events[-1], RunFinished)
    assert worst < 5.0  # the loop never stalled; the figure is in benchmarks/aio_latency.py


def test_cancelling_the_asyncio_task_cancels_the_run_and_its_trees(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths, replay="sleep 3600", kill_grace=0.2)
    lease = os.environ[LEASE_VARIABLE]
    before = lease_holders(lease)

    async def main() -> None:
        async with evolane.aio.open_runtime(store=str(paths["store"])) as runtime:
            task = asyncio.create_task(runtime.optimize(OptimizeRequest(config=config)))
            async with asyncio.timeout(30):
                while not task.done() and not lease_holders(lease) - before:  # replays running
                    await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not lease_holders(lease) - before  # every tree was gone when the cancel ended

    asyncio.run(main())
    (run_dir,) = (paths["store"] / "runs").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"


def _sleeper_config(root: Path) -> evolane.CampaignConfig:
    from evolane.cli._examples import SLEEPER_DEFAULTS, example_settings

    settings = example_settings("sleeper", root / "ex")
    keys = ("target", "dataset", "replay", "judge", "optimizer")
    presets = {**SLEEPER_DEFAULTS, "iterations": 1, "population": 1, "replay_concurrency": 4}
    return evolane.CampaignConfig(
        **{k: settings[k] for k in keys},
        required_files=tuple(settings["required_files"]),
        store=str(root / "store"),
        **presets,
    )


async def test_the_trio_api_runs_the_sleeper_end_to_end(tmp_path: Path) -> None:
    config = _sleeper_config(tmp_path)
    with trio.fail_after(120):
        async with evolane.open_runtime(store=config.store) as runtime:
            report = await runtime.optimize(OptimizeRequest(config=config))
    assert report is not None and report.status == "finished"
    assert report.budget.spent.tokens and report.budget.spent.tokens > 0  # sleeper usage.json
    assert report.test is not None


def test_the_asyncio_api_runs_the_sleeper_end_to_end(tmp_path: Path) -> None:
    config = _sleeper_config(tmp_path)

    async def main() -> object:
        async with evolane.aio.open_runtime(store=config.store) as runtime:
            return await asyncio.wait_for(runtime.optimize(OptimizeRequest(config=config)), 120)

    report = asyncio.run(main())
    assert report is not None and report.status == "finished"  # type: ignore[attr-defined]


def _runs_left(store: Path) -> dict[str, tuple[str, int]]:
    """Each run in ``store``: its status and the size of its events file."""
    found = {}
    for run_dir in sorted((store / "runs").glob("*")):
        events = run_dir / "events.jsonl"
        status = json.loads((run_dir / "run.json").read_text())["status"]
        found[run_dir.name] = (status, events.stat().st_size if events.exists() else 0)
    return found


START_CANCELS = ["at-once", "after-5ms", "once-run-json-exists"]
"""When the caller of `start_optimize` is cancelled: before its first checkpoint, a few ms
in (preparing), and the moment the run is written (before it has begun)."""


def _run_written(store: Path) -> bool:
    """Whether the run's records are being written: campaign.json first, then run.json (the
    last write before the run begins, so polling for run.json could see it too late)."""
    return bool(list(store.glob("campaigns/*/campaign.json")))


async def _cancel_when(moment: str, store: Path, scope: trio.CancelScope) -> None:
    if moment == "after-5ms":
        await trio.sleep(0.005)
    else:
        while not _run_written(store):
            await trio.sleep(0.001)
    scope.cancel()


@pytest.mark.parametrize("moment", START_CANCELS)
async def test_cancelling_the_caller_while_the_run_starts_leaves_no_run_going(
    tmp_path: Path, moment: str
) -> None:
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths, replay="sleep 3600", kill_grace=0.2)
    lease = os.environ[LEASE_VARIABLE]
    before = lease_holders(lease)
    with trio.fail_after(60):
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            async with trio.open_nursery() as nursery:
                with trio.CancelScope() as scope:
                    if moment == "at-once":
                        scope.cancel()
                    else:
                        nursery.start_soon(_cancel_when, moment, paths["store"], scope)
                    await runtime.start_optimize(OptimizeRequest(config=config))
                    pytest.fail("start_optimize returned in spite of the cancellation")
                nursery.cancel_scope.cancel()
            assert not runtime._nursery.child_tasks  # no run goes on without a handle
            assert not lease_holders(lease) - before  # and none of its trees
            runs = _runs_left(paths["store"])
            assert all(status == "interrupted" for status, _ in runs.values()), runs
        assert _runs_left(paths["store"]) == runs  # the events file stopped growing


@pytest.mark.parametrize("moment", START_CANCELS)
def test_cancelling_the_asyncio_start_cancels_the_run_and_kills_its_trees(
    tmp_path: Path, moment: str
) -> None:
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths, replay="sleep 3600", kill_grace=0.2)
    lease = os.environ[LEASE_VARIABLE]
    before = lease_holders(lease)

    async def cancel_when(task: asyncio.Task[object], runtime: evolane.aio.AioRuntime) -> None:
        if moment == "at-once":  # as soon as trio has begun the run (it is preparing)
            while not runtime._runtime._nursery.child_tasks:
                await asyncio.sleep(0)
        elif moment == "after-5ms":
            await asyncio.sleep(0.005)
        else:
            while not _run_written(paths["store"]):
                await asyncio.sleep(0.001)
        task.cancel()

    async def main() -> dict[str, tuple[str, int]]:
        async with evolane.aio.open_runtime(store=str(paths["store"])) as runtime:
            task = asyncio.create_task(runtime.start_optimize(OptimizeRequest(config=config)))
            canceller = asyncio.create_task(cancel_when(task, runtime))
            async with asyncio.timeout(60):
                with pytest.raises(asyncio.CancelledError):
                    await task
                await canceller
            assert not runtime._runtime._nursery.child_tasks  # no run goes on
            assert not lease_holders(lease) - before
            runs = _runs_left(paths["store"])
        assert all(status == "interrupted" for status, _ in runs.values()), runs
        return runs

    runs = asyncio.run(main())
    assert _runs_left(paths["store"]) == runs


@pytest.mark.parametrize("ticks", [1, 2, 5])
def test_cancelling_the_asyncio_host_while_the_guest_starts_ends_the_task(
    tmp_path: Path, ticks: int
) -> None:
    entered = []

    async def use() -> None:
        async with evolane.aio.open_runtime(store=str(tmp_path / "store")):
            entered.append(True)
            await asyncio.sleep(3600)

    async def main() -> None:
        task = asyncio.create_task(use())
        for _ in range(ticks):
            await asyncio.sleep(0)
        task.cancel()
        async with asyncio.timeout(30):  # the guest closes as soon as it has started
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    assert not entered


async def test_closing_the_runtime_under_a_run_makes_result_raise_run_cancelled(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, PLAN)
    entered, hanging = _hanging_backend()
    config = toy_config(paths, replay="backend:hang")
    with trio.fail_after(30):
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            handle = await runtime.start_optimize(
                OptimizeRequest(config=config), backends=Backends(replay=hanging)
            )
            await entered.wait()
        # the runtime's close cancelled the run from outside the handle's own scope
        assert handle.done
        with pytest.raises(evolane.RunCancelled, match="runtime closed"):
            await handle.result()


async def test_a_bad_cluster_or_a_python_replay_on_dask_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    from pydantic import ValidationError

    paths = write_toy(tmp_path, PLAN)
    with pytest.raises(ValidationError, match="--cluster bogus"):
        toy_config(paths, cluster="bogus")
    with pytest.raises(ValidationError, match="--cluster dask://nowhere"):
        toy_config(paths).model_copy(update={"cluster": "dask://nowhere"})
    with pytest.raises(ValidationError, match="--cluster"):
        OptimizeRequest(config={**toy_config(paths).model_dump(), "cluster": "local:0"})
    config = toy_config(paths, replay="backend:replay", cluster="local:1")
    async with evolane.open_runtime(store=paths["store"]) as runtime:
        with pytest.raises(InputError, match="in-process replay backend"):
            await runtime.start_optimize(
                OptimizeRequest(config=config), backends=Backends(replay=replay_backend)
            )
    assert not (paths["store"] / "runs").exists()  # no run.json: nothing was persisted


async def test_a_store_that_is_a_file_or_a_corrupt_run_record_is_bad_input(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for store in (a_file, a_file / "below"):
        async with evolane.open_runtime(store=store) as runtime:
            with pytest.raises(InputError, match="not a directory"):
                await runtime.start_optimize(OptimizeRequest(config=toy_config(paths)))
    record = paths["store"] / "runs" / "r-bad" / "run.json"
    record.parent.mkdir(parents=True)
    record.write_text('{"status": "running"')
    async with evolane.open_runtime(store=paths["store"]) as runtime:
        for request in (
            OptimizeRequest(resume="r-bad"),
            OptimizeRequest(from_run="r-bad", rerun_evaluator=True),
        ):
            with pytest.raises(InputError, match=f"{record}: cannot read the run record"):
                await runtime.start_optimize(request)


async def test_a_scheduler_that_crashes_mid_campaign_ends_the_run_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal's disk fills while a candidate is measured: the scheduler crashes. The
    campaign must not wait for the dead scheduler to answer a Ping (it never can before the
    run's tree restarts it): the wait is made longer than the hang guard, so a wait fails it."""
    import errno

    from evolane.measure import _pipeline
    from evolane.store import _journal

    monkeypatch.setattr(_pipeline, "UNITS_STOP_WAIT", 200.0)
    real_append = _journal.Journal.append_lines  # the run journal's group commit

    def full_disk(self: _journal.Journal, lines: list[bytes], *, durable: bool = False) -> None:
        for line in lines:
            if b'"type":"unit"' in line and b'"measurement":"c0.i0.s0"' in line:
                raise OSError(errno.ENOSPC, "No space left on device")
        real_append(self, lines, durable=durable)

    monkeypatch.setattr(_journal.Journal, "append_lines", full_disk)
    paths = write_toy(tmp_path, {"0.0": "fix:2", "0.1": "fix:1"})
    config = toy_config(paths, replay="backend:replay", iterations=1, screening=False)
    with trio.fail_after(90):  # a hang guard, below the wait (shielded: it fails after it)
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            handle = await runtime.start_optimize(
                OptimizeRequest(config=config), backends=Backends(replay=replay_backend)
            )
            outcome = await handle.result()
    # The scheduler's crash on a full disk, not a timeout: the run ends failed, naming it.
    assert outcome.report is not None and outcome.report.status == "failed"
    assert outcome.report.message.endswith(": No space left on device")


async def test_a_cancelled_run_starts_no_new_measurement(tmp_path: Path) -> None:
    """Cancelled while a candidate is measured, the campaign must not take the cancelled
    measurement as a result and go on (the next slot, the final scores) in its grace."""
    started: list[tuple[bool, str]] = []  # (after the cancel, unit id)
    cancelled, in_flight = False, trio.Event()

    async def slow_replay(call: BackendCall) -> dict:
        unit = call.env["EVOLANE_UNIT"]
        started.append((cancelled, unit))
        if unit.startswith("c0.i0.s0.") and ".screen" not in unit:
            in_flight.set()
            await trio.sleep(3)
        return await replay_backend(call)

    paths = write_toy(tmp_path, {"0.0": "fix:2", "0.1": "fix:1"})
    config = toy_config(paths, replay="backend:replay", iterations=1, screening=False)
    with trio.fail_after(60):
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            handle = await runtime.start_optimize(
                OptimizeRequest(config=config), backends=Backends(replay=slow_replay)
            )
            await in_flight.wait()
            cancelled = True
            handle.cancel()
            with pytest.raises(evolane.RunCancelled):
                await handle.result()
    late = sorted({unit.rsplit(".", 3)[0] for after, unit in started if after})
    assert late in ([], ["c0.i0.s0"]), late  # at most the units of the measurement in flight


async def test_a_proposal_paid_for_is_journaled_even_if_the_run_stops_before_its_debit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The optimizer answered; the run is cancelled while its usage is debited. The proposal
    must already be in the journal, so a resume takes it instead of paying for it again."""
    from evolane.campaign import _peers
    from evolane.messages import Debit
    from evolane.store import read_journal

    debiting = trio.Event()
    real_ask = _peers.Peers.ask_budget

    async def stuck_debit(self: _peers.Peers, message: object) -> object:
        if isinstance(message, Debit) and message.item == "c0.i0.s0":
            debiting.set()
            await trio.sleep_forever()
        return await real_ask(self, message)  # type: ignore[arg-type]

    monkeypatch.setattr(_peers.Peers, "ask_budget", stuck_debit)
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths, replay="backend:replay", optimizer="backend:optimizer")
    backends = Backends(replay=replay_backend, optimizer=optimizer_backend)
    with trio.fail_after(60):
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            handle = await runtime.start_optimize(OptimizeRequest(config=config), backends=backends)
            await debiting.wait()
            handle.cancel()
            with pytest.raises(evolane.RunCancelled):
                await handle.result()
    (journal,) = (paths["store"] / "runs").glob("*/journal.jsonl")
    slots = [r["slot"] for r in read_journal(journal).records if r.get("type") == "proposal"]
    assert "c0.i0.s0" in slots
