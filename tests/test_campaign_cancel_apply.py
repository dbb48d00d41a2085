"""A run cancelled while its post-apply check runs (Ctrl-C twice, a host's deadline) or
stopped then (Ctrl-C once, an embedding's ``stop()``): the check is killed at once and the
publish undone, the target left exactly as it was; a stopped run is resumable."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import trio

import evolane
from evolane.embed import OptimizeRequest
from tests.campaign_helpers import (
    run_optimize,
    shared_folder,
    toy_config,
    toy_flags,
    wait_for,
    with_flag,
    write_toy,
)

PLAN = {"0.0": "fix:3"}
# Unique to this test process: a pytest-xdist worker running another test of this file at the
# same time has a check of its own running, which a fixed mark took for this one's.
MARK = f"check-under-test-{uuid.uuid4().hex}"


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


async def test_stop_during_the_post_apply_check_kills_it_and_ends_the_run_interrupted(
    tmp_path: Path,
) -> None:
    """An embedding's ``stop()`` (a first Ctrl-C's) was ignored during the apply: the run
    waited out the check and published (found by review)."""
    paths = write_toy(tmp_path, PLAN)
    before = _files(paths["target"])
    config = toy_config(
        paths,
        iterations=1,
        population=1,
        apply="auto_verified",
        check=f"sh -c 'sleep 3600' {MARK}",
        kill_grace=0.2,
    )
    with trio.fail_after(100):  # a bound on a hang, not a timing figure
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            handle = await runtime.start_optimize(OptimizeRequest(config=config))
            while not _checks_running():
                await trio.sleep(0.05)
            handle.stop()
            outcome = await handle.result()
    assert outcome.report is not None and outcome.report.status == "interrupted"
    assert outcome.exit_code == 130
    assert not _checks_running()
    assert _files(paths["target"]) == before
    (run_dir,) = (paths["store"] / "runs").iterdir()
    assert json.loads((run_dir / "apply.json").read_text())["state"] == "rolled_back"


def test_a_ctrl_c_during_the_post_apply_check_stops_the_run_and_resume_publishes(
    tmp_path: Path,
) -> None:
    """A single Ctrl-C printed "stopping now", then waited out the whole check and published,
    exit 0 (found by review): it now stops the apply like a cancel, and the run is resumable."""
    paths = write_toy(tmp_path, PLAN)
    before = _files(paths["target"])
    marks = shared_folder(tmp_path / "marks")
    started, quick = marks / "started", marks / "quick"
    check = f"sh -c 'touch {started}; [ -e {quick} ] || sleep 60' {MARK}"
    flags = with_flag(toy_flags(paths, paths["store"]), "--iterations", "1")
    flags = with_flag(flags, "--population", "1")
    flags += ["--apply", "auto_verified", "--check", check, "--expose-rw", str(marks)]
    command = [sys.executable, "-m", "evolane", "optimize", *flags]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(started, process, "the post-apply check started")
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=100)  # a bound on a hang, not a timing figure
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, (out, err)
    assert not _checks_running()
    assert _files(paths["target"]) == before
    (run_dir,) = (paths["store"] / "runs").iterdir()
    assert f"resume: evolane optimize --resume {run_dir.name}" in out, out
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    assert json.loads((run_dir / "report.json").read_text())["status"] == "interrupted"
    assert json.loads((run_dir / "apply.json").read_text())["state"] == "rolled_back"
    fsck = subprocess.run(
        [sys.executable, "-m", "evolane", "fsck", "--store", str(paths["store"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert fsck.returncode == 0 and "clean" in fsck.stdout, (fsck.stdout, fsck.stderr)
    quick.touch()
    resumed = run_optimize(["--resume", run_dir.name, "--store", str(paths["store"])])
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((run_dir / "apply.json").read_text())["state"] == "committed"
    assert _files(paths["target"]) != before
