"""The measurement plan as an IO-free state machine (in the style of h11): `MeasurePlan.handle`
takes an event, updates the plan and returns the actions its IO shell (the scheduler) must
perform; every action that does IO is answered by exactly one event. No trio, no clock, no
files of its own (ended units' records go to the `SealedRecords` it is given: the shell's
spills them to a scratch file, the default keeps them in memory): property tests drive it
with any completion order.

- A candidate unit starts only after its paired baseline unit succeeded (or was reused);
  a failed control blocks its treatment (``blocked_by``).
- Dispatch follows `start_order` (first repetitions of all cases first, baselines about a
  wave of lanes ahead of their candidates), so pairs complete early and early stop can bite.
- Early stop is judged on the prefix of complete cases in plan order, so the point where
  it stops, and the decision, never depend on completion timing.
- A finished unit is reused (either arm) when tree, case, repetition, seed and every
  fingerprint match: a parent's baseline across its candidates, an accepted candidate's
  results as its baseline in the next iteration; a baseline's failure too once it repeated
  (`FailureStreaks`, after the journal's record); never in a ``fresh`` request.
- Every completed unit is journaled (durably) before it counts, with its tree's digest: a
  resume or re-judge takes a stored unit only for the same unit id on the same tree.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING

from evolane.measure._layout import UnitLayout, reading_order, repetitions, start_order
from evolane.measure._prefix import CasePrefix, decision
from evolane.measure._restore import earlier_replay, not_stored, restorable, stored_replay
from evolane.measure._sealed import SealedRecords
from evolane.measure._steps import (
    Action,
    ChargeUnit,
    Event,
    Finish,
    JournalReplay,
    JournalUnit,
    JudgeDenied,
    Progress,
    ReplayJournaled,
    ReserveDenied,
    StartJudge,
    StartReplay,
    StopRequested,
    StopUnit,
    UnitCharged,
    UnitEnded,
    UnitJournaled,
    UnitJudged,
    UnitReplayed,
)
from evolane.measure._table import Unit, UnitStep, UnitTable
from evolane.measure._units import (
    RESTORABLE,
    blocked_replay,
    judge_job,
    repeating_failure,
    replay_debit,
    replay_job,
    replay_record,
    reuse_key,
    reused_results,
    shared_failure,
    unit_counts,
    unit_event,
    unit_record,
    unit_records_chunks,
    unit_records_json,
    unit_status,
    unsent_judge,
)
from evolane.messages import (
    MeasureEvent,
    MeasureRequest,
    MeasureStatus,
    MeasureSummary,
    ReplayResult,
    UnitEvent,
    UnitRecord,
)
from evolane.stats import clustered

if TYPE_CHECKING:
    from evolane.measure._scheduling import SchedulerSettings
    from evolane.messages import ArtifactRef

__all__ = ["RESTORABLE", "MeasurePlan", "Unit", "repetitions", "start_order"]


class MeasurePlan:
    """One measurement's units, start order, early stop and decision, without IO.

    ``records`` (every ended unit's record, and the succeeded ones by `reuse_key` for reuse)
    outlives the plan: the shell passes the same `SealedRecords` to every measurement and
    the plan puts each unit there as it ends (in memory when none is given). ``budgeted``:
    replays are charged (`ChargeUnit`); ``journaled``: units are journaled before they count.
    """

    def __init__(
        self,
        request: MeasureRequest,
        settings: SchedulerSettings,
        *,
        lanes: int,
        records: SealedRecords | None = None,
        budgeted: bool = False,
        journaled: bool = False,
    ) -> None:
        if lanes < 1:
            raise ValueError(f"a measurement needs at least one replay lane, got {lanes}")
        self.request, self.settings, self.lanes = request, settings, lanes
        self.records = SealedRecords() if records is None else records
        self.budgeted, self.journaled = budgeted, journaled
        self.case_ids, numbers = reading_order(request, settings)
        self.reps = repetitions(request, len(self.case_ids), settings.min_cases)
        self.layout = UnitLayout(request, self.case_ids, self.reps, numbers)
        self.units = UnitTable(request, self.layout, self.case_ids, self.records)
        self.priority = start_order(self.layout, lanes)
        self.stop_reason: MeasureStatus | None = None
        self.message = ""
        self.cutoff: int | None = None  # cases at or beyond this index are not needed
        self.early: tuple[str, str] | None = None  # (decision, reason) of an early stop
        self.diverged: dict[str, str] = {}  # unit id -> the other tree its stored record has
        self._ready: list[tuple[int, int]] = []
        self._free = lanes
        self._left = len(self.units)
        self._actions: list[Action] = []
        self._moved = self._finished = False
        self._sealed: list[Unit] = []  # ended since the last event: compacted at the next
        self._judging = 0  # units judging or rejudging now
        paired = request.candidate_ref is not None
        # Clustered cases are not independent: the gate judges clusters (`decision`), and early
        # stop reads whole clusters, which the reading order keeps together (`CasePrefix`).
        self.clusters = settings.clusters if clustered(self.case_ids, settings.clusters) else None
        prefix = (len(self.case_ids), self.units, request.gate, paired)
        self._prefix = CasePrefix(
            *prefix, allow_accept=request.early_accept, clusters=self.clusters
        )

    # ----- the machine ------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """Whether every unit has ended (`Finish` was returned)."""
        return self._finished

    @property
    def in_flight(self) -> int:
        """How many units hold a replay lane now."""
        return self.lanes - self._free

    def start(self) -> list[Action]:
        """The first actions: units without a control are ready, as many start as lanes."""
        self._compact()
        for unit in self.units:
            if unit.depends_on is None:
                self._make_ready(unit)
        if self.stop_reason is not None:  # stopped before it started: no unit runs
            self._drop_ready(self.stop_reason)
        return self._settle()

    def handle(self, event: Event) -> list[Action]:
        """Take one event; the actions it leads to, in the order to perform them."""
        self._compact()
        if isinstance(event, StopRequested):
            self._stop(event.reason, event.message)
        elif isinstance(event, UnitReplayed):
            self._replayed(self._at(event.unit_id, "replaying"), event.replay)
        elif isinstance(event, ReserveDenied):
            unit = self._at(event.unit_id, "replaying")
            self._stop("budget_limited", "the budget denied a replay")
            self._finish(unit, "not_run", "budget")
        elif isinstance(event, JudgeDenied):
            unit = self._at(event.unit_id, "judging", "rejudging")
            self._judging -= 1
            self._stop("budget_limited", "the budget denied a judge")
            self._unjudged(unit, "budget")
        elif isinstance(event, UnitCharged):
            self._charged(self._at(event.unit_id, "charging"))
        elif isinstance(event, ReplayJournaled):
            self._judge(self._at(event.unit_id, "journaling_replay"))
        elif isinstance(event, UnitJudged):
            unit = self._at(event.unit_id, "judging", "rejudging")
            self._judging -= 1
            unit.judge = event.judge
            why = shared_failure(unit)
            if why is not None and not self._beyond_cutoff(unit):
                self._stop("shared_failure", why)
            self._conclude(unit, journal=True)
        elif isinstance(event, UnitJournaled):
            self._counted(self._at(event.unit_id, "journaling"))
        else:
            raise TypeError(f"not a measurement event: {event!r}")
        return self._settle()

    def unit(self, unit_id: str) -> Unit:
        """The unit ``unit_id`` names; KeyError when it names none of this plan's."""
        unit = self._find(unit_id)
        if unit is None:
            raise KeyError(unit_id)
        return unit

    def _find(self, unit_id: str) -> Unit | None:
        index = self.layout.find(unit_id)
        unit = None if index is None else self.units[index]
        return unit if unit is not None and unit.unit_id == unit_id else None

    def _at(self, unit_id: str, *steps: UnitStep) -> Unit:
        unit = self._find(unit_id)
        if unit is None or unit.step not in steps:
            where = "unknown" if unit is None else unit.step
            raise ValueError(f"unit {unit_id!r} is {where}, not {' or '.join(steps)}")
        return unit

    def _compact(self) -> None:
        """Drop the typed results of the units that ended before this event: the shell has
        performed the actions that read them (`unit_event`), their records keep them."""
        for unit in self._sealed:
            unit.compact()
        self._sealed.clear()

    def _emit(self, action: Action) -> None:
        self._actions.append(action)

    def _settle(self) -> list[Action]:
        """Start ready units on free lanes, then tell progress and the end, once."""
        while self._ready and self._free > 0 and self.stop_reason is None:
            _, index = heapq.heappop(self._ready)
            self._begin(self.units[index])
        if self._moved:
            self._emit(Progress())
            self._moved = False
        if self._left == 0 and not self._finished:
            self._finished = True
            self._emit(Finish())
        actions, self._actions = self._actions, []
        return actions

    # ----- one unit ---------------------------------------------------------------------

    def _begin(self, unit: Unit) -> None:
        """A lane is the unit's: end it at once (stopped, reused, restored), or replay it."""
        self._free -= 1
        unit.holds_lane = True
        if self.stop_reason is not None or self._beyond_cutoff(unit):
            self._unbegun(unit, self.stop_reason or "early_stop")
            return
        key = reuse_key(self.settings, unit)
        fresh = self.request.fresh  # both arms replayed in this window: nothing reused
        cached = None if fresh else self.records.reuse.get(key)
        if cached is not None:  # the same tree, case, repetition and seed: the same experiment
            self._reuse(unit, cached)
            return
        record = restorable(self.settings, unit, self.diverged)
        if record is not None:
            self._restore(unit, record)
            return
        stored = stored_replay(self.settings, unit, self.diverged)
        if stored is not None:  # replayed before an interruption, not yet judged: judge only
            unit.restored, unit.replay = True, stored.replay  # charged as the run resumed
            self._charged(unit)
            return
        failed = None if fresh or unit.arm != "baseline" else self.records.failures.reusable(key)
        if failed is not None:  # it failed so on each try: it would again (after the journal's)
            self._reuse(unit, failed)
            return
        if not self.settings.replays_allowed:
            self._finish(unit, "not_run", not_stored(unit, self.diverged))
            return
        replay = None if fresh else earlier_replay(self.settings, unit, key)
        if replay is not None:  # a stopped run of this cycle replayed it: judge only, no charge
            unit.restored, unit.replay = True, replay
            self._charged(unit)
            return
        unit.step = "replaying"
        self._emit(StartReplay(unit.unit_id, replay_job(self.settings, unit)))
        self._moved = True  # a lane more is busy: observers see it before any unit ends

    def _reuse(self, unit: Unit, number: int) -> None:
        """Take the results of an earlier try of ``unit``'s experiment (sealed record
        ``number``): nothing run, charged or journaled (a resume finds it again alike)."""
        unit.replay, unit.judge = reused_results(self.records.get(number), unit)
        unit.reused = True
        status = unit_status(unit)
        self._finish(unit, status, "reused" if status == "succeeded" else "reused failure")

    def _restore(self, unit: Unit, record: UnitRecord) -> None:
        """Take a unit finished before an interruption from the journal: no rerun, and no
        charge here: what it spent was charged as the run resumed (`restored_debits`), as
        an early stop can leave it unread (not in a re-judge, which judges it anew)."""
        assert record.replay is not None
        unit.replay, unit.judge, unit.restored = record.replay, record.judge, True
        unit.note = "rejudged" if self.settings.rejudge else "restored"
        if self.settings.rejudge:
            unit.judge = None
            if unit.replay.status == "succeeded":
                unit.step = "rejudging"
                self._judging += 1
                self._emit(StartJudge(unit.unit_id, judge_job(self.settings, unit)))
                return
            self._conclude(unit, journal=True)
        else:
            self._conclude(unit, journal=False)

    def _replayed(self, unit: Unit, replay: ReplayResult) -> None:
        unit.replay = replay
        why = shared_failure(unit)
        if why is not None and not self._beyond_cutoff(unit):
            self._stop("shared_failure", why)  # before this lane is handed back: none starts
        if self.budgeted and not (unit.restored and self.settings.rejudge):
            unit.step = "charging"  # its lane frees once charged: the next reserve sees it
            self._emit(ChargeUnit(unit.unit_id, (replay_debit(unit),)))
        else:
            self._charged(unit)

    def _charged(self, unit: Unit) -> None:
        assert unit.replay is not None
        self._release_lane(unit)
        if unit.replay.status != "succeeded":
            self._conclude(unit, journal=True)
        elif not unit.restored and self.journaled:  # a resume judges it without replaying it
            unit.step = "journaling_replay"
            key = reuse_key(self.settings, unit)
            record = replay_record(self.request.measurement_id, unit, key)
            self._emit(JournalReplay(unit.unit_id, record))
        else:
            self._judge(unit)

    def _judge(self, unit: Unit) -> None:
        if self.stop_reason is not None or self._beyond_cutoff(unit):  # its replay is kept
            self._unjudged(unit, self.stop_reason or "early_stop")
            return
        unit.step = "judging"
        self._judging += 1
        self._emit(StartJudge(unit.unit_id, judge_job(self.settings, unit)))

    def _unjudged(self, unit: Unit, reason: str, *, journal: bool = True) -> None:
        """A stop came between ``unit``'s replay and its judgement: cancelled and journaled
        as a judge the stop cut is, so its journaled replay has its unit record (found by
        audit: after an early stop, most often in a resumed run, the replay stood alone)."""
        unit.judge, unit.note = unsent_judge(unit.unit_id), reason
        self._conclude(unit, journal=journal)

    def _conclude(self, unit: Unit, *, journal: bool) -> None:
        """The unit's result is known: journal it (when asked), then it counts."""
        unit.status = unit_status(unit)
        if not (journal and self.journaled):
            self._counted(unit)
            return
        unit.step = "journaling"
        key = reuse_key(self.settings, unit) if unit.status == "succeeded" else None
        record = unit_record(self.request.measurement_id, unit, key)
        self._emit(JournalUnit(unit.unit_id, record))

    def _counted(self, unit: Unit) -> None:
        way = repeating_failure(unit) if unit.status in RESTORABLE else None
        self._finish(unit, unit.status)
        if unit.status == "succeeded":  # same tree, case, repetition and seed: either arm
            self.records.reuse.add(reuse_key(self.settings, unit), unit.sealed_at)
        if unit.arm == "baseline" and unit.status in RESTORABLE:  # a try that ended
            self.records.failures.ended(reuse_key(self.settings, unit), way, unit.sealed_at)

    # ----- ending units, releasing their treatments, stopping -----------------------------

    def _release_lane(self, unit: Unit) -> None:
        if unit.holds_lane:
            unit.holds_lane = False
            self._free += 1

    def _finish(self, unit: Unit, status: str, note: str = "") -> None:
        unit.status, unit.note = status, note or unit.note
        unit.done, unit.step = True, "done"
        unit.seal()
        self._sealed.append(unit)
        self._release_lane(unit)
        self._left -= 1
        self._moved = True
        if unit.took_part:
            self._emit(UnitEnded(unit.unit_id))
        self._prefix.ended(unit)
        if self.early is None and self.stop_reason is None:
            early = self._prefix.early_stop()
            if early is not None:
                decision, reason, self.cutoff = early
                self.early = (decision, reason)
                beyond = [u for u in self.units if u.case_index >= self.cutoff and not u.done]
                self._emit(StopUnit(tuple(u.unit_id for u in beyond)))
        for waiting in self.layout.dependents(unit.index):
            self._release(self.units[waiting], unit)

    def _release(self, unit: Unit, control: Unit) -> None:
        """The control of ``unit`` ended: block it, skip it, or make it ready."""
        if control.status != "succeeded":
            self._unbegun(unit, f"control {control.status}", control)
        elif self.stop_reason is not None or self._beyond_cutoff(unit):
            self._unbegun(unit, self.stop_reason or "early_stop")
        else:
            self._make_ready(unit)

    def _unbegun(self, unit: Unit, note: str, control: Unit | None = None) -> None:
        """``unit`` ends before it began: ``not_run`` (blocked by ``control``, when given),
        unless its replay was journaled before the run resumed (charged as it resumed): then
        cancelled with it and journaled, as a judge a stop cut is (found by review: it ended
        ``not_run``, a charged replay in the journal and no outcome)."""
        stored = stored_replay(self.settings, unit, {})  # {}: a diverged one is noted on begin
        if stored is not None:  # not journaled again when its session's stop cut its judge
            self._release_lane(unit)
            unit.restored, unit.replay = True, stored.replay
            cut = self.settings.restored.get(unit.unit_id)
            again = cut is None or cut.status != "cancelled" or cut.replay != stored.replay
            self._unjudged(unit, note, journal=again)
        elif control is None:
            self._finish(unit, "not_run", note)
        else:
            unit.replay = blocked_replay(unit, control.unit_id)
            self._finish(unit, "blocked" if control.status != "not_run" else "not_run")

    def _make_ready(self, unit: Unit) -> None:
        unit.step = "ready"
        heapq.heappush(self._ready, (self.priority[unit.index], unit.index))

    def _beyond_cutoff(self, unit: Unit) -> bool:
        return self.cutoff is not None and unit.case_index >= self.cutoff

    def _stop(self, reason: MeasureStatus, message: str) -> None:
        """Start no more units: stop those in flight, and those waiting for a lane never
        run (those waiting on a control follow it)."""
        if self.stop_reason is not None:
            return
        self.stop_reason, self.message = reason, message[:512]
        self._emit(StopUnit(tuple(u.unit_id for u in self.units if not u.done)))
        self._drop_ready(reason)

    def _drop_ready(self, reason: MeasureStatus) -> None:
        while self._ready:
            _, index = heapq.heappop(self._ready)
            self._unbegun(self.units[index], reason)

    # ----- what the shell reports -------------------------------------------------------

    def progress(self) -> MeasureEvent:
        """How far the measurement is: complete pairs in plan order, their mean delta and SE."""
        planned = self.cutoff if self.cutoff is not None else len(self.case_ids)
        event = self._prefix.event(
            self.request.measurement_id, planned, self.in_flight, self._judging
        )
        if self.request.candidate_ref is None:  # the parent alone: no pairs, no decision
            cases = {"pairs_done": self._prefix.length, "mean_delta": None, "se": None}
            event = event.model_copy(update={"parent_only": True, **cases})
        return event

    def unit_event(self, unit_id: str) -> UnitEvent:
        """The unit of a `UnitEnded` action, as a progress event for observers."""
        unit = self.unit(unit_id)
        if not (unit.done and unit.took_part):
            raise ValueError(f"unit {unit_id!r} did not end after taking part")
        return unit_event(self.request.measurement_id, unit)

    def records_json(self) -> bytes:
        """`records` as the blob's bytes, from each unit's sealed record."""
        return unit_records_json(self.units)

    def records_chunks(self) -> Iterator[bytes]:
        """`records_json` in chunks (to stream the blob to the store, from a thread: every
        record is written out first, so the chunks only read)."""
        self.records.flush()
        return unit_records_chunks(self.units)

    def summary(self, units_ref: ArtifactRef, wall_seconds: float) -> MeasureSummary:
        """The outcome, once `Finish` was returned: the decision on the cases before the
        cutoff (an early stop's own decision, unless the measurement was stopped), the
        counts, and why it ended."""
        if not self._finished:
            raise RuntimeError("the measurement has units that did not end")
        early = self.early if self.stop_reason is None else None
        gate = decision(
            self.units, len(self.case_ids), self.request.gate, self.cutoff, early, self.clusters
        )
        status: MeasureStatus = self.stop_reason or ("early_stopped" if self.early else "complete")
        message = self.message
        if self.diverged and not self.settings.replays_allowed and self.stop_reason is None:
            status = "diverged"
            message = (
                f"the stored run diverged: {len(self.diverged)} unit(s) were replayed on "
                f"another tree than this run plans (first {min(self.diverged)}); they were "
                "not used"
            )[:512]
        return MeasureSummary(
            measurement_id=self.request.measurement_id,
            status=status,
            message=message,
            gate=gate,
            **unit_counts(self.units),
            cases_compared=gate.n,
            wall_seconds=wall_seconds,
            units_ref=units_ref,
        )
