"""A session SIGKILLed while its commands hang silently, then resumed, through the real CLI:
the resume counts the killed session's silent seconds against ``--wall-clock-budget``
(README: the budget counts "every session of every run, each counted from its command's
start"). Before the session's heartbeat (`evolane.campaign._alive`) it counted the session
only up to its last event or journal line, so a kill and a ``--resume`` gave a hung
campaign its wall-clock budget back (found by hostile review: a session killed 25 s into a
silent hang counted 5 s)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.campaign_helpers import (
    shared_folder,
    start_optimize,
    toy_config,
    toy_flags,
    wait_for,
    with_flag,
    write_toy,
)

SILENT = 4.0
"""Seconds of silence (no unit ends, no event, no journal line) the heartbeat has shown
before the session is killed: waited for by its mtime, not slept, so a loaded host's lag
cannot fail the test."""


def _beaten(alive: Path, since: float, process: subprocess.Popen[bytes]) -> None:
    """Poll until ``alive``'s mtime is ``since`` + `SILENT` or later (120 s at most)."""
    deadline = time.monotonic() + 120
    while not (alive.exists() and alive.stat().st_mtime >= since + SILENT):
        assert process.poll() is None, "the run ended before its heartbeat showed the hang"
        assert time.monotonic() < deadline, "the heartbeat never showed the hang"
        time.sleep(0.05)


def test_a_session_killed_in_a_silent_hang_counts_its_silent_seconds(tmp_path: Path) -> None:
    from evolane.campaign._prepare import prepare_run

    paths = write_toy(tmp_path, {"default": "fix:1"})
    marks = shared_folder(tmp_path / "marks")
    replay = f"sh -c 'touch {marks}/started; sleep 3600' replay {{candidate}} {{output_dir}}"
    flags = with_flag(toy_flags(paths, paths["store"]), "--replay", replay)
    flags += ["--expose-rw", str(marks), "--wall-clock-budget", "3600"]
    flags += ["--replay-timeout", "3000"]
    process = start_optimize(flags, tmp_path)
    try:
        wait_for(marks / "started", process, "a replay started")
        hung = (marks / "started").stat().st_mtime
        (run_dir,) = (paths["store"] / "runs").iterdir()
        _beaten(run_dir / "session.alive", hung, process)  # every replay hangs: silence
    finally:
        process.kill()
        process.wait()
    assert process.returncode == -9
    began = json.loads((run_dir / "run.json").read_text())["session_started"]
    beat = (run_dir / "session.alive").stat().st_mtime  # its last: SILENT past the hang
    resumed = prepare_run(toy_config(paths), resume_run=run_dir.name)
    # Counted up to its last heartbeat; before, only up to its last event or journal line,
    # written before the hang. Timestamps the run wrote, compared: no duration measured.
    assert began + resumed.run.elapsed_seconds == pytest.approx(beat, abs=1e-3)
