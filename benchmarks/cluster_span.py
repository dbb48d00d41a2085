"""Why a cluster's cases must share one split (README "Dataset rows"), through `evolane.stats`.

A campaign of ``--candidates`` useless candidates (each one's effect on a cluster drawn from
N(0, ``--sd``): no gain on average) keeps the last one the paired val gate accepts, and
confirms it on the test split at 0.05 (the full-gain sign test of pass/fail scores). Each of
the 32 test cases shares its cluster with one of the 32 val cases (``span``: the same
cluster, so the same effect) or has one of its own. Prints the share of campaigns that
publish a best with no true gain, with its 95% Clopper-Pearson interval.

    python benchmarks/cluster_span.py [--campaigns 300] [--sd 0.4] [--seed 11]
"""

from __future__ import annotations

import argparse

import numpy as np

from evolane.messages import GateConfig
from evolane.stats import clopper_pearson, confirm, decide

CASES = 32


def _scores(rng: np.random.Generator, ids: list[str], chance: np.ndarray) -> dict[str, list[float]]:
    return {case: [float(rng.random() < p)] for case, p in zip(ids, chance, strict=True)}


def _published(rng: np.random.Generator, span: bool, candidates: int, sd: float) -> bool:
    """One campaign: whether its best (no true gain) is confirmed on the test split."""
    val = [f"v{i:03d}" for i in range(CASES)]
    test = [f"t{i:03d}" for i in range(CASES)]
    base_val = rng.uniform(0.2, 0.6, CASES)
    base_test = base_val if span else rng.uniform(0.2, 0.6, CASES)
    parent = _scores(rng, val, base_val)
    best = None
    for index in range(candidates):
        effect = rng.normal(0.0, sd, CASES)
        scores = _scores(rng, val, np.clip(base_val + effect, 0.0, 1.0))
        if decide(parent, scores, GateConfig(seed=index)).decision == "accept":
            best = effect
    if best is None:
        return False
    effect = best if span else rng.normal(0.0, sd, CASES)
    seed_test = _scores(rng, test, base_test)
    best_test = _scores(rng, test, np.clip(base_test + effect, 0.0, 1.0))
    verdict = confirm(seed_test, best_test, GateConfig(), pass_fail=True, bound=False)
    return verdict.decision == "confirmed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--campaigns", type=int, default=300)
    parser.add_argument("--candidates", type=int, default=16)
    parser.add_argument("--sd", type=float, default=0.4)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    for span in (True, False):
        hits = sum(_published(rng, span, args.candidates, args.sd) for _ in range(args.campaigns))
        low, high = clopper_pearson(hits, args.campaigns, 0.95)
        where = "in the clusters of val cases" if span else "in clusters of their own"
        print(
            f"test cases {where}: a useless best published in {hits} of {args.campaigns} "
            f"campaigns ({hits / args.campaigns:.1%}, 95% interval {low:.1%}-{high:.1%})"
        )


if __name__ == "__main__":
    main()
