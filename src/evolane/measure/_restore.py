"""What a resumed run or a re-judge takes from the journal of the run it continues (no IO):
a unit's stored record counts only if it was made on the tree this unit plans."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from evolane.measure._table import Unit
from evolane.measure._units import RESTORABLE
from evolane.messages import Debit, ReplayRecord, ReplayResult, UnitRecord, Usage

if TYPE_CHECKING:
    from evolane.measure._scheduling import SchedulerSettings

_Stored = TypeVar("_Stored", UnitRecord, ReplayRecord)


def _on_tree(
    records: Mapping[str, _Stored], unit: Unit, diverged: dict[str, str]
) -> _Stored | None:
    """The journal's record of ``unit``, if it was made on the tree this unit plans (a unit
    id names no tree: after other decisions the same id can mean another tree); a record on
    another tree is noted in ``diverged`` (unit id -> that tree)."""
    record = records.get(unit.unit_id)
    if record is None:
        return None
    if record.tree is not None and record.tree != unit.tree_ref.digest:  # None: an older journal
        diverged[unit.unit_id] = record.tree[:80]
        return None
    return record


def restorable(
    settings: SchedulerSettings, unit: Unit, diverged: dict[str, str]
) -> UnitRecord | None:
    """The stored record of ``unit`` when it ended in a status a resume takes (`RESTORABLE`)."""
    record = _on_tree(settings.restored, unit, diverged)
    if record is None or record.status not in RESTORABLE or record.replay is None:
        return None
    return record


def stored_replay(
    settings: SchedulerSettings, unit: Unit, diverged: dict[str, str]
) -> ReplayRecord | None:
    """The stored replay of ``unit`` that was not judged before the interruption."""
    return _on_tree(settings.restored_replays, unit, diverged)


def earlier_replay(settings: SchedulerSettings, unit: Unit, key: bytes) -> ReplayResult | None:
    """The replay of the experiment ``key`` (``unit``'s `reuse_key`) that an earlier run of
    the campaign's cycle journaled but a stop left unjudged (`SchedulerSettings.earlier`), as
    ``unit``'s: judged, not replayed again; its spend is in the campaign's books already."""
    record = settings.earlier.get(key)
    if not isinstance(record, ReplayRecord):
        return None
    return record.replay.model_copy(update={"unit_id": unit.unit_id, "arm": unit.arm})


def not_stored(unit: Unit, diverged: Mapping[str, str]) -> str:
    """Why a unit without a stored replay is not run when replays are not allowed."""
    other = diverged.get(unit.unit_id)
    if other is not None:
        return f"the stored run diverged: it replayed {unit.unit_id} on tree {other}"
    return "no stored replay to judge again"


def unpaid_debits(record: UnitRecord) -> tuple[Debit, ...]:
    """What a journaled unit that a resume runs again (not `RESTORABLE`: a stop cut it
    short) spent that nothing charges again: its judge's usage (the samples answered and
    the requests cut off), and its replay's unless that replay succeeded (then it is
    journaled on its own and charged as the run resumes: `stored_replay_debit`). Charged as known:
    the reservation an unknown amount was charged in its session is not journaled."""
    debits: list[Debit] = []
    replay, judge = record.replay, record.judge
    if replay is not None and replay.status != "succeeded" and _spent(replay.usage):
        debits.append(
            Debit(
                item=record.unit,
                actual=replay.usage,
                complete=replay.usage_complete,
                stage="replay",
            )
        )
    if judge is not None and _spent(judge.usage):
        debits.append(
            Debit(
                item=record.unit, actual=judge.usage, complete=judge.usage_complete, stage="judge"
            )
        )
    return tuple(debits)


def restored_debits(
    record: UnitRecord, earlier: Mapping[bytes, UnitRecord | ReplayRecord]
) -> tuple[Debit, ...]:
    """What a journaled unit a resume takes (`RESTORABLE`) spent, charged once as the run
    resumes, whether its measurement reads it again or not (an early stop reached sooner
    can leave it unread, and its spend was real): its judgement, and its replay unless an
    earlier run of the cycle made that replay (``earlier``: the campaign's books hold it)."""
    replay, judge = record.replay, record.judge
    if record.status not in RESTORABLE or replay is None:
        return ()
    taken = {
        stored.replay.name
        for stored in earlier.values()
        if isinstance(stored, ReplayRecord) and stored.replay.name is not None
    }
    debits: list[Debit] = []
    if replay.name is None or replay.name not in taken:
        usage, complete = replay.usage, replay.usage_complete
        debits.append(Debit(item=record.unit, actual=usage, complete=complete, stage="replay"))
    if judge is not None and _spent(judge.usage):
        usage, complete = judge.usage, judge.usage_complete
        debits.append(Debit(item=record.unit, actual=usage, complete=complete, stage="judge"))
    return tuple(debits)


def stored_replay_debit(record: ReplayRecord) -> Debit | None:
    """What a replay journaled before an interruption and not judged then spent: charged
    once as the run resumes, whether the resume judges it or not (an early stop or a
    decision reached first can leave it unjudged for good, and its spend was real)."""
    replay = record.replay
    if not _spent(replay.usage):
        return None
    return Debit(
        item=record.unit, actual=replay.usage, complete=replay.usage_complete, stage="replay"
    )


def _spent(usage: Usage) -> bool:
    return bool(usage.tokens or usage.cost_usd)


def replay_names(records: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The unit id of each name a replay command ran under (``EVOLANE_UNIT``,
    `evolane.messages.ReplayJob.name`) in journal ``records`` (as `evolane.store.read_journal`
    reads them): how what a command logged is matched to its unit."""
    found: dict[str, str] = {}
    for record in records:
        replay = record.get("replay")
        name = replay.get("name") if isinstance(replay, Mapping) else None
        if isinstance(name, str) and isinstance(record.get("unit"), str):
            found[name] = record["unit"]
    return found
