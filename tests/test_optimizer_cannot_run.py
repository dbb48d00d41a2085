"""An optimizer whose command cannot run (found by review): a missing agent CLI or a wrong
script path failed every call, and the run ended finished, its campaign complete, exit 0,
having tried nothing. Now, as for a model endpoint down on every call, it ends failed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.campaign_helpers import toy_flags, with_flag, write_toy

EVOLANE = [sys.executable, "-m", "evolane"]


def _run(tmp_path: Path, optimizer: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    paths = write_toy(tmp_path, {"0.0": "fix:1"})
    script = tmp_path / "tools" / "optimize.sh"  # a script without its exec bit
    script.parent.mkdir()
    script.write_text("#!/bin/sh\nexit 0\n")
    optimizer = optimizer.replace("{not_executable}", str(script))
    args = with_flag(toy_flags(paths, paths["store"]), "--optimizer", optimizer)
    args = with_flag(with_flag(args, "--iterations", "2"), "--isolation", "process")
    done = subprocess.run(
        [*EVOLANE, "optimize", *args], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    reports = list((paths["store"] / "runs").glob("*/report.json"))
    assert len(reports) == 1, done.stderr
    return done, json.loads(reports[0].read_text())


@pytest.mark.parametrize(
    ("optimizer", "said"),
    [
        ("sh -c 'no-such-agent-cli --go'", "exit 127 on every call (|no-such-agent-cli"),
        ("/no/such/optimize.sh {workdir}", "did not start on every call ("),
        ("sh -c '{not_executable}'", "exit 126 on every call ("),
    ],
)
def test_an_optimizer_that_cannot_run_fails_the_run(
    tmp_path: Path, optimizer: str, said: str
) -> None:
    done, report = _run(tmp_path, optimizer)
    assert done.returncode == 1, done.stderr
    assert report["status"] == "failed" and report["campaign_status"] == "paused"
    assert "the optimizer's command cannot run: " in report["message"], report["message"]
    assert all(part in report["message"] for part in said.split("|")), report["message"]


def test_an_optimizer_that_fails_otherwise_still_only_costs_its_slots(tmp_path: Path) -> None:
    done, report = _run(tmp_path, "sh -c 'echo out of credits >&2; exit 1'")
    assert done.returncode == 0, done.stderr
    assert report["status"] == "finished"
    failures = [item["failure"] for item in report["failures"]]
    assert failures and all(f["code"] == "exit_1" for f in failures), failures
