"""Online error control over many candidates (README "Online error control"), through
`evolane.stats`: does a campaign that tries 60 candidates accept one with no true gain more
often than alpha?

A campaign hill-climbs ``--iterations`` x ``--population`` candidates (horizon H = their
product) on one set of val cases, each case a pass chance (or a graded score) drawn once;
every candidate is measured against its parent, whose val replays it reuses (as a run does:
the candidates' p-values share them). A candidate is accepted when the paired gate (k = 1)
accepts and `online_p_value` of its deltas is at most `OnlineErrorControl`'s level; the best
accepted one of an iteration becomes the parent. Every candidate has its parent's true mean
(no gain), except, with ``good first``, slot 0 of each iteration, which gains +0.35 (its
accept carries its level to slot 1, the fallback's path). Repetitions share a case-level
draw with probability ``rho`` (correlated repeats). A false accept is an accepted candidate
whose true mean over the cases is not above its parent's. Prints the share of campaigns
with one, and its 95% Wilson interval.

    python benchmarks/online_many.py [--campaigns 150] [--seed 7] [--quick]

2026-12-07 (200 campaigns a cell, H = 60, alpha 0.05, beside other jobs): pass/fail 32 cases
2.0% [0.8, 5.0]; pass/fail 32 x 3 correlated repeats 0.5% [0.1, 2.8]; graded 32 cases 0.0%
[0, 1.9]; graded 32 x 3 correlated, good first 0.0% [0, 1.9]; pass/fail 100 cases, good
first 1.0% [0.3, 3.6]: within alpha in every cell (pass/fail scores come closest: their
sign test's p-values are 2^-k-like steps, and 2^-11 = 0.00049 already lies near 0.05 / 60).
Through the real CLI, 60 useless candidates a campaign on tests/audit_helpers.py's toy (32
flaky val cases, `--iterations 10 --population 6 --error-control online`): no candidate
accepted in any of the campaigns run, every decision audited clean by tests/audit_oracle.py,
although in one the reused parent replays let the gate alone accept 35 of the 60.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np

from evolane.messages import GateConfig
from evolane.stats import OnlineErrorControl, decide, online_p_value

ALPHA = 0.05
GAIN = 0.35


@dataclass(frozen=True)
class Cell:
    """One setting: val cases, graded scores or pass/fail, repetitions and their
    correlation, and whether slot 0 of each iteration truly gains."""

    cases: int
    graded: bool
    reps: int
    rho: float
    good_first: bool


CELLS = (
    Cell(32, False, 1, 0.0, False),
    Cell(32, False, 3, 0.9, False),
    Cell(32, True, 1, 0.0, False),
    Cell(32, True, 3, 0.9, True),
    Cell(100, False, 1, 0.0, True),
)


def wilson(hits: int, n: int) -> str:
    """``hits`` of ``n`` as a percentage with its 95% Wilson interval."""
    p, z = hits / n, 1.96
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low, high = 100 * max(0.0, mid - half), 100 * (mid + half)
    return f"{hits}/{n} = {100 * p:.1f}% [{low:.1f}, {high:.1f}]"


def _chance(base: np.ndarray, shift: float) -> np.ndarray:
    return np.clip(base + shift, 0.0, 1.0)


def _scores(rng: np.random.Generator, chance: np.ndarray, cell: Cell) -> dict[str, list[float]]:
    """Per case, ``cell.reps`` scores; each repetition reuses the case's shared draw with
    probability ``cell.rho``."""
    shared = rng.random(chance.size)
    draws = rng.random((chance.size, cell.reps))
    same = rng.random((chance.size, cell.reps)) < cell.rho
    u = np.where(same, shared[:, None], draws)
    if cell.graded:  # quarters around the chance, mean close to it
        scores = np.round(4 * np.clip(chance[:, None] + (u - 0.5) * 0.8, 0.0, 1.0)) / 4
    else:
        scores = (u < chance[:, None]).astype(float)
    return {f"v{i:03d}": row.tolist() for i, row in enumerate(scores)}


def _true_mean(base: np.ndarray, shift: float, cell: Cell) -> float:
    """The expected score over the cases at ``shift`` (graded: by the quarters' rounding)."""
    chance = _chance(base, shift)
    if not cell.graded:
        return float(chance.mean())
    u = (np.arange(2000) + 0.5) / 2000
    scores = np.round(4 * np.clip(chance[:, None] + (u - 0.5) * 0.8, 0.0, 1.0)) / 4
    return float(scores.mean())


def campaign(rng: np.random.Generator, cell: Cell, iterations: int, population: int) -> bool:
    """One campaign: whether it accepted a candidate with no true gain over its parent."""
    base = 0.2 + 0.6 * rng.random(cell.cases)
    config = GateConfig(gate="paired", k_se=1.0, seed=int(rng.integers(1 << 30)))
    control = OnlineErrorControl(ALPHA, horizon=iterations * population)
    shift = 0.0
    parent = _scores(rng, _chance(base, shift), cell)
    for _ in range(iterations):
        accepted = []
        for slot in range(population):
            tried = shift + (GAIN if cell.good_first and slot == 0 else 0.0)
            scores = _scores(rng, _chance(base, tried), cell)
            gate = decide(parent, scores, config)
            p = 1.0
            if gate.decision == "accept":
                deltas = np.array([np.mean(scores[c]) - np.mean(parent[c]) for c in parent])
                p = online_p_value(deltas, config, pass_fail=not cell.graded)
            if control.record(gate.decision, p_value=p).decision != "accept":
                continue
            if _true_mean(base, tried, cell) <= _true_mean(base, shift, cell) + 1e-12:
                return True
            accepted.append((gate.mean_delta, -slot, tried, scores))
        if accepted:
            _, _, shift, parent = max(accepted, key=lambda a: (a[0], a[1]))
    return False


def main() -> None:
    """Every cell's rate of campaigns with a false accept."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--campaigns", type=int, default=150)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--population", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="10 campaigns a cell")
    args = parser.parse_args()
    campaigns = 10 if args.quick else args.campaigns
    horizon = args.iterations * args.population
    for cell in CELLS:
        rng = np.random.default_rng(args.seed)
        hits = sum(campaign(rng, cell, args.iterations, args.population) for _ in range(campaigns))
        kind = "graded" if cell.graded else "pass/fail"
        print(
            f"{kind} {cell.cases} cases x {cell.reps} (rho {cell.rho:g})"
            f"{', good first' if cell.good_first else ''}, H = {horizon}: a campaign accepted "
            f"a candidate with no true gain in {wilson(hits, campaigns)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
