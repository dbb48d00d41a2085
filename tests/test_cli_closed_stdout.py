"""A reader that stops reading (``evolane ... | head``) changes no exit code: ``optimize`` and
``report --follow`` still exit with the run's own code (DESIGN §10), and an estimate nobody
reads is no internal error. rich's default on a broken pipe is ``exit 1`` (what the other
read-only commands still do, as Python's note on SIGPIPE advises)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.campaign_helpers import toy_flags, usage_replay, write_toy

EVOLANE = [sys.executable, "-m", "evolane"]


def _closed_stdout(*args: str) -> subprocess.CompletedProcess[str]:
    """``evolane *args`` with a stdout whose reader is already gone: every write is EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [*EVOLANE, *args], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300
        )
    finally:
        os.close(write_end)


def test_a_closed_stdout_keeps_the_runs_exit_code(tmp_path: Path) -> None:
    paths = write_toy(tmp_path / "toy", {"0.0": "fix:2"})
    store = tmp_path / "store"
    flags = toy_flags(paths, store)
    flags[flags.index("--progress") + 1] = "plain"
    flags[flags.index("--replay") + 1] = usage_replay(tmp_path)
    run = _closed_stdout("optimize", *flags, "--max-tokens", "1500")
    assert run.returncode == 3, run.stderr  # budget limited, as with a reader
    assert "internal error" not in run.stderr
    (run_id,) = [path.name for path in (store / "runs").iterdir()]
    followed = _closed_stdout("report", run_id, "--store", str(store), "--follow")
    assert followed.returncode == 3, followed.stderr
    estimated = _closed_stdout("estimate", *flags)
    assert estimated.returncode == 0, estimated.stderr
    assert "internal error" not in estimated.stderr
