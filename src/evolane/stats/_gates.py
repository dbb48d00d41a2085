"""The gates: paired (k x SE), bootstrap, strict and threshold, with the coverage guard and
the no-regression veto (DESIGN §6).

Inputs are per-case lists of repetition scores in [0, 1]. Repetitions are averaged within a
case and cases are the independent sample (clusters are, when cases name them: see
`evolane.stats._clusters`); a case is *comparable* when both arms have at
least one score for it. Infrastructure failures are not candidate failures: the caller
leaves those cases (or repetitions) out, and the coverage guard notices when too few remain.

Every comparison that decides a verdict is made with a tolerance of 1e-12 (relative and
absolute), and a value within it of its bar counts as *not* beyond it: the decision never
hangs on floating-point accident. Coverage is compared exactly (integers and fractions, see
`evolane.stats._levels`). Every reason names the rule that decided and its numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from evolane.messages import MAX_VETOED_LISTED, Decision, GateConfig, GateResult
from evolane.stats._bootstrap import bootstrap_ci
from evolane.stats._clusters import Clusters, cluster_means, clustered, planned_clusters
from evolane.stats._levels import coverage_shortfall

TOLERANCE = 1e-12
"""Relative and absolute tolerance of every decisive comparison (see `beyond`)."""

CaseScores = Mapping[str, Sequence[float]]
"""Per case id, the scores of each repetition in [0, 1] (a list per case, in any order)."""


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


def paired_sample(baseline: CaseScores, candidate: CaseScores) -> PairedSample:
    """Pair the cases that both arms scored at least once, averaging repetitions per case."""
    ids = sorted(c for c in baseline.keys() & candidate.keys() if baseline[c] and candidate[c])
    base = np.array([_case_mean(c, baseline[c]) for c in ids], dtype=np.float64)
    cand = np.array([_case_mean(c, candidate[c]) for c in ids], dtype=np.float64)
    return PairedSample(ids, base, cand)


def paired_deltas(baseline: CaseScores, candidate: CaseScores) -> tuple[list[str], np.ndarray]:
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
    """Accept iff mean > k*SE and mean > min_effect, strictly; SE = 0 and ties have own rules.

    SE = 0 (all deltas equal): the evidence is exact, so accept iff mean > max(0, min_effect)
    (reason ``se_zero``). mean == k*SE or mean == min_effect within `TOLERANCE`: *not* above
    the bar, so reject with reason ``tie``. With pass/fail scores a candidate that fixes one
    case and breaks none has mean == SE exactly (1/n each): at k = 1 that is a tie and
    rejects, so it must fix at least two more cases than it breaks (see `min_acceptable_gain`).
    """
    mean, k, floor = e.mean, e.config.k_se, e.config.min_effect
    if e.se == 0.0:
        bar = max(0.0, floor)
        if beyond(mean, bar):
            return "accept", f"se_zero: every delta is {mean:+.4g} > {bar:.4g}: accepted"
        return "reject", f"se_zero: every delta is {mean:+.4g}, not above {bar:.4g}: rejected"
    bar = k * e.se
    rule = f"k*SE ({k:.2f} x {e.se:.4g} = {bar:.4g})"
    if mean < bar and not close(mean, bar):
        return "reject", f"mean_delta {mean:+.4g} < {rule}: rejected"
    if mean < floor and not close(mean, floor):
        return "reject", f"mean_delta {mean:+.4g} < min_effect {floor:.4g}: rejected"
    if close(mean, bar):
        return "reject", f"tie: mean_delta {mean:+.4g} = {rule}, not above it: rejected"
    if close(mean, floor):
        return "reject", f"tie: mean_delta {mean:+.4g} = min_effect {floor:.4g}: rejected"
    above_floor = f" and > min_effect {floor:.4g}" if floor else ""
    return "accept", f"mean_delta {mean:+.4g} > {rule}{above_floor}: accepted"


def _bootstrap(e: _Evidence) -> Verdict:
    """Accept iff the seeded expanded-percentile CI's lower bound > min_effect (a tie rejects)."""
    low, floor = e.ci[0], e.config.min_effect
    ci = f"ci_low {low:+.4g} ({e.config.confidence:g} CI, {e.config.bootstrap_samples} resamples)"
    if close(low, floor):
        return "reject", f"tie: {ci} = min_effect {floor:.4g}, not above it: rejected"
    if low > floor:
        return "accept", f"{ci} > min_effect {floor:.4g}: accepted"
    return "reject", f"{ci} < min_effect {floor:.4g}: rejected"


def _strict(e: _Evidence) -> Verdict:
    """Accept iff the candidate is >= the baseline on every case and > on at least one."""
    worse = int(np.count_nonzero(e.deltas < -TOLERANCE))
    better = int(np.count_nonzero(e.deltas > TOLERANCE))
    n = e.deltas.size
    if worse:
        return "reject", f"strict: candidate < baseline on {worse} of {n} cases: rejected"
    if not better:
        return "reject", f"strict: candidate == baseline on all {e.deltas.size} cases: rejected"
    return "accept", (
        f"strict: candidate >= baseline on all {e.deltas.size} cases, > on {better}: accepted"
    )


def _threshold(e: _Evidence) -> Verdict:
    """Accept iff the candidate's mean score >= threshold and the mean delta > 0."""
    score = math.fsum(e.sample.candidate.tolist()) / e.deltas.size
    bar = e.config.threshold
    if score < bar and not close(score, bar):
        return "reject", f"candidate mean score {score:.4g} < threshold {bar:.4g}: rejected"
    if not beyond(e.mean, 0.0):
        return "reject", f"mean_delta {e.mean:+.4g}, not above 0: rejected"
    return "accept", (
        f"candidate mean score {score:.4g} >= threshold {bar:.4g}, mean_delta {e.mean:+.4g} > 0: "
        "accepted"
    )


_GATES: dict[str, Callable[[_Evidence], Verdict]] = {
    "paired": _paired,
    "bootstrap": _bootstrap,
    "strict": _strict,
    "threshold": _threshold,
}


def _passes(scores: Sequence[float], pass_score: float) -> tuple[int, int]:
    """(repetitions that pass, repetitions) of one case: a pass is a score >= ``pass_score``."""
    bar = pass_score - TOLERANCE * max(1.0, pass_score)
    return sum(1 for s in scores if s >= bar), len(scores)


def regression_p_value(baseline_reps: int, candidate_reps: int) -> float:
    """The exact one-sided p-value of a case the parent passed on all ``baseline_reps``
    repetitions and the candidate failed on all ``candidate_reps``: 1 / C(r_b + r_c, r_b).

    Fisher's exact test: if both arms passed the case equally often, the r_b passes among
    the r_b + r_c exchangeable repetitions fall all on the parent's side with this chance
    (1 + 1 repetitions: 0.5; 2 + 2: 0.167; 3 + 3: 0.05; 4 + 4: 0.014).
    """
    if baseline_reps < 1 or candidate_reps < 1:
        raise ValueError("a regression needs at least one repetition on each side")
    return 1.0 / math.comb(baseline_reps + candidate_reps, baseline_reps)


def regressions(baseline: CaseScores, candidate: CaseScores, config: GateConfig) -> list[str]:
    """Sorted ids of the comparable cases the no-regression veto counts as regressions.

    A case is a regression when the parent (``baseline``) passed it on *every* repetition,
    the candidate failed it on *every* repetition (a pass is a score >= ``pass_score``
    within `TOLERANCE`), and that split is evidence beyond replay noise: its exact Fisher
    p-value `regression_p_value` is <= ``regression_alpha``. One flaky repetition on either
    side is therefore never a regression, and with one repetition per side (p = 0.5) no
    case is, unless ``regression_alpha`` = 1, which trusts every consistent pass -> fail
    (right only for deterministic replays; the ``strict`` gate is the other way to forbid
    any worse case). The level is per case: over many flaky cases some good candidates are
    still vetoed (benchmarks/decisions.py measures how many).
    """
    found = []
    for case in baseline.keys() & candidate.keys():
        base, cand = baseline[case], candidate[case]
        if not base or not cand:
            continue
        base_passed, base_reps = _passes(base, config.pass_score)
        cand_passed, cand_reps = _passes(cand, config.pass_score)
        if base_passed < base_reps or cand_passed > 0:
            continue
        if regression_p_value(base_reps, cand_reps) <= config.regression_alpha * (1 + TOLERANCE):
            found.append(case)
    return sorted(found)


def _listed(case: str) -> str:
    """A case id as a bounded `Name` (1 to 128 characters) for `GateResult.vetoed_cases`."""
    if not case:
        return "<empty>"
    return case if len(case) <= 128 else case[:127] + "\u2026"


def judge_sample(sample: PairedSample, config: GateConfig, n_planned: int) -> GateResult:
    """The gate's verdict on an already paired sample, without the no-regression veto.

    `decide` is this plus the veto; preflight uses it on synthetic samples.
    """
    deltas = sample.deltas
    n = deltas.size
    if n_planned < n:
        raise ValueError(f"n_planned={n_planned} is smaller than the {n} comparable cases")
    mean, se = mean_and_se(deltas)
    ci = (mean, mean)
    if n >= 2:
        ci = bootstrap_ci(deltas, config.confidence, config.bootstrap_samples, config.seed)
    coverage = coverage_shortfall(n, n_planned, config)
    if coverage is not None:
        decision, reason = "indecisive", coverage
    else:
        decision, reason = _GATES[config.gate](_Evidence(sample, deltas, mean, se, ci, config))
    return GateResult(
        gate=config.gate,
        n=n,
        n_planned=n_planned,
        mean_delta=mean,
        se=se,
        ci_low=ci[0],
        ci_high=ci[1],
        decision=decision,
        reason=reason[:256],
    )


CLUSTERED_GATES = ("paired", "bootstrap")
"""The gates with an error level: with clustered cases they judge clusters (`judge_clusters`)."""


def judge_clusters(
    sample: PairedSample,
    config: GateConfig,
    n_planned: int,
    planned_ids: Collection[str],
    clusters: Clusters | None,
) -> GateResult:
    """`judge_sample`, by cluster when two of the ``planned_ids`` (of ``n_planned`` cases;
    the others each a cluster of its own) share a cluster and the gate has an error level
    (`CLUSTERED_GATES`): each cluster's mean pair is one observation, so the mean delta, its
    SE, the bootstrap and the coverage guard (``min_cases``, ``min_coverage``) are over
    clusters; the result's ``n`` and ``n_planned`` stay case counts and its reason names
    the clusters. Exactly `judge_sample` otherwise. The strict and threshold gates, which
    have no level, judge cases."""
    if config.gate not in CLUSTERED_GATES or not clustered(planned_ids, clusters):
        return judge_sample(sample, config, n_planned)
    assert clusters is not None
    ids, (base, cand) = cluster_means(sample.ids, (sample.baseline, sample.candidate), clusters)
    planned = planned_clusters(planned_ids, n_planned, clusters)
    result = judge_sample(PairedSample(ids, base, cand), config, planned)
    reason = f"by cluster ({len(ids)} of {planned} clusters, {len(sample.ids)} cases): "
    return result.model_copy(
        update={
            "n": len(sample.ids),
            "n_planned": n_planned,
            "reason": (reason + result.reason)[:256],
        }
    )


def decide(
    baseline: CaseScores,
    candidate: CaseScores,
    config: GateConfig,
    n_planned: int | None = None,
    *,
    clusters: Clusters | None = None,
) -> GateResult:
    """Judge ``candidate`` against ``baseline`` (per case, each repetition's score in [0, 1]).

    Order: the coverage guard (fewer than ``min_cases`` comparable cases, or fewer than
    ``min_coverage`` of ``n_planned`` in exact arithmetic -> indecisive, reason ``coverage``;
    the paired and bootstrap gates need at least 2), then the no-regression veto (reason
    ``regression``, see `regressions`), then the gate's own rule. ``n_planned`` defaults to
    the number of cases either arm names. Every result reports n, the mean delta, its SE and
    a seeded expanded-percentile bootstrap CI; its reason names the rule and its numbers.

    - paired: accept iff mean > k_se*SE and mean > min_effect (SE = sd/sqrt(n), ddof=1);
      all deltas equal (SE = 0): accept iff mean > max(0, min_effect), reason ``se_zero``;
      mean == k_se*SE (or == min_effect) within 1e-12: not above, so reject, reason ``tie``.
    - bootstrap: accept iff the CI's lower bound > min_effect (a tie rejects).
    - strict: accept iff candidate >= baseline on every case and > on at least one.
    - threshold: accept iff the candidate's mean score >= threshold and mean delta > 0.

    ``clusters`` (case id -> cluster name): cases that are not independent; the paired and
    bootstrap gates then judge clusters (`judge_clusters`).
    """
    sample = paired_sample(baseline, candidate)
    named = baseline.keys() | candidate.keys()
    planned = len(named) if n_planned is None else n_planned
    result = judge_clusters(sample, config, planned, named, clusters)
    vetoed = regressions(baseline, candidate, config) if config.no_regression else []
    return with_veto(result, vetoed, config)


def with_veto(result: GateResult, vetoed: list[str], config: GateConfig) -> GateResult:
    """``result`` with the no-regression veto's cases listed, rejected when there are any
    and the gate was not already indecisive."""
    update: dict[str, object] = {
        "vetoed_cases": tuple(_listed(case) for case in vetoed[:MAX_VETOED_LISTED])
    }
    if vetoed and result.decision != "indecisive":
        alpha = config.regression_alpha
        update["decision"] = "reject"
        update["reason"] = (
            f"regression: {len(vetoed)} case(s) the parent passed on every repetition fail on "
            f"every repetition in the candidate (exact p <= regression_alpha {alpha:g}): rejected"
        )[:256]
    return result.model_copy(update=update)
