"""The campaign's bookkeeping, IO-free: funnel records, decisions, measurement records,
scores from unit records, failures. The campaign actor fills a `Book`; the report reads it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from evolane.campaign._report import (
    DecisionRecord,
    FailureRecord,
    FunnelRecord,
    IterationRecord,
    LineageEntry,
    MeasurementRecord,
    Purpose,
    ScoreCI,
    score_ci,
)
from evolane.messages import Decision, FailureEvent, FunnelStage, LocalGateResult, MeasureSummary
from evolane.stats import Clusters, cluster_means, paired_sample
from evolane.views import arm_scores, left_out_at_zero

MAX_FAILURES = 1000
"""Failure events kept in a report (the count beyond is stated)."""


@dataclass
class SlotBook:
    """One candidate slot's path through the funnel, built up as it goes."""

    cycle: int
    iteration: int
    slot: int
    slot_id: str
    stages: list[FunnelStage] = field(default_factory=list)
    digest: str = ""
    gates: list[LocalGateResult] = field(default_factory=list)
    decision: Decision | None = None
    reason: str = ""
    optimizer: str = ""
    terminal: str = "not_run"

    def reach(self, stage: FunnelStage) -> None:
        self.stages.append(stage)

    @property
    def ended(self) -> bool:
        """Whether the slot has its terminal stage (`end` was called)."""
        return bool(self.stages) and self.stages[-1] == self.terminal

    def end(self, terminal: str, reason: str, decision: Decision | None = None) -> None:
        self.terminal, self.reason = terminal, reason[:256]
        if decision is not None:
            self.decision = decision
        self.stages.append(terminal)  # type: ignore[arg-type]

    def record(self) -> FunnelRecord:
        return FunnelRecord(
            cycle=self.cycle,
            iteration=self.iteration,
            slot=self.slot,
            slot_id=self.slot_id,
            stages=tuple(self.stages),
            terminal=self.terminal,  # type: ignore[arg-type]
            reason=self.reason,
            digest=self.digest,
            gates=tuple(self.gates[:8]),
            decision=self.decision,
            optimizer=self.optimizer[:256],
        )


@dataclass
class Book:
    """Everything a run's report lists, in the order it happened."""

    funnel: list[SlotBook] = field(default_factory=list)
    decisions: list[DecisionRecord] = field(default_factory=list)
    measurements: list[MeasurementRecord] = field(default_factory=list)
    iterations: list[IterationRecord] = field(default_factory=list)
    lineage: list[LineageEntry] = field(default_factory=list)
    failures: list[FailureRecord] = field(default_factory=list)
    failures_dropped: int = 0

    def decide(self, slot: SlotBook, decision: Decision, reason: str) -> None:
        """Record a decision on a slot's candidate (the comparable list)."""
        self.decisions.append(
            DecisionRecord(
                cycle=slot.cycle,
                iteration=slot.iteration,
                slot=slot.slot,
                digest=slot.digest,
                decision=decision,
                reason=reason[:256],
            )
        )

    def fail(self, where: str, failure: FailureEvent) -> None:
        if len(self.failures) < MAX_FAILURES:
            self.failures.append(FailureRecord(where=where[:128], failure=failure))
        else:
            self.failures_dropped += 1

    def measured(
        self,
        summary: MeasureSummary,
        units: list[dict[str, Any]],
        *,
        purpose: Purpose,
        cycle: int,
        split: str,
        iteration: int | None = None,
        slot: int | None = None,
    ) -> MeasurementRecord:
        """Keep a measurement's record and the failures among its units."""
        gate = summary.gate
        record = MeasurementRecord(
            measurement_id=summary.measurement_id,
            purpose=purpose,
            cycle=cycle,
            iteration=iteration,
            slot=slot,
            split=split,  # type: ignore[arg-type]
            status=summary.status,
            n=gate.n,
            n_planned=gate.n_planned,
            mean_delta=gate.mean_delta,
            se=gate.se,
            ci_low=gate.ci_low,
            ci_high=gate.ci_high,
            decision=gate.decision,
            reason=gate.reason,
            units_planned=summary.units_planned,
            units_run=summary.units_run,
            units_reused=summary.units_reused,
            units_restored=summary.units_restored,
            units_failed=summary.units_failed,
            units_cancelled=summary.units_cancelled,
            units_blocked=summary.units_blocked,
            units_not_run=summary.units_not_run,
            wall_seconds=summary.wall_seconds,
            units_ref=summary.units_ref,
        )
        self.measurements.append(record)
        for unit in units:
            if unit.get("reused"):
                continue
            for part in ("replay", "judge"):
                result = unit.get(part) or {}
                failure = result.get("failure")
                if failure and result.get("status") != "cancelled":  # stopped on purpose
                    self.fail(str(unit["unit"]), FailureEvent.model_validate(failure))
        return record


def first_failure(units: list[dict[str, Any]]) -> str:
    """The first unit failure in ``units`` as one quoted line (stage, code, owner, message)."""
    for unit in units:
        for stage in ("replay", "judge"):
            failure = (unit.get(stage) or {}).get("failure")
            if failure:
                message = str(failure.get("message") or "").strip().replace("\n", " ")
                detail = f": {message[:200]}" if message else ""
                return f"{stage} {failure.get('code')} ({failure.get('owner')}){detail}"
        if unit.get("status") == "not_run" and unit.get("note"):
            return f"not run: {str(unit['note'])[:200]}"
    return "no unit finished"


def arm_score(
    units: list[dict[str, Any]], arm: str, *, confidence: float, seed: int
) -> ScoreCI | None:
    """One arm's mean score with its bootstrap CI."""
    return score_ci(arm_scores(units, arm), confidence=confidence, seed=seed)


def settled_digests(earlier: Iterable[str], decisions: Iterable[DecisionRecord]) -> list[str]:
    """The campaign's duplicate memory after a cycle: the earlier digests, then candidates
    decided on (a tree cut short by a stop is left out: a later cycle may measure it)."""
    seen = dict.fromkeys(earlier)
    for record in decisions:
        decided = record.decision in ("accept", "reject")
        if record.digest and (decided or record.reason.startswith("protected_paths")):
            seen.setdefault(record.digest)
    return list(seen)


def hardest_failing(units: list[dict[str, Any]], pass_score: float = 1.0) -> str | None:
    """The case the parent scored lowest on, if it fails it (below ``pass_score``): the one
    screening tries first."""
    scores = arm_scores(units, "baseline")
    means = {case: sum(v) / len(v) for case, v in scores.items() if v}
    failing = [(mean, case) for case, mean in means.items() if mean < pass_score]
    return min(failing)[1] if failing else None


def online_deltas(units: list[dict[str, Any]], clusters: Clusters) -> tuple[Any, bool]:
    """Candidate - parent on a measurement's comparable pairs: per case, or each cluster's
    mean when two of the cases share a cluster (`stats.cluster_means`); and whether per case.
    A candidate unit left out on its side only counts as 0 (`views.left_out_at_zero`), as
    the gate reads it for an acceptance: the online p-value of the cases it passes alone let
    an output that takes the judge's endpoint down on the cases it fails pass a level the
    same measurement with them at 0 does not (found by review)."""
    baseline = arm_scores(units, "baseline")
    sample = paired_sample(baseline, left_out_at_zero(units, baseline)[0])
    ids, (deltas,) = cluster_means(sample.ids, (sample.deltas,), clusters)
    return deltas, len(ids) == len(sample.ids)
