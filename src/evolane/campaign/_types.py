"""The campaign actor's messages, setup and result, and the small helpers its cycle uses."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

import trio

from evolane.actors import ActorRef
from evolane.campaign._book import Book, SlotBook
from evolane.campaign._config import CampaignConfig
from evolane.campaign._gates import GateSettings
from evolane.campaign._report import MeasurementRecord, Scores
from evolane.campaign._runs import RejectedEdit, ResumeState
from evolane.lanes import StopBoard
from evolane.measure import Pipeline, ProgressBus, RunJournal
from evolane.messages import (
    ArtifactRef,
    FailureEvent,
    Message,
    ProposeResult,
    SlotEvent,
)
from evolane.sandbox import SandboxHost
from evolane.store import BlobStore

Stop = Literal["budget_limited", "exhausted", "interrupted", "failed"]


class RunCampaign(Message):
    """Run the campaign's cycle to its end (or its deadline); answers `CampaignDone`."""

    kind: Literal["campaign.run"] = "campaign.run"
    deadline: float | None = None  # trio clock: the wall-clock budget's end


class CampaignDone(Message):
    """How the cycle ended; the details are in the `CampaignResult` handed to the caller."""

    kind: Literal["campaign.done"] = "campaign.done"
    stop: Literal["finished", "budget_limited", "exhausted", "interrupted", "failed"]


@dataclass
class CampaignSetup:
    """What the campaign actor is given at start: settings, refs and the run's shared objects."""

    config: CampaignConfig
    run_id: str
    cycle: int
    store: BlobStore
    host: SandboxHost
    pipeline: Pipeline
    optimizers: list[ActorRef]
    optimizer_board: StopBoard
    budget: ActorRef
    journal: RunJournal
    bus: ProgressBus
    gates: GateSettings
    seed_ref: ArtifactRef
    parent_ref: ArtifactRef
    stalled: int
    rejected: list[RejectedEdit]
    resume: ResumeState
    has_test: bool
    optimizer_allowed: bool = True  # False when re-judging stored work: proposals come from it
    seen: tuple[str, ...] = ()  # tree digests of the campaign's earlier candidates, oldest first
    interrupt: trio.Event = field(default_factory=trio.Event)


@dataclass
class CampaignResult:
    """What the cycle produced, for the report (filled in place as the run goes)."""

    book: Book = field(default_factory=Book)
    best_ref: ArtifactRef | None = None
    best_delta: float | None = None
    stalled: int = 0
    rejected: list[RejectedEdit] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)  # every candidate digest so far, oldest first
    stop: str = "finished"
    message: str = ""
    scores: Scores = field(default_factory=Scores)
    test: MeasurementRecord | None = None
    finalized: bool = False
    wall_clock_hit: bool = False  # budget_limited by the run's deadline, not a ceiling


def slot_seed(seed: int, cycle: int, iteration: int, slot: int) -> int:
    """The optimizer's seed for one slot: distinct per slot, the same on a resume."""
    digest = hashlib.sha256(f"{seed}:{cycle}:{iteration}:{slot}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


class Stopped(Exception):
    """The cycle ends before its last iteration: how (``stop``) and why (``message``)."""

    def __init__(self, stop: Stop, message: str) -> None:
        super().__init__(message)
        self.stop, self.message = stop, message


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
