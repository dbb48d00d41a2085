"""A run killed with SIGKILL and resumed, whose resumed session's early stop comes between a
unit's replay and its judgement: the journal holds that unit's outcome (``cancelled``), as
an uninterrupted run's does, never its replay alone (found by the decision audit: a reader
of the resumed run's journal saw a replay with no outcome)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.audit_helpers import journaled_units
from tests.audit_oracle import blob, read_run
from tests.campaign_helpers import run_optimize, toy_flags, write_toy

MEASURED = "c0.i0.s0"
"""The harmful candidate's paired measurement: it stops early (`PLAN`)."""

PLAN = {"0.0": "harm:1"}

HOLD_CHARGE = """
import sys, trio
from evolane.cli import main
from evolane.measure import _scheduler

Measurement = _scheduler._Measurement
charge, judge = Measurement._charge, Measurement._judge
measured, cutoff, told, held = sys.argv[1], int(sys.argv[2]), sys.argv[3], []

def mine(plan):
    return plan.request.measurement_id == measured

async def held_charge(self, action):
    # The first replay beyond the early stop's cutoff is charged once the stop came (or,
    # should it not come, once every case before it ended): the other lanes go on.
    plan, unit = self.plan, self.plan.unit(action.unit_id)
    if mine(plan) and unit.case_index >= cutoff and not held:
        held.append(unit.unit_id)
        def before_done():
            return all(u.done for u in plan.units if u.case_index < unit.case_index)
        while plan.early is None and not before_done():
            await trio.sleep(0.01)
        with open(told, "a") as out:
            out.write(f"{unit.unit_id} {plan.early is not None}\\n")
    await charge(self, action)

async def held_judge(self, action):
    # No judgement (so no early stop) before a replay beyond the cutoff is being charged,
    # or nothing is left to replay.
    plan = self.plan
    def replaying():
        return any(u.step in ("waiting", "ready", "replaying") for u in plan.units)
    while mine(plan) and not held and replaying():
        await trio.sleep(0.01)
    await judge(self, action)

Measurement._charge, Measurement._judge = held_charge, held_judge
sys.argv = ["evolane", "optimize", *sys.argv[4:]]
main()
"""


def _run(root: Path) -> list[str]:
    """The toy's flags (store ``root/store``): one harmful candidate, judged one at a time."""
    paths = write_toy(root, PLAN)
    flags = toy_flags(paths, root / "store", lanes=3)
    return [*flags, "--iterations", "1", "--population", "1", "--judge-concurrency", "1"]


def _measured(root: Path) -> dict[str, Any]:
    """The `MEASURED` measurement of the report of the one run under ``root``."""
    _, _, report = read_run(root / "store")
    (measured,) = [m for m in report["measurements"] if m["measurement_id"] == MEASURED]
    return measured


def _outcomes(records: list[dict[str, Any]]) -> dict[str, str]:
    """Each journaled unit's last status, by unit id."""
    return {r["unit"]: r["status"] for r in records if r["type"] == "unit"}


def _killed_then_resumed_holding(root: Path, cutoff: int) -> tuple[str, bool]:
    """The toy under ``root``, killed (SIGKILL) once the parent's val units are journaled,
    then resumed with the first replay beyond ``cutoff`` held (`HOLD_CHARGE`): that unit,
    and whether the early stop came before its judge."""
    store = root / "store"
    process = subprocess.Popen(
        [sys.executable, "-m", "evolane", "optimize", *_run(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120  # a guard against a hang, not a timing figure
    while len(journaled_units(store)) < 12:  # killed before the pair is measured
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    (run,) = (store / "runs").iterdir()
    told = root / "held.txt"
    resume = ["--resume", run.name, "--store", str(store), "--progress", "none"]
    resumed = subprocess.run(
        [sys.executable, "-c", HOLD_CHARGE, MEASURED, str(cutoff), str(told), *resume],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    (line,) = told.read_text().splitlines()
    held, cut = line.split()
    return held, cut == "True"


def test_a_resumed_runs_early_stop_before_a_judge_journals_the_units_outcome(
    tmp_path: Path,
) -> None:
    whole = run_optimize(_run(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-2000:]
    early = _measured(tmp_path / "whole")
    assert early["status"] == "early_stopped"
    held, cut = _killed_then_resumed_holding(tmp_path / "killed", early["n"])  # n: one per case
    assert cut  # the resumed session's early stop came between its replay and its judge
    _, records, _ = read_run(tmp_path / "killed" / "store")
    outcomes = _outcomes(records)
    alone = [r["unit"] for r in records if r["type"] == "replay" and r["unit"] not in outcomes]
    assert not alone, f"replays journaled without their unit's outcome: {alone}"
    assert outcomes[held] == "cancelled"  # as a judge the stop cut (or never started)
    again = _measured(tmp_path / "killed")
    keys = ("status", "decision", "n", "mean_delta")
    assert [again[k] for k in keys] == [early[k] for k in keys]
    listed = json.loads(blob(tmp_path / "killed" / "store", again["units_ref"]["digest"]))
    ran = [u for u in listed if u["status"] not in ("blocked", "not_run") and not u["reused"]]
    assert len(ran) == again["units_run"] + again["units_restored"]
    assert {u["unit"]: u["status"] for u in ran} == {u["unit"]: outcomes[u["unit"]] for u in ran}
