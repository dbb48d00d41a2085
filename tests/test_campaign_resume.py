"""Crash-consistent resume: ``evolane optimize`` killed with SIGKILL at several journal
positions, then ``--resume``, reaches the uninterrupted run's decisions, re-running at most
the units that were in flight."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evolane.store import read_journal
from tests.campaign_helpers import toy_flags, write_toy

# iteration 0 accepts nothing (the stall count rises); 1 and 2 accept
PLAN = {"0.0": "harm:1", "0.1": "noop", "1.0": "fix:2", "1.1": "harm:2", "2.0": "fix:1"}
LANES = 3


def _optimize(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "evolane", "optimize", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _finish(process: subprocess.Popen[bytes]) -> int:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, (out.decode(), err.decode())
    return process.returncode


def _report(store: Path) -> dict:
    (path,) = (store / "runs").glob("*/report.json")
    return json.loads(path.read_text())


def _decisions(report: dict) -> list[tuple]:
    return [
        (d["iteration"], d["slot"], d["digest"], d["decision"], d["reason"])
        for d in report["decisions"]
    ]


def _journal_records(store: Path) -> list[dict]:
    journals = list((store / "runs").glob("*/journal.jsonl"))
    return read_journal(journals[0]).records if journals else []


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, int]:
    root = tmp_path_factory.mktemp("reference")
    paths = write_toy(root, PLAN)
    log = root / "replays.log"
    _finish(_optimize(toy_flags(paths, root / "store", log)))
    return _report(root / "store"), len(log.read_text().splitlines())


@pytest.mark.parametrize("kill_after", [1, 12, 40])
def test_resume_after_sigkill_reaches_the_same_decisions(
    tmp_path: Path, reference: tuple[dict, int], kill_after: int
) -> None:
    expected, _ = reference
    paths = write_toy(tmp_path, PLAN)
    store, log = tmp_path / "store", tmp_path / "replays.log"
    process = _optimize(toy_flags(paths, store, log))
    deadline = time.monotonic() + 60
    while len(_journal_records(store)) < kill_after:
        assert process.poll() is None, "the run ended before the kill point"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    (run_dir,) = (store / "runs").iterdir()
    assert not (run_dir / "report.json").exists()
    records = _journal_records(store)
    finished = {r["unit"] for r in records if r["type"] in ("unit", "replay")}
    before = set(log.read_text().split())
    resumed = _optimize(["--resume", run_dir.name, "--store", str(store), "--progress", "none"])
    _finish(resumed)
    report = _report(store)
    assert _decisions(report) == _decisions(expected)
    assert report["resumed"] == 1
    assert sum(m["units_restored"] for m in report["measurements"]) > 0
    launched = log.read_text().split()
    after = launched[len(before) :] if len(launched) >= len(before) else []
    assert not finished & set(after)  # a finished replay never runs again
    assert before & set(after) <= before - finished  # only replays in flight at the kill re-run
    again = _optimize(["--resume", run_dir.name, "--store", str(store)])
    _, err = again.communicate(timeout=60)
    assert again.returncode == 2 and b"already ended (finished)" in err  # nothing to resume


def test_rerun_evaluator_judges_stored_replays_and_replays_nothing(
    tmp_path: Path, reference: tuple[dict, int]
) -> None:
    paths = write_toy(tmp_path, PLAN)
    store, log = tmp_path / "store", tmp_path / "replays.log"
    _finish(_optimize(toy_flags(paths, store, log)))
    (first,) = (store / "runs").iterdir()
    launches = len(log.read_text().splitlines())
    judge = tmp_path / "lenient.sh"
    judge.write_text("echo '{\"score\": 1.0}'\n")
    _finish(
        _optimize(
            [
                "--from-run",
                first.name,
                "--rerun-evaluator",
                "--judge",
                f"sh {judge}",
                "--store",
                str(store),
                "--progress",
                "none",
            ]
        )
    )
    assert len(log.read_text().splitlines()) == launches  # not one replay ran again
    (second,) = [p for p in (store / "runs").iterdir() if p.name != first.name]
    report = json.loads((second / "report.json").read_text())
    assert report["config"]["judge"] == f"sh {judge}"
    measured = [m for m in report["measurements"] if m["purpose"] == "paired"]
    assert measured and all(m["units_run"] == 0 for m in measured)
    assert sum(m["units_restored"] for m in report["measurements"]) > 0
    # every stored replay now scores 1.0: no candidate can beat its parent under a strict gate
    assert all(d["decision"] != "accept" for d in report["decisions"])
