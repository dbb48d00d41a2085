"""What the progress events tell of a measurement and a decision, from its unit records:
each arm's mean score, the cases a candidate fixes and breaks, and why it stopped early.

IO-free; the campaign's peers (`evolane.campaign._peers`) put these in the events the live
view draws.
"""

from __future__ import annotations

from typing import Any, Literal

from evolane.messages import GateConfig, GateResult
from evolane.views import arm_scores, mean_passes

EarlyStop = Literal["", "settled", "sequential", "coverage"]


def arm_mean(units: list[dict[str, Any]], arm: str) -> float | None:
    """The mean over cases of each case's mean score on ``arm`` (None: no case scored), as
    the report's scores count it."""
    means = [sum(scores) / len(scores) for scores in arm_scores(units, arm).values() if scores]
    if not means:
        return None
    return min(1.0, max(0.0, sum(means) / len(means)))


def fixed_and_broken(units: list[dict[str, Any]], pass_score: float) -> tuple[int, int]:
    """(cases the candidate passes that the parent failed, cases the parent passed that the
    candidate fails), a case passing by `mean_passes` (as the report's per-case table);
    cases without a score on both arms are not counted."""
    base, cand = arm_scores(units, "baseline"), arm_scores(units, "candidate")
    fixed = broken = 0
    for case in base.keys() & cand.keys():
        before, after = mean_passes(base[case], pass_score), mean_passes(cand[case], pass_score)
        fixed += after and not before
        broken += before and not after
    return fixed, broken


def early_stop(reason: str) -> EarlyStop:
    """Which early stop ended a measurement, read from the gate's reason ("": none)."""
    if not reason.startswith("early stop"):
        return ""
    for source in ("settled", "coverage"):
        if f", {source}:" in reason:
            return source  # type: ignore[return-value]
    return "sequential"


def decision_fields(
    gate: GateResult, config: GateConfig, units: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """The `DecisionEvent` fields that tell the rule's numbers and the cases it moved."""
    fields: dict[str, Any] = {
        "gate": gate.gate,
        "se": gate.se,
        "k_se": config.k_se,
        "min_effect": config.min_effect,
        "n": gate.n,
        "n_planned": gate.n_planned,
        "early": early_stop(gate.reason),
    }
    if units is not None:
        fields["fixed"], fields["broken"] = fixed_and_broken(units, config.pass_score)
        fields["candidate_mean"] = arm_mean(units, "candidate")
    return fields
