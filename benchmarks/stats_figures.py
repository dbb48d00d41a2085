"""Paired statistics figures (issue 5, "Must reach"), pure statistics, no subprocesses.

Prints, from one run:
  bootstrap CI, 1,000 cases x 10,000 resamples       <= 200 ms, vs a naive Python loop (scaled)
  early stop at effect +-0.15 (noise sd 0.07, 64 cases, 200 seeded trials):
      mean fraction of pairs spent <= 50%, agreement with the full evaluation >= 95%
  the same on clustered cases (30 sessions of 2-6 turns, intra-class correlation 0.5 and 0.9,
      early stop reading each session's mean delta in the seeded order of the sessions),
      against the full clustered evaluation; and at effect 0 (case sd 1/3) both accept rates
  sequential test at effect 0 (1,000 trials, bounded symmetric deltas): false accepts <= alpha

    python benchmarks/stats_figures.py [--trials 200] [--null-trials 1000] [--steps 1000]
"""

from __future__ import annotations

import argparse
import itertools
import random
import time

import numpy as np

from evolane.messages import GateConfig
from evolane.stats import (
    EarlyStop,
    SequentialTest,
    bootstrap_ci,
    cluster_ends,
    cluster_order,
    decide,
)

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


def clustered_trial(
    effect: float, icc: float, sd: float, seed: int, config: GateConfig, sessions: int = 30
) -> tuple[float, str, str]:
    """(share of the cases read, early decision, full clustered decision) of one seeded
    measurement of ``sessions`` sessions of 2-6 turns: a case's delta is ``effect`` plus its
    session's shift and its own noise (sd ``sd`` in all, intra-class correlation ``icc``).
    Early stop reads the sessions as `measure.CasePrefix` does: in `cluster_order`, one
    mean delta per session (tests/test_cluster_early_stop.py runs the same through
    `MeasurePlan`)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 7, sessions)
    session = np.repeat(np.arange(sessions), sizes)
    latent = rng.normal(0.0, np.sqrt(icc), sessions)[session]
    latent += rng.normal(0.0, np.sqrt(1.0 - icc), session.size)
    deltas = dict(enumerate((effect + sd * latent).clip(-1.0, 1.0).tolist()))
    clusters = {f"c{i}": f"s{s}" for i, s in enumerate(session.tolist())}
    order = cluster_order(clusters, seed, clusters)
    ends = cluster_ends(order, clusters)
    stop = EarlyStop(config, len(ends), noun="clusters")
    read, start = len(order), 0
    for end in ends.tolist():
        part = [deltas[int(case[1:])] for case in order[start:end]]
        start = end
        if stop.update(sum(part) / len(part)) is not None:
            read = end
            break
    base = {f"c{i}": [max(0.0, -d)] for i, d in deltas.items()}
    cand = {f"c{i}": [max(0.0, d)] for i, d in deltas.items()}
    final = decide(base, cand, config, clusters=clusters).decision
    return read / len(order), stop.decision or final, final


def bench_clustered_early_stop(trials: int, null_trials: int) -> None:
    """Early stop by cluster against the full clustered evaluation: pairs spent and
    agreement at +-0.15 (case sd 0.07), false accepts of both at 0 (case sd 1/3)."""
    config = GateConfig(bootstrap_samples=1)  # the paired gate does not read the CI
    print(f"clustered early stop, sessions of 2-6 turns, {trials} seeded trials, paired gate:")
    for icc in (0.5, 0.9):
        for effect, sessions in itertools.product((0.15, -0.15), (30, 64)):
            runs = [
                clustered_trial(effect, icc, 0.07, seed, config, sessions) for seed in range(trials)
            ]
            spent = float(np.mean([share for share, _, _ in runs]))
            agree = float(np.mean([early == full for _, early, full in runs]))
            print(
                f"  icc {icc} effect {effect:+.2f}, {sessions} sessions: pairs spent "
                f"{spent:6.1%}, agreement {agree:6.1%} (target >= 95%)"
            )
        runs = [clustered_trial(0.0, icc, 1 / 3, seed, config) for seed in range(null_trials)]
        early = float(np.mean([e == "accept" for _, e, _ in runs]))
        full = float(np.mean([f == "accept" for _, _, f in runs]))
        agree = float(np.mean([e == f for _, e, f in runs]))
        print(
            f"  icc {icc} effect  0.00, 30 sessions ({null_trials} trials, sd 1/3): "
            f"false accepts early {early:6.1%} vs full {full:6.1%} (level 15.9%), "
            f"agreement {agree:6.1%}"
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
    bench_clustered_early_stop(args.trials, args.null_trials)
    bench_false_accepts(args.null_trials, args.steps)


if __name__ == "__main__":
    main()
