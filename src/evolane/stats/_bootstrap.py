"""Seeded, vectorised, case-level percentile bootstrap of a mean."""

from __future__ import annotations

import numpy as np

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


def bootstrap_ci(
    deltas: np.ndarray, confidence: float, samples: int, seed: int
) -> tuple[float, float]:
    """Seeded percentile bootstrap CI at level ``confidence`` for the mean of ``deltas``.

    Cases are resampled with replacement (the case is the independent unit). A single
    case, or cases that are all equal, give the degenerate interval ``(mean, mean)``.
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
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    lowest, highest = float(values.min()), float(values.max())
    return float(np.clip(low, lowest, highest)), float(np.clip(high, lowest, highest))
