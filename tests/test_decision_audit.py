"""An independent audit of what `evolane optimize` records: real campaigns on a toy whose
candidates have a known true effect (tests/audit_helpers.py), each measurement decided
again from README's and DESIGN §6's rules by an oracle sharing no code with
`evolane.stats`; early stop against the full evaluation; SIGKILL and ``--resume`` against
an uninterrupted run. The long simulation of the rates is benchmarks/decision_audit.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.audit_helpers import Toy, kill_and_resume, optimize, write_project
from tests.audit_oracle import audit_run, paid_twice, read_run

STRONG = {"default": 0.0, "0.0.1": 0.35}
"""Slot 1 of iteration 0 truly better (+0.35 pass probability on every case), the rest null."""


def _campaign(root: Path, toy: Toy, flags: list[str], log: Path | None = None) -> list[str]:
    """Write the toy under ``root`` and return its full flags (store ``root/store``)."""
    common = ["--store", str(root / "store"), "--error-control", "none", "--iterations", "2"]
    return write_project(root / "p", toy, log) + common + flags


def _run(root: Path, toy: Toy, flags: list[str]) -> None:
    done = optimize(_campaign(root, toy, flags))
    assert done.returncode == 0, done.stderr[-2000:]


MIXED = {"default": 0.0, "0.0.1": 0.1, "0.0.3": 0.2, "0.1.2": 0.25}
"""Eight candidates, most with no true effect over their parent, some a little better."""


def test_recorded_decisions_follow_from_the_journal(tmp_path: Path) -> None:
    """The fast audit: eight candidates measured by the paired gate, each measurement's n,
    mean delta, SE and decision the oracle's on the journal's units (breaking the gate's
    rule, e.g. halving its k x SE bar, fails it)."""
    flags = ["--seed", "3", "--population", "4", "--replay-concurrency", "4"]
    _run(tmp_path, Toy(cases=16, plan=MIXED), flags)
    audit = audit_run(tmp_path / "store", tmp_path / "p" / "data.jsonl")
    assert not audit.problems
    assert len(audit.decisions) == 8 and "accept" in audit.decisions.values()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("toy", "flags"),
    [
        (
            Toy(cases=24, cluster_size=2, judge=True, judge_hard=0.1, judge_flaky=0.3,
                replay_crash=0.05, plan=STRONG),
            ["--seed", "4", "--candidate-replay-repetitions", "2",
             "--baseline-replay-repetitions", "1", "--iterations", "1"],
        ),
        (
            Toy(cases=12, judge=True, graded=True, judge_hard=0.2, plan=STRONG),
            ["--seed", "2", "--gate", "bootstrap", "--no-regression",
             "--baseline-replay-repetitions", "2", "--candidate-replay-repetitions", "2",
             "--population", "3", "--iterations", "1"],
        ),
        (
            Toy(cases=10, judge=True, graded=True, plan=STRONG),
            ["--seed", "1", "--gate", "threshold", "--threshold", "0.45", "--k-se", "2"],
        ),
        (
            Toy(cases=20, test_cases=16, plan={"default": 0.0, "0.0.1": 0.5}),
            ["--seed", "9", "--error-control", "confirm", "--iterations", "1"],
        ),
    ],
    ids=["paired-clusters-judge-failures", "bootstrap-no-regression", "threshold", "confirm"],
)  # fmt: skip
def test_every_recorded_decision_follows_from_the_journal(
    tmp_path: Path, toy: Toy, flags: list[str]
) -> None:
    """Each val measurement's n, mean delta, SE and decision are the oracle's on the units
    the journal holds (a failed judge never a score, a candidate's unscored unit 0), each
    pair of one case, each decision in the report the measurement's."""
    _run(tmp_path, toy, flags)
    audit = audit_run(tmp_path / "store", tmp_path / "p" / "data.jsonl")
    assert not audit.problems
    assert "accept" in audit.decisions.values() and "reject" in audit.decisions.values()
    if toy.judge_hard:  # judges failed on infrastructure: the oracle saw how each counted
        assert sum(audit.judge_failed.values())
    if toy.test_cases:  # the accepted best was confirmed (or not) on the test split
        assert read_run(tmp_path / "store")[2]["confirmation"]


@pytest.mark.slow
def test_early_stop_decides_as_the_full_evaluation(tmp_path: Path) -> None:
    """The same campaign with and without early stop (replays score the same for the same
    seed): every candidate gets the same decision, and each early stop rests on a prefix."""
    toy = Toy(cases=24, plan={"default": 0.0, "0.0.1": 0.3, "0.1.0": 0.05})
    decisions = []
    for name, switch in (("early", "--sequential"), ("full", "--no-sequential")):
        _run(tmp_path / name, toy, ["--seed", "7", switch])
        audit = audit_run(tmp_path / name / "store", tmp_path / name / "p" / "data.jsonl")
        assert not audit.problems
        decisions.append(audit.decisions)
    _, _, report = read_run(tmp_path / "early" / "store")
    assert any(m["status"] == "early_stopped" for m in report["measurements"])
    assert decisions[0] == decisions[1]


@pytest.mark.slow
def test_sigkill_and_resume_pay_nothing_twice_and_decide_the_same(tmp_path: Path) -> None:
    """A run killed mid-measurement and resumed decides as the uninterrupted one, runs no
    replay again that the journal held at the kill, and its record passes the oracle."""
    toy = Toy(cases=16, judge=True, judge_hard=0.1, plan=STRONG)  # failures that repeat
    flags = ["--seed", "5", "--replay-concurrency", "2"]
    _run(tmp_path / "whole", toy, flags)
    reference = audit_run(tmp_path / "whole" / "store", tmp_path / "whole" / "p" / "data.jsonl")
    root, log = tmp_path / "killed", tmp_path / "killed" / "log" / "replays.log"
    log.parent.mkdir(parents=True)
    log.parent.chmod(0o777)  # a root evolane's commands run as uids of their own
    before = kill_and_resume(_campaign(root, toy, flags, log), root / "store", kill_after=40)
    audit = audit_run(root / "store", root / "p" / "data.jsonl")
    assert not audit.problems
    assert audit.decisions == reference.decisions
    names = {r["replay"]["name"]: r["unit"] for r in before if r["replay"].get("name")}
    journaled = [r["unit"] for r in before if r["replay"]["status"] != "cancelled"]
    assert not paid_twice(log, journaled, names)
