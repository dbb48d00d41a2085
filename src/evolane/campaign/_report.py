"""``report.json`` (a pydantic model with an exported JSON Schema) and ``report.md``.

Everything a team wants to read the morning after: statuses, the selected candidate, each
measurement's evidence, the funnel of every candidate slot, the budget, the lineage, the
failures, the sealed test result, and ``decisions``: the ordered list on which two runs of
the same seed are compared. Lists are in a stable order.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, create_model, model_validator

from evolane.campaign._config import CampaignConfig, with_stored_defaults
from evolane.campaign._confirm import ConfirmationRecord
from evolane.campaign._estimate import Estimate
from evolane.campaign._online import OnlineBudget
from evolane.campaign._splits import SplitPlan
from evolane.inputs import TrajectorySummary
from evolane.measure import STORED_LIMITS
from evolane.messages import (
    ArtifactRef,
    Decision,
    FailureEvent,
    FunnelStage,
    LocalGateResult,
    Name,
    Record,
    ShortText,
    Text,
    Usage,
)
from evolane.views import token_count

REPORT_VERSION = 1
_MANY = 1_000_000
Terminal = Literal["selected", "rejected", "blocked", "not_run"]
Purpose = Literal["baseline", "screening", "paired", "final_val", "final_test"]


class ScoreCI(Record):
    """A tree's mean score on a split, with a CI over cases (`stats.case_mean_ci`)."""

    mean: float = Field(ge=0.0, le=1.0)
    ci_low: float = Field(ge=0.0, le=1.0)
    ci_high: float = Field(ge=0.0, le=1.0)
    n: int = Field(ge=0)


class Scores(Record):
    """The seed and the best tree, on the val split and on the sealed test split."""

    baseline_val: ScoreCI | None = None
    best_val: ScoreCI | None = None
    baseline_test: ScoreCI | None = None
    best_test: ScoreCI | None = None


class MeasurementRecord(Record):
    """One measurement's summary: what ran and the gate's evidence."""

    measurement_id: Name
    purpose: Purpose
    cycle: int = Field(ge=0)
    iteration: int | None = None
    slot: int | None = None
    split: Literal["train", "val", "test"]
    status: ShortText
    n: int = Field(ge=0)
    n_planned: int = Field(ge=0)
    mean_delta: float
    se: float
    ci_low: float
    ci_high: float
    decision: Decision
    reason: ShortText
    units_planned: int = Field(ge=0)
    units_run: int = Field(ge=0)
    units_reused: int = Field(ge=0)
    units_restored: int = Field(ge=0)
    units_failed: int = Field(ge=0)
    units_cancelled: int = Field(default=0, ge=0)
    units_blocked: int = Field(ge=0)
    units_not_run: int = Field(ge=0)
    wall_seconds: float = Field(ge=0)
    units_ref: ArtifactRef


class FunnelRecord(Record):
    """Where one candidate slot went: every stage it reached and why it ended there."""

    cycle: int = Field(ge=0)
    iteration: int = Field(ge=0)
    slot: int = Field(ge=0)
    slot_id: Name
    stages: tuple[FunnelStage, ...] = Field(default=(), max_length=16)
    terminal: Terminal = "not_run"
    reason: ShortText = ""
    digest: ShortText = ""
    gates: tuple[LocalGateResult, ...] = Field(default=(), max_length=8)
    decision: Decision | None = None
    optimizer: ShortText = ""  # the first line the optimizer printed


class DecisionRecord(Record):
    """One decision, the unit of comparison between runs of the same seed."""

    cycle: int = Field(ge=0)
    iteration: int = Field(ge=0)
    slot: int = Field(ge=0)
    digest: ShortText
    decision: Decision
    reason: ShortText


class IterationRecord(Record):
    """One iteration: its parent, the convergence signal, what was accepted."""

    cycle: int = Field(ge=0)
    iteration: int = Field(ge=0)
    parent: ShortText
    convergence: ShortText
    accepted_slot: int | None = None
    best_after: ShortText


class LineageEntry(Record):
    """A tree that became the best: its parent and the evidence that promoted it."""

    digest: ShortText
    parent: ShortText | None
    cycle: int = Field(ge=0)
    iteration: int | None = None
    slot: int | None = None
    mean_delta: float | None = None


class FailureRecord(Record):
    """A failure event and where it happened (a unit id or a slot id)."""

    where: Name
    failure: FailureEvent


class BudgetRecord(Record):
    """The ledger at the end: ceilings, spent (this run and the whole campaign), by stage."""

    ceilings: Usage
    spent: Usage
    campaign_spent: Usage
    spent_by_stage: dict[Name, Usage] = Field(default_factory=dict, max_length=64)
    spent_by_role: dict[Name, Usage] = Field(default_factory=dict, max_length=8)
    """This run's spend by role: ``optimizer``, ``replay``, ``judge``."""
    cached: dict[Name, int] = Field(default_factory=dict, max_length=8)
    """Model answers taken from the response cache (free), by role."""
    overruns: int = Field(default=0, ge=0)
    campaign_wall_seconds: float | None = Field(default=None, ge=0)
    """The campaign's wall over its runs up to this run's end: what ``--wall-clock-budget``
    counts (None: a report from before it was kept)."""


class ApplyRecord(Record):
    """What the apply policy did with the selected candidate."""

    policy: ShortText
    status: ShortText
    message: Text = ""
    proposal_dir: ShortText = ""
    diff_ref: ArtifactRef | None = None
    backup_ref: ArtifactRef | None = None


class Report(Record):
    """``report.json``: the whole outcome of one run of a campaign."""

    version: int = REPORT_VERSION
    run_id: Name
    campaign_id: Name
    cycle: int = Field(ge=0)
    status: ShortText  # finished | budget_limited | interrupted | failed
    campaign_status: ShortText
    message: Text = ""
    started: float
    finished: float
    wall_seconds: float = Field(ge=0)
    """This session's wall (a resumed run's earlier sessions are in ``run_wall_seconds``)."""
    run_wall_seconds: float | None = Field(default=None, ge=0)
    """The run's wall over every session it ran (None: a report from before it was kept)."""
    resumed: int = Field(default=0, ge=0)
    isolation: ShortText = ""
    limits: Text = ""
    """The commands' resource limits in force and what enforced each (`describe_limits`);
    empty in a report written before the limits existed."""
    config: CampaignConfig
    estimate: Estimate | None = None
    splits: SplitPlan | None = None
    """Which split fed the optimizer, each split's cases, the carve (None: an older report)."""

    def wall_text(self) -> str:
        """The run's wall in words: a resumed run's over all its sessions, then this one's
        (found by review: a resumed run showed its last session's wall alone, beside the
        spend of all its sessions)."""
        total = self.wall_seconds if self.run_wall_seconds is None else self.run_wall_seconds
        if not self.resumed:
            return f"{total:.1f} s"
        sessions = self.resumed + 1
        return f"{total:.1f} s over {sessions} sessions ({self.wall_seconds:.1f} s this one)"

    def ceilings_text(self) -> str:
        """Each of the campaign's ceilings that is set (tokens, cost, wall clock) with what
        the campaign spent of it, in words; empty when none is (found by review: the
        wall-clock budget was shown nowhere in the summary or the reports)."""
        spent, ceilings, parts = self.budget.campaign_spent, self.budget.ceilings, []
        if ceilings.tokens is not None:
            parts.append(f"tokens {token_count(spent.tokens)} of {token_count(ceilings.tokens)}")
        if ceilings.cost_usd is not None:
            parts.append(f"cost ${spent.cost_usd or 0:.4f} of ${ceilings.cost_usd:.4f}")
        budget, wall = self.config.wall_clock_budget, self.budget.campaign_wall_seconds
        if budget is not None:
            used = "" if wall is None else f"{wall:.1f} s of "
            parts.append(f"wall clock {used}{budget:.1f} s")
        return "; ".join(parts)

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        """A report written before ``feedback_split`` existed is of a run that fed back val;
        one written before the command limits, of a run whose commands had none."""
        if isinstance(data, dict) and "config" in data:
            keys = ("feedback_split", *STORED_LIMITS)
            return {**data, "config": with_stored_defaults(data["config"], keys)}
        return data

    seed: ArtifactRef
    selected: ArtifactRef | None = None  # the best tree, when it is not the seed
    best: ArtifactRef
    apply: ApplyRecord | None = None
    scores: Scores = Scores()
    test: MeasurementRecord | None = None
    confirmation: ConfirmationRecord | None = None
    """The best confirmed (or not) against the seed on the test split before a publish."""
    error_control: Text = ""
    """The campaign's error control, in words."""
    online: OnlineBudget | None = None
    """The campaign's online error budget after this run (``online`` mode): alpha, horizon
    and every candidate tested so far with its p-value, level and decision."""
    confirmations: OnlineBudget | None = None
    """The campaign's confirmation budget after this run (``confirm`` mode): every best
    tested on the test split so far, across cycles, with its p-value, level and verdict."""
    iterations: tuple[IterationRecord, ...] = Field(default=(), max_length=_MANY)
    measurements: tuple[MeasurementRecord, ...] = Field(default=(), max_length=_MANY)
    funnel: tuple[FunnelRecord, ...] = Field(default=(), max_length=_MANY)
    decisions: tuple[DecisionRecord, ...] = Field(default=(), max_length=_MANY)
    lineage: tuple[LineageEntry, ...] = Field(default=(), max_length=_MANY)
    failures: tuple[FailureRecord, ...] = Field(default=(), max_length=_MANY)
    budget: BudgetRecord
    artifacts: dict[Name, ArtifactRef] = Field(default_factory=dict, max_length=1024)
    trajectories: TrajectorySummary | None = None
    """For a run from trajectory files: the task groups (cases, failures, completeness, the
    one chosen and why) and the turns excluded as context_incomplete, by id with reason."""


CYCLE_PARTS = (
    "scores",
    "test",
    "confirmation",
    "online",
    "confirmations",
    "iterations",
    "measurements",
    "funnel",
    "decisions",
    "lineage",
    "failures",
)
"""The parts of a report that the campaign actor's cycle produces."""

CycleReport: type[Record] = create_model(  # a view of `Report`: its fields are declared there
    "CycleReport",
    __base__=Record,
    __doc__="The parts of a report one cycle produced, typed and bounded as in `Report`.",
    **{
        name: (Report.model_fields[name].annotation, Report.model_fields[name])
        for name in CYCLE_PARTS
    },
)


def score_ci(per_case: dict[str, list[float]], *, confidence: float, seed: int) -> ScoreCI | None:
    """Mean over cases of each case's mean score, with its CI (`stats.case_mean_ci`:
    Clopper-Pearson for pass/fail scores, never collapsing for graded ones)."""
    from evolane.stats import case_mean_ci  # numpy: where a run's scores are summed up

    found = case_mean_ci(per_case, confidence=confidence, seed=seed)
    if found is None:
        return None
    mean, low, high, n = found
    return ScoreCI(mean=mean, ci_low=low, ci_high=high, n=n)
