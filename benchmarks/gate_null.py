"""The paired gate's per-candidate false-accept rate under the null, per mixture.

A candidate with no true effect (its replays drawn from the parent's own distribution, case
by case) is measured against its parent as a run measures it: the cases in the run's seeded
order through `EarlyStop`, then `decide` on every case when early stop did not decide. The
k x SE rule's level 1 - Phi(k) (0.023 at k = 2) is the level of a normal mean with a known
SE; with an estimated SE over few cases, or sparse pass/fail deltas (a few +1 and -1 among
zeros), the real rate differs per mixture, above or below it. Rates carry 95% Wilson
intervals; each cell cross-checks a vectorised copy of the rule against `decide`.

    python benchmarks/gate_null.py              # 20,000 trials a cell, a few minutes
    python benchmarks/gate_null.py --trials 2000
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decisions import as_scores, case_ids, draw_cases, seeded, wilson
from evolane.messages import GateConfig
from evolane.stats import EarlyStop, decide, gate_level

Draw = Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray]]
"""One null pair: the parent's and the candidate's per-case scores (one replay each)."""


def _pass_fail(cases: Callable[[np.random.Generator, int], np.ndarray]) -> Draw:
    def draw(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        p = cases(rng, n)
        return (rng.random(n) < p).astype(float), (rng.random(n) < p).astype(float)

    return draw


def _sparse(rng: np.random.Generator, n: int) -> np.ndarray:
    kind = rng.random(n)
    return np.where(kind < 0.45, 0.97, np.where(kind < 0.9, 0.03, 0.5))


def _hard(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.where(rng.random(n) < 0.7, 0.03, rng.uniform(0.05, 0.5, n))


def _rubric(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A 5-level rubric: each case's quality, each replay judged with noise, rounded."""
    quality = rng.uniform(0.0, 1.0, n)

    def judged() -> np.ndarray:
        return np.clip(np.round((quality + rng.normal(0.0, 0.15, n)) * 4) / 4, 0.0, 1.0)

    return judged(), judged()


def _beta(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Continuous scores: each case a Beta with its own mean, concentration 6."""
    mean = rng.uniform(0.05, 0.95, n)
    a, b = 6 * mean, 6 * (1 - mean)
    return rng.beta(a, b), rng.beta(a, b)


MIXTURES: dict[str, tuple[str, Draw]] = {
    "bench": (
        "pass/fail, decisions.py's: 35% p=.97, 35% p=.03, 30% p~U(.2,.8)",
        _pass_fail(draw_cases),
    ),
    "flaky": (
        "pass/fail, every case p~U(.2,.8) (dense deltas)",
        _pass_fail(lambda r, n: r.uniform(0.2, 0.8, n)),
    ),
    "coin": ("pass/fail, every case p=.5", _pass_fail(lambda r, n: np.full(n, 0.5))),
    "sparse": ("pass/fail, 45% p=.97, 45% p=.03, 10% p=.5 (few deltas)", _pass_fail(_sparse)),
    "hard": ("pass/fail, 70% p=.03, 30% p~U(.05,.5)", _pass_fail(_hard)),
    "rubric": ("graded, 5-level rubric, judge noise sd .15", _rubric),
    "beta": ("graded, continuous Beta scores", _beta),
}


def paired_accepts(deltas: np.ndarray, k: float) -> np.ndarray:
    """The paired rule of `decide` (min_effect 0), one row of deltas a trial."""
    n = deltas.shape[1]
    mean = deltas.mean(axis=1)
    se = deltas.std(axis=1, ddof=1) / math.sqrt(n)
    equal = np.all(deltas == deltas[:, :1], axis=1)
    tol = 1e-12
    tie = np.isclose(mean, k * se, rtol=tol, atol=tol)
    beyond = (mean > k * se) & ~tie
    zero = (mean > 0) & ~np.isclose(mean, 0.0, rtol=tol, atol=tol)
    return np.where(equal, zero, beyond)


def cell(name: str, n: int, k: float, trials: int, seed: int, check: int) -> tuple[int, int]:
    """False accepts in ``trials`` null measurements: full evaluation, and as a run decides."""
    rng = np.random.default_rng([seed, n, int(10 * k), sum(map(ord, name))])
    draw = MIXTURES[name][1]
    config = GateConfig(k_se=k, bootstrap_samples=1)
    pairs = [draw(rng, n) for _ in range(trials)]
    deltas = np.array([cand - base for base, cand in pairs])
    full = paired_accepts(deltas, k)
    ids = case_ids(n)
    for trial in range(min(check, trials)):  # the vectorised rule is the gate's
        base, cand = pairs[trial]
        real = decide(as_scores(ids, base[:, None]), as_scores(ids, cand[:, None]), config)
        assert (real.decision == "accept") == bool(full[trial]), (name, n, k, trial)
    final = 0
    for trial in range(trials):
        stop = EarlyStop(config, n)
        for delta in deltas[trial, seeded(n, trial)].tolist():
            if stop.update(delta) is not None:
                break
        decided = stop.decision if stop.decision is not None else ("accept" if full[trial] else "")
        final += decided == "accept"
    return int(full.sum()), final


def pct(hits: int, trials: int) -> str:
    """'3.1% [2.9, 3.4]'."""
    rate, low, high = wilson(hits, trials)
    return f"{100 * rate:4.1f}% [{100 * low:4.1f}, {100 * high:4.1f}]"


def main() -> None:
    """Print the table: mixture x val cases x k, full evaluation and as a run decides."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--k", type=float, nargs="+", default=[2.0])
    parser.add_argument("--cases", type=int, nargs="+", default=[16, 32, 100])
    parser.add_argument("--only", nargs="+", choices=sorted(MIXTURES), default=list(MIXTURES))
    args = parser.parse_args()
    began = time.perf_counter()
    for name in args.only:
        print(f"\n{name}: {MIXTURES[name][0]}")
    print(f"\n{args.trials} null candidates a cell (seed {args.seed}); 95% Wilson intervals")
    print(
        f"{'mixture':8s} {'k':>3s} {'n':>4s} {'level':>6s}  {'full evaluation':22s}  "
        "as a run decides (early stop)"
    )
    for k in args.k:
        level = gate_level(GateConfig(k_se=k))
        assert level is not None
        for name in args.only:
            for n in args.cases:
                full, final = cell(name, n, k, args.trials, args.seed, check=1000)
                print(
                    f"{name:8s} {k:3g} {n:4d} {100 * level:5.2f}%  {pct(full, args.trials):22s}  "
                    f"{pct(final, args.trials)}",
                    flush=True,
                )
    print(f"\n{time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
