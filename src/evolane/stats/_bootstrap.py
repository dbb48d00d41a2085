"""Seeded, vectorised, case-level bootstrap of a mean: the expanded percentile interval."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal

import numpy as np

from evolane.stats._dist import normal_cdf, t_quantile

BootstrapMethod = Literal["expanded", "percentile"]

_CHUNK_ELEMENTS = 1 << 18
"""Resampled values per chunk (~4 MiB of indices and values): bounds memory at any size."""


def bootstrap_means(deltas: np.ndarray, samples: int, seed: int) -> np.ndarray:
    """The means of ``samples`` seeded resamples (with replacement) of ``deltas``.

    The draws depend only on ``(len(deltas), samples, seed)``: chunking bounds memory
    (about 4 MiB at a time) without changing the result.
    """
    values = np.asarray(deltas, dtype=np.float64).ravel()
    n = values.size
    if n == 0:
        raise ValueError("cannot bootstrap an empty sample")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    rows = max(1, _CHUNK_ELEMENTS // n)
    means = np.empty(samples, dtype=np.float64)
    for start in range(0, samples, rows):
        count = min(rows, samples - start)
        index = rng.integers(0, n, size=(count, n), dtype=np.intp)  # take() wants intp
        np.sum(values.take(index), axis=1, out=means[start : start + count])
    means /= n
    return means


@lru_cache(maxsize=4096)
def expanded_tail(n: int, confidence: float) -> float:
    """The tail probability the expanded percentile interval reads at ``n`` cases.

    Hesterberg's expanded percentile interval ("What teachers should know about the
    bootstrap", The American Statistician 69, 2015): the plain percentile interval is too
    narrow at few cases (a factor sqrt((n-1)/n) from the plug-in variance and z in place of
    Student's t); reading the bootstrap quantiles at the tail a' with
    z_{a'} = sqrt(n/(n-1)) * t_{n-1, a} restores the t interval's width while keeping the
    bootstrap's shape. At n = 10 and 95% the tail is 0.0086 instead of 0.025; by n = 1,000
    it is 0.0245.
    """
    tail = (1.0 - confidence) / 2.0
    if n < 2:
        return tail
    widened = math.sqrt(n / (n - 1)) * t_quantile(1.0 - tail, n - 1)
    return normal_cdf(-widened)


def bootstrap_ci(
    deltas: np.ndarray,
    confidence: float,
    samples: int,
    seed: int,
    *,
    method: BootstrapMethod = "expanded",
) -> tuple[float, float]:
    """Seeded bootstrap CI at level ``confidence`` for the mean of ``deltas``.

    Cases are resampled with replacement (the case is the independent unit). ``method``:
    ``expanded`` (the default) reads the quantiles at `expanded_tail`, which holds about
    nominal coverage from 10 cases on for deltas that are not strongly skewed (the plain
    ``percentile`` interval covers about 90% at a nominal 95% with 10 cases). A single case,
    or cases that are all equal, give the degenerate interval ``(mean, mean)``.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    values = np.asarray(deltas, dtype=np.float64).ravel()
    if values.size == 0:
        raise ValueError("cannot bootstrap an empty sample")
    if not np.all(np.isfinite(values)):
        raise ValueError("deltas must be finite")
    if values.size == 1 or np.all(values == values[0]):
        mean = float(values.mean())
        return mean, mean
    means = bootstrap_means(values, samples, seed)
    if method == "expanded":
        tail = expanded_tail(values.size, confidence)
    elif method == "percentile":
        tail = (1.0 - confidence) / 2.0
    else:
        raise ValueError(f"unknown bootstrap method {method!r}")
    low, high = np.quantile(means, [tail, 1.0 - tail])
    lowest, highest = float(values.min()), float(values.max())
    return float(np.clip(low, lowest, highest)), float(np.clip(high, lowest, highest))
