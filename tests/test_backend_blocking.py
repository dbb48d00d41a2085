"""An in-process backend that blocks the event loop past its deadline is told apart from one
cut at it: its timeout says it never yielded (nothing could stop it meanwhile)."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from evolane.embed import BackendCall
from evolane.lanes._backends import run_backend


async def test_a_backend_that_blocks_the_loop_past_its_deadline_says_so(tmp_path: Path) -> None:
    # Found by review: `time.sleep(40)` under a 10 s deadline ended "killed at the deadline
    # after 40.0s": nothing killed it, the whole run stood still.
    async def blocking(call: BackendCall) -> None:
        time.sleep(2.0)  # past the deadline and BLOCKED_PAST, without a checkpoint

    async def yielding(call: BackendCall) -> None:
        await trio.sleep(60)

    call = BackendCall(role="replay", workspace=tmp_path, seed=0)
    blocked = await run_backend(blocking, call, trio.current_time() + 0.1, trio.Event())
    assert blocked.status == "timed_out"
    assert "without yielding to the event loop" in blocked.error, blocked.error
    cut = await run_backend(yielding, call, trio.current_time() + 0.1, trio.Event())
    assert cut.status == "timed_out" and cut.error == ""
