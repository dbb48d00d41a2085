"""An `evolane.aio` runtime used where it cannot work says so in one `RuntimeError`, with
nothing started: from another thread's event loop, or once its ``async with`` has ended;
a stop or cancel of a run that ended with its runtime does nothing, as in trio; and a
cancelled entry leaves nothing running in the guest."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

import evolane.aio
from evolane.embed import Backends, EvolvePolicy, OptimizeRequest, ServiceSettings
from tests.campaign_helpers import toy_config, write_toy
from tests.evolve_helpers import backend_config, trace_record, write_trace_target
from tests.test_embed import PLAN, judge_backend, optimizer_backend, replay_backend
from tests.test_evolve_service import BACKENDS as EVOLVE_BACKENDS

BACKENDS = Backends(replay=replay_backend, judge=judge_backend, optimizer=optimizer_backend)


def _request(tmp_path: Path) -> tuple[OptimizeRequest, Path]:
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths, replay="backend:r", judge="backend:j", optimizer="backend:o")
    return OptimizeRequest(config=config), paths["store"]


def test_a_runtime_used_from_another_threads_loop_refuses_and_starts_nothing(
    tmp_path: Path,
) -> None:
    # Found by review: asyncio's "got Future attached to a different loop" came only after
    # the run had started in the runtime's loop, where it went on with no handle.
    request, store = _request(tmp_path)
    errors: list[BaseException] = []

    async def main() -> None:
        async with evolane.aio.open_runtime(store=str(store)) as runtime:

            def other() -> None:
                try:
                    asyncio.run(runtime.start_optimize(request, backends=BACKENDS))
                except BaseException as error:  # what it raised is the test
                    errors.append(error)

            thread = threading.Thread(target=other)
            thread.start()
            while thread.is_alive():
                await asyncio.sleep(0.01)
            for _ in range(20):  # the guest's turns: a run sent to it would begin here
                await asyncio.sleep(0.01)

    asyncio.run(main())
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
    assert "another event loop" in str(errors[0])
    assert not (store / "runs").exists()  # no run was started


def test_a_closed_runtime_refuses_and_a_stop_after_it_does_nothing(tmp_path: Path) -> None:
    # Found by review: both raised trio.RunFinishedError into the asyncio caller.
    request, store = _request(tmp_path)

    async def main() -> None:
        async with evolane.aio.open_runtime(store=str(store)) as runtime:
            handle = await runtime.start_optimize(request, backends=BACKENDS)
            report = (await handle.result()).report
            assert report is not None and report.status == "finished"
        handle.stop()
        handle.cancel()
        with pytest.raises(RuntimeError, match="runtime is closed"):
            await runtime.start_optimize(request, backends=BACKENDS)

    asyncio.run(main())


def test_cancelling_the_entry_of_an_evolve_service_closes_it(tmp_path: Path) -> None:
    # Found by review: the service went on starting in the guest and ran there with no
    # owner, its store's queue held: opening one again raised InputError ("the evolve queue
    # is open in another service") until the runtime closed. The cancel comes after a
    # number of loop turns swept over the start (it hit the start in 9 of 20 before).
    paths = write_trace_target(tmp_path, 4)
    settings = ServiceSettings(policy=EvolvePolicy(every=100), run_jobs=False)
    config = backend_config(paths)

    async def main() -> None:
        async with evolane.aio.open_runtime(store=str(paths["store"])) as runtime:
            for turns in range(0, 40, 2):

                async def enter() -> None:
                    async with runtime.evolve_service(config, settings, backends=EVOLVE_BACKENDS):
                        await asyncio.sleep(60)

                task = asyncio.ensure_future(enter())
                for _ in range(turns):
                    await asyncio.sleep(0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                async with runtime.evolve_service(
                    config, settings, backends=EVOLVE_BACKENDS
                ) as evolve:
                    await evolve.record(trace_record(turns))

    asyncio.run(main())


def test_a_second_runtime_in_one_loop_is_refused_and_the_first_runs_on(tmp_path: Path) -> None:
    # Found by review: trio's "Attempted to call run() from inside a run()" was all it said.
    request, store = _request(tmp_path)

    async def main() -> str:
        async with evolane.aio.open_runtime(store=str(store)) as runtime:
            with pytest.raises(RuntimeError, match="already open in this thread"):
                async with evolane.aio.open_runtime(store=str(store)):
                    pass
            report = await runtime.optimize(request, backends=BACKENDS)
            return report.status

    assert asyncio.run(main()) == "finished"


def test_a_run_its_runtime_closed_under_ends_its_readers_as_in_trio(tmp_path: Path) -> None:
    # Found by review: `result()` awaited in a task of its own raised asyncio.CancelledError
    # (the task looked cancelled; an asyncio.TaskGroup swallowed it), and a task reading
    # `events()` waited for ever. In trio they get RunCancelled and the end of the events.
    paths = write_toy(tmp_path, PLAN)
    request = OptimizeRequest(config=toy_config(paths, replay="sleep 3600", kill_grace=0.2))

    async def main() -> tuple[BaseException | None, int]:
        first = asyncio.Event()

        async def read(handle: evolane.aio.AioRunHandle) -> int:
            seen = 0
            async for _ in handle.events():
                seen += 1
                first.set()
            return seen

        async with asyncio.timeout(30):  # a guard: a reader that hangs fails the test
            async with evolane.aio.open_runtime(store=str(paths["store"])) as runtime:
                handle = await runtime.start_optimize(request)
                reader = asyncio.create_task(read(handle))
                result = asyncio.create_task(handle.result())
                await first.wait()
            seen = await reader
            error = (await asyncio.gather(result, return_exceptions=True))[0]
        assert not result.cancelled()
        return error, seen

    error, seen = asyncio.run(main())
    assert isinstance(error, evolane.RunCancelled) and "runtime closed" in str(error)
    assert seen >= 1
