"""Screening on a gate's own case: how often a null candidate screening let in is accepted.

When val feeds the optimizer, ``--fast-verified`` screens on a val case (the parent's
hardest failing one) and passes a candidate only on a gain there. This simulates null
candidates on pass/fail cases (each case's pass rate uniform in [0.2, 0.8], both arms
drawn alike) and the paired gate's rule (mean > k * SE, SE with n - 1), vectorised, and
prints per n the accept rate of a screened-in candidate with the screened pair kept in the
gate (evolane before) and left out (evolane now), against the gate alone on every case.

    python benchmarks/screen_leak.py [--trials 400000] [--k 2]
"""

from __future__ import annotations

import argparse

import numpy as np


def _accepts(deltas: np.ndarray, k: float) -> np.ndarray:
    mean = deltas.mean(axis=1)
    se = deltas.std(axis=1, ddof=1) / np.sqrt(deltas.shape[1])
    return mean - k * se > 0


def simulate(n: int, trials: int, k: float, rng: np.random.Generator) -> tuple[float, ...]:
    """(screened-in share, accept rate kept, left out, the gate alone) for ``n`` cases."""
    rate = rng.uniform(0.2, 0.8, size=(trials, n))
    base = rng.random((trials, n)) < rate
    cand = rng.random((trials, n)) < rate
    deltas = cand.astype(float) - base
    fails = ~base
    case = np.argmax(fails, axis=1)  # the parent's failing case screening is on
    screened_in = fails.any(axis=1) & cand[np.arange(trials), case]
    kept = _accepts(deltas, k)
    others = np.ones_like(deltas, dtype=bool)
    others[np.arange(trials), case] = False
    left_out = _accepts(deltas[others].reshape(trials, n - 1), k)
    return (
        float(screened_in.mean()),
        float(kept[screened_in].mean()),
        float(left_out[screened_in].mean()),
        float(kept.mean()),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=400_000)
    parser.add_argument("--k", type=float, default=2.0)
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    for n in (8, 16, 32):
        share, kept, left_out, alone = simulate(n, args.trials, args.k, rng)
        print(
            f"n={n}: screened in {share:.3f}; accepted once in: pair kept {kept:.4f} "
            f"({kept / alone:.2f}x the gate alone), left out {left_out:.4f} "
            f"({left_out / alone:.2f}x); the gate alone {alone:.4f}"
        )


if __name__ == "__main__":
    main()
