"""The prefix of complete cases that early stop reads, grown as units end, and the decision
(no IO). Clustered cases are read cluster by cluster: early stop takes one value per complete
cluster, its mean delta, as the clustered gate does (`stats.judge_clusters`)."""

from __future__ import annotations

import math
from array import array

import numpy as np

from evolane.measure._table import Unit, UnitTable
from evolane.measure._units import arm_matrices
from evolane.messages import Decision, GateConfig, GateResult, MeasureEvent
from evolane.stats import (
    CLUSTERED_GATES,
    Clusters,
    EarlyStop,
    ScoreMatrix,
    cluster_ends,
    decide_matrices,
    mean_and_se,
)


class CasePrefix:
    """The leading run of cases whose units all ended, in plan order, grown as units end:
    each ended unit costs O(1) amortised (a case's delta is taken once, when it completes)
    plus what `EarlyStop.update` costs. Early stop reads only this prefix, so where it stops
    never depends on the order in which units end.

    Clustered cases (``clusters``, read cluster by cluster: `stats.cluster_order`) judged by a
    gate with a level (`stats.CLUSTERED_GATES`): early stop takes one value per cluster once
    all its cases are complete, the mean delta of its comparable cases (not comparable when
    it has none), out of as many as there are clusters, so its coverage rule, its settled
    bounds and its sequential test are those of the clustered gate, on independent values
    in [-1, 1] read in a seeded order of the clusters; an early stop's cutoff is a cluster's
    end. Each cluster's mean is taken once, when it completes: O(1) amortised per case."""

    def __init__(
        self,
        cases: int,
        units: UnitTable,
        gate: GateConfig,
        paired: bool,
        *,
        allow_accept: bool = True,
        clusters: Clusters | None = None,
    ) -> None:
        """``paired``: the measurement has a candidate arm (a baseline alone is measured
        whole: there is nothing to decide early); ``allow_accept`` False: an early stop may
        only reject (`EarlyStop`); ``clusters``: the cases' clusters when two share one (each
        cluster's cases together in ``units``' reading order)."""
        # Case k's units are ``start + k * step`` for each column (repetition and arm) of the
        # layout: no index, start or count is kept per case.
        self._columns = units.layout.columns()
        self._cases = cases
        self._units = units
        self.length = 0  # cases in the prefix
        self._complete = array("d")  # each prefix case's delta (NaN: a failure on either side)
        self._deltas = array("d")  # the comparable ones
        self._fed = 0  # complete cases (clusters, by cluster) the early stop has taken
        self._ends = None  # where each cluster ends, when early stop reads clusters
        if clusters is not None and gate.gate in CLUSTERED_GATES:
            self._ends = cluster_ends(units.case_ids[:cases], clusters)
        planned, noun = (cases, "cases") if self._ends is None else (len(self._ends), "clusters")
        self._stopper = (
            EarlyStop(gate, planned, allow_accept=allow_accept, noun=noun)
            if gate.sequential and paired
            else None
        )

    @property
    def pairs(self) -> int:
        """Comparable cases in the prefix."""
        return len(self._deltas)

    def ended(self, unit: Unit) -> None:
        """Count ``unit`` as ended (marked done); the prefix takes every case that is now
        complete (all its units done)."""
        while self.length < self._cases:
            members = [self._units[start + self.length * step] for start, step in self._columns]
            if not all(member.done for member in members):
                return
            delta = _case_delta(members)
            self._complete.append(math.nan if delta is None else delta)
            if delta is not None:
                self._deltas.append(delta)
            self.length += 1

    def early_stop(self) -> tuple[Decision, str, int] | None:
        """(decision, reason, cutoff) once the decision on the prefix can no longer change or
        the anytime-valid sequential test decides; None while the measurement must go on
        (always None for a full evaluation, ``sequential=False``). The cutoff is the number
        of cases the decision reads. A case that is not comparable is fed as such: it counts
        against coverage, so an early decision obeys the same coverage rule as a full one."""
        stopper = self._stopper
        if stopper is None:
            return None
        if self._ends is not None:
            return self._cluster_stop(stopper, self._ends)
        while self._fed < len(self._complete):
            index, delta = self._fed, self._complete[self._fed]
            self._fed += 1
            decision = stopper.update(None if math.isnan(delta) else delta)
            if decision is not None:
                return decision, stopper.reason, index + 1  # "early stop after ..."
        return None

    def _cluster_stop(
        self, stopper: EarlyStop, ends: array[int]
    ) -> tuple[Decision, str, int] | None:
        """`early_stop` by cluster: each complete cluster's mean delta over its comparable
        cases (None without any), once; the cutoff is the end of the cluster it stops at."""
        while self._fed < len(ends) and ends[self._fed] <= len(self._complete):
            start, end = ends[self._fed - 1] if self._fed else 0, ends[self._fed]
            self._fed += 1
            comparable = [d for d in self._complete[start:end] if not math.isnan(d)]
            mean = math.fsum(comparable) / len(comparable) if comparable else None
            decision = stopper.update(None if mean is None else min(1.0, max(-1.0, mean)))
            if decision is not None:
                return decision, stopper.reason, end
        return None

    def event(
        self, measurement_id: str, planned: int, lanes_busy: int, judges_busy: int = 0
    ) -> MeasureEvent:
        """The progress event: the prefix's comparable pairs, their mean delta (None without
        any) and its SE (None below two)."""
        mean = se = None
        if self._deltas:
            mean, se = mean_and_se(np.array(self._deltas, dtype=np.float64))
        return MeasureEvent(
            run_id="-",
            measurement_id=measurement_id,
            pairs_done=self.pairs,
            pairs_planned=planned,
            lanes_busy=lanes_busy,
            judges_busy=judges_busy,
            mean_delta=mean,
            se=se if self.pairs > 1 else None,
        )


def _case_delta(units: list[Unit]) -> float | None:
    base = [u.score for u in units if u.arm == "baseline" and u.score is not None]
    cand = [u.score for u in units if u.arm == "candidate" and u.score is not None]
    return sum(cand) / len(cand) - sum(base) / len(base) if base and cand else None


_EVIDENCE = ("mean_delta", "se", "ci_low", "ci_high")


def decision(
    units: UnitTable,
    cases: int,
    gate: GateConfig,
    cutoff: int | None,
    early: tuple[str, str] | None,
    clusters: Clusters | None = None,
) -> GateResult:
    """The gate's result on the cases before ``cutoff`` (all ``cases`` without one); an early
    stop's (decision, reason), when given, replaces the gate's own. Its ``n_planned`` is the
    measurement's ``cases`` either way: an early stop reads fewer, it does not plan fewer
    (found by review: a stop after 25 of 26 cases was reported as n 25/25). ``clusters``:
    the gate judges clusters (`stats.judge_clusters`)."""
    baseline, candidate = arm_matrices(units, cutoff)
    planned = cutoff if cutoff is not None else cases
    result = decide_matrices(baseline, candidate, gate, n_planned=planned, clusters=clusters)
    update: dict[str, object] = {"n_planned": cases}
    if early is not None:
        update.update(decision=early[0], reason=early[1])
    result = result.model_copy(update=update)
    if result.decision != "accept":
        return result
    worst, left_out = _left_out_at_zero(units, baseline, candidate)
    if not left_out:
        return result
    check = decide_matrices(baseline, worst, gate, n_planned=planned, clusters=clusters)
    if check.decision == "accept":  # its evidence with them at 0: what ranks candidates
        evidence = {
            name: getattr(check, name) for name in ("mean_delta", "se", "ci_low", "ci_high")
        }
        said = f"{result.reason}; {left_out} left-out candidate unit(s) counted at 0"
        return result.model_copy(update={**evidence, "reason": said[:256]})
    reason = (
        f"{left_out} candidate unit(s) ended unscored (left out) on cases whose baseline was "
        "scored, and with them at 0 the gate would not accept: indecisive; "
        f"gate: {result.reason}"
    )
    return result.model_copy(update={"decision": "indecisive", "reason": reason[:256]})


def _left_out_at_zero(
    units: UnitTable, baseline: ScoreMatrix, candidate: ScoreMatrix
) -> tuple[ScoreMatrix, int]:
    """``candidate`` with each unit that ran but ended unscored (left out: a judge's model
    endpoint that failed, a spawn that never started, a stop while it ran) at 0 on a case
    whose baseline was scored, and how many there were. A pair left out on one side only is
    missing data the candidate's own output may have caused (an output that takes a judge's
    endpoint down, and its check with it, on the cases it fails: found by review, a worse
    candidate accepted on the cases it passes), so an acceptance must hold without it."""
    scores = candidate.scores.copy()
    scored = ~np.isnan(baseline.scores).all(axis=1)
    left_out = 0
    for place, rep in zip(*np.nonzero(np.isnan(scores) & scored[:, None]), strict=True):
        index = units.layout.index(int(place), int(rep), True)
        if index is not None and units[index].took_part:
            scores[place, rep] = 0.0
            left_out += 1
    return ScoreMatrix(candidate.ids, scores), left_out
