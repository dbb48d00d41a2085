"""The measurement scheduler: turns a paired plan into replay and judge work, in order.

- A candidate unit starts only after its paired baseline unit succeeded (or was reused);
  a failed control blocks its treatment (``blocked_by``).
- Dispatch follows the plan order (first repetitions of all cases first, each case's
  baseline before its candidate), so pairs complete early and early stopping can bite.
- Early stop is judged on the prefix of complete cases in plan order, so the point where
  it stops, and the decision, never depend on completion timing.
- A finished unit is reused (either arm) when tree, case, repetition, seed and every
  fingerprint match: a parent's baseline across its candidates, an accepted candidate's
  results as its baseline in the next iteration.
- Every completed unit is journaled (durably) before it counts, with its tree's digest: a
  resume or re-judge takes a stored unit only for the same unit id on the same tree.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Mapping
from typing import Any

import orjson
import trio

from evolane.actors import Actor, ActorError, ActorRef
from evolane.lanes import StopBoard
from evolane.measure._scheduling import (
    RESTORABLE,
    SchedulerSettings,
    Unit,
    framework_failure,
    repetitions,
    start_order,
    unit_seed,
)
from evolane.messages import (
    Debit,
    JudgeJob,
    JudgeResult,
    MeasureEvent,
    MeasureRequest,
    MeasureStatus,
    MeasureSummary,
    Message,
    ReplayJob,
    ReplayRecord,
    ReplayResult,
    Reserve,
    ReserveReply,
    UnitRecord,
)
from evolane.stats import EarlyStop, decide
from evolane.store import BlobStore

__all__ = [
    "RESTORABLE",
    "MeasurementScheduler",
    "SchedulerSettings",
    "repetitions",
    "unit_seed",
]


PROBE_POLL_SECONDS = 0.05
"""How often a unit waiting for the budget's first estimate of the stage asks again."""


class MeasurementScheduler(Actor):
    """Runs one `MeasureRequest` at a time over pools of replay and judge lanes."""

    accepts = (MeasureRequest,)

    def __init__(
        self,
        settings: SchedulerSettings,
        replay_lanes: list[ActorRef],
        judge_lanes: list[ActorRef],
        budget: ActorRef | None,
        store: BlobStore,
        board: StopBoard,
    ) -> None:
        self.settings, self.store, self.board, self.budget = settings, store, board, budget
        self.replay_lanes, self.judge_lanes = list(replay_lanes), list(judge_lanes)
        self.baseline_cache: dict[str, tuple[ReplayResult, JudgeResult]] = {}

    async def receive(self, message: Message) -> MeasureSummary:
        assert isinstance(message, MeasureRequest)
        run = _Measurement(self, message)
        return await run.execute()

    def baseline_key(self, unit: Unit) -> str:
        case_ref = self.settings.case_refs[unit.case_id]
        parts = (
            self.settings.fingerprint,
            unit.tree_ref.digest,
            case_ref.digest,
            unit.repetition,
            unit_seed(self.settings.seed, unit.case_id, unit.repetition),
        )
        return hashlib.sha256(repr(parts).encode()).hexdigest()

    async def record_replay(self, measurement_id: str, unit: Unit, replay: ReplayResult) -> None:
        """Journal a finished replay before its judgement (not fsynced: a process kill keeps
        it; a power loss only costs a replay)."""
        if self.settings.journal is None:
            return
        record = ReplayRecord(
            measurement=measurement_id, unit=unit.unit_id, tree=unit.tree_ref.digest, replay=replay
        )
        await self.settings.journal.append(record, durable=False)

    async def record(self, measurement_id: str, unit: Unit) -> None:
        """Journal one completed unit durably (the resume source) before it counts."""
        if self.settings.journal is None:
            return
        record = UnitRecord(
            measurement=measurement_id,
            unit=unit.unit_id,
            tree=unit.tree_ref.digest,
            status=unit.status,  # type: ignore[arg-type]
            reused=unit.reused,
            replay=unit.replay,
            judge=unit.judge,
        )
        await self.settings.journal.append(record)


class _Measurement:
    """One measurement's units, dispatcher and early-stop bookkeeping."""

    def __init__(self, scheduler: MeasurementScheduler, request: MeasureRequest) -> None:
        self.s, self.request = scheduler, request
        settings = scheduler.settings
        case_ids = list(request.case_ids) or list(settings.splits.get(request.split, ()))
        self.case_ids = case_ids
        self.reps = repetitions(request, len(case_ids), settings.min_cases)
        self.units = self._plan()
        self.priority = start_order(self.units, len(scheduler.replay_lanes))
        self.ready: list[tuple[tuple[int, int], int]] = []
        self.wake = trio.Event()
        self.free_replay = trio.open_memory_channel[ActorRef](len(scheduler.replay_lanes))
        self.free_judge = trio.open_memory_channel[ActorRef](len(scheduler.judge_lanes))
        self.stop_reason: MeasureStatus | None = None
        self.message = ""
        self.cutoff: int | None = None  # cases at or beyond this index are not needed
        self.early: tuple[str, str] | None = None
        self.last_progress = -1e9
        self.diverged: dict[str, str] = {}  # unit id -> the other tree its stored record has

    def _plan(self) -> list[Unit]:
        units: list[Unit] = []
        baseline_of: dict[tuple[int, int], Unit] = {}
        mid = self.request.measurement_id
        for rep in range(max(self.reps)):
            for index, case_id in enumerate(self.case_ids):
                if rep < self.reps[0]:
                    unit = Unit(
                        len(units),
                        f"{mid}.{index}.{rep}.b",
                        case_id,
                        index,
                        "baseline",
                        rep,
                        self.request.baseline_ref,
                    )
                    baseline_of[(index, rep)] = unit
                    units.append(unit)
                if rep < self.reps[1] and self.request.candidate_ref is not None:
                    control = baseline_of[(index, min(rep, self.reps[0] - 1))]
                    units.append(
                        Unit(
                            len(units),
                            f"{mid}.{index}.{rep}.c",
                            case_id,
                            index,
                            "candidate",
                            rep,
                            self.request.candidate_ref,
                            control,
                        )
                    )
        return units

    # ----- the loop --------------------------------------------------------------------

    async def execute(self) -> MeasureSummary:
        started = trio.current_time()
        board = self.s.board
        board.idle, board.cancelled = trio.Event(), trio.Event()
        try:
            return await self._execute(started)
        finally:
            board.clear()
            board.idle.set()

    async def _execute(self, started: float) -> MeasureSummary:
        for lane in self.s.replay_lanes:
            self.free_replay[0].send_nowait(lane)
        for lane in self.s.judge_lanes:
            self.free_judge[0].send_nowait(lane)
        try:
            async with trio.open_nursery() as nursery:
                for unit in self.units:
                    if unit.depends_on is None:
                        heapq.heappush(self.ready, (self.priority[unit.index], unit.index))
                    else:
                        nursery.start_soon(self._release_when_control_done, unit)
                await self._dispatch(nursery)
        except BaseException:
            self.s.board.stop_all()
            raise
        return await self._summary(trio.current_time() - started)

    async def _dispatch(self, nursery: trio.Nursery) -> None:
        while not all(unit.done.is_set() for unit in self.units):
            if self.s.board.cancelled.is_set():
                self._stop("cancelled", "the measurement was cancelled")
            while self.ready and self.stop_reason is None:
                lane = self._try_lane(self.free_replay)
                if lane is None:
                    break
                _, index = heapq.heappop(self.ready)
                nursery.start_soon(self._run_unit, self.units[index], lane)
            if self.stop_reason is not None:
                self._abandon_pending()
            self.wake = trio.Event()
            await self.wake.wait()

    @staticmethod
    def _try_lane(pool: tuple[Any, Any]) -> ActorRef | None:
        try:
            return pool[1].receive_nowait()
        except trio.WouldBlock:
            return None

    def _finish(self, unit: Unit, status: str, note: str = "") -> None:
        unit.status, unit.note = status, note or unit.note
        unit.done.set()
        self.wake.set()
        self._progress()

    def _progress(self) -> None:
        """Tell the progress observer how far the measurement is (at most every interval)."""
        publish = self.s.settings.on_progress
        now = trio.current_time()
        if publish is None or now - self.last_progress < self.s.settings.progress_interval:
            return
        self.last_progress = now
        deltas = [d for _, d in self._complete_prefix() if d is not None]
        mean = se = None
        if deltas:
            mean = sum(deltas) / len(deltas)
            if len(deltas) > 1:
                var = sum((d - mean) ** 2 for d in deltas) / (len(deltas) - 1)
                se = (var / len(deltas)) ** 0.5
        free = self.free_replay[0].statistics().current_buffer_used
        publish(
            MeasureEvent(
                run_id="-",
                measurement_id=self.request.measurement_id,
                pairs_done=len(deltas),
                pairs_planned=self.cutoff if self.cutoff is not None else len(self.case_ids),
                lanes_busy=max(0, len(self.s.replay_lanes) - free),
                mean_delta=None if mean is None else max(-1.0, min(1.0, mean)),
                se=se,
            )
        )

    def _abandon_pending(self) -> None:
        """Units still waiting for a lane never run; those in flight finish on their own
        (stopped through the board) and those waiting on a control follow it."""
        while self.ready:
            _, index = heapq.heappop(self.ready)
            self._finish(self.units[index], "not_run", self.stop_reason or "")

    async def _release_when_control_done(self, unit: Unit) -> None:
        assert unit.depends_on is not None
        await unit.depends_on.done.wait()
        control = unit.depends_on
        if control.status != "succeeded":
            blocked = ReplayResult(
                unit_id=unit.unit_id,
                case_id=unit.case_id,
                arm="candidate",
                repetition=unit.repetition,
                status="blocked",
                blocked_by=control.unit_id,
            )
            unit.replay = blocked
            self._finish(unit, "blocked" if control.status != "not_run" else "not_run")
            return
        if self.stop_reason is not None or self._beyond_cutoff(unit):
            self._finish(unit, "not_run", self.stop_reason or "early_stop")
            return
        heapq.heappush(self.ready, (self.priority[unit.index], unit.index))
        self.wake.set()

    def _beyond_cutoff(self, unit: Unit) -> bool:
        return self.cutoff is not None and unit.case_index >= self.cutoff

    # ----- one unit --------------------------------------------------------------------

    async def _run_unit(self, unit: Unit, lane: ActorRef) -> None:
        try:
            replay = await self._replay(unit, lane)
        finally:
            self.free_replay[0].send_nowait(lane)
            self.wake.set()
        if replay is None:
            return
        unit.replay = replay
        if self.s.budget is not None and not (unit.restored and self.s.settings.rejudge):
            debit = Debit(
                item=unit.unit_id,
                actual=replay.usage,
                complete=replay.usage_complete,
                stage="replay",
            )
            await self.s.budget.ask(debit, timeout=30)
        if replay.status == "succeeded":
            if not unit.restored:  # a resume judges it without replaying it again
                await self.s.record_replay(self.request.measurement_id, unit, replay)
            unit.judge = await self._judge(unit, replay)
        unit.status = self._status(unit)
        await self.s.record(self.request.measurement_id, unit)
        if unit.status == "succeeded":  # same tree, case, repetition and seed: either arm
            assert unit.judge is not None
            self.s.baseline_cache[self.s.baseline_key(unit)] = (replay, unit.judge)
        self._finish(unit, unit.status)
        self._check_early_stop()

    async def _replay(self, unit: Unit, lane: ActorRef) -> ReplayResult | None:
        if self.stop_reason is not None or self._beyond_cutoff(unit):
            self._finish(unit, "not_run", self.stop_reason or "early_stop")
            return None
        cached = self.s.baseline_cache.get(self.s.baseline_key(unit))
        if cached is not None:  # the same tree, case, repetition and seed: the same experiment
            mine = {"unit_id": unit.unit_id, "arm": unit.arm}
            unit.replay, unit.judge = cached[0].model_copy(update=mine), cached[1]
            unit.reused = True
            self._finish(unit, "succeeded", "reused")
            self._check_early_stop()
            return None
        restored = self._stored(self.s.settings.restored, unit)
        if restored is not None and restored.status in RESTORABLE and restored.replay:
            await self._restore(unit, restored)
            return None
        stored = self._stored(self.s.settings.restored_replays, unit)
        if stored is not None:  # replayed before an interruption, not yet judged: judge only
            unit.restored = True
            return stored.replay
        if not self.s.settings.replays_allowed:
            other = self.diverged.get(unit.unit_id)
            why = "no stored replay to judge again"
            if other is not None:
                why = f"the stored run diverged: it replayed {unit.unit_id} on tree {other}"
            self._finish(unit, "not_run", why)
            return None
        if not await self._reserve(unit):
            self._stop("budget_limited", "the budget denied a replay")
            self._finish(unit, "not_run", "budget")
            return None
        settings = self.s.settings
        job = ReplayJob(
            unit_id=unit.unit_id,
            case_id=unit.case_id,
            case_ref=settings.case_refs[unit.case_id],
            tree_ref=unit.tree_ref,
            arm=unit.arm,
            repetition=unit.repetition,  # type: ignore[arg-type]
            seed=unit_seed(settings.seed, unit.case_id, unit.repetition),
            timeout_seconds=settings.replay_timeout,
        )
        try:
            result: ReplayResult = await lane.ask(job, timeout=settings.replay_timeout + 60)
        except ActorError as error:  # a lane that crashed or hung: the framework's fault
            result = ReplayResult(
                unit_id=unit.unit_id,
                case_id=unit.case_id,
                arm=job.arm,
                repetition=unit.repetition,
                status="failed",
                failure=framework_failure("replay", error),
            )
        if result.failure is not None and result.failure.code == "spawn_failed":
            # Stop before this lane is handed back: no further unit may start.
            self._stop(
                "shared_failure", f"{unit.arm} replay could not start: {result.failure.message}"
            )
        return result

    def _stored(self, records: Mapping[str, Any], unit: Unit) -> Any:
        """The journal's record of ``unit``, if it was made on the tree this unit plans (a
        unit id names no tree: after other decisions the same id can mean another tree)."""
        record = records.get(unit.unit_id)
        if record is None:
            return None
        if record.tree is not None and record.tree != unit.tree_ref.digest:  # None: older
            self.diverged[unit.unit_id] = record.tree[:80]
            return None
        return record

    async def _restore(self, unit: Unit, record: UnitRecord) -> None:
        """Take a unit finished before an interruption from the journal: no rerun, but its
        usage is charged again so the budget sees the whole run (not in a re-judge: the
        stored run paid for those replays)."""
        assert record.replay is not None
        replay, judge = record.replay, record.judge
        if self.s.settings.rejudge:  # re-evaluation: the stored replay, judged anew
            judge = await self._judge(unit, replay) if replay.status == "succeeded" else None
        unit.replay, unit.judge, unit.restored = replay, judge, True
        if self.s.budget is not None and not self.s.settings.rejudge:
            debit = Debit(
                item=unit.unit_id,
                actual=replay.usage,
                complete=replay.usage_complete,
                stage="replay",
            )
            await self.s.budget.ask(debit, timeout=30)
        status = unit.status = self._status(unit)
        if self.s.settings.rejudge:
            await self.s.record(self.request.measurement_id, unit)
        if status == "succeeded":
            assert judge is not None
            self.s.baseline_cache[self.s.baseline_key(unit)] = (replay, judge)
        self._finish(unit, status, "rejudged" if self.s.settings.rejudge else "restored")
        self._check_early_stop()

    async def _reserve(self, unit: Unit) -> bool:
        if self.s.budget is None:
            return True
        # The first unit of a stage runs alone until its usage gives an estimate: wait for it
        # (bounded by its own deadline and kill ladder), never give up early.
        settings = self.s.settings
        with trio.move_on_after(settings.replay_timeout * 2 + 60):
            while True:
                reply: ReserveReply = await self.s.budget.ask(
                    Reserve(stage="replay", item=unit.unit_id), timeout=30
                )
                if reply.granted or not reply.retry or self.stop_reason is not None:
                    return reply.granted
                await trio.sleep(PROBE_POLL_SECONDS)
        return False

    async def _judge(self, unit: Unit, replay: ReplayResult) -> JudgeResult:
        lane = await self.free_judge[1].receive()
        try:
            settings = self.s.settings
            assert replay.output_ref is not None
            job = JudgeJob(
                unit_id=unit.unit_id,
                case_id=unit.case_id,
                case_ref=settings.judge_case_refs[unit.case_id],
                output_ref=replay.output_ref,
                tree_ref=unit.tree_ref,
                timeout_seconds=settings.judge_timeout,
                seed=unit_seed(settings.seed, unit.case_id, unit.repetition),
            )
            try:
                return await lane.ask(job, timeout=settings.judge_timeout * 4 + 60)
            except ActorError as error:
                return JudgeResult(
                    unit_id=unit.unit_id,
                    status="failed",
                    source="command",
                    failure=framework_failure("judge", error),
                )
        finally:
            self.free_judge[0].send_nowait(lane)

    @staticmethod
    def _status(unit: Unit) -> str:
        assert unit.replay is not None
        if unit.replay.status != "succeeded":
            return unit.replay.status
        if unit.judge is None or unit.judge.status != "succeeded":
            return "cancelled" if unit.judge and unit.judge.status == "cancelled" else "failed"
        return "succeeded"

    def _stop(self, reason: MeasureStatus, message: str) -> None:
        if self.stop_reason is None:
            self.stop_reason, self.message = reason, message[:512]
            for unit in self.units:
                if not unit.done.is_set():
                    self.s.board.stop(unit.unit_id)
            self.wake.set()

    # ----- early stop and the decision -------------------------------------------------

    def _scores(self, upto: int | None) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
        baseline: dict[str, list[float]] = {}
        candidate: dict[str, list[float]] = {}
        for unit in self.units:
            if upto is not None and unit.case_index >= upto:
                continue
            if unit.score is not None:
                side = baseline if unit.arm == "baseline" else candidate
                side.setdefault(unit.case_id, []).append(unit.score)
        return baseline, candidate

    def _complete_prefix(self) -> list[tuple[int, float | None]]:
        """(case index, delta or None) for the leading run of finished cases, in plan order."""
        by_case: dict[int, list[Unit]] = {}
        for unit in self.units:
            by_case.setdefault(unit.case_index, []).append(unit)
        prefix = []
        for index in range(len(self.case_ids)):
            units = by_case.get(index, [])
            if not all(u.done.is_set() for u in units):
                break
            base = [u.score for u in units if u.arm == "baseline" and u.score is not None]
            cand = [u.score for u in units if u.arm == "candidate" and u.score is not None]
            delta = sum(cand) / len(cand) - sum(base) / len(base) if base and cand else None
            prefix.append((index, delta))
        return prefix

    def _check_early_stop(self) -> None:
        """Stop once the decision on the prefix of finished cases can no longer change, or the
        anytime-valid sequential test decides; ``sequential=False`` means a full evaluation."""
        gate = self.request.gate
        if self.early is not None or self.stop_reason is not None or not gate.sequential:
            return
        stopper = EarlyStop(gate, len(self.case_ids))
        for index, delta in self._complete_prefix():
            if delta is None:
                continue  # not comparable (a failure on either side): not evidence either way
            decision = stopper.update(delta)
            if decision is not None:
                self.early = (decision, f"early stop ({stopper.source}) after {stopper.n} cases")
                self.cutoff = index + 1
                for unit in self.units:
                    if unit.case_index >= self.cutoff and not unit.done.is_set():
                        self.s.board.stop(unit.unit_id)
                self.wake.set()
                return

    async def _summary(self, wall: float) -> MeasureSummary:
        baseline, candidate = self._scores(self.cutoff)
        planned = self.cutoff if self.cutoff is not None else len(self.case_ids)
        gate = decide(baseline, candidate, self.request.gate, n_planned=planned)
        if self.early is not None and self.stop_reason is None:
            gate = gate.model_copy(update={"decision": self.early[0], "reason": self.early[1]})
        ordered = sorted(self.units, key=lambda u: (u.case_index, u.repetition, u.arm))
        records = [
            {
                "unit": u.unit_id,
                "case": u.case_id,
                "arm": u.arm,
                "repetition": u.repetition,
                "status": u.status,
                "reused": u.reused,
                "restored": u.restored,
                "note": u.note,
                "score": u.score,
                "replay": u.replay.model_dump(mode="json") if u.replay else None,
                "judge": u.judge.model_dump(mode="json") if u.judge else None,
            }
            for u in ordered
        ]
        units_ref = await trio.to_thread.run_sync(self.s.store.put_bytes, orjson.dumps(records))
        counts = {
            status: sum(u.status == status for u in self.units)
            for status in ("failed", "blocked", "not_run")
        }
        status: MeasureStatus = self.stop_reason or ("early_stopped" if self.early else "complete")
        if self.diverged and not self.s.settings.replays_allowed and self.stop_reason is None:
            status = "diverged"
            first = min(self.diverged)
            self.message = (
                f"the stored run diverged: {len(self.diverged)} unit(s) were replayed on "
                f"another tree than this run plans (first {first}); they were not used"
            )[:512]
        return MeasureSummary(
            measurement_id=self.request.measurement_id,
            status=status,
            message=self.message,
            gate=gate,
            units_planned=len(self.units),
            units_run=sum(
                u.replay is not None and not (u.reused or u.restored) and u.status != "blocked"
                for u in self.units
            ),
            units_reused=sum(u.reused for u in self.units),
            units_restored=sum(u.restored for u in self.units),
            units_failed=counts["failed"] + sum(u.status == "timed_out" for u in self.units),
            units_cancelled=sum(u.status == "cancelled" for u in self.units),
            units_blocked=counts["blocked"],
            units_not_run=counts["not_run"],
            cases_compared=gate.n,
            wall_seconds=wall,
            units_ref=units_ref,
        )
