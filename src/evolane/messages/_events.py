"""Progress events: what a run tells its observers (the live view, ``events.jsonl``).

Every event carries the run id, a sequence number and the seconds since the run began, so a
stream can be checked for gaps; the kinds are few and each says one thing.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evolane.messages._base import Message, Name, Record, ShortSaid, ShortText
from evolane.messages._measure import Arm, UnitStatus, Usage
from evolane.messages._optimize import LocalGateResult

MAX_PREFLIGHT_LINES = 12
"""Preflight lines a run's estimate carries at most (the gate's, the splits', the copy
scan's, the host's share of processes): 8 cut a copy line off (found by review)."""

_COUNT = 10**15
"""Upper bound of every count and amount in an event (events are bounded by schema)."""

FunnelStage = Literal[
    "generated",
    "unique",
    "duplicate",
    "local_gates",
    "screening",
    "paired_replay",
    "evaluation",
    "selected",
    "rejected",
    "blocked",
    "not_run",
]
"""Where a candidate slot stands; the last four are terminal."""

Phase = Literal["estimate", "baseline", "optimize", "measure", "finalize", "apply", "report"]


class ProgressEvent(Message):
    """Base of every progress event (abstract: not sent itself)."""

    kind: Name
    run_id: Name
    seq: int = Field(default=0, ge=0, le=2**63 - 1)
    t: float = Field(default=0.0, ge=0, le=1e9)


class RunStarted(ProgressEvent):
    """The run began (or resumed): its shape, so a view can lay itself out."""

    kind: Literal["event.run_started"] = "event.run_started"
    campaign_id: Name
    cycle: int = Field(ge=0, le=_COUNT)
    iterations: int = Field(ge=0, le=_COUNT)
    population: int = Field(ge=0, le=_COUNT)
    replay_lanes: int = Field(ge=0, le=_COUNT)
    judge_lanes: int = Field(ge=0, le=_COUNT)
    resumed: bool = False
    isolation: ShortText = ""
    wall_clock_budget: float | None = Field(default=None, ge=0, le=_COUNT)
    wall_clock_left: float | None = Field(default=None, le=_COUNT)  # of it, as this session began
    safeguards: tuple[ShortText, ...] = Field(default=(), max_length=8)
    """The host-wide safeguards in force (``lease_sweep``, ``subreaper``, ``lifeline``, ...)."""


class EstimateEvent(ProgressEvent):
    """The cost and wall estimate, before any expensive work."""

    kind: Literal["event.estimate"] = "event.estimate"
    replays_max: int = Field(ge=0, le=_COUNT)
    judge_calls_max: int = Field(ge=0, le=_COUNT)
    optimizer_calls_max: int = Field(ge=0, le=_COUNT)
    wall_low_seconds: float | None = Field(default=None, ge=0, le=_COUNT)
    wall_high_seconds: float | None = Field(default=None, ge=0, le=_COUNT)
    wall_worst_seconds: float | None = Field(default=None, ge=0, le=_COUNT)
    """Every unit into its timeout and every judge call retried (when the range above is a
    realistic one, from a probe or earlier runs)."""
    judge_retries_max: int = Field(default=0, ge=0, le=_COUNT)
    """Judge retries at most, on top of the judge calls above: possible, not certain spend."""
    judge_samples: int = Field(default=1, ge=1, le=16)
    """Model requests each judge call makes (the built-in model judge's samples)."""
    tokens: float | None = Field(default=None, ge=0, le=_COUNT)
    cost_usd: float | None = Field(default=None, ge=0, le=_COUNT)
    by_role: dict[Name, Usage] = Field(default_factory=dict, max_length=8)
    """Tokens and dollars expected per role (optimizer, replay, judge)."""
    preflight: tuple[ShortSaid, ...] = Field(default=(), max_length=MAX_PREFLIGHT_LINES)
    """What the gate can accept with these cases and repetitions, in words (shown as text: a
    line quoting a file name holds no terminal control, and each control character is 3
    bytes, not the 6 of its JSON escape: found by hypothesis, 8 lines of them went over
    `MAX_MESSAGE_BYTES`)."""
    splits: ShortSaid = ""
    """Which split feeds the optimizer and how many cases each split has, in words."""


class PhaseEvent(ProgressEvent):
    """The run entered a phase; iteration events also carry the convergence signal."""

    kind: Literal["event.phase"] = "event.phase"
    phase: Phase
    cycle: int = Field(default=0, ge=0, le=_COUNT)
    iteration: int | None = Field(default=None, ge=0, le=_COUNT)
    parent: ShortText = ""  # the parent tree's digest
    convergence: ShortText = ""


class SlotEvent(ProgressEvent):
    """A candidate slot moved through the funnel."""

    kind: Literal["event.slot"] = "event.slot"
    iteration: int = Field(ge=0, le=_COUNT)
    slot: int = Field(ge=0, le=_COUNT)
    stage: FunnelStage
    digest: ShortText = ""
    reason: ShortSaid = ""
    gate: LocalGateResult | None = None


class MeasureEvent(ProgressEvent):
    """A measurement's progress or end: pairs done of planned, and the evidence so far."""

    kind: Literal["event.measure"] = "event.measure"
    measurement_id: Name
    pairs_done: int = Field(ge=0, le=_COUNT)
    pairs_planned: int = Field(ge=0, le=_COUNT)
    lanes_busy: int = Field(default=0, ge=0, le=_COUNT)
    """Replay lanes this measurement holds now."""
    judges_busy: int = Field(default=0, ge=0, le=_COUNT)
    """Its units being judged now."""
    mean_delta: float | None = None
    se: float | None = None
    finished: bool = False
    decision: ShortText = ""
    parent_only: bool = False
    """A measurement of the parent alone (a baseline): cases, not pairs, and no decision."""
    purpose: ShortText = ""
    """What the finished measurement was for: ``baseline`` (the parent alone), ``paired``,
    ``screening``, ``final_val``, ``final_test`` ("": not told)."""
    split: ShortText = ""
    iteration: int | None = Field(default=None, ge=0, le=_COUNT)
    baseline_mean: float | None = Field(default=None, ge=0, le=1)
    """The parent's (baseline arm's) mean score over cases, when finished."""
    candidate_mean: float | None = Field(default=None, ge=0, le=1)
    """The candidate arm's mean score over cases, when finished."""


class UnitEvent(ProgressEvent):
    """A unit (one replay and judgement of one case, on one arm and repetition) ended:
    published once, after its record was journaled, for each unit that ran, was reused or
    was restored (units never started, or blocked by their control, are only counted)."""

    kind: Literal["event.unit"] = "event.unit"
    measurement_id: Name
    unit_id: Name
    case_id: Name
    arm: Arm
    repetition: int = Field(ge=0, le=_COUNT)
    status: UnitStatus
    note: ShortText = ""
    """Why it ended so, when not plainly: ``reused``, ``restored``, ``early_stop``, ..."""
    reused: bool = False
    """Taken from an earlier unit of the same experiment: nothing ran."""
    restored: bool = False
    """Taken from an interrupted run's journal (or judged again from its stored replay)."""
    score: float | None = Field(default=None, ge=0, le=1)
    replay_seconds: float = Field(default=0.0, ge=0, le=_COUNT)
    judge_seconds: float = Field(default=0.0, ge=0, le=_COUNT)
    tokens: float | None = Field(default=None, ge=0, le=_COUNT)
    """What its replay and judgement used together (None: unknown)."""
    cost_usd: float | None = Field(default=None, ge=0, le=_COUNT)
    failure: ShortText = ""
    """Whose fault and why, for a unit that did not succeed (``owner stage code: message``)."""


class DecisionEvent(ProgressEvent):
    """The gate decided on a candidate (accept, reject or indecisive) and why."""

    kind: Literal["event.decision"] = "event.decision"
    iteration: int = Field(ge=0, le=_COUNT)
    slot: int = Field(ge=0, le=_COUNT)
    digest: ShortText
    decision: Literal["accept", "reject", "indecisive"]
    reason: ShortText
    mean_delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    summary: ShortSaid = ""
    """The optimizer's one-line summary of the edit."""
    gate: ShortText = ""
    """The gate that decided (``paired``, ``bootstrap``, ``strict``, ``threshold``)."""
    se: float | None = Field(default=None, ge=0)
    k_se: float | None = Field(default=None, ge=0)
    min_effect: float | None = None
    n: int | None = Field(default=None, ge=0, le=_COUNT)
    """Comparable cases the decision read."""
    n_planned: int | None = Field(default=None, ge=0, le=_COUNT)
    early: Literal["", "settled", "sequential", "coverage"] = ""
    """Why the measurement stopped before its last case, if it did."""
    fixed: int | None = Field(default=None, ge=0, le=_COUNT)
    """Cases the candidate passes and the parent failed (a pass: mean score >= pass_score)."""
    broken: int | None = Field(default=None, ge=0, le=_COUNT)
    """Cases the parent passed and the candidate fails."""
    candidate_mean: float | None = Field(default=None, ge=0, le=1)
    """The candidate's mean score over the cases measured."""


class EndpointLoad(Record):
    """A model endpoint's adaptive concurrency limit (AIMD on 429), as the live view shows it."""

    endpoint: ShortText
    limit: int = Field(ge=0, le=_COUNT)
    in_flight: int = Field(ge=0, le=_COUNT)
    rate_limited: int = Field(ge=0, le=_COUNT)
    """Answers 429 so far."""


class BudgetUpdate(ProgressEvent):
    """The ledger: spent, reserved and the ceilings, per dimension."""

    kind: Literal["event.budget"] = "event.budget"
    spent: Usage
    reserved: Usage
    ceilings: Usage
    by_role: dict[Name, Usage] = Field(default_factory=dict, max_length=8)
    """Spent by role: ``optimizer``, ``replay``, ``judge``."""
    endpoints: tuple[EndpointLoad, ...] = Field(default=(), max_length=8)
    """The model endpoints the run calls, with their rate limits."""


class WarningEvent(ProgressEvent):
    """Something a person should know about (an infrastructure failure, a lost event)."""

    kind: Literal["event.warning"] = "event.warning"
    message: ShortText


class RunFinished(ProgressEvent):
    """The run ended: statuses, the best tree and where the report is."""

    kind: Literal["event.run_finished"] = "event.run_finished"
    status: ShortText
    campaign_status: ShortText
    best: ShortText = ""
    baseline_val: float | None = None
    best_val: float | None = None
    report: ShortText = ""
    verdict: ShortText = ""
    """The test split's verdict on the best and what became of it (e.g. ``not confirmed on
    the test split; apply auto_verified: unconfirmed``); empty when there was neither."""


EVENT_TYPES: tuple[type[ProgressEvent], ...] = (
    RunStarted,
    EstimateEvent,
    PhaseEvent,
    SlotEvent,
    MeasureEvent,
    UnitEvent,
    DecisionEvent,
    BudgetUpdate,
    WarningEvent,
    RunFinished,
)
