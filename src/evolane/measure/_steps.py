"""The measurement plan's vocabulary: the events its shell tells it (each answers one action)
and the actions it asks of the shell (`evolane.measure._plan`)."""

from __future__ import annotations

from dataclasses import dataclass

from evolane.messages import (
    Debit,
    JudgeJob,
    JudgeResult,
    MeasureStatus,
    ReplayJob,
    ReplayRecord,
    ReplayResult,
    UnitRecord,
)

# ----- events: what the shell tells the plan ----------------------------------------------


@dataclass(frozen=True, slots=True)
class _OfUnit:
    """An event or action about one unit."""

    unit_id: str


@dataclass(frozen=True, slots=True)
class UnitReplayed(_OfUnit):
    """A replay lane answered `StartReplay` (a lane that crashed: a framework failure)."""

    replay: ReplayResult


@dataclass(frozen=True, slots=True)
class ReserveDenied(_OfUnit):
    """The budget refused room for the replay of `StartReplay`; nothing ran."""


@dataclass(frozen=True, slots=True)
class JudgeDenied(_OfUnit):
    """The budget refused room for the judgement of `StartJudge`; nothing ran (the replay
    stays journaled: a resume judges it)."""


@dataclass(frozen=True, slots=True)
class UnitCharged(_OfUnit):
    """The budget took the debit of `ChargeUnit`."""


@dataclass(frozen=True, slots=True)
class ReplayJournaled(_OfUnit):
    """The record of `JournalReplay` is in the journal."""


@dataclass(frozen=True, slots=True)
class UnitJudged(_OfUnit):
    """A judge lane answered `StartJudge` (a lane that crashed: a framework failure)."""

    judge: JudgeResult


@dataclass(frozen=True, slots=True)
class UnitJournaled(_OfUnit):
    """The record of `JournalUnit` is durably in the journal: the unit may count."""


@dataclass(frozen=True, slots=True)
class StopRequested:
    """Start no more units (``reason``: e.g. ``cancelled``); units in flight end on their own."""

    reason: MeasureStatus
    message: str


Event = (
    (UnitReplayed | ReserveDenied | JudgeDenied | UnitCharged | ReplayJournaled | UnitJudged)
    | UnitJournaled
    | StopRequested
)

# ----- actions: what the plan asks of the shell -------------------------------------------


@dataclass(frozen=True, slots=True)
class StartReplay(_OfUnit):
    """Reserve room in the budget, then replay ``job`` on a free replay lane (the plan never
    starts more than the lanes it was given). Answer `UnitReplayed` or `ReserveDenied`."""

    job: ReplayJob


@dataclass(frozen=True, slots=True)
class ChargeUnit(_OfUnit):
    """Charge ``debits`` to the budget, in order. Answer `UnitCharged`."""

    debits: tuple[Debit, ...]


@dataclass(frozen=True, slots=True)
class JournalReplay(_OfUnit):
    """Append ``record`` to the run journal (need not be durable). Answer `ReplayJournaled`."""

    record: ReplayRecord


@dataclass(frozen=True, slots=True)
class StartJudge(_OfUnit):
    """Reserve room for a judge that may spend (`SchedulerSettings.judge_costs`), judge
    ``job`` on the next free judge lane and charge what it used. Answer `UnitJudged` or
    `JudgeDenied`."""

    job: JudgeJob


@dataclass(frozen=True, slots=True)
class JournalUnit(_OfUnit):
    """Append ``record`` to the run journal durably. Answer `UnitJournaled`."""

    record: UnitRecord


@dataclass(frozen=True, slots=True)
class StopUnit:
    """Stop these units if they are in flight (their lanes answer early). No answer."""

    unit_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class UnitEnded(_OfUnit):
    """A unit that ran, was reused or was restored ended (after its record was journaled,
    when it is): `MeasurePlan.unit_event` describes it for observers. No answer."""


@dataclass(frozen=True, slots=True)
class Progress:
    """Units ended: `MeasurePlan.progress` has news for observers. No answer."""


@dataclass(frozen=True, slots=True)
class Finish:
    """Every unit ended: store `MeasurePlan.records_json`, then build `MeasurePlan.summary`."""


Action = (
    (StartReplay | ChargeUnit | JournalReplay | StartJudge | JournalUnit | StopUnit)
    | UnitEnded
    | Progress
    | Finish
)
