"""The measurement scheduler: the IO shell around `MeasurePlan` (``_plan.py``).

It receives a `MeasureRequest`, feeds the plan events and performs the plan's actions: it asks
the budget and the replay and judge lanes, journals, publishes progress, stores the units
blob and returns the `MeasureSummary`. Every decision (what starts, in which order, when to
stop, the verdict) is the plan's; each action that does IO runs as its own task and answers
with one event, which the measurement's loop feeds back to the plan.
"""

from __future__ import annotations

from typing import Any

import trio

from evolane.actors import Actor, ActorError, ActorRef, ActorStopped
from evolane.measure._budget import reserve_when_known
from evolane.measure._plan import (
    Action,
    ChargeUnit,
    Event,
    JournalReplay,
    JournalUnit,
    JudgeDenied,
    MeasurePlan,
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
from evolane.measure._scheduling import SchedulerSettings
from evolane.measure._sealed import SealedRecords
from evolane.measure._units import LANES_DOWN, preload, unsent_judge
from evolane.messages import (
    Debit,
    FailureEvent,
    JournalRecord,
    JudgeJob,
    JudgeResult,
    MeasureRequest,
    MeasureSummary,
    Message,
    Ping,
    Pong,
    Release,
    ReplayJob,
    ReplayResult,
    Reserve,
    StopAll,
    StopUnits,
    Usage,
)
from evolane.store import BlobStore, storage_failure

__all__ = ["MeasurementScheduler", "SchedulerSettings"]

LANE_ANSWER_MARGIN = 60.0
"""Seconds a lane may still take to answer after its unit's own deadline: the kill ladder's
grace, storing the outputs, the reply. Past it the lane counts as hung (a framework failure)."""

JUDGE_TIMEOUTS_ALLOWED = 4.0
"""Judge timeouts a judge lane may use before it counts as hung: its retries share the one
deadline, but each attempt's kill ladder may overrun it."""

ESTIMATE_WAIT_REPLAYS = 2.0
"""Replay timeouts a unit waits for the budget's first estimate of its stage (the first unit
of a stage runs alone until its usage is known); past them it counts as denied."""


class MeasurementScheduler(Actor):
    """Runs one `MeasureRequest` at a time over pools of replay and judge lanes.

    A `StopAll` signal cancels the running measurement (every unit in flight is stopped
    through its lane, none starts); a `Ping` is answered once no measurement runs (the
    mailbox is served in order), which is how a caller waits for a cancelled one to end.
    """

    accepts = (MeasureRequest, Ping)
    signals = (StopAll,)

    def __init__(
        self,
        settings: SchedulerSettings,
        replay_lanes: list[ActorRef],
        judge_lanes: list[ActorRef],
        budget: ActorRef | None,
        store: BlobStore,
    ) -> None:
        self.settings, self.store, self.budget = settings, store, budget
        self.replay_lanes, self.judge_lanes = list(replay_lanes), list(judge_lanes)
        # Every measurement's sealed unit records, out of memory, and the succeeded units
        # by `reuse_key` for reuse.
        self.records = SealedRecords(store.tmp)
        self.crashes: dict[str, str] = {}  # per stage, the last crash of a lane (its message)
        preload(self.records, settings.earlier)
        self.running: _Measurement | None = None
        # A stop that found no measurement running: one asked before it may still be queued
        # (its caller was cancelled before it was served), so requests up to the stopper's
        # `Ping` start cancelled.
        self.stop_pending = False

    async def receive(self, message: Message) -> MeasureSummary | Pong:
        if isinstance(message, Ping):
            self.stop_pending = False
            return Pong(seq=message.seq, responder=self.context.name)
        assert isinstance(message, MeasureRequest)
        self.running = _Measurement(self, message)
        if self.stop_pending:
            self.running.cancel()
        try:
            return await self.running.execute()
        finally:
            self.running = None

    async def stopped(self) -> None:
        """Drop the sealed records (their file goes with it)."""
        self.records.close()

    def on_signal(self, message: Message) -> None:
        if not isinstance(message, StopAll):
            return
        if self.running is not None:
            self.running.cancel()
        else:
            self.stop_pending = True


class _Measurement:
    """One measurement: its plan, the lanes it hands out, and the tasks doing its IO."""

    def __init__(self, scheduler: MeasurementScheduler, request: MeasureRequest) -> None:
        self.s = scheduler
        settings = scheduler.settings
        self.plan = MeasurePlan(
            request,
            settings,
            lanes=len(scheduler.replay_lanes),
            records=scheduler.records,
            budgeted=scheduler.budget is not None,
            journaled=settings.journal is not None,
        )
        # Each unit waits for at most one answer at a time, and one cancel may come: the
        # buffer never fills.
        self.answers = trio.open_memory_channel[Event](len(self.plan.units) + 1)
        self.cancelled = False
        self.stop_everything = False
        self.stopped: set[str] = set()  # stopped before a lane took them
        self.in_lane: dict[str, ActorRef] = {}  # unit id -> the lane running it
        self.free_replay = trio.open_memory_channel[ActorRef](len(scheduler.replay_lanes))
        self.free_judge = trio.open_memory_channel[ActorRef](len(scheduler.judge_lanes))
        self.last_progress = -1e9
        self.progress_held = False  # a progress event the interval held back, not yet told

    async def execute(self) -> MeasureSummary:
        started = trio.current_time()
        await self._run()
        wall = trio.current_time() - started
        # Streamed: the blob is never held whole beside the records it is made of.
        chunks = self.plan.records_chunks()
        units_ref = await trio.to_thread.run_sync(self.s.store.put_stream, chunks)
        return self.plan.summary(units_ref, wall)

    def cancel(self) -> None:
        """Stop the measurement (from a signal): the loop feeds the plan a stop request."""
        if not self.cancelled:
            self.cancelled = True
            self._answer(StopRequested("cancelled", "the measurement was cancelled"))

    async def _run(self) -> None:
        """Feed the plan until every unit ended; a failure or cancellation here stops every
        unit in flight before it propagates."""
        for lane in self.s.replay_lanes:
            self.free_replay[0].send_nowait(lane)
        for lane in self.s.judge_lanes:
            self.free_judge[0].send_nowait(lane)
        try:
            async with trio.open_nursery() as nursery:
                if self.cancelled:  # stopped before it was served: no unit starts
                    self._perform(nursery, self.plan.handle(self.answers[1].receive_nowait()))
                self._perform(nursery, self.plan.start())
                while not self.plan.finished:
                    answer = await self._next_answer()
                    if isinstance(answer, StopRequested) and self.plan.stop_reason is not None:
                        continue  # a cancel after another stop: already stopping
                    self._perform(nursery, self.plan.handle(answer))
        except BaseException:
            self._send_stop(None)
            raise

    def _perform(self, nursery: trio.Nursery, actions: list[Action]) -> None:
        """Start each IO action as a task (it answers with one event); do the rest now."""
        for action in actions:
            match action:
                case StartReplay():
                    nursery.start_soon(self._replay, action)
                case ChargeUnit():
                    nursery.start_soon(self._charge, action)
                case JournalReplay(unit_id=unit_id, record=record):
                    assert self.s.settings.journal is not None
                    self.s.settings.journal.hold(record)  # not durable: no IO, no task
                    self._answer(ReplayJournaled(unit_id))
                case StartJudge():
                    nursery.start_soon(self._judge, action)
                case JournalUnit(unit_id=unit_id, record=record):
                    nursery.start_soon(self._journal, record, True, UnitJournaled(unit_id))
                case StopUnit(unit_ids=unit_ids):
                    self._send_stop(unit_ids)
                case UnitEnded(unit_id=unit_id):
                    if self.s.settings.on_unit is not None:
                        self.s.settings.on_unit(self.plan.unit_event(unit_id))
                case Progress():
                    self._progress()
                case _:  # Finish: the loop sees `plan.finished`
                    pass

    def _answer(self, event: Event) -> None:
        self.answers[0].send_nowait(event)

    def _send_stop(self, unit_ids: tuple[str, ...] | None) -> None:
        """Tell units to stop (None: every unit), so their lanes answer early: a unit in a
        lane through a `StopUnits` signal to that lane; one not yet in a lane is answered
        cancelled without being sent (`_ask_lane`). The only place stop signals leave the
        scheduler."""
        if unit_ids is None:
            self.stop_everything = True
            for lane in (*self.s.replay_lanes, *self.s.judge_lanes):
                lane.signal(StopAll())
            return
        by_lane: dict[ActorRef, list[str]] = {}
        for unit_id in unit_ids:
            lane = self.in_lane.get(unit_id)
            if lane is None:
                self.stopped.add(unit_id)
            else:
                by_lane.setdefault(lane, []).append(unit_id)
        for lane, ids in by_lane.items():
            for stop in StopUnits.batches(ids):
                lane.signal(stop)

    async def _next_answer(self) -> Event:
        """The next answer; while a progress event is held back, it is told once its
        interval has passed with no answer (the last word before a long silence, a hung
        unit's, is never lost: found by review)."""
        if self.progress_held:
            interval = self.s.settings.progress_interval
            with trio.move_on_at(self.last_progress + interval):
                return await self.answers[1].receive()
            self._progress()
        return await self.answers[1].receive()

    def _progress(self) -> None:
        """Tell the progress observer how far the measurement is (at most every interval;
        one held back is told by `_next_answer`)."""
        settings = self.s.settings
        now = trio.current_time()
        if settings.on_progress is None:
            return
        if now - self.last_progress < settings.progress_interval:
            self.progress_held = True
            return
        self.last_progress, self.progress_held = now, False
        settings.on_progress(self.plan.progress())

    # ----- the IO of one unit: each answers with one event ----------------------------

    async def _replay(self, action: StartReplay) -> None:
        job = action.job
        if not await self._reserve("replay", job.unit_id, job.timeout_seconds):
            self._answer(ReserveDenied(job.unit_id))
            return
        lane = await self.free_replay[1].receive()
        try:
            timeout = job.timeout_seconds + LANE_ANSWER_MARGIN
            answer = await self._ask_lane(lane, job, timeout)
            result: ReplayResult = answer or ReplayResult.without_output(job, "cancelled")
        except ActorError as error:  # a lane that crashed or hung: the framework's fault
            failure = framework_failure("replay", error, self.s.crashes)
            result = ReplayResult.without_output(job, "failed", failure)
        finally:
            self.free_replay[0].send_nowait(lane)
        self._answer(UnitReplayed(job.unit_id, result))

    async def _ask_lane(
        self, lane: ActorRef, job: ReplayJob | JudgeJob, timeout: float
    ) -> Any | None:
        """Ask ``lane`` to run ``job``: None, and nothing sent, for a unit stopped before it
        got a lane. An ask that ends without its answer (cancelled, timed out) stops the unit
        by name there, since its job may still wait in the lane's mailbox."""
        if self.stop_everything or job.unit_id in self.stopped:
            self.stopped.discard(job.unit_id)
            return None
        self.in_lane[job.unit_id] = lane
        try:
            return await lane.ask(job, timeout=timeout)
        except BaseException:
            lane.signal(StopUnits(unit_ids=(job.unit_id,)))
            raise
        finally:
            self.in_lane.pop(job.unit_id, None)

    async def _reserve(self, stage: str, unit_id: str, timeout: float) -> bool:
        """Room in the budget for ``unit_id``'s ``stage`` (a unit of ``timeout`` seconds)."""
        budget = self.s.budget
        if budget is None:
            return True
        # The first unit of a stage runs alone until its usage gives an estimate: wait for it
        # (bounded by its own deadline and kill ladder), never give up early.
        reply = await reserve_when_known(
            budget.ask,
            lambda: Reserve(stage=stage, item=unit_id),
            timeout * ESTIMATE_WAIT_REPLAYS + LANE_ANSWER_MARGIN,
            lambda: self.plan.stop_reason is not None,
        )
        return reply is not None and reply.granted

    async def _charge(self, action: ChargeUnit) -> None:
        assert self.s.budget is not None
        for debit in action.debits:
            await self.s.budget.ask(debit)
        self._answer(UnitCharged(action.unit_id))

    async def _journal(self, record: JournalRecord, durable: bool, answer: Event) -> None:
        journal = self.s.settings.journal
        assert journal is not None
        await journal.append(record, durable=durable)
        self._answer(answer)

    async def _judge(self, action: StartJudge) -> None:
        job = action.job
        timeout = job.timeout_seconds * JUDGE_TIMEOUTS_ALLOWED + LANE_ANSWER_MARGIN
        budgeted = self.s.budget is not None and self.s.settings.judge_costs
        lane = await self.free_judge[1].receive()
        try:
            # Reserved once it has a lane: a judge waiting for one holds no room.
            if budgeted and not await self._reserve("judge", job.unit_id, timeout):
                self._answer(JudgeDenied(job.unit_id))
                return
            result = await self._judged(lane, job, timeout, budgeted)
        finally:
            self.free_judge[0].send_nowait(lane)
        self._answer(UnitJudged(job.unit_id, result))

    async def _judged(
        self, lane: ActorRef, job: JudgeJob, timeout: float, budgeted: bool
    ) -> JudgeResult:
        """``job``'s result from ``lane`` (a lane's crash: a failure); when ``budgeted``, what
        it used is charged, at least its reservation if it was cut short, and a judge never
        sent (its unit stopped first) only gives its reservation back."""
        sent = not (self.stop_everything or job.unit_id in self.stopped)  # as `_ask_lane` sees
        result: JudgeResult | None = None
        try:
            answer = await self._ask_lane(lane, job, timeout)
            result = answer or unsent_judge(job.unit_id)
        except ActorError as error:
            result = JudgeResult(
                unit_id=job.unit_id,
                status="failed",
                source="command",
                failure=framework_failure("judge", error, self.s.crashes),
            )
        finally:
            if budgeted:
                with trio.CancelScope(shield=True):
                    await self._settle_judge(job.unit_id, result if sent else None, sent)
        return result

    async def _settle_judge(self, unit_id: str, result: JudgeResult | None, sent: bool) -> None:
        assert self.s.budget is not None
        if not sent:
            await self.s.budget.ask(Release(item=unit_id), timeout=LANE_ANSWER_MARGIN)
            return
        usage, complete = (result.usage, result.usage_complete) if result else (Usage(), False)
        await self.s.budget.ask(
            Debit(item=unit_id, actual=usage, complete=complete, stage="judge"),
            timeout=LANE_ANSWER_MARGIN,
        )


def framework_failure(stage: str, error: Exception, crashes: dict[str, str]) -> FailureEvent:
    """A lane that crashed or hung, as the framework's failure of ``stage``: ``lane_error``
    (this unit's, kept in ``crashes``), or `LANES_DOWN` when the lane is stopped or down
    (its supervisor gave up: every later unit would fail alike, so the measurement stops on
    it), naming the stage's last crash. A lane that could not write the store (a full disk:
    a command may fill it) raises instead: the run cannot go on and ends ``failed`` (it
    ended ``finished``, exit 0: found by review)."""
    if storage_failure(error) is not None:
        raise error
    down = isinstance(error, ActorStopped)
    code = LANES_DOWN if down else "lane_error"
    failure = FailureEvent.of(error, owner="framework", stage=stage, code=code)  # type: ignore[arg-type]
    if not down:
        crashes[stage] = failure.message
    elif stage in crashes:
        said = f"{failure.message}; its last crash: {crashes[stage]}"[:512]
        failure = failure.model_copy(update={"message": said})
    return failure
