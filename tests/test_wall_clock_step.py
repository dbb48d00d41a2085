"""A session's length is counted on the monotonic clock: a wall clock stepped during a run
(NTP, a resumed VM) neither spends nor gives back the campaign's wall-clock budget."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
import trio

import evolane
from evolane.embed import BackendCall, Backends, OptimizeRequest
from tests.campaign_helpers import toy_config, write_toy
from tests.test_embed import PLAN, optimizer_backend, replay_backend

DAY = 86_400.0


async def test_a_wall_clock_step_during_a_run_is_not_its_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by review: elapsed was time.time() - started, so a clock stepped a day forward
    # mid-run recorded a day of wall-clock budget spent (and the report's wall a day long).
    real, step = time.time, [0.0]
    monkeypatch.setattr(time, "time", lambda: real() + step[0])

    async def replay(call: BackendCall) -> dict:
        step[0] = DAY  # the clock is stepped once the run is under way
        return await replay_backend(call)

    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths, replay="backend:r", judge=None, optimizer="backend:o", iterations=1)
    backends = Backends(replay=replay, optimizer=optimizer_backend)
    began = time.monotonic()  # the session as this test sees it, on a clock nobody steps
    with trio.fail_after(120):  # a hang guard, not a timing figure
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            report = await runtime.optimize(OptimizeRequest(config=config), backends=backends)
    span = time.monotonic() - began
    assert report is not None and step[0] == DAY
    run = orjson.loads((paths["store"] / "runs" / report.run_id / "run.json").read_bytes())
    assert report.wall_seconds <= span, (report.wall_seconds, span)  # not the day stepped
    assert run["elapsed_seconds"] <= span, (run["elapsed_seconds"], span)
