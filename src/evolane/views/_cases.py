"""How one case fared over its runs: scored, failed on its own account, or an infrastructure
failure, and its category against the pass threshold.

One rule of categories for the optimizer prompt and the report's heatmap (pass / fail /
flaky / infra), so the two name a case alike; and one rule of passing (`mean_passes`: the
mean of its runs reaches the pass score) for the decision's fixed and broken cases, the
report's per-case table and what the prompt asks to protect or to fix. With the default pass
score of 1 the two agree: only a case whose every run passes has a mean of 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Category = Literal["always_failing", "flaky", "infra_errored", "solid"]
"""``solid``: every scored run passes; ``always_failing``: none does; ``flaky``: both;
``infra_errored``: no scored run, only infrastructure or judge failures."""
RunKind = Literal["scored", "own_failure", "infra", "none"]
INFRA_OWNERS = ("infrastructure", "framework")
"""Failure owners that are not the tree's fault."""


def run_kind(unit: dict[str, Any]) -> RunKind:
    """A scored run, a replay the tree failed itself, an infrastructure failure, or none
    (never ran: not_run, blocked)."""
    if _score(unit) is not None:
        return "scored"
    replay, judge = unit.get("replay"), unit.get("judge")
    replay, judge = (
        replay if isinstance(replay, dict) else {},
        judge if isinstance(judge, dict) else {},
    )
    failure = replay.get("failure")
    if isinstance(failure, dict):
        return "infra" if failure.get("owner") in INFRA_OWNERS else "own_failure"
    if judge.get("status") in ("failed", "cancelled"):
        return "infra"
    if unit.get("status") in ("timed_out", "cancelled") or replay.get("status") == "timed_out":
        return "infra"
    return "none"


@dataclass(frozen=True)
class CaseRuns:
    """A case's runs sorted by kind, and its category."""

    category: Category
    scored: list[tuple[float, dict[str, Any]]]
    """(score, unit) of each scored run; a run the tree failed itself scores 0."""
    infra: list[dict[str, Any]]
    threshold: float

    @property
    def mean(self) -> float:
        """The mean score of the scored runs (0 without any), within 0..1."""
        if not self.scored:
            return 0.0
        return min(1.0, max(0.0, sum(score for score, _ in self.scored) / len(self.scored)))

    @property
    def passes(self) -> bool:
        """Whether the case passes on this arm (`mean_passes` of its scored runs)."""
        return mean_passes([score for score, _ in self.scored], self.threshold)

    @property
    def failing(self) -> list[tuple[float, dict[str, Any]]]:
        """The scored runs below the threshold."""
        return [(score, unit) for score, unit in self.scored if score < self.threshold]


def case_runs(units: list[dict[str, Any]], threshold: float = 1.0) -> CaseRuns | None:
    """The runs of one case (``units``) and its category; None when none of them ran."""
    scored: list[tuple[float, dict[str, Any]]] = []
    infra: list[dict[str, Any]] = []
    for unit in units:
        kind = run_kind(unit)
        if kind == "scored":
            scored.append((float(unit["score"]), unit))  # a finite number: `_score`
        elif kind == "own_failure":
            scored.append((0.0, unit))
        elif kind == "infra":
            infra.append(unit)
    if not scored:
        return CaseRuns("infra_errored", [], infra, threshold) if infra else None
    failing = sum(score < threshold for score, _ in scored)
    category: Category = (
        "solid" if not failing else "always_failing" if failing == len(scored) else "flaky"
    )
    return CaseRuns(category, scored, infra, threshold)


PASS_TOLERANCE = 1e-12
"""Relative float slack under the pass score (a mean of 0.7s may sum to 0.6999...)."""


def mean_passes(scores: list[float], pass_score: float) -> bool:
    """Whether a case passes on an arm: the mean of its runs' scores reaches ``pass_score``.
    The one rule of fixed and broken cases, in decisions and in the report's per-case table."""
    if not scores:
        return False
    return sum(scores) / len(scores) >= pass_score - PASS_TOLERANCE * max(1.0, pass_score)


def arm_scores(units: list[dict[str, Any]], arm: str) -> dict[str, list[float]]:
    """Per-case scores of one arm (``baseline`` or ``candidate``) from unit records."""
    scores: dict[str, list[float]] = {}
    for unit in units:
        score = _score(unit)
        if unit.get("arm") == arm and score is not None:
            scores.setdefault(str(unit.get("case")), []).append(score)
    return scores


def left_out_at_zero(
    units: list[dict[str, Any]], baseline: Mapping[str, list[float]]
) -> tuple[dict[str, list[float]], int]:
    """The candidate arm's per-case scores (`arm_scores`) with each candidate unit that ran
    but ended unscored (left out: a judge's endpoint that failed, a stop while it ran) on a
    case ``baseline`` scored at 0, and how many there were: missing data on the candidate's
    side only may be its own output's doing (an output that takes a judge's endpoint down
    on the cases it fails), so a confirmation must hold with it at 0."""
    scores = arm_scores(units, "candidate")
    count = 0
    for unit in units:
        if unit.get("arm") != "candidate" or _score(unit) is not None:
            continue
        replay, case = unit.get("replay"), str(unit.get("case"))
        ran = isinstance(replay, dict) and replay.get("status") != "blocked"
        if case in baseline and (ran or unit.get("reused") or unit.get("restored")):
            scores.setdefault(case, []).append(0.0)
            count += 1
    return scores, count


def _score(unit: dict[str, Any]) -> float | None:
    """A unit record's score when it is a finite number (a record read from a file may hold
    anything)."""
    score = unit.get("score")
    if isinstance(score, bool) or not isinstance(score, int | float):
        return None
    return float(score) if math.isfinite(score) else None
