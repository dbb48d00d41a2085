"""What the campaign actor is started with (setup and services), the outcome it stores, its
slot names, and the small helpers its cycle uses."""

from __future__ import annotations

import errno
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from evolane.campaign._book import Book, SlotBook, settled_digests
from evolane.campaign._config import CampaignConfig, FeedbackSplit
from evolane.campaign._confirm import ConfirmationRecord
from evolane.campaign._gates import GateSettings
from evolane.campaign._held_out import SplitLooks
from evolane.campaign._online import (
    Mode,
    OnlineBudget,
    OnlineRule,
    campaign_alpha,
    opening_budget,
    resolved_mode,
)
from evolane.campaign._report import CycleReport, MeasurementRecord, Scores
from evolane.campaign._resume import ResumeState
from evolane.campaign._runs import (
    REJECTED_KEPT,
    CampaignState,
    RejectedEdit,
    RunRecord,
)
from evolane.lanes import OPTIMIZER_ENDPOINT_FAILED
from evolane.measure import MeasureSlots, ProgressBus, RunJournal, lane_names
from evolane.messages import (
    ArtifactRef,
    CycleStop,
    FailureEvent,
    MeasureSummary,
    ProposeResult,
    Record,
    ShortText,
    SlotEvent,
    Text,
)
from evolane.sandbox import SandboxHost
from evolane.stats import seed_for
from evolane.store import BlobStore

Stop = Literal["budget_limited", "exhausted", "interrupted", "failed"]
_MANY = 1_000_000  # as many digests as a campaign may have seen


@dataclass(frozen=True)
class RunSlots(MeasureSlots):
    """The slot names of a run's tree (``prefix`` is ``run-<id>``): the measurement's, the
    optimizer lanes' pool and the campaign actor."""

    @property
    def optimizer(self) -> str:
        """The optimizer lanes' pool."""
        return f"{self.prefix}.optimizer"

    @property
    def campaign(self) -> str:
        """The campaign actor."""
        return f"{self.prefix}.campaign"

    def optimizers(self, count: int) -> list[str]:
        """The optimizer lanes' slot names."""
        return lane_names(self.optimizer, count)


@dataclass(frozen=True)
class CampaignSetup:
    """What the campaign actor is started with: its settings and gates, the run's record (ids,
    seed and parent trees), the campaign's record (the state a cycle carries on from), and
    its peers' slot names."""

    config: CampaignConfig
    gates: GateSettings
    run: RunRecord
    campaign: CampaignState
    slots: RunSlots
    test_cases: int
    optimizer_allowed: bool = True  # False when re-judging stored work: proposals come from it
    feedback_split: FeedbackSplit = "train"  # whose results the optimizer sees (`_splits`)
    trace_reasons: Mapping[str, str] = field(default_factory=dict)
    """Case id -> the recorded trace's excerpt of a failure (a run from trajectories): the
    optimizer's failure index (`campaign._prompt`)."""

    @property
    def has_test(self) -> bool:
        """Whether the dataset has a sealed test split (the best is confirmed on it)."""
        return self.test_cases > 0

    @property
    def error_control(self) -> Mode:
        """The campaign-level error control this cycle runs (``auto`` resolved)."""
        return resolved_mode(self.config.error_control, self.test_cases)

    @property
    def confirms(self) -> bool:
        """Whether an accepted best is confirmed on the test split before a publish."""
        return self.error_control == "confirm" and self.has_test

    def online_budget(self) -> OnlineBudget | None:
        """The error budget this cycle continues (``online`` mode): the campaign's stored
        one, else a fresh one over the cycles left; None in other modes."""
        if self.error_control != "online":
            return None
        if self.campaign.online is not None:
            return self.campaign.online
        return opening_budget(self.config, self._cycles_left())

    def confirmation_budget(self) -> OnlineBudget:
        """The campaign's confirmation budget: its stored one, else alpha = 1 - confidence
        over the cycles it has left (one confirmation a cycle at most). A best with no true
        gain tested once a cycle would otherwise get a fresh chance each cycle (found by
        review: 12.8% published over 5 cycles, where a single test holds 3.5%)."""
        if self.campaign.confirmations is not None:
            return self.campaign.confirmations
        alpha = campaign_alpha(self.config)
        return OnlineBudget(alpha=alpha, horizon=max(1, self._cycles_left()))

    def replaced_by(self, best: ArtifactRef) -> ArtifactRef:
        """The tree a publish of ``best`` would replace, which it is confirmed against: what
        an earlier cycle published, else the seed (a later cycle confirmed against the seed
        published a tree worse than the one the target held: found by review)."""
        applied = self.campaign.applied_ref
        if applied is not None and applied.digest != best.digest:
            return applied
        return self.seed_ref

    def _cycles_left(self) -> int:
        campaign = self.campaign
        return max(self.config.max_improvement_cycles, campaign.max_cycles) - campaign.cycles

    @property
    def run_id(self) -> str:
        """The run's id (from its record)."""
        return self.run.run_id

    @property
    def cycle(self) -> int:
        """Which cycle of the campaign this run is (from its record)."""
        return self.run.cycle

    @property
    def seed_ref(self) -> ArtifactRef:
        """The target's tree when the campaign began."""
        return self.run.seed_ref


@dataclass(frozen=True)
class CampaignServices:
    """The live objects the campaign actor uses, each because a message cannot do its job:

    - ``store``: payloads (prompts, contexts, unit records, the outcome) never travel in
      messages; they are blobs, and the store is a file service, not an actor.
    - ``host``: runs the validator gate's command in the sandbox (spawning is a service).
    - ``journal``: the run's one durable writer, shared with the scheduler (a record may
      exceed a message); the campaign appends the proposals a resume takes.
    - ``bus``: the progress fan-out to the events file and observers (lossy, never blocks).
    - ``resume``: what the journal of an interrupted run holds (read only).
    - ``case_refs``: the stored cases as replays see them (read only), for the optimizer's
      context.
    - ``clusters``: per case id, its cluster (read only): online control and the
      confirmation test clustered cases by cluster (`stats.cluster_means`).
    - ``looks``: records in the store's ledgers of the held-out splits that a look at one
      begins, before its first replay (blocking): `campaign._held_out.SplitLooks`.
    """

    store: BlobStore
    host: SandboxHost
    journal: RunJournal
    bus: ProgressBus
    resume: ResumeState
    case_refs: Mapping[str, ArtifactRef]
    clusters: Mapping[str, str] = field(default_factory=dict)
    looks: SplitLooks | None = None


class CycleOutcome(Record):
    """How one cycle ended and what it produced, for the report and the campaign's state:
    stored as a blob when the cycle ends (`CampaignDone` carries its ref)."""

    stop: CycleStop = "finished"
    message: Text = ""
    wall_clock_hit: bool = False  # budget_limited by the run's deadline, not a ceiling
    best_ref: ArtifactRef | None = None
    stalled: int = Field(default=0, ge=0)
    rejected: tuple[RejectedEdit, ...] = Field(default=(), max_length=REJECTED_KEPT)
    seen: tuple[ShortText, ...] = Field(default=(), max_length=_MANY)  # oldest first
    report: CycleReport = CycleReport()


@dataclass
class CycleState:
    """One cycle's working state, owned by the campaign actor alone: the parent it climbs
    from, the digests it has seen, its best tree, stall count, rejected-edit memory, the
    book the report is made of, and how it ended."""

    parent: ArtifactRef
    stalled: int
    rejected: list[RejectedEdit]
    seen: set[str]
    parent_units: list[dict[str, Any]] = field(default_factory=list)
    best_ref: ArtifactRef | None = None
    book: Book = field(default_factory=Book)
    stop: CycleStop = "finished"
    message: str = ""
    scores: Scores = field(default_factory=Scores)
    test: MeasurementRecord | None = None
    confirmation: ConfirmationRecord | None = None
    confirmations: OnlineBudget | None = None  # the campaign's, with this cycle's attempt
    wall_clock_hit: bool = False
    online: OnlineRule | None = None  # the campaign's acceptance rule in ``online`` mode

    @classmethod
    def starting(cls, setup: CampaignSetup) -> CycleState:
        """The state a cycle starts in: from the run's parent, with the campaign's memory
        (its online error budget included)."""
        parent, campaign = setup.run.parent_ref, setup.campaign
        budget = setup.online_budget()
        return cls(
            parent=parent,
            best_ref=parent,
            stalled=campaign.stalled,
            rejected=list(campaign.rejected),
            seen={parent.digest, *campaign.seen},
            online=OnlineRule(budget) if budget is not None else None,
        )

    def stopped(self, timed_out: bool) -> None:
        """The cycle was cut short: by its wall-clock deadline (``budget_limited``) when
        ``timed_out``, else by a graceful stop (``interrupted``, resumable)."""
        self.wall_clock_hit = timed_out
        self.stop = "budget_limited" if timed_out else "interrupted"
        self.message = "the wall-clock budget ran out" if timed_out else "interrupted: resumable"

    def outcome(self, seen_before: tuple[str, ...]) -> CycleOutcome:
        """The cycle's outcome (``seen_before``: the campaign's digests when it began)."""
        book = self.book
        report = CycleReport(
            scores=self.scores,
            test=self.test,
            confirmation=self.confirmation,
            online=self.online.budget if self.online is not None else None,
            confirmations=self.confirmations,
            iterations=tuple(book.iterations),
            measurements=tuple(book.measurements),
            funnel=tuple(slot.record() for slot in book.funnel),
            decisions=tuple(book.decisions),
            lineage=tuple(book.lineage),
            failures=tuple(book.failures),
        )
        return CycleOutcome(
            stop=self.stop,
            message=self.message[:2048],
            wall_clock_hit=self.wall_clock_hit,
            best_ref=self.best_ref,
            stalled=self.stalled,
            rejected=tuple(self.rejected),
            seen=tuple(settled_digests(seen_before, book.decisions)),
            report=report,
        )


def slot_seed(seed: int, cycle: int, iteration: int, slot: int) -> int:
    """The optimizer's seed for one slot: distinct per slot, the same on a resume."""
    return seed_for(seed, cycle, iteration, slot)


class Stopped(Exception):
    """The cycle ends before its last iteration: how (``stop``) and why (``message``)."""

    def __init__(self, stop: Stop, message: str) -> None:
        super().__init__(message)
        self.stop, self.message = stop, message


class HostFailed(Stopped):
    """The cycle ends ``failed``: a measurement stopped on the host's failure (see
    `shared_failure_line`), not on a candidate's."""

    def __init__(self, message: str) -> None:
        super().__init__("failed", message)


CANNOT_RUN = frozenset({"spawn_failed", "exit_126", "exit_127"})
"""Optimizer failures no retry mends: its command did not start for want of its program
(`MISSING_PROGRAM`), or its shell could not run a program it names (126 not executable, 127
not found)."""
MISSING_PROGRAM = (errno.ENOENT, errno.EACCES, errno.ENOEXEC)
"""The errno of a ``spawn_failed`` (`FailureEvent.spawn_errno`, never its message's text)
when the program is missing or cannot be executed.
Any other spawn failure (EAGAIN, ENOMEM, EMFILE, a cgroup it could not join, an injected
`evolane.testing.Chaos` refusal) may pass: it costs its slot only (found by review: a
transient one on every call of an iteration failed the run)."""


def _cannot_run(failure: FailureEvent) -> bool:
    """Whether ``failure`` says the optimizer's command cannot run (see `CANNOT_RUN`)."""
    if failure.code == "spawn_failed":
        return failure.spawn_errno in MISSING_PROGRAM
    return failure.code in CANNOT_RUN


LANES_GONE = frozenset({"ActorStopped", "NotAnswered"})
"""The codes of a proposal whose optimizer lane was down: its pool's supervisor gave up after
more crashes than it absorbs (`evolane.measure.lane_pool`), so every later call fails alike."""
LANE_BROKE = LANES_GONE | {"ActorCrashed", "AskTimeout"}
"""The codes of a proposal lost because its lane broke (crashed, down, hung): a bug of
evolane's, never the optimizer's failure."""


def optimizer_down(results: list[ProposeResult], last_crash: str | None = None) -> str | None:
    """Why the run cannot go on when the optimizer lanes are down (their supervisor gave up
    after repeated crashes: evolane's failure, ``last_crash`` the last one's text), or every
    proposal of an iteration failed on the optimizer's model endpoint (HTTP 5xx, 401, the
    network), or every one because its command cannot run (`CANNOT_RUN`: a missing agent CLI,
    a script path wrong): the next ones would too. None otherwise (found by review: each
    ended finished, a campaign complete that tried nothing; a crash alone costs its slot)."""
    failures = [r.failure for r in results if r.failure is not None]
    if any(f.owner == "framework" and f.code in LANES_GONE for f in failures):
        crash = f"; the last crash: {last_crash}" if last_crash else ""
        return (
            "the optimizer lanes are down: their supervisor gave up after repeated crashes "
            f"(evolane's failure, not the optimizer's){crash}"
        )
    if not failures or len(failures) < len(results):
        return None
    first, said = failures[0], failures[0].message[-300:].strip()
    if all(f.code == OPTIMIZER_ENDPOINT_FAILED for f in failures):
        return f"the optimizer's model endpoint failed on every call ({said})"
    if all(_cannot_run(f) for f in failures):
        shown = first.code.replace("_", " ", 1) if first.code.startswith("exit_") else None
        return (
            f"the optimizer's command cannot run: {shown or 'did not start'} on every call "
            f"({said or 'no output'})"
        )
    return None


def shared_failure_line(summary: MeasureSummary) -> str:
    """Why a run stops when a measurement stopped as a shared failure (a replay that could not
    start, a lost Dask cluster): the host's failure, never a candidate's, so no decision may
    stand on the pairs it cut short (found by review: the run went on, published on partial
    pairs or none, and ended ``finished``, a campaign ``complete``, exit 0)."""
    return (
        f"measurement {summary.measurement_id} stopped: {summary.message[:300]} "
        "(the host's failure, not a candidate's: nothing was decided on it)"
    )


def not_stored(slot_id: str) -> ProposeResult:
    """The failed proposal of a re-evaluation slot the judged run has no proposal for."""
    failure = FailureEvent(
        owner="framework",
        stage="optimizer",
        code="not_stored",
        message="a re-evaluation runs no optimizer, and the run it judges has no proposal here",
    )
    return ProposeResult(slot_id=slot_id, status="failed", failure=failure)


def failure_text(result: ProposeResult) -> str:
    """Why a proposal did not succeed, in one short line (its failure, else its status)."""
    if result.failure is not None:
        return f"{result.failure.code} {result.failure.message}".strip()[:200]
    return result.status


def slot_id(cycle: int, iteration: int, slot: int) -> str:
    """A candidate slot's id, the same on a resume: ``c<cycle>.i<iteration>.s<slot>``. Its
    measurements are named after it: the slot id (paired) and ``<slot id>.<purpose>``."""
    return f"c{cycle}.i{iteration}.s{slot}"


_SLOT_ID = re.compile(r"c(\d+)\.i(\d+)\.s(\d+)(?:\.|$)")


def slot_of(measurement_id: str) -> tuple[int, int, int] | None:
    """The candidate slot (cycle, iteration, slot) a measurement is of, read from its id
    (see `slot_id`); None for a parent's baseline or a final measurement."""
    found = _SLOT_ID.match(measurement_id)
    return None if found is None else (int(found[1]), int(found[2]), int(found[3]))


def slot_event(run_id: str, book: SlotBook, stage: str) -> SlotEvent:
    """The progress event for one slot reaching ``stage``."""
    return SlotEvent(
        run_id=run_id,
        iteration=book.iteration,
        slot=book.slot,
        stage=stage,  # type: ignore[arg-type]
        digest=book.digest,
        reason=book.reason,
    )
