"""Messages of the campaign: optimizer jobs and their results, and local gate verdicts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evolane.messages._base import ArtifactRef, Message, Name, Record, ShortSaid
from evolane.messages._measure import FailureEvent, Usage

LocalGate = Literal[
    "disallowed_entries",
    "no_op",
    "duplicate",
    "protected_paths",
    "size_limit",
    "malformed",
]
"""The cheap checks a candidate passes before it may cost a replay, in the order they run."""

GateOutcome = Literal["pass", "reject", "indecisive"]


class LocalGateResult(Record):
    """One local gate's verdict on a candidate tree; ``indecisive`` is never scored."""

    gate: LocalGate
    outcome: GateOutcome
    reason: ShortSaid = ""
    paths: tuple[ShortSaid, ...] = Field(default=(), max_length=4)  # the first few offenders

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"


class ProposeJob(Message):
    """Run the optimizer once: edit a copy of the parent tree, guided by the prompt file."""

    kind: Literal["optimizer.job"] = "optimizer.job"
    slot_id: Name
    parent_ref: ArtifactRef
    prompt_ref: ArtifactRef
    context_ref: ArtifactRef | None = None  # read-only folder beside the workdir
    seed: int = Field(ge=0, le=2**63 - 1)
    timeout_seconds: float = Field(gt=0, le=86_400)
    idle_seconds: float = Field(gt=0, le=86_400)


class ProposeResult(Message):
    """The candidate tree an optimizer produced, or why there is none (costs the slot only)."""

    kind: Literal["optimizer.result"] = "optimizer.result"
    slot_id: Name
    status: Literal["succeeded", "failed", "timed_out", "idle_killed", "cancelled", "rejected"]
    tree_ref: ArtifactRef | None = None
    gate: LocalGateResult | None = None  # set when the workdir held disallowed entries
    failure: FailureEvent | None = None
    stdout_ref: ArtifactRef | None = None
    stderr_ref: ArtifactRef | None = None
    summary: ShortSaid = ""  # the first line of the optimizer's stdout
    usage: Usage = Usage()
    usage_complete: bool = False
    """Whether ``usage`` counts all it spent (tokens and dollars, nothing cut off): only
    then is it the ledger's sample of what an optimizer call costs."""
    wall_seconds: float = Field(default=0.0, ge=0, le=1e15)
