"""A run cancelled while its post-apply check runs (Ctrl-C twice, a host's deadline): the
check is killed at once and the publish undone, the target left exactly as it was."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import trio

import evolane
from evolane.embed import OptimizeRequest
from tests.campaign_helpers import toy_config, write_toy

PLAN = {"0.0": "fix:3"}
MARK = "check-under-test"


def _files(root: Path) -> dict[str, bytes]:
    files = sorted(path for path in root.rglob("*") if path.is_file())
    return {str(path.relative_to(root)): path.read_bytes() for path in files}


def _checks_running() -> bool:
    for process in psutil.process_iter(["cmdline"]):
        if MARK in (process.info["cmdline"] or []):
            return True
    return False


async def _cancel_once_the_check_runs(scope: trio.CancelScope) -> None:
    while not _checks_running():
        await trio.sleep(0.05)
    scope.cancel()


async def test_a_cancel_during_the_post_apply_check_kills_it_and_undoes_the_publish(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, PLAN)
    before = _files(paths["target"])
    # The check never ends by itself: the whole apply was shielded, so the cancel waited it
    # out to its 120 s timeout, then the run ended rolled back "timed out" (found by review).
    check = f"sh -c 'sleep 3600' {MARK}"
    config = toy_config(
        paths, iterations=1, population=1, apply="auto_verified", check=check, kill_grace=0.2
    )
    with trio.fail_after(100):  # a bound on a hang, not a timing figure
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as scope:
                nursery.start_soon(_cancel_once_the_check_runs, scope)
                async with evolane.open_runtime(store=paths["store"]) as runtime:
                    handle = await runtime.start_optimize(OptimizeRequest(config=config))
                    await handle.result()
            nursery.cancel_scope.cancel()
    assert scope.cancelled_caught
    assert not _checks_running()
    assert _files(paths["target"]) == before
    (run_dir,) = (paths["store"] / "runs").iterdir()
    applied = json.loads((run_dir / "apply.json").read_text())
    assert applied["state"] == "rolled_back", applied
    assert "interrupted during the post-apply check" in applied["message"], applied
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
