"""Under `evolane.aio` no sandbox host runs file work on the event loop: the host's asyncio
loop shares the thread, and small layouts and outputs done inline held a 10 ms asyncio
ticker back up to 71-82 ms at load 4-5 (`benchmarks/aio_latency.py`, over its 50 ms
target). A trio embedding and the CLI keep the inline gates (their CPU saving, issue 22)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import evolane.aio
from evolane.embed import BackendCall, Backends, OptimizeRequest, open_runtime
from evolane.sandbox import INLINE_WORK, open_sandbox
from tests.campaign_helpers import toy_config, write_toy
from tests.test_embed import PLAN, judge_backend, optimizer_backend, replay_backend


def _recording(seen: list[bool]) -> Backends:
    async def replay(call: BackendCall) -> dict:
        seen.append(INLINE_WORK.get())  # the context the run's sandbox host was opened in
        return await replay_backend(call)

    return Backends(replay=replay, judge=judge_backend, optimizer=optimizer_backend)


def _request(tmp_path: Path) -> tuple[OptimizeRequest, Path]:
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths, replay="backend:r", judge="backend:j", optimizer="backend:o")
    return OptimizeRequest(config=config), paths["store"]


def test_an_asyncio_hosts_runs_do_no_file_work_on_its_loop(tmp_path: Path) -> None:
    request, store = _request(tmp_path)
    seen: list[bool] = []

    async def main() -> None:
        async with evolane.aio.open_runtime(store=str(store)) as runtime:
            report = await runtime.optimize(request, backends=_recording(seen))
            assert report is not None and report.status == "finished"
        assert INLINE_WORK.get()  # the host's own context is left as it was

    asyncio.run(main())
    assert seen and not any(seen)


async def test_a_trio_embedding_keeps_the_inline_gates(tmp_path: Path) -> None:
    request, store = _request(tmp_path)
    seen: list[bool] = []
    async with open_runtime(store=str(store)) as runtime:
        report = await runtime.optimize(request, backends=_recording(seen))
    assert report is not None and report.status == "finished"
    assert seen and all(seen)


async def test_a_host_opened_with_inline_work_off_sends_every_piece_to_threads(
    tmp_path: Path,
) -> None:
    INLINE_WORK.set(False)  # this test's task alone
    async with open_sandbox(tmp_path / "sb") as host:
        assert host.inline.attempt(lambda: "ran") is None
        assert host.inline_cleanup.attempt(lambda: "ran") is None
    INLINE_WORK.set(True)
    async with open_sandbox(tmp_path / "sb2") as host:
        assert host.inline.attempt(lambda: "ran") == "ran"
