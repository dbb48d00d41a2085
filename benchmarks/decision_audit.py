"""Do the decisions a run records follow from its own numbers? Many small campaigns through
the real `evolane optimize` on the toy of tests/audit_helpers.py (every candidate's true
effect known), each read back and decided again by tests/audit_oracle.py; then the rates.

    python benchmarks/decision_audit.py matrix               # every setting once, audited
    python benchmarks/decision_audit.py early --campaigns 2  # early stop vs full, per setting
    python benchmarks/decision_audit.py resume --kill-after 3 20 45 70 80  # SIGKILL, --resume
    python benchmarks/decision_audit.py null --campaigns 40  # null accept rate, k = 2
    python benchmarks/decision_audit.py power --campaigns 30 [--mixture readme]
    python benchmarks/decision_audit.py seeds --campaigns 40  # the slow audit cell, per seed

``early``: each setting with and without early stop, same seeds: the same decisions (a
sequential test's early accept may differ, README: >= 99.1% agree). ``resume``: killed
after N journaled units, resumed: the uninterrupted run's decisions, no journaled replay
run again. ``null``: every candidate has its parent's shift (no true effect), paired k = 2,
32 val cases, one replay each (README: 3.1% for cases all flaky at 32 cases). ``power``:
each candidate +``--shift`` (0.15) over the seed, paired k = 1, 32 val cases (README: 74.8%
on its mixture, ``--mixture readme``). Each rate is printed beside the toy's own model (its
32 cases' pass chances, the full evaluation, numpy) and carries a 95% Wilson interval.
``seeds``: the slow test's campaign of clusters and judge failures (tests/audit_helpers.py
``JUDGE_FAILURES``) on audit seeds ``--seed``, ``--seed`` + 1, ...: each seed's problems,
and how often it decided as meant: the better candidate accepted, the worse rejected
(``EVOLANE_AUDIT_SEED=<seed>`` replays one in the test).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.audit_helpers import (
    JUDGE_FAILURES,
    Toy,
    kill_and_resume,
    optimize,
    pass_chance,
    write_project,
)
from tests.audit_oracle import Audit, audit_run, paid_twice

MATRIX: list[tuple[str, Toy, list[str]]] = [
    ("paired k1", Toy(plan={"default": 0.0, "0.0.1": 0.3}), []),
    ("paired k2 reps 2/3", Toy(cases=10, plan={"default": 0.1}),
     ["--k-se", "2", "--baseline-replay-repetitions", "2", "--candidate-replay-repetitions", "3"]),
    ("bootstrap", Toy(plan={"default": 0.2}), ["--gate", "bootstrap"]),
    ("strict", Toy(judge=True, graded=True, plan={"default": 0.1}), ["--gate", "strict"]),
    ("threshold", Toy(judge=True, graded=True, plan={"default": 0.1}),
     ["--gate", "threshold", "--threshold", "0.5"]),
    ("clusters of 3", Toy(cases=30, cluster_size=3, plan={"default": 0.15}), []),
    ("no early stop", Toy(plan={"default": 0.0}), ["--no-sequential"]),
    ("no regression 3/3", Toy(cases=10, plan={"default": "0.3/0.15"}),
     ["--no-regression", "--baseline-replay-repetitions", "3",
      "--candidate-replay-repetitions", "3"]),
    ("population 4", Toy(plan={"default": 0.05}), ["--population", "4", "--iterations", "1"]),
    ("judge failures", Toy(judge=True, judge_hard=0.15, judge_flaky=0.3, replay_crash=0.05,
                           plan={"default": 0.1}), []),
    ("confirm on 12 test cases", Toy(test_cases=12, plan={"default": 0.0, "0.0.1": 0.35}),
     ["--error-control", "confirm"]),
    ("graded judge, online", Toy(cases=24, judge=True, graded=True, plan={"default": 0.2}),
     ["--error-control", "online"]),
]  # fmt: skip


def campaign(root: Path, toy: Toy, flags: list[str], seed: int, audit: str = "0") -> Audit:
    """One campaign in a fresh folder under ``root`` (``audit``: its judge's seed), audited
    (its folder removed)."""
    folder = Path(tempfile.mkdtemp(dir=root))
    try:
        common = ["--store", str(folder / "store"), "--seed", str(seed), "--error-control", "none"]
        args = write_project(folder / "p", toy, seed=audit) + common + ["--iterations", "2", *flags]
        done = optimize(args)
        if done.returncode != 0:
            raise SystemExit(f"exit {done.returncode}: {done.stderr[-800:]}")
        return audit_run(folder / "store", folder / "p" / "data.jsonl")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def wilson(hits: int, n: int) -> str:
    """``hits`` of ``n`` as a percentage with its 95% Wilson interval."""
    if n == 0:
        return "n/a"
    p, z = hits / n, 1.96
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return f"{hits}/{n} = {100 * p:.1f}% [{100 * (mid - half):.1f}, {100 * (mid + half):.1f}]"


def model_rate(toy: Toy, shift: float, k: float, trials: int = 200_000) -> float:
    """The paired gate's full-evaluation accept rate on the toy's own cases (their pass
    chances as its replay draws them), simulated with numpy: what the CLI's should be near."""
    rng = np.random.default_rng(0)
    ids = [f"v{i:02d}" for i in range(toy.cases)]
    chance = np.array([pass_chance(case, 0.0, toy.mixture) for case in ids])
    better = np.array([pass_chance(case, shift, toy.mixture) for case in ids])
    deltas = (rng.random((trials, toy.cases)) < better).astype(float)
    deltas -= rng.random((trials, toy.cases)) < chance
    mean, se = deltas.mean(axis=1), deltas.std(axis=1, ddof=1) / math.sqrt(toy.cases)
    tie = np.isclose(mean, k * se, rtol=1e-12, atol=1e-12)
    return float(np.where(se == 0, mean > 0, (mean > k * se) & ~tie).mean())


def matrix(root: Path, seed: int) -> None:
    """Every setting once, audited."""
    for index, (name, toy, flags) in enumerate(MATRIX):
        audit = campaign(root, toy, flags, seed + index)
        print(f"{name:24} {json.dumps(audit.decisions)} problems: {audit.problems or 'none'}")


def early(root: Path, seed: int, campaigns: int) -> None:
    """Every setting with and without early stop, the same seeds: the decisions compared
    (not with unequal repetitions: the arm with fewer is told repetition numbers drawn by
    the run's secret, so two runs replay other draws)."""
    for name, toy, flags in MATRIX:
        if "--candidate-replay-repetitions" in flags:
            reps = flags.index("--candidate-replay-repetitions")
            if flags[reps + 1] != flags[flags.index("--baseline-replay-repetitions") + 1]:
                continue
        toy = dataclasses.replace(toy, judge_flaky=0.0)  # drawn per unit: early stop runs others
        differ = []
        for index in range(seed, seed + campaigns):
            sequential, full = (
                campaign(root, toy, [*flags, switch], index)
                for switch in ("--sequential", "--no-sequential")
            )
            differ += [
                f"seed {index} {slot}: {decision} early, {full.decisions.get(slot)} full"
                for slot, decision in sequential.decisions.items()
                if decision != full.decisions.get(slot)
            ]
            differ += sequential.problems + full.problems
        print(f"{name:24} {campaigns} seeds: {differ or 'same decisions, no problems'}")


RESUMED: list[tuple[str, Toy, list[str]]] = [
    ("judge failures", Toy(judge=True, judge_hard=0.15, replay_crash=0.05, plan={"default": 0.1}),
     ["--replay-concurrency", "2"]),
    ("clusters, no regression 2/2", Toy(cases=20, cluster_size=2, plan={"default": "0.2/0.1"}),
     ["--no-regression", "--baseline-replay-repetitions", "2",
      "--candidate-replay-repetitions", "2"]),
    ("online", Toy(cases=24, plan={"default": 0.0, "0.0.0": 0.5}), ["--error-control", "online"]),
]  # fmt: skip


def resume(root: Path, seed: int, kill_points: list[int]) -> None:
    """Each setting killed (SIGKILL) after ``kill_points`` journaled units and resumed: the
    decisions of the uninterrupted run, no replay journaled before the kill run again."""
    for name, toy, flags in RESUMED:
        whole = campaign(root, toy, flags, seed)
        found = list(whole.problems)
        for kill_after in kill_points:
            folder = Path(tempfile.mkdtemp(dir=root))
            log = folder / "log" / "replays.log"
            log.parent.mkdir()
            log.parent.chmod(0o777)  # a root evolane's commands run as uids of their own
            store = folder / "store"
            common = ["--store", str(store), "--seed", str(seed), "--iterations", "2"]
            args = [*write_project(folder / "p", toy, log), "--error-control", "none", *common]
            before = kill_and_resume([*args, *flags], store, kill_after)
            audit = audit_run(folder / "store", folder / "p" / "data.jsonl")
            found += audit.problems
            if audit.decisions != whole.decisions:
                found.append(f"killed at {kill_after}: {audit.decisions} != {whole.decisions}")
            names = {r["replay"]["name"]: r["unit"] for r in before if r["replay"].get("name")}
            journaled = [r["unit"] for r in before if r["replay"]["status"] != "cancelled"]
            found += [
                f"killed at {kill_after}: {unit} ran twice"
                for unit in paid_twice(log, journaled, names)
            ]
            shutil.rmtree(folder, ignore_errors=True)
        print(f"{name:28} killed at {kill_points}: {found or 'same decisions, nothing paid twice'}")


def seeds(root: Path, seed: int, campaigns: int) -> None:
    """The slow audit's campaign of clusters and judge failures on ``campaigns`` audit seeds:
    each seed's problems, and how often it decided as meant (its better candidate accepted,
    the worse rejected: what the test needs to have audited both)."""
    toy, flags = JUDGE_FAILURES
    meant, found = 0, []
    for index in range(seed, seed + campaigns):
        audit = campaign(root, toy, flags, 0, audit=str(index))  # its flags name its --seed
        found += [f"seed {index}: {problem}" for problem in audit.problems]
        if all((decision == "accept") == (shift > 0) for shift, decision in audit.tried):
            meant += 1
        else:
            print(f"audit seed {index}: {audit.decisions} (shift, decision: {audit.tried})")
    print(
        f"{campaigns} audit seeds from {seed}: decided as meant {wilson(meant, campaigns)}; "
        f"audit problems: {found or 'none'}"
    )


def rate(root: Path, args: argparse.Namespace) -> None:
    """``null`` (k = 2, four iterations of null candidates) or ``power`` (k = 1, one
    iteration of candidates + ``shift`` over the seed) on 32 val cases, one replay each."""
    shift, k, iterations = (0.0, 2.0, 4) if args.mode == "null" else (args.shift, 1.0, 1)
    toy = Toy(cases=32, mixture=args.mixture, plan={"default": shift})
    flags = ["--k-se", f"{k}", "--iterations", f"{iterations}", "--population", "2"]
    accepted = tried = 0
    problems: list[str] = []
    for index in range(args.campaigns):
        audit = campaign(root, toy, [*flags, "--stall", "9"], args.seed + index)
        problems += audit.problems
        tried += len(audit.tried)
        accepted += sum(1 for _, decision in audit.tried if decision == "accept")
    print(
        f"{args.mode} ({args.mixture}, shift {shift}, k {k:g}): accepted "
        f"{wilson(accepted, tried)} of the candidates (the toy's model, full evaluation: "
        f"{100 * model_rate(toy, shift, k):.1f}%); audit problems: {problems or 'none'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("matrix", "early", "resume", "null", "power", "seeds"))
    parser.add_argument("--kill-after", type=int, nargs="+", default=[3, 20, 45, 70])
    parser.add_argument("--campaigns", type=int, default=30)
    parser.add_argument("--shift", type=float, default=0.15)
    parser.add_argument("--mixture", choices=("flaky", "readme"), default="flaky")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="audit-") as scratch:
        if args.mode == "matrix":
            matrix(Path(scratch), args.seed)
        elif args.mode == "early":
            early(Path(scratch), args.seed, args.campaigns)
        elif args.mode == "resume":
            resume(Path(scratch), args.seed, args.kill_after)
        elif args.mode == "seeds":
            seeds(Path(scratch), args.seed, args.campaigns)
        else:
            rate(Path(scratch), args)


if __name__ == "__main__":
    main()
