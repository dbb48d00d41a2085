"""The gates: paired (k x SE), bootstrap, strict and threshold, with the coverage guard and
the no-regression veto (DESIGN §6).

Inputs are per-case lists of repetition scores in [0, 1]. Repetitions are averaged within a
case and cases are the independent sample; a case is *comparable* when both arms have at
least one score for it. Infrastructure failures are not candidate failures: the caller
leaves those cases (or repetitions) out, and the coverage guard notices when too few remain.

Every comparison that decides a verdict is made with a tolerance of 1e-12 (relative and
absolute), and a value within it of its bar counts as *not* beyond it: the decision never
hangs on floating-point accident.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from evolane.messages import MAX_VETOED_LISTED, Decision, GateConfig, GateResult
from evolane.stats._bootstrap import bootstrap_ci

TOLERANCE = 1e-12
"""Relative and absolute tolerance of every decisive comparison (see `beyond`)."""

Scores = Mapping[str, Sequence[float]]


def close(a: float, b: float) -> bool:
    """True when ``a`` and ``b`` are equal within `TOLERANCE` (relative and absolute)."""
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def beyond(a: float, b: float) -> bool:
    """True when ``a > b`` by more than `TOLERANCE`: a tie is never "beyond"."""
    return a > b and not close(a, b)


def _case_mean(case: str, scores: Sequence[float]) -> float:
    """The correctly rounded mean of one case's repetition scores, validated to lie in [0, 1]."""
    total = math.fsum(scores)
    if not all(0.0 <= s <= 1.0 for s in scores):  # also refuses NaN
        raise ValueError(f"case {case!r}: scores must be finite and lie in [0, 1], got {scores}")
    return min(1.0, max(0.0, total / len(scores)))


@dataclass(frozen=True, slots=True)
class PairedSample:
    """Comparable cases (sorted ids) with each arm's per-case mean score."""

    ids: list[str]
    baseline: np.ndarray
    candidate: np.ndarray

    @property
    def deltas(self) -> np.ndarray:
        """Per-case candidate minus baseline mean scores, each in [-1, 1]."""
        return self.candidate - self.baseline


def paired_sample(baseline: Scores, candidate: Scores) -> PairedSample:
    """Pair the cases that both arms scored at least once, averaging repetitions per case."""
    ids = sorted(c for c in baseline.keys() & candidate.keys() if baseline[c] and candidate[c])
    base = np.array([_case_mean(c, baseline[c]) for c in ids], dtype=np.float64)
    cand = np.array([_case_mean(c, candidate[c]) for c in ids], dtype=np.float64)
    return PairedSample(ids, base, cand)


def paired_deltas(baseline: Scores, candidate: Scores) -> tuple[list[str], np.ndarray]:
    """Comparable case ids (sorted) and their per-case mean deltas (candidate - baseline)."""
    sample = paired_sample(baseline, candidate)
    return sample.ids, sample.deltas


def mean_and_se(deltas: np.ndarray) -> tuple[float, float]:
    """Correctly rounded mean and standard error (sample sd, ddof=1, over sqrt(n)).

    All-equal deltas give exactly ``(delta, 0.0)``; fewer than two give an SE of 0.0,
    which the coverage guard never lets a k x SE gate use.
    """
    n = deltas.size
    if n == 0:
        return 0.0, 0.0
    if np.all(deltas == deltas[0]):
        return float(deltas[0]), 0.0
    mean = math.fsum(deltas.tolist()) / n
    sd = math.sqrt(math.fsum(((deltas - mean) ** 2).tolist()) / (n - 1))
    return mean, sd / math.sqrt(n)


@dataclass(frozen=True, slots=True)
class _Evidence:
    """What a gate rule looks at: the pairs, their summary and the configuration."""

    sample: PairedSample
    deltas: np.ndarray
    mean: float
    se: float
    ci: tuple[float, float]
    config: GateConfig


Verdict = tuple[Decision, str]


def _paired(e: _Evidence) -> Verdict:
    """Accept iff mean > k*SE and mean > min_effect; SE = 0 and exact ties have own rules.

    SE = 0 (all deltas equal): the evidence is exact, so accept iff mean > max(0, min_effect)
    (reason ``se_zero``). mean == k*SE or mean == min_effect within `TOLERANCE`: reject with
    reason ``tie``.
    """
    mean, k, floor = e.mean, e.config.k_se, e.config.min_effect
    if e.se == 0.0:
        bar = max(0.0, floor)
        if beyond(mean, bar):
            return "accept", f"se_zero: all deltas equal {mean:.6g} > {bar:.6g}"
        return "reject", f"se_zero: all deltas equal {mean:.6g} <= {bar:.6g}"
    bar = k * e.se
    if mean < bar and not close(mean, bar):
        return "reject", f"mean_delta <= k*SE ({mean:.6g} <= {bar:.6g})"
    if mean < floor and not close(mean, floor):
        return "reject", f"mean_delta <= min_effect ({mean:.6g} <= {floor:.6g})"
    if close(mean, bar):
        return "reject", f"tie: mean_delta == k*SE ({mean:.6g} == {bar:.6g})"
    if close(mean, floor):
        return "reject", f"tie: mean_delta == min_effect ({mean:.6g} == {floor:.6g})"
    above_floor = f", > min_effect {floor:.6g}" if floor else ""
    return "accept", f"mean_delta > k*SE ({mean:.6g} > {bar:.6g}){above_floor}"


def _bootstrap(e: _Evidence) -> Verdict:
    """Accept iff the seeded percentile CI's lower bound > min_effect (a tie rejects)."""
    low, floor = e.ci[0], e.config.min_effect
    if close(low, floor):
        return "reject", f"tie: ci_low == min_effect ({low:.6g} == {floor:.6g})"
    if low > floor:
        return "accept", f"ci_low > min_effect ({low:.6g} > {floor:.6g})"
    return "reject", f"ci_low <= min_effect ({low:.6g} <= {floor:.6g})"


def _strict(e: _Evidence) -> Verdict:
    """Accept iff the candidate is >= the baseline on every case and > on at least one."""
    worse = int(np.count_nonzero(e.deltas < -TOLERANCE))
    better = int(np.count_nonzero(e.deltas > TOLERANCE))
    if worse:
        return "reject", f"strict: candidate < baseline on {worse} of {e.deltas.size} cases"
    if not better:
        return "reject", f"strict: candidate == baseline on all {e.deltas.size} cases"
    return "accept", f"strict: candidate >= baseline everywhere, > on {better} cases"


def _threshold(e: _Evidence) -> Verdict:
    """Accept iff the candidate's mean score >= threshold and the mean delta > 0."""
    score = math.fsum(e.sample.candidate.tolist()) / e.deltas.size
    bar = e.config.threshold
    if score < bar and not close(score, bar):
        return "reject", f"candidate mean score < threshold ({score:.6g} < {bar:.6g})"
    if not beyond(e.mean, 0.0):
        return "reject", f"mean_delta <= 0 ({e.mean:.6g})"
    return "accept", f"candidate mean score >= threshold ({score:.6g} >= {bar:.6g}), mean_delta > 0"


_GATES: dict[str, Callable[[_Evidence], Verdict]] = {
    "paired": _paired,
    "bootstrap": _bootstrap,
    "strict": _strict,
    "threshold": _threshold,
}


def regressions(sample: PairedSample, pass_score: float) -> list[str]:
    """Sorted ids of the cases the baseline passes and the candidate fails.

    A case passes when its mean score >= ``pass_score`` (within `TOLERANCE`).
    """
    bar = pass_score - TOLERANCE * max(1.0, pass_score)
    failed = (sample.baseline >= bar) & (sample.candidate < bar)
    return [case for case, hit in zip(sample.ids, failed.tolist(), strict=True) if hit]


def _listed(case: str) -> str:
    """A case id as a bounded `Name` (1 to 128 characters) for `GateResult.vetoed_cases`."""
    if not case:
        return "<empty>"
    return case if len(case) <= 128 else case[:127] + "\u2026"


def _coverage(n: int, n_planned: int, config: GateConfig) -> str | None:
    """The reason the sample is too thin to judge, or None when it is enough."""
    needed = max(config.min_cases, 2 if config.gate in ("paired", "bootstrap") else 1)
    if n < needed:
        detail = " (SE undefined)" if n < 2 <= needed else ""
        return f"coverage: n={n} < {needed} comparable cases{detail}"
    if n < config.min_coverage * n_planned:
        return f"coverage: {n}/{n_planned} comparable < min_coverage {config.min_coverage:g}"
    return None


def decide(
    baseline: Scores, candidate: Scores, config: GateConfig, n_planned: int | None = None
) -> GateResult:
    """Judge ``candidate`` against ``baseline`` (per-case repetition scores in [0, 1]).

    Order: the coverage guard (fewer than ``min_cases`` comparable cases, or fewer than
    ``min_coverage`` of ``n_planned`` -> indecisive, reason ``coverage``; the paired and
    bootstrap gates need at least 2), then the no-regression veto (reason ``regression``),
    then the gate's own rule. ``n_planned`` defaults to the number of cases either arm names.
    Every result reports n, the mean delta, its SE and a seeded percentile bootstrap CI.

    - paired: accept iff mean > k_se*SE and mean > min_effect (SE = sd/sqrt(n), ddof=1);
      all deltas equal (SE = 0): accept iff mean > max(0, min_effect), reason ``se_zero``;
      mean == k_se*SE (or == min_effect) within 1e-12: reject, reason ``tie``.
    - bootstrap: accept iff the CI's lower bound > min_effect (a tie rejects).
    - strict: accept iff candidate >= baseline on every case and > on at least one.
    - threshold: accept iff the candidate's mean score >= threshold and mean delta > 0.
    """
    sample = paired_sample(baseline, candidate)
    deltas = sample.deltas
    n = deltas.size
    planned = len(baseline.keys() | candidate.keys()) if n_planned is None else n_planned
    if planned < n:
        raise ValueError(f"n_planned={planned} is smaller than the {n} comparable cases")
    mean, se = mean_and_se(deltas)
    ci = (mean, mean)
    if n >= 2:
        ci = bootstrap_ci(deltas, config.confidence, config.bootstrap_samples, config.seed)
    vetoed = regressions(sample, config.pass_score) if config.no_regression else []
    coverage = _coverage(n, planned, config)
    if coverage is not None:
        decision, reason = "indecisive", coverage
    elif vetoed:
        decision = "reject"
        reason = f"regression: {len(vetoed)} case(s) the baseline passed fail in the candidate"
    else:
        evidence = _Evidence(sample, deltas, mean, se, ci, config)
        decision, reason = _GATES[config.gate](evidence)
    return GateResult(
        gate=config.gate,
        n=n,
        n_planned=planned,
        mean_delta=mean,
        se=se,
        ci_low=ci[0],
        ci_high=ci[1],
        decision=decision,
        reason=reason[:256],
        vetoed_cases=tuple(_listed(case) for case in vetoed[:MAX_VETOED_LISTED]),
    )
