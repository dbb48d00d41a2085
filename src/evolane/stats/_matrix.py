"""The gate's inputs as matrices: each arm's repetition scores as one row per case (NaN: no
score), the compact form of `CaseScores` a large measurement decides on. `decide_matrices`
gives exactly what `decide` gives on the same scores (the same means, sums and bars), without
a list per case."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from evolane.messages import GateConfig, GateResult
from evolane.stats._clusters import Clusters
from evolane.stats._gates import (
    TOLERANCE,
    PairedSample,
    judge_clusters,
    regression_p_value,
    with_veto,
)


@dataclass(frozen=True, slots=True)
class ScoreMatrix:
    """One arm's scores: row ``i`` holds case ``ids[i]``'s repetition scores in [0, 1]
    (float64; NaN where a repetition has no comparable score)."""

    ids: Sequence[str]
    scores: np.ndarray

    def __post_init__(self) -> None:
        if self.scores.dtype != np.float64:  # the sums `decide` makes are float64 ones
            object.__setattr__(self, "scores", np.asarray(self.scores, dtype=np.float64))
        if self.scores.ndim != 2 or self.scores.shape[0] != len(self.ids):
            raise ValueError(f"scores must be ({len(self.ids)}, reps), got {self.scores.shape}")
        present = self.scores[~np.isnan(self.scores)]
        if present.size and not (present.min() >= 0.0 and present.max() <= 1.0):
            row = int(np.flatnonzero(((self.scores < 0) | (self.scores > 1)).any(axis=1))[0])
            raise ValueError(
                f"case {self.ids[row]!r}: scores must be finite and lie in [0, 1], "
                f"got {self.scores[row].tolist()}"
            )

    def case_scores(self) -> dict[str, list[float]]:
        """The same scores as `CaseScores` (cases with no score left out)."""
        return {
            self.ids[row]: [s for s in values.tolist() if not math.isnan(s)]
            for row, values in enumerate(self.scores)
            if not np.isnan(values).all()
        }


def _same_rows(baseline: ScoreMatrix, candidate: ScoreMatrix) -> None:
    if baseline.ids is not candidate.ids and list(baseline.ids) != list(candidate.ids):
        raise ValueError("both arms' matrices must name the same cases in the same rows")


def _scored(matrix: ScoreMatrix) -> np.ndarray:
    return ~np.isnan(matrix.scores)


def _means(matrix: ScoreMatrix, rows: np.ndarray) -> np.ndarray:
    """Each of ``rows``' mean score as `decide` takes it (a correctly rounded sum), computed
    in place on one copy of the rows' scores."""
    scores = matrix.scores[rows]
    if scores.shape[1] == 1:  # one score a case (every row here has one): its own mean
        scores += 0.0  # as a sum would: -0.0 becomes 0.0
        return scores.ravel()
    counts = np.count_nonzero(~np.isnan(scores), axis=1)
    if scores.shape[1] == 2:  # one addition: numpy's sum is correctly rounded too
        totals = np.nansum(scores, axis=1)
    else:
        totals = np.array([math.fsum(v for v in row if not math.isnan(v)) for row in scores])
    del scores
    np.divide(totals, counts, out=totals)
    return np.clip(totals, 0.0, 1.0, out=totals)


def matrix_sample(baseline: ScoreMatrix, candidate: ScoreMatrix) -> PairedSample:
    """`paired_sample` of two matrices: the cases both arms scored, in sorted id order.
    Each step's array is dropped once the next is made (at 100,000 cases its peak is a few
    arrays of a pointer a case)."""
    _same_rows(baseline, candidate)
    both = _scored(baseline).any(axis=1)
    both &= _scored(candidate).any(axis=1)
    rows = np.flatnonzero(both)
    del both
    ids = np.array(baseline.ids, dtype=object)
    if rows.size < ids.size:
        ids = ids[rows]
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    rows = rows[order]
    del order
    sorted_ids: list[str] = ids.tolist()
    del ids
    return PairedSample(sorted_ids, _means(baseline, rows), _means(candidate, rows))


def matrix_regressions(
    baseline: ScoreMatrix, candidate: ScoreMatrix, config: GateConfig
) -> list[str]:
    """`regressions` of two matrices: sorted ids of the cases the no-regression veto counts."""
    _same_rows(baseline, candidate)
    bar = config.pass_score - TOLERANCE * max(1.0, config.pass_score)
    base_reps, cand_reps = _scored(baseline).sum(axis=1), _scored(candidate).sum(axis=1)
    base_passed = (baseline.scores >= bar).sum(axis=1)
    cand_passed = (candidate.scores >= bar).sum(axis=1)
    flipped = (base_reps > 0) & (cand_reps > 0) & (base_passed == base_reps) & (cand_passed == 0)
    level = config.regression_alpha * (1 + TOLERANCE)
    found = [
        baseline.ids[row]
        for row in np.flatnonzero(flipped).tolist()
        if regression_p_value(int(base_reps[row]), int(cand_reps[row])) <= level
    ]
    return sorted(found)


def decide_matrices(
    baseline: ScoreMatrix,
    candidate: ScoreMatrix,
    config: GateConfig,
    n_planned: int | None = None,
    *,
    clusters: Clusters | None = None,
) -> GateResult:
    """`decide` on two matrices of the same cases (see `decide` for the rules; the rows are
    the planned cases, ``clusters`` as there). The veto's cases are found before the sample
    is made, so their arrays and the sample's never live at once."""
    vetoed = matrix_regressions(baseline, candidate, config) if config.no_regression else []
    if n_planned is None:
        n_planned = int((_scored(baseline).any(axis=1) | _scored(candidate).any(axis=1)).sum())
    sample = matrix_sample(baseline, candidate)
    result = judge_clusters(sample, config, n_planned, baseline.ids, clusters)
    return with_veto(result, vetoed, config)
