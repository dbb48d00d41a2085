"""Messages of the measurement pipeline: budget, replay and judge jobs, their results, and
the measurement request and its summary."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from evolane.messages._base import ArtifactRef, Message, Name, Record, Said, ShortText
from evolane.messages._gate import GateConfig, GateResult

Arm = Literal["baseline", "candidate"]
Owner = Literal["candidate", "task", "infrastructure", "framework"]
Stage = Literal["replay", "judge", "optimizer", "gate", "budget", "scheduler"]
UnitStatus = Literal["succeeded", "failed", "timed_out", "cancelled", "blocked", "not_run"]
MeasureStatus = Literal[
    "complete", "early_stopped", "budget_limited", "shared_failure", "cancelled", "diverged"
]
"""How a measurement ended. ``diverged``: a re-judge (no replays allowed) met units its stored
run replayed on another tree than this run plans; they were not used, and not run."""
Dimension = Literal["tokens", "cost_usd", "wall_seconds"]
DIMENSIONS: tuple[Dimension, ...] = ("tokens", "cost_usd", "wall_seconds")
_BIG = 1e15


class Usage(Record):
    """Resource use per dimension; ``None`` means unknown (not zero)."""

    tokens: float | None = Field(default=None, ge=0, le=_BIG)
    cost_usd: float | None = Field(default=None, ge=0, le=_BIG)
    wall_seconds: float | None = Field(default=None, ge=0, le=_BIG)
    cached: bool = False
    """A model's answer taken from the response cache (``--llm-cache``): it cost nothing."""

    def get(self, dimension: Dimension) -> float | None:
        return getattr(self, dimension)


class FailureEvent(Record):
    """Why a unit did not produce a usable result, and whose fault it is."""

    owner: Owner
    stage: Stage
    code: ShortText
    message: Said = ""
    repairable: bool = False
    spawn_errno: int | None = None
    """A ``spawn_failed``'s errno from evolane's own spawn (`ProcessOutcome.spawn_errno`):
    whether the host refused it for the moment is read from this, never from the message."""

    @classmethod
    def of(
        cls,
        error: BaseException,
        *,
        owner: Owner,
        stage: Stage,
        code: str,
        repairable: bool = False,
        where: str = "",
    ) -> FailureEvent:
        """The failure an exception stands for: ``where`` (default: the exception's type)
        and its text, clipped to the field's bound."""
        message = f"{where or type(error).__name__}: {error}"[:512]
        return cls(owner=owner, stage=stage, code=code, message=message, repairable=repairable)


class Reserve(Message):
    """Ask the budget for room for one unit of work before starting it."""

    kind: Literal["budget.reserve"] = "budget.reserve"
    stage: Name
    item: Name
    estimate: Usage | None = None
    zero_cost: bool = False


class ReserveReply(Message):
    """Granted, or denied with the reason (a denial changes nothing)."""

    kind: Literal["budget.reserve_reply"] = "budget.reserve_reply"
    granted: bool
    reason: ShortText = ""
    retry: bool = False  # denied for now only: ask again when a unit of the stage has finished


class Debit(Message):
    """Charge what a unit used; incomplete dimensions are charged at least their reservation."""

    kind: Literal["budget.debit"] = "budget.debit"
    item: Name
    actual: Usage
    complete: bool = True
    stage: Name | None = None  # for a charge without a reservation (a unit restored on resume)


class Release(Message):
    """Drop a reservation without a charge (the unit never ran)."""

    kind: Literal["budget.release"] = "budget.release"
    item: Name


class LedgerQuery(Message):
    """Ask for the ledger's current state."""

    kind: Literal["budget.query"] = "budget.query"


class BudgetEvent(Message):
    """A ceiling crossed 50, 80 or 100 percent, or an overrun: told to observers."""

    kind: Literal["budget.event"] = "budget.event"
    dimension: Dimension
    level: Literal["50%", "80%", "100%", "overrun"]
    spent: float
    ceiling: float | None = None
    item: Name | None = None


class ReplayJob(Message):
    """Replay one case for one arm and repetition, in a fresh sandboxed workspace."""

    kind: Literal["replay.job"] = "replay.job"
    unit_id: Name
    case_id: Name
    case_ref: ArtifactRef
    tree_ref: ArtifactRef
    arm: Arm
    repetition: int = Field(ge=0, le=10_000)
    """The repetition its command is told (``EVOLANE_REPETITION``): the unit's own, or for the
    arm with fewer repetitions one drawn from the other's (``measure``'s shown_repetition)."""
    seed: int = Field(ge=0, le=2**63 - 1)
    timeout_seconds: float = Field(gt=0, le=86_400)
    name: Name | None = None
    """What a replay command sees of the unit (``EVOLANE_UNIT``, its folder's name): an
    opaque name (`evolane.lanes.blind_name`), never the unit id, which names its arm,
    measurement and split; None: a random one. An in-process backend gets the unit id."""


class ReplayResult(Message):
    """What a replay produced: a status, refs to its outputs, usage, and a failure event."""

    kind: Literal["replay.result"] = "replay.result"
    unit_id: Name
    case_id: Name
    arm: Arm
    repetition: int = Field(ge=0, le=10_000)
    status: UnitStatus
    failure: FailureEvent | None = None
    output_ref: ArtifactRef | None = None
    stdout_ref: ArtifactRef | None = None
    stderr_ref: ArtifactRef | None = None
    usage: Usage = Usage()
    usage_complete: bool = False
    wall_seconds: float = Field(default=0.0, ge=0, le=_BIG)
    attempts: int = Field(default=1, ge=0, le=100)
    name: Name | None = None
    """The name its command ran under (`ReplayJob.name`), to find what it logged."""
    blocked_by: Name | None = None

    @classmethod
    def without_output(
        cls, job: ReplayJob, status: UnitStatus, failure: FailureEvent | None = None
    ) -> ReplayResult:
        """The result of ``job`` when it produced nothing (it failed, or was cancelled)."""
        return cls(
            unit_id=job.unit_id,
            case_id=job.case_id,
            arm=job.arm,
            repetition=job.repetition,
            status=status,
            failure=failure,
        )


class JudgeJob(Message):
    """Score one replay output."""

    kind: Literal["judge.job"] = "judge.job"
    unit_id: Name
    case_id: Name
    case_ref: ArtifactRef
    output_ref: ArtifactRef
    tree_ref: ArtifactRef
    seed: int = Field(ge=0, le=2**63 - 1)
    timeout_seconds: float = Field(gt=0, le=86_400)
    name: Name | None = None
    """What a judge command sees of the unit (its folder's name, with ``-judge``): its
    replay's opaque name (`ReplayJob.name`), never the unit id; None: a random one. A judge
    may run the candidate's code or the replay's output (``pytest {candidate}``, a
    verification command running an answer), which must not learn its arm or split."""


class JudgeResult(Message):
    """A score in [0, 1], or an infrastructure failure (never a score of 0)."""

    kind: Literal["judge.result"] = "judge.result"
    unit_id: Name
    status: Literal["succeeded", "failed", "cancelled"]
    score: float | None = Field(default=None, ge=0.0, le=1.0)
    source: Literal["command", "verification_command", "exact_match"]
    failure: FailureEvent | None = None
    detail_ref: ArtifactRef | None = None
    attempts: int = Field(default=1, ge=0, le=100)
    wall_seconds: float = Field(default=0.0, ge=0, le=_BIG)
    usage: Usage = Usage()
    """What the judge's attempts used together (a model judge's tokens and dollars)."""
    usage_complete: bool = False
    """Every attempt reported its usage (else the charge is at least the reservation)."""


class MeasureRequest(Message):
    """Measure a candidate tree against a baseline tree on a split (or a few cases)."""

    kind: Literal["measure.request"] = "measure.request"
    measurement_id: Name
    baseline_ref: ArtifactRef
    candidate_ref: ArtifactRef | None = None  # None: measure the baseline alone
    split: Literal["train", "val", "test"] = "val"
    case_ids: tuple[Name, ...] = Field(  # screening: a few cases, each once
        default=(), max_length=8, json_schema_extra={"uniqueItems": True}
    )
    skip_case_ids: tuple[Name, ...] = Field(default=(), max_length=8)
    """Cases of the split not read, with every case of their clusters: a screening chose
    the candidate on them, so their pairs are not independent of its selection."""
    baseline_repetitions: int | None = Field(default=None, ge=1, le=100)
    candidate_repetitions: int | None = Field(default=None, ge=1, le=100)
    gate: GateConfig = GateConfig()
    early_accept: bool = True
    """False: an early stop may reject but never accept (online error control reads the
    p-value of the full evaluation, which a data-chosen stop would make invalid)."""
    fresh: bool = False
    """True: no unit is reused from another measurement of the run, so both arms are
    replayed in this one's window, each baseline beside its candidate (online error control
    re-measures a parent this way before it accepts a candidate whose baseline replays came
    from an earlier window: a drift of the replays' world would favour the candidate)."""

    @field_validator("case_ids")
    @classmethod
    def _each_case_once(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """A case named twice would plan two units under one id (and count it twice)."""
        if len(set(value)) != len(value):
            raise ValueError("must name each case once")
        return value


class MeasureSummary(Message):
    """The outcome of a measurement; the per-unit records are in the store (``units_ref``)."""

    kind: Literal["measure.summary"] = "measure.summary"
    measurement_id: Name
    status: MeasureStatus
    message: Said = ""
    gate: GateResult
    units_planned: int
    units_run: int
    units_reused: int
    units_restored: int = 0  # taken from the journal of an interrupted run
    units_failed: int  # failed or timed out
    units_cancelled: int = 0  # stopped on purpose (early stop, a stop of the run)
    units_blocked: int
    units_not_run: int
    cases_compared: int
    wall_seconds: float
    units_ref: ArtifactRef
