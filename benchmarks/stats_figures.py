"""Paired statistics figures (issue 5, "Must reach"), pure statistics, no subprocesses.

Prints, from one run:
  bootstrap CI, 1,000 cases x 10,000 resamples       <= 200 ms, vs a naive Python loop (scaled)
  early stop at effect +-0.15 (noise sd 0.07, 64 cases, 200 seeded trials):
      mean fraction of pairs spent <= 50%, agreement with the full evaluation >= 95%
  sequential test at effect 0 (1,000 trials, bounded symmetric deltas): false accepts <= alpha

    python benchmarks/stats_figures.py [--trials 200] [--null-trials 1000] [--steps 1000]
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np

from evolane.messages import GateConfig
from evolane.stats import EarlyStop, SequentialTest, bootstrap_ci, decide

CASES, RESAMPLES = 1_000, 10_000


def naive_bootstrap_seconds(deltas: list[float], resamples: int) -> float:
    """Seconds for a plain-Python percentile bootstrap (the reference being beaten)."""
    rng = random.Random(0)
    n = len(deltas)
    start = time.perf_counter()
    means = []
    for _ in range(resamples):
        total = 0.0
        for _ in range(n):
            total += deltas[rng.randrange(n)]
        means.append(total / n)
    means.sort()
    _ = (means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1])
    return time.perf_counter() - start


def bench_bootstrap(repeats: int = 7) -> None:
    """Time the vectorised bootstrap and compare with the naive loop scaled to full size."""
    deltas = np.random.default_rng(0).uniform(-1.0, 1.0, CASES)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        bootstrap_ci(deltas, 0.95, RESAMPLES, seed=0)
        times.append(time.perf_counter() - start)
    small = RESAMPLES // 50
    naive = naive_bootstrap_seconds(deltas.tolist(), small) * (RESAMPLES / small)
    best, median = min(times), float(np.median(times))
    print(f"bootstrap CI {CASES:,} cases x {RESAMPLES:,} resamples:")
    print(
        f"  vectorised   best {best * 1e3:7.1f} ms, median {median * 1e3:7.1f} ms (target <= 200)"
    )
    print(f"  naive loop   {naive * 1e3:9.0f} ms (measured at {small} resamples, scaled x50)")
    print(f"  speed-up     {naive / median:9.0f}x")


def early_stop_trial(effect: float, seed: int, cases: int, config: GateConfig) -> tuple[int, bool]:
    """(pairs spent, same decision as the full evaluation) for one seeded measurement."""
    deltas = np.random.default_rng(seed).normal(effect, 0.07, cases).clip(-1.0, 1.0).tolist()
    stop = EarlyStop(config, cases)
    for d in deltas:
        if stop.update(d) is not None:
            break
    base = {f"c{i}": [max(0.0, -d)] for i, d in enumerate(deltas)}
    cand = {f"c{i}": [max(0.0, d)] for i, d in enumerate(deltas)}
    final = decide(base, cand, config).decision
    return stop.n, (stop.decision or final) == final


def bench_early_stop(trials: int, cases: int = 64) -> None:
    """Fraction of pairs spent and agreement with the full evaluation, both directions."""
    config = GateConfig(bootstrap_samples=1_000)
    print(f"early stop, {cases} cases, noise sd 0.07, {trials} seeded trials, paired gate:")
    for effect in (0.15, -0.15):
        runs = [early_stop_trial(effect, seed, cases, config) for seed in range(trials)]
        spent = float(np.mean([n for n, _ in runs])) / cases
        agree = float(np.mean([ok for _, ok in runs]))
        print(
            f"  effect {effect:+.2f}: pairs spent {spent:6.1%} (target <= 50%), "
            f"agreement {agree:6.1%} (target >= 95%)"
        )


NULLS = {
    "uniform[-1,1]": lambda rng, n: rng.uniform(-1.0, 1.0, n),
    "+-1 coin": lambda rng, n: rng.choice([-1.0, 1.0], n),
    "N(0,0.07) clipped": lambda rng, n: rng.normal(0.0, 0.07, n).clip(-1.0, 1.0),
}


def bench_false_accepts(trials: int, steps: int, alpha: float = 0.05) -> None:
    """False accept / reject rates of the sequential test at true effect 0."""
    print(f"sequential test at effect 0, {trials:,} trials of up to {steps:,} deltas:")
    for name, draw in NULLS.items():
        rng = np.random.default_rng(1)
        accepts = rejects = 0
        for _ in range(trials):
            test = SequentialTest(alpha)
            for d in draw(rng, steps).tolist():
                test.update(d)
                if test.decision != "continue":
                    break
            accepts += test.decision == "accept"
            rejects += test.decision == "reject"
        print(
            f"  {name:18} false accept {accepts / trials:6.1%} (alpha {alpha:.0%}),"
            f" false reject {rejects / trials:6.1%}"
        )


def main() -> None:
    """Run every figure once and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200, help="early-stop trials per sign")
    parser.add_argument("--null-trials", type=int, default=1_000, help="trials at effect 0")
    parser.add_argument("--steps", type=int, default=1_000, help="deltas per trial at effect 0")
    args = parser.parse_args()
    bench_bootstrap()
    bench_early_stop(args.trials)
    bench_false_accepts(args.null_trials, args.steps)


if __name__ == "__main__":
    main()
