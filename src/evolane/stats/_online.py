"""Campaign-level error control: confirmation on held-out cases and online testing.

A campaign tests many candidates; each passes the val gate with some probability even when
it is useless (about 16% at k = 1), so a campaign that tries 16 of them promotes one about
half the time. Two IO-free building blocks bound the probability that a campaign publishes
an edit with no true effect:

- `confirm`: a one-sided test of the accepted best against the original on held-out cases
  (the test split), at the user's confidence. The held-out cases took no part in choosing
  the best, so under "no true gain" it confirms with probability <= 1 - confidence,
  however many candidates the campaign tried.
- `OnlineErrorControl`: for a campaign without held-out cases, the online fallback
  procedure spends an error budget alpha over the sequence of candidates.

Both read `no_gain_p_value`: the sign test of full gains against losses with pass/fail
scores, else the betting bound; `sign_flip_p_value`, valid only when an edit changes
nothing, is exported and decides nothing here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np

from evolane.messages import Decision, GateConfig
from evolane.stats._clusters import Clusters, cluster_means, clustered, planned_clusters
from evolane.stats._gates import CaseScores, paired_sample
from evolane.stats._levels import as_fraction
from evolane.stats._sequential import SequentialTest

_EXACT_ENUMERATION = 16
"""Up to this many cases off any grid, the sign-flip test enumerates all 2^n flips."""

_GRID_DENOMINATORS = range(1, 121)
"""Deltas that are multiples of 1/L for one of these L are tested exactly on the grid."""

_GRID_WORK = 50_000_000
"""Largest (nonzero cases x grid span) the exact grid convolution takes on."""


def _grid(values: np.ndarray) -> int | None:
    """The smallest L with every value a multiple of 1/L (within 1e-9), or None."""
    for denominator in _GRID_DENOMINATORS:
        scaled = values * denominator
        if np.all(np.abs(scaled - np.rint(scaled)) <= 1e-9):
            return denominator
    return None


def _p_on_grid(steps: np.ndarray, observed: int) -> float:
    """Exact P(sum of +-steps >= observed) under fair independent signs (a convolution)."""
    total = int(steps.sum())
    dist = np.zeros(2 * total + 1)
    dist[total] = 1.0  # index = sum + total
    for step in steps.tolist():
        shifted = np.zeros_like(dist)
        shifted[step:] += dist[:-step] if step else dist
        shifted[: dist.size - step] += dist[step:]
        dist = shifted / 2.0
    return float(min(1.0, dist[observed + total :].sum()))


def sign_flip_p_value(
    deltas: np.ndarray | list[float], *, margin: float = 0.0, samples: int = 10_000, seed: int = 0
) -> float:
    """One-sided p-value of the paired sign-flip test that the mean delta exceeds ``margin``.

    Under "no effect" (each case's baseline and candidate scores exchangeable) every delta
    is as likely to be negative as positive, so the observed sum of ``deltas - margin`` is
    compared with the sums under all 2^n sign flips: p = P(flipped sum >= observed). Exact
    (valid at any n, ties counted against the candidate) when the deltas lie on a grid of
    1/L (pass/fail scores with repetitions) or n <= 16; otherwise a seeded Monte Carlo
    estimate with ``samples`` flips, (1 + hits) / (1 + samples), which is itself valid. The
    sum of squares is the same under every flip, so this is also the permutation version of
    the paired t-test, and it keeps its level asymptotically under heterogeneous effects.
    """
    values = np.asarray(deltas, dtype=np.float64).ravel() - margin
    if values.size == 0:
        return 1.0
    if not np.all(np.isfinite(values)):
        raise ValueError("deltas must be finite")
    sizes = np.abs(values)
    observed = math.fsum(values.tolist())
    denominator = _grid(sizes)
    if denominator is not None:
        steps = np.rint(sizes * denominator).astype(np.int64)
        steps = steps[steps > 0]
        if steps.size * max(1, int(steps.sum())) <= _GRID_WORK:
            return _p_on_grid(steps, math.ceil(observed * denominator - 1e-6))
    n = values.size
    if n <= _EXACT_ENUMERATION:
        codes = np.arange(2**n, dtype=np.int64)[:, None] >> np.arange(n)
        sums = ((codes & 1) * 2 - 1) @ sizes
        return float(np.mean(sums >= observed - 1e-9 * max(1.0, abs(observed))))
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    hits = 0
    rows = max(1, (1 << 18) // n)
    for start in range(0, samples, rows):
        count = min(rows, samples - start)
        signs = rng.integers(0, 2, size=(count, n), dtype=np.int8) * 2 - 1
        hits += int(np.count_nonzero(signs @ sizes >= observed - 1e-9 * max(1.0, abs(observed))))
    return (1 + hits) / (1 + samples)


_ORDER_KEY = 0x0C0FFEE5  # the betting order's stream, apart from the gate's bootstrap draws


def no_gain_p_value(
    deltas: np.ndarray | list[float],
    *,
    margin: float = 0.0,
    pass_fail: bool = False,
    order_seed: int = 0,
) -> float:
    """One-sided p-value against "the mean delta is at most ``margin``" (no true gain), for
    paired deltas in [-1, 1]: what `confirm` and online error control read.

    The sign-flip test (`sign_flip_p_value`) alone holds only under "the edit changes
    nothing" (deltas symmetric about the margin): an edit that gains a little on most cases
    and loses badly on a few has a mean below zero, yet a sample that misses the rare losses
    gets a sign-flip p of 2^-n (found by review: confirmed 20% of the time on 32 cases, not
    5%). So:

    - ``pass_fail`` (every score is 0 or 1 by construction; a delta is a difference of
      means over repetitions): `full_gain_p_value`, valid at any distribution; with one
      repetition and margin 0 it is the sign test, the sign-flip p itself;
    - else 1/E, E the final wealth of the betting test (`SequentialTest`): an e-value for
      "mean <= margin" at any distribution of bounded deltas, so P(1/E <= a) <= a; exact
      arithmetic, no Monte Carlo floor (a sign-flip estimate from N random flips cannot
      go below 1 / (1 + N), which at 200 is above online control's 0.0031: found by
      review). The bets read the deltas in an order drawn at random (``order_seed``), never
      the given one: cases given sorted by id, a category whose ids sort first and that
      gains first bought wealth that the many small losses after it could not take back
      (found by review: an edit with a true mean of 0 confirmed 99% of the time).
    """
    values = np.asarray(deltas, dtype=np.float64).ravel()
    if not np.all(np.isfinite(values)):
        raise ValueError("deltas must be finite")
    if pass_fail:
        return full_gain_p_value(values, margin=margin)
    test = SequentialTest(0.5, margin=margin)  # its level plays no part in the wealth
    shuffled = values[np.random.default_rng([order_seed, _ORDER_KEY]).permutation(values.size)]
    for delta in shuffled.tolist():
        test.update(min(1.0, max(-1.0, delta)))
    return min(1.0, math.exp(-test.log_wealth[0]))


_BOUND_EDGE = 1.0 - 1e-9  # the betting test takes margins inside (-1, 1)
_BOUND_TOLERANCE = 1e-3  # the bound is printed to 3 decimals, rounded down


def no_gain_lower_bound(
    deltas: np.ndarray | list[float],
    *,
    level: float,
    margin: float = 0.0,
    pass_fail: bool = False,
    order_seed: int = 0,
) -> float:
    """The one-sided lower confidence bound on the mean delta, at ``level``, that inverts
    `no_gain_p_value`: the largest m it shows the mean to be above (p(m) <= level), to
    within 1e-3, rounded down; -1 when it shows none. Found by review: beside the verdict, a
    report printed the gate's bootstrap interval, which excluded 0 at 6 cases while the
    confirmation said p = 0.15; this bound agrees with the verdict at ``margin`` by
    construction (at least ``margin`` iff p(margin) <= level), so the two never disagree."""
    values = np.asarray(deltas, dtype=np.float64).ravel()

    def shown(m: float) -> bool:
        p = no_gain_p_value(values, margin=m, pass_fail=pass_fail, order_seed=order_seed)
        return p <= level

    start = min(_BOUND_EDGE, max(-_BOUND_EDGE, margin))
    if shown(start):
        low, high = start, _BOUND_EDGE
        if shown(high):
            return high
    else:
        low, high = -_BOUND_EDGE, start
        if not shown(low):
            return -1.0
    while high - low > _BOUND_TOLERANCE:  # shown(low), not shown(high)
        middle = (low + high) / 2.0
        low, high = (middle, high) if shown(middle) else (low, middle)
    return low


def no_gain_margin(config: GateConfig) -> float:
    """The mean delta "no true gain" means for `confirm` and online control: the gate's
    ``min_effect`` when positive, else 0 (a non-inferiority margin is the gate's alone)."""
    return max(0.0, config.min_effect)


_EXACT_TAIL = 1024  # cases up to which the sign test's tail is summed in integers


def full_gain_p_value(deltas: np.ndarray | list[float], *, margin: float = 0.0) -> float:
    """The sign test of full gains against losses, valid for "mean delta <= ``margin``" at
    any distribution on [-1, 1]: k cases gained 1 (the most there is) and l fell below the
    margin; under that hypothesis a case among them is a full gain with probability at most
    (1 + margin) / 2, so p = P(Binomial(k + l, (1 + margin) / 2) >= k)."""
    values = np.asarray(deltas, dtype=np.float64).ravel()
    if not np.all(np.isfinite(values)):
        raise ValueError("deltas must be finite")
    gains = int(np.count_nonzero(values >= 1.0 - 1e-9))
    total = gains + int(np.count_nonzero(values < margin - 1e-12))
    if gains == 0:
        return 1.0
    if margin == 0.0 and total <= _EXACT_TAIL:  # in integers: 2^-k exactly
        return sum(math.comb(total, j) for j in range(gains, total + 1)) / (1 << total)
    chance = (1.0 + margin) / 2.0
    logs = [
        math.lgamma(total + 1) - math.lgamma(j + 1) - math.lgamma(total - j + 1)
        + j * math.log(chance) + (total - j) * math.log1p(-chance)
        for j in range(gains, total + 1)
    ]  # fmt: skip
    top = max(logs)
    return float(min(1.0, math.exp(top) * math.fsum(math.exp(x - top) for x in logs)))


ConfirmDecision = Literal["confirmed", "unconfirmed", "indecisive"]


@dataclass(frozen=True, slots=True)
class Confirmation:
    """The verdict of `confirm`, with its evidence and a one-line reason."""

    decision: ConfirmDecision
    n: int
    n_planned: int
    mean_delta: float
    p_value: float
    level: float
    reason: str
    lower_bound: float | None = None
    """`no_gain_lower_bound` at ``level`` (None: indecisive, or not asked for)."""
    clusters: int | None = None
    """The comparable clusters the test read, when the cases were clustered (else None)."""


def confirm(
    baseline: CaseScores,
    candidate: CaseScores,
    config: GateConfig,
    n_planned: int | None = None,
    *,
    confidence: float | None = None,
    pass_fail: bool = False,
    bound: bool = True,
    clusters: Clusters | None = None,
) -> Confirmation:
    """Confirm an accepted best (``candidate``) against the original (``baseline``) on
    held-out cases: a one-sided test of "no true gain" at ``confidence`` (default the
    gate's), `no_gain_p_value` (``pass_fail``: every score is 0 or 1 by construction).

    ``confirmed`` iff that p-value (margin max(0, min_effect)) <= 1 - confidence;
    ``indecisive`` when fewer than ``min_coverage`` of ``n_planned`` cases are comparable
    (``min_cases`` is not applied: a test split may be small; `can_ever_confirm` says
    whether it can confirm at all). Guarantee: when the best has no true gain over the
    original, P(confirmed) <= 1 - confidence, because the held-out cases took no part in
    choosing it: this bounds the campaign's false-publish rate, whatever happened on val.
    ``bound``: also find the test's lower confidence bound (`no_gain_lower_bound`, some ten
    p-values more). ``clusters`` (case id -> cluster name): when two cases share one, each
    cluster's mean delta is one observation of the test (the betting bound, even with
    ``pass_fail``: a cluster's mean is a full gain only when every one of its cases is) and
    ``min_coverage`` counts clusters (`evolane.stats._clusters`).
    """
    confidence = config.confidence if confidence is None else confidence
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    level = float(1 - as_fraction(confidence))
    sample = paired_sample(baseline, candidate)
    n = len(sample.ids)
    planned = len(baseline.keys() | candidate.keys()) if n_planned is None else n_planned
    if planned < n:
        raise ValueError(f"n_planned={planned} is smaller than the {n} comparable cases")
    deltas, units, shown, groups = sample.deltas, n, planned, None
    named = baseline.keys() | candidate.keys()
    if clustered(named, clusters):
        assert clusters is not None
        ids, (deltas,) = cluster_means(sample.ids, (deltas,), clusters)
        units = groups = len(ids)
        shown = planned_clusters(named, planned, clusters)
        pass_fail = False  # a cluster's mean is rarely a full gain: the betting bound reads it
    mean = math.fsum(deltas.tolist()) / units if units else 0.0
    where = f"{n} held-out cases" if groups is None else f"{groups} clusters of {n} held-out cases"
    if units == 0 or Fraction(units) < as_fraction(config.min_coverage) * shown:
        reason = f"coverage: {units}/{shown} held-out {'cases' if groups is None else 'clusters'} "
        reason += "comparable: indecisive"
        return Confirmation("indecisive", n, planned, mean, 1.0, level, reason, None, groups)
    margin = no_gain_margin(config)
    p = no_gain_p_value(deltas, margin=margin, pass_fail=pass_fail, order_seed=config.seed)
    verdict: ConfirmDecision = "confirmed" if p <= level else "unconfirmed"
    relation = "<=" if verdict == "confirmed" else ">"
    reason = (
        f"confirm: mean {mean:+.4g} on {where}, one-sided p {p:.3g} "
        f"{relation} {level:.3g} (confidence {confidence:g}, margin {margin:g}): {verdict}"
    )
    lower = (
        no_gain_lower_bound(
            deltas, level=level, margin=margin, pass_fail=pass_fail, order_seed=config.seed
        )
        if bound
        else None
    )
    return Confirmation(verdict, n, planned, mean, p, level, reason[:256], lower, groups)


@dataclass(frozen=True, slots=True)
class OnlineVerdict:
    """One candidate's outcome under `OnlineErrorControl`: the campaign's ``decision``, the
    ``gate``'s own, the level it was tested at and its p-value."""

    decision: Decision
    gate: Decision
    level: float
    p_value: float
    reason: str


class OnlineErrorControl:
    """Spend an error budget ``alpha`` over a campaign's candidates: the online fallback
    procedure (Tian & Ramdas, "Online control of the familywise error rate", Statistical
    Methods in Medical Research 30, 2021).

    Candidate i is tested at level alpha_i = alpha * gamma_i + (alpha_{i-1} if candidate
    i-1 was accepted, else 0), with gamma_i = 1/horizon for i <= horizon (0 after) or, with
    no horizon, gamma_i = 1/(i(i+1)); the gammas sum to <= 1. A candidate is accepted iff
    its gate accepts *and* its p-value <= alpha_i (`record`).

    Guarantee (strong familywise error control, under *any* dependence between candidates:
    shared val cases, reused baseline replays, hill-climbing): if each recorded p-value is
    valid for its candidate's null hypothesis "no better than its parent"
    (P(p <= u) <= u), then P(any candidate whose null holds is accepted over the whole
    campaign) <= alpha. Hence the campaign publishes an edit with no true gain over the
    original with probability <= alpha. The campaign reads `no_gain_p_value` of the full
    val evaluation (the full-gain sign test, else 1/E of the betting test), valid at any
    distribution of the deltas when read at the full evaluation: the measurement must not
    accept early (``EarlyStop(..., allow_accept=False)``; a fixed-n p-value read at a
    data-chosen stopping time is not valid; a reject may still stop early). An e-value e
    gives p = 1/e; the betting test's wealth (`SequentialTest.wealth`) is one at any
    stopping time, early accepts included, but it is weaker at a few dozen cases. The price
    is power: at alpha 0.05 over 16 candidates each is tested at about 0.003.
    """

    __slots__ = ("_alpha", "_carried", "_history", "_horizon")

    def __init__(self, alpha: float = 0.05, *, horizon: int | None = None) -> None:
        """Spend ``alpha`` over at most ``horizon`` candidates (None: an unbounded sequence)."""
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
        if horizon is not None and horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self._alpha = alpha
        self._horizon = horizon
        self._carried = 0.0
        self._history: list[OnlineVerdict] = []

    def _gamma(self, index: int) -> float:
        if self._horizon is not None:
            return 1.0 / self._horizon if index <= self._horizon else 0.0
        return 1.0 / (index * (index + 1))

    def level_for_next(self) -> float:
        """The level alpha_i at which the next candidate is tested."""
        return self._alpha * self._gamma(len(self._history) + 1) + self._carried

    def record(
        self, decision: Decision, *, p_value: float | None = None, e_value: float | None = None
    ) -> OnlineVerdict:
        """Record the next candidate's gate ``decision`` and its evidence (a p-value, or an
        e-value e read as p = min(1, 1/e)); returns the campaign's decision: ``accept`` only
        when the gate accepted and p <= `level_for_next`, else the gate's own (an accept
        the budget does not cover becomes ``reject``)."""
        if (p_value is None) == (e_value is None):
            raise ValueError("give exactly one of p_value and e_value")
        if p_value is not None:
            if not 0.0 <= p_value <= 1.0:
                raise ValueError(f"p_value must lie in [0, 1], got {p_value}")
            p = p_value
        else:
            assert e_value is not None
            if not e_value >= 0.0:
                raise ValueError(f"e_value must be >= 0, got {e_value}")
            p = min(1.0, 1.0 / e_value) if e_value > 0 else 1.0
        level = self.level_for_next()
        covered = p <= level
        index = len(self._history) + 1
        if decision == "accept" and covered:
            final: Decision = "accept"
            self._carried = level
        else:
            final = "reject" if decision == "accept" else decision
            self._carried = 0.0
        relation = "<=" if covered else ">"
        reason = (
            f"online: candidate {index}, p {p:.3g} {relation} level {level:.3g} "
            f"(alpha {self._alpha:g}), gate {decision}: {final}"
        )
        verdict = OnlineVerdict(final, decision, level, p, reason)
        self._history.append(verdict)
        return verdict

    @property
    def alpha(self) -> float:
        """The campaign's error budget."""
        return self._alpha

    @property
    def horizon(self) -> int | None:
        """The number of candidates the budget is spread over (None: unbounded)."""
        return self._horizon

    @property
    def history(self) -> tuple[OnlineVerdict, ...]:
        """Every recorded verdict, in order: to resume, record each one's ``gate`` decision
        and ``p_value`` again into a new instance with the same alpha and horizon."""
        return tuple(self._history)

    @property
    def tested(self) -> int:
        """How many candidates have been recorded."""
        return len(self._history)
