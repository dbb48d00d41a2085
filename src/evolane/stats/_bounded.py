"""A CI for the mean score of one arm over cases (scores in [0, 1]), for the report.

Not the gate's interval: the gate keeps `bootstrap_ci` (its decisions do not change). A
report's per-arm interval must not collapse when every case scored the same (all failed on
a hard task) nor be clipped to the observed range, which the bootstrap does: on a task whose
true mean was 0.068 its 95% interval covered the truth 43% of the time at 8 cases, 68% at 16
(found by review).
"""

from __future__ import annotations

import numpy as np

from evolane.stats._bootstrap import bootstrap_ci
from evolane.stats._dist import beta_quantile

_SAME = 1e-12
"""Scores this close count as one value: no spread (`effective_cases`)."""

_MOST_CASES = 1e8
"""The largest effective sample: beyond it the beta quantiles overflow, and the interval
is a few 1e-5 wide already."""


def clopper_pearson(successes: float, trials: float, confidence: float) -> tuple[float, float]:
    """The Clopper-Pearson ("exact") interval of a proportion from beta quantiles.

    ``successes`` and ``trials`` may be fractional (an effective sample, see
    `bounded_mean_ci`); with whole counts it covers at least ``confidence`` at every p.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if trials <= 0 or not 0.0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, trials > 0: {successes}, {trials}")
    tail = (1.0 - confidence) / 2.0
    low = 0.0 if successes <= 0 else beta_quantile(tail, successes, trials - successes + 1.0)
    high = (
        1.0
        if successes >= trials
        else beta_quantile(1.0 - tail, successes + 1.0, trials - successes)
    )
    return low, high


def effective_cases(values: np.ndarray) -> float:
    """How many pass/fail cases carry the information of ``values`` (Korn and Graubard's
    effective sample size): n for 0/1 scores or no spread, else n * m (1 - m) / s^2 (at most
    `_MOST_CASES`). Found by review: 18 graded scores of 0.05, whose variance is rounding
    noise (1e-35), gave 1.7e34 cases, and the report's interval overflowed (the run ended in
    an internal error); 26 of them gave the interval [0.05, 0.05].

    Scores in [0, 1] with mean m vary at most as a pass/fail score does, so this is at least
    about n - 1: graded scores never get a wider interval than pass/fail ones.
    """
    n = values.size
    mean = float(values.mean())
    if n < 2 or np.all((values == 0.0) | (values == 1.0)) or not 0.0 < mean < 1.0:
        return float(n)
    if float(np.ptp(values)) <= _SAME:  # no spread: var() of equal values is rounding noise
        return float(n)
    spread = float(values.var(ddof=1))
    if spread <= 0.0:
        return float(n)
    return min(_MOST_CASES, max(1.0, n * mean * (1.0 - mean) / spread))


def bounded_mean_ci(
    values: np.ndarray, confidence: float, *, samples: int, seed: int
) -> tuple[float, float]:
    """A CI for the mean of scores in [0, 1] that never collapses: Clopper-Pearson.

    Pass/fail scores (every value 0 or 1): the Clopper-Pearson interval, at least nominal
    coverage at any n and any true mean. Graded scores: Clopper-Pearson at the effective
    sample (`effective_cases`: a t interval's width with a proportion's shape near 0 and 1),
    widened to contain the seeded `bootstrap_ci`, so a dense graded arm keeps about the
    bootstrap's width while an arm of nearly all zeros is not clipped to its range.
    Simulated (95%, 8 / 16 / 32 cases): a hard pass/fail task 0.985 / 0.978 / 0.979, a mostly
    zero 5-level rubric 0.998 / 0.996 / 0.949, dense graded 0.940 / 0.939 / 0.948.
    """
    scores = np.asarray(values, dtype=np.float64).ravel()
    if scores.size == 0:
        raise ValueError("no scores")
    if not np.all((scores >= 0.0) & (scores <= 1.0)):
        raise ValueError("scores must lie in [0, 1]")
    cases = effective_cases(scores)
    low, high = clopper_pearson(float(scores.mean()) * cases, cases, confidence)
    if not np.all((scores == 0.0) | (scores == 1.0)):
        boot_low, boot_high = bootstrap_ci(scores, confidence, samples, seed)
        low, high = min(low, boot_low), max(high, boot_high)
    return max(0.0, low), min(1.0, high)


def case_mean_ci(
    per_case: dict[str, list[float]], *, confidence: float, seed: int, samples: int = 2000
) -> tuple[float, float, float, int] | None:
    """(mean, low, high, n): the mean over cases of each case's mean score (clipped to
    0..1) with `bounded_mean_ci`; None without any scored case."""
    means = np.array([sum(v) / len(v) for v in per_case.values() if v], dtype=np.float64)
    if means.size == 0:
        return None
    means = np.clip(means, 0.0, 1.0)
    low, high = bounded_mean_ci(means, confidence, samples=samples, seed=seed)
    return float(means.mean()), low, high, int(means.size)
