"""A run stopped while it stores its cases (a large dataset: 100,000 cases took minutes on a
loaded host) stops there, through the real CLI: its wall-clock budget ends it
``budget_limited`` (exit 3) without storing the rest, as a first Ctrl-C ends it
``interrupted``; both were heard only once every case was stored (a 40 s budget ran 288 s,
a Ctrl-C took 199 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EVOLANE = [sys.executable, "-m", "evolane"]
CASES = 3000
"""Cases stored twice (replay and judge copies): a dozen batches of `BATCH_FILES`."""


def _workload(root: Path) -> list[str]:
    target = root / "target"
    target.mkdir()
    (target / "skill.txt").write_text("seed\n")
    rows = (
        {"id": f"v{index:05d}", "input": {"n": index}, "expected_output": index, "split": "val"}
        for index in range(CASES)
    )
    dataset = root / "cases.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return [
        "optimize", "--target", str(target), "--dataset", str(dataset),
        "--store", str(root / "st"), "--replay", "sh -c 'echo 0'", "--optimizer", "true",
        "--isolation", "process", "--progress", "none",
    ]  # fmt: skip


def _objects(store: Path) -> int:
    return sum(1 for path in (store / "objects").rglob("*") if path.is_file())


def test_a_wall_clock_budget_spent_before_the_cases_are_stored_stops_the_storing(
    tmp_path: Path,
) -> None:
    args = _workload(tmp_path)
    done = subprocess.run(
        [*EVOLANE, *args, "--wall-clock-budget", "0.000001"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    store = tmp_path / "st"
    (report_file,) = (store / "runs").glob("*/report.json")
    report = json.loads(report_file.read_text())
    assert report["status"] == "budget_limited", report["message"]
    assert report["message"] == "the wall-clock budget ran out"
    assert _objects(store) < CASES  # the stop came before the cases' first batch was written
