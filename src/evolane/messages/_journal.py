"""The records of a run's journal (``runs/<id>/journal.jsonl``, DESIGN §7), told apart by
``type``: a judged unit, a replay not judged yet, an optimizer proposal.

A record's JSON is the journal line, key for key, so stores written before these models
existed resume as they are (``tree`` is optional: older journals lack it). A line this
evolane does not know is refused with one line naming it, never half read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError

from evolane.messages._base import Digest, Name, Record
from evolane.messages._measure import JudgeResult, ReplayResult, UnitStatus
from evolane.messages._optimize import ProposeResult

ReuseKey = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$", max_length=32)]
"""A unit's reuse key (`evolane.measure`'s 16-byte digest of what its experiment was), in hex."""


class UnitRecord(Record):
    """A unit that ended (durably journaled before it counts): the source a resume restores."""

    type: Literal["unit"] = "unit"
    measurement: Name
    unit: Name
    tree: Digest | None = None  # the tree it ran on; None in journals older than the field
    status: UnitStatus
    reused: bool = False
    replay: ReplayResult | None = None
    judge: JudgeResult | None = None
    key: ReuseKey | None = None
    """A succeeded unit's reuse key (hex): the next run of the same cycle of its campaign
    (after a wall-clock stop) reuses it for the same experiment. None in older journals (and
    for units that did not succeed): never reused across runs."""


class ReplayRecord(Record):
    """A replay that succeeded, journaled before its judgement: a resume only judges it."""

    type: Literal["replay"] = "replay"
    measurement: Name
    unit: Name
    tree: Digest | None = None  # as in `UnitRecord`
    replay: ReplayResult
    key: ReuseKey | None = None
    """Its unit's reuse key (hex): the next run of the same cycle of its campaign (after a
    wall-clock stop cut its judgement) judges it instead of replaying it. None in older
    journals: never taken across runs."""


class ProposalRecord(Record):
    """An optimizer slot's proposal: a resume takes it instead of asking the optimizer again."""

    type: Literal["proposal"] = "proposal"
    slot: Name
    result: ProposeResult
    parent: Digest | None = None
    """The tree it was asked to improve: the next run of the same cycle of its campaign
    (after a wall-clock stop) takes it for the same slot and parent instead of asking the
    optimizer again. None in older journals: never taken across runs."""


JournalRecord = Annotated[UnitRecord | ReplayRecord | ProposalRecord, Field(discriminator="type")]
"""Any record of a run's journal (a pydantic discriminated union on ``type``)."""

JOURNAL_RECORDS: dict[str, type[Record]] = {
    "unit": UnitRecord,
    "replay": ReplayRecord,
    "proposal": ProposalRecord,
}
"""Every journal record class, by its ``type``."""

_ADAPTER: TypeAdapter[JournalRecord] = TypeAdapter(JournalRecord)


class JournalRecordError(ValueError):
    """A journal line that is not a record this evolane knows (the store's version differs)."""


def parse_journal_record(value: Mapping[str, Any], where: str) -> JournalRecord:
    """The typed record of one journal line's object; ``where`` names the line (path:line).

    Raises `JournalRecordError` (one line, naming ``where``) for an unknown ``type`` or a
    record that does not match its type's fields.
    """
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in JOURNAL_RECORDS:
        raise JournalRecordError(
            f"{where}: journal record of unknown type {str(kind)[:40]!r}: the store was "
            "written by a newer or older evolane"
        )
    try:
        return _ADAPTER.validate_python(dict(value))
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"][1:]) or "record"
        raise JournalRecordError(
            f"{where}: unreadable {kind} record ({field}: {first['msg']}): the store was "
            "written by a newer or older evolane"
        ) from None
