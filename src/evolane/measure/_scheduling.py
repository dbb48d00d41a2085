"""The measurement scheduler's settings, unit record and the seeds it derives."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import trio

from evolane.measure._journal import RunJournal
from evolane.messages import (
    ArtifactRef,
    FailureEvent,
    JudgeResult,
    MeasureEvent,
    MeasureRequest,
    ReplayRecord,
    ReplayResult,
    UnitRecord,
)
from evolane.stats import seed_for


@dataclass(frozen=True)
class SchedulerSettings:
    """What every measurement shares: the cases, timeouts, repetitions policy, journal."""

    case_refs: dict[str, ArtifactRef]  # what a replay sees: no answers
    judge_case_refs: dict[str, ArtifactRef]  # what a judge sees: with expected_output
    splits: dict[str, tuple[str, ...]]
    fingerprint: str  # dataset, workspace seed, replay and judge commands: what reuse must match
    replay_timeout: float = 600.0
    judge_timeout: float = 120.0
    min_cases: int = 8
    seed: int = 0
    journal: RunJournal | None = None
    restored: Mapping[str, UnitRecord] = field(default_factory=dict)  # unit id -> record
    # (a record counts only if its "tree" is the tree the unit plans: unit ids hold no tree)
    restored_replays: Mapping[str, ReplayRecord] = field(default_factory=dict)  # judged next
    on_progress: Callable[[MeasureEvent], object] | None = None  # a progress bus's publish
    rejudge: bool = False  # restored units are judged again (--rerun-evaluator)
    replays_allowed: bool = True  # False: a unit without a stored replay is not run
    progress_interval: float = 0.1  # seconds between two progress events of a measurement


RESTORABLE = frozenset({"succeeded", "failed", "timed_out"})
"""Unit statuses a resumed run takes from the journal; cancelled units run again."""


@dataclass
class Unit:
    """One replay of one case on one arm and repetition, and what became of it."""

    index: int
    unit_id: str
    case_id: str
    case_index: int
    arm: str
    repetition: int
    tree_ref: ArtifactRef
    depends_on: Unit | None = None
    done: trio.Event = field(default_factory=trio.Event)
    status: str = "pending"
    replay: ReplayResult | None = None
    judge: JudgeResult | None = None
    reused: bool = False
    restored: bool = False
    note: str = ""

    @property
    def score(self) -> float | None:
        """The judge's score when both the replay and the judge succeeded; 0 when the candidate
        itself broke the replay (a crash or no output it caused); else None (not comparable)."""
        failure = self.replay.failure if self.replay is not None else None
        if failure is not None and failure.owner == "candidate":
            return 0.0
        ok = self.replay is not None and self.replay.status == "succeeded"
        judged = self.judge is not None and self.judge.status == "succeeded"
        return self.judge.score if ok and judged and self.judge is not None else None


def framework_failure(stage: str, error: Exception) -> FailureEvent:
    """A lane that crashed or hung, as the framework's failure of ``stage``."""
    return FailureEvent(
        owner="framework",
        stage=stage,
        code="lane_error",  # type: ignore[arg-type]
        message=f"{type(error).__name__}: {error}"[:512],
    )


def unit_seed(run_seed: int, case_id: str, repetition: int) -> int:
    """The seed shared by both arms of a pair (same case, same repetition)."""
    return seed_for(run_seed, case_id, repetition)


def repetitions(request: MeasureRequest, cases: int, min_cases: int) -> tuple[int, int]:
    """Explicit repetitions win; else 1/1 with enough independent cases, 2/3 without."""
    adaptive = (1, 1) if cases >= min_cases else (2, 3)
    return (
        request.baseline_repetitions or adaptive[0],
        request.candidate_repetitions or adaptive[1],
    )


def start_order(units: list[Unit], lanes: int) -> dict[int, tuple[int, int]]:
    """Each unit's start priority (lower first): first repetitions before later ones, and
    within a repetition baselines about a wave of ``lanes`` ahead of the candidates that
    wait for them. Plan order alone lets the last baseline start in the last wave, so its
    candidate runs in a wave of its own after it."""
    order: dict[int, tuple[int, int]] = {}
    baselines = candidates = 0
    for unit in units:
        if unit.arm == "baseline":
            order[unit.index] = (unit.repetition, 2 * (baselines - lanes))
            baselines += 1
        else:
            order[unit.index] = (unit.repetition, 2 * candidates + 1)
            candidates += 1
    return order
