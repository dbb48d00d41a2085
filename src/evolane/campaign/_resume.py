"""What a run's journal gives the session that continues it (`read_resume_state`): the units
and replays a resume restores, the proposals it takes, what cut attempts spent."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evolane.inputs import InputError
from evolane.measure import RESTORABLE, stored_replay_debit, unpaid_debits
from evolane.messages import (
    Debit,
    JournalRecordError,
    ProposalRecord,
    ReplayRecord,
    UnitRecord,
    parse_journal_record,
)
from evolane.store import JournalCorruptError, read_journal


@dataclass
class ResumeState:
    """What an interrupted run's journal holds: finished units and optimizer proposals."""

    units: dict[str, UnitRecord] = field(default_factory=dict)
    replays: dict[str, ReplayRecord] = field(default_factory=dict)  # replayed, not judged
    proposals: dict[str, ProposalRecord] = field(default_factory=dict)
    unpaid: list[Debit] = field(default_factory=list)
    """What units and optimizer calls a stop cut short spent, every session's (a resume runs
    them again), and the replays journaled unjudged (``replays``: judged, if at all, free)."""
    keyed: dict[bytes, UnitRecord | ReplayRecord] = field(default_factory=dict)
    """By reuse key: the succeeded units, then the replays not judged (``replays``)."""
    earlier: dict[bytes, UnitRecord | ReplayRecord] = field(default_factory=dict)
    """The ``keyed`` records of the campaign's earlier runs of this cycle (`earlier_results`)."""
    earlier_proposals: dict[tuple[str, str], ProposalRecord] = field(default_factory=dict)
    """Their ``proposals``, by slot and parent digest: taken, not asked again nor charged."""
    host_failed: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    """The earlier runs of the cycle that failed on the host's failure in measuring a
    candidate, by its slot id and tree digest (`host_failed_runs`)."""
    torn: bool = False

    def __post_init__(self) -> None:
        self.prune()

    def prune(self) -> None:
        """Drop replay records of units whose judged record a resume restores."""
        for unit, record in self.units.items():
            if record.status in RESTORABLE:
                self.replays.pop(unit, None)

    @property
    def empty(self) -> bool:
        return not self.units and not self.proposals


def cut_proposal_debit(record: ProposalRecord) -> Debit:
    """What an optimizer call a stop cut short spent (its usage as the lane saw it: a model's
    answered and cut requests), charged as known: the reservation an unknown amount was
    charged in its session is not journaled."""
    result = record.result
    return Debit(
        item=record.slot, actual=result.usage, complete=result.usage_complete, stage="optimizer"
    )


_VERSION_HINT = ": the store was written by a newer or older evolane"


def read_resume_state(journal: Path) -> ResumeState:
    """Collect the journal's unit, replay and proposal records (the last of an id wins).

    Raises `InputError` (one line naming the journal line) for a line that is not a record
    this evolane writes: one of an unknown type (a newer or older evolane wrote it), one
    that does not validate or a damaged line before the last (`evolane fsck` finds both).
    """
    state = ResumeState()
    if not journal.exists():
        return state
    fsck = f"run `evolane fsck --store {journal.parent.parent.parent}`"
    try:
        read = read_journal(journal)
    except JournalCorruptError as error:
        raise InputError(f"{error}; {fsck}") from None
    state.torn = read.torn is not None
    for line, value in enumerate(read.records, start=1):  # records are lines 1..n, in order
        try:
            record = parse_journal_record(value, f"{journal}:{line}")
        except JournalRecordError as error:
            text = str(error)
            if "unknown type" not in text:  # a known type that does not validate: damage
                text = f"{text.removesuffix(_VERSION_HINT)}; {fsck}"
            raise InputError(text) from None
        if isinstance(record, UnitRecord):
            state.units[record.unit] = record
            if record.key is not None and record.status == "succeeded":
                state.keyed[bytes.fromhex(record.key)] = record
            if record.status not in RESTORABLE:  # each session's cut attempt: none is charged again
                state.unpaid.extend(unpaid_debits(record))
        elif isinstance(record, ReplayRecord):
            state.replays[record.unit] = record
        elif record.result.status == "cancelled":  # cut: charged again, never the slot's result
            state.unpaid.append(cut_proposal_debit(record))
        else:
            state.proposals[record.slot] = record
    state.prune()
    for replay in state.replays.values():  # after the units: a succeeded one serves first
        if replay.key is not None:
            state.keyed.setdefault(bytes.fromhex(replay.key), replay)
        debit = stored_replay_debit(replay)  # judged or not by the resume: charged once here
        if debit is not None:
            state.unpaid.append(debit)
    return state
