"""A run killed with SIGKILL and resumed, whose resumed session's early stop comes between a
unit's replay and its judgement: the journal holds that unit's outcome (``cancelled``), as
an uninterrupted run's does, never its replay alone (found by the decision audit: a reader
of the resumed run's journal saw a replay with no outcome). And a run a Ctrl-C cut between
replays and their judgements, resumed: each such unit has its cut attempt and its outcome in
the journal, and counts once, with its outcome, its replay charged once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.audit_helpers import Toy, journal_records, journaled_units, optimize, write_project
from tests.audit_oracle import audit_run, blob, read_run
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


CUT = Toy(cases=8, judge=True, plan={"default": 0.0, "0.0.1": 0.35})
"""The audit's toy, its replays writing a usage document (100 tokens) and its judge slow."""


def _cut_flags(root: Path) -> list[str]:
    """`CUT` under ``root`` (store ``root/store``), its judgements one at a time."""
    flags = write_project(root / "p", CUT)
    replay, judge = root / "p" / "replay.py", root / "p" / "judge.py"
    usage = 'pathlib.Path(output, "usage.json").write_text(json.dumps({"tokens": 100}))\n'
    replay.write_text(replay.read_text() + usage)
    judge.write_text("import time\ntime.sleep(0.5)\n" + judge.read_text())
    return [
        *flags, "--store", str(root / "store"), "--error-control", "none", "--seed", "5",
        "--iterations", "1", "--population", "2", "--replay-concurrency", "4",
        "--judge-concurrency", "1",
    ]  # fmt: skip


def _interrupted_between_replays_and_judges(root: Path) -> list[str]:
    """`CUT` under ``root``, Ctrl-C'd (exit 130) once the parent's val replays are all
    journaled (nothing else runs then) and two at least wait for their judge; the units it
    journaled ``cancelled`` with their replay."""
    process = subprocess.Popen(
        [sys.executable, "-m", "evolane", "optimize", *_cut_flags(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120  # a guard against a hang, not a timing figure
    while True:
        base = [r for r in journal_records(root / "store") if r.get("measurement") == "c0.i0.base"]
        judged = {r["unit"] for r in base if r["type"] == "unit"}
        if len({r["unit"] for r in base}) == CUT.cases and len(judged) <= CUT.cases - 2:
            break
        assert process.poll() is None and time.monotonic() < deadline, "never between"
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) == 130
    units = [r for r in journal_records(root / "store") if r["type"] == "unit"]
    return [
        r["unit"]
        for r in units
        if r["status"] == "cancelled" and r["replay"]["status"] == "succeeded"
    ]


def _replay_tokens(store: Path) -> float:
    return read_run(store)[2]["budget"]["spent_by_role"]["replay"]["tokens"]


@pytest.mark.slow
def test_a_unit_a_ctrl_c_cut_before_its_judge_counts_once_after_the_resume(
    tmp_path: Path,
) -> None:
    """The journal keeps the cut attempt (``cancelled``, what it spent) and the resumed
    session's outcome; the report, the audit's oracle (each unit's last record), the books
    and the decisions are the uninterrupted run's: each unit counted once, with its outcome,
    each replay charged once (the oracle took the cut attempt for a unit journaled twice)."""
    whole = optimize(_cut_flags(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-2000:]
    reference = audit_run(tmp_path / "whole" / "store", tmp_path / "whole" / "p" / "data.jsonl")
    root = tmp_path / "cut"
    cut = _interrupted_between_replays_and_judges(root)
    assert cut  # replayed, journaled, their judge never sent
    (run,) = (root / "store" / "runs").iterdir()
    resumed = optimize(["--resume", run.name, "--store", str(root / "store"), "--progress", "none"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    audit = audit_run(root / "store", root / "p" / "data.jsonl")
    assert not audit.problems
    assert audit.decisions == reference.decisions
    _, records, report = read_run(root / "store")
    (base,) = [m for m in report["measurements"] if m["measurement_id"] == "c0.i0.base"]
    listed = {u["unit"]: u for u in json.loads(blob(root / "store", base["units_ref"]["digest"]))}
    for unit in cut:
        statuses = [r["status"] for r in records if r["type"] == "unit" and r["unit"] == unit]
        assert statuses == ["cancelled", "succeeded"] and listed[unit]["status"] == "succeeded"
    assert base["units_planned"] == len(listed) == CUT.cases
    assert (base["units_cancelled"], base["units_restored"]) == (0, CUT.cases)
    assert _replay_tokens(root / "store") == _replay_tokens(tmp_path / "whole" / "store")
