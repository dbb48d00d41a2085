"""An independent audit of what `evolane optimize` records: real campaigns on a toy whose
candidates have a known true effect (tests/audit_helpers.py), each measurement decided
again from README's and DESIGN §6's rules by an oracle sharing no code with
`evolane.stats`; early stop against the full evaluation; SIGKILL and ``--resume`` against
an uninterrupted run. The long simulation of the rates is benchmarks/decision_audit.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.audit_helpers import (
    JUDGE_FAILURES,
    Toy,
    audit_seed,
    journaled_units,
    kill_and_resume,
    optimize,
    write_project,
)
from tests.audit_oracle import audit_run, paid_twice, read_run

STRONG = {"default": 0.0, "0.0.1": 0.35}
"""Slot 1 of iteration 0 truly better (+0.35 pass probability on every case), the rest null."""


def _campaign(
    root: Path, toy: Toy, flags: list[str], log: Path | None = None, seed: str = "0"
) -> list[str]:
    """Write the toy under ``root`` and return its full flags (store ``root/store``)."""
    common = ["--store", str(root / "store"), "--error-control", "none", "--iterations", "2"]
    return write_project(root / "p", toy, log, seed) + common + flags


def _run(root: Path, toy: Toy, flags: list[str], seed: str = "0") -> None:
    done = optimize(_campaign(root, toy, flags, seed=seed))
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


def test_an_early_stop_by_cluster_rests_on_whole_clusters(tmp_path: Path) -> None:
    """Early stop by cluster decides on the clusters read to its cutoff, whole, however many
    cases past it ran a repetition before the stop (the oracle gave up past 6 such cases and
    called README's early stop a mismatch: 7 in the slow audit's campaign, audit seed 11)."""
    toy = Toy(cases=48, cluster_size=3, plan={"default": 0.6})
    flags = ["--seed", "1", "--iterations", "1", "--population", "1"]
    flags += ["--candidate-replay-repetitions", "2", "--replay-concurrency", "8"]
    _run(tmp_path, toy, flags)
    audit = audit_run(tmp_path / "store", tmp_path / "p" / "data.jsonl")
    assert not audit.problems
    _, _, report = read_run(tmp_path / "store")
    (early,) = [m for m in report["measurements"] if m["status"] == "early_stopped"]
    assert early["decision"] == "accept" and early["n_planned"] - early["n"] > 6


def test_one_audit_seed_replays_one_run(tmp_path: Path) -> None:
    """The toy judge's transient failures come from the audit seed and the call, and no path
    is in the commands (the run's fingerprint draws the one-repetition arm's repetitions and
    names the units): the same seed in two folders journals the same units, judge attempts
    and scores, so a failing seed of the slow audit replays exactly."""
    toy = Toy(cases=8, judge=True, judge_flaky=0.5, plan={"default": 0.2})
    reps = ["--candidate-replay-repetitions", "2", "--baseline-replay-repetitions", "1"]
    flags = ["--seed", "1", "--iterations", "1", "--population", "1", *reps]
    runs = []
    for name in ("a", "b"):
        _run(tmp_path / name, toy, flags, seed="7")
        runs.append(sorted(map(_outcome, journaled_units(tmp_path / name / "store"))))
    assert runs[0] == runs[1]
    assert any(attempts > 1 for *_, attempts, _ in runs[0] if attempts)  # transient failures


def _outcome(unit: dict[str, Any]) -> tuple[object, ...]:
    """What two runs of one audit seed agree on about a journaled unit: its id, opaque
    name, status, and its judge's attempts and score."""
    judge = unit.get("judge") or {}
    name = unit["replay"]["name"]
    return unit["unit"], name, unit["status"], judge.get("attempts"), judge.get("score")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("toy", "flags"),
    [
        JUDGE_FAILURES,
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
    pair of one case, each decision in the report the measurement's. The judge's transient
    failures are drawn from an audit seed: ``EVOLANE_AUDIT_SEED=<seed>`` replays a run."""
    seed = audit_seed()
    _run(tmp_path, toy, flags, seed)
    audit = audit_run(tmp_path / "store", tmp_path / "p" / "data.jsonl")
    replay = f"EVOLANE_AUDIT_SEED={seed} replays this run ({tmp_path})"
    assert not audit.problems, f"{replay}: {audit.problems}"
    decided = set(audit.decisions.values())
    assert {"accept", "reject"} <= decided, f"{replay}: {audit.decisions} ({audit.tried})"
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
