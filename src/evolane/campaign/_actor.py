"""The campaign actor: hill-climbs from the parent tree, one iteration at a time.

An iteration asks the optimizer lanes for up to ``population`` candidates (concurrently),
sends each through the funnel (unique -> local gates -> screening -> paired measurement ->
evaluation) in slot order, and promotes the best accepted one to parent. After the last
iteration the seed and the best tree are scored on the val split and the sealed test split
(never used to decide), the apply policy runs, and the report is written.

Everything that decides is deterministic given the seed: slot seeds, measurement ids and unit
ids are derived, candidates are measured in slot order, and early stopping is judged on the
plan-ordered prefix. So a resumed run, which takes finished units and proposals from the
journal, reaches the decisions of an uninterrupted one.
"""

from __future__ import annotations

from typing import Any

import orjson
import trio

from evolane.actors import Actor, ActorError, ActorRef
from evolane.campaign._book import (
    SlotBook,
    arm_score,
    arm_scores,
    first_failure,
    hardest_failing,
    settled_digests,
)
from evolane.campaign._gates import run_local_gates
from evolane.campaign._prompt import (
    build_prompt,
    classify_cases,
    convergence,
    edit_diff,
    encode_prompt,
    focus_cases,
    write_context,
)
from evolane.campaign._report import IterationRecord, LineageEntry, Purpose, Scores
from evolane.campaign._runs import REJECTED_KEPT, RejectedEdit
from evolane.campaign._types import (
    CampaignDone,
    CampaignResult,
    CampaignSetup,
    RunCampaign,
    Stopped,
    failure_text,
    not_stored,
    slot_event,
    slot_seed,
)
from evolane.messages import (
    ArtifactRef,
    BudgetUpdate,
    Debit,
    DecisionEvent,
    FailureEvent,
    LedgerQuery,
    MeasureEvent,
    MeasureRequest,
    MeasureSummary,
    Message,
    PhaseEvent,
    ProposeJob,
    ProposeResult,
    Reserve,
    ReserveReply,
    WarningEvent,
)

__all__ = [
    "Campaign",
    "CampaignDone",
    "CampaignResult",
    "CampaignSetup",
    "RunCampaign",
    "slot_seed",
]


class Campaign(Actor):
    """Drives one cycle of a campaign; see the module docstring."""

    accepts = (RunCampaign,)

    def __init__(self, setup: CampaignSetup, result: CampaignResult) -> None:
        self.setup, self.result = setup, result

    async def receive(self, message: Message) -> CampaignDone:
        assert isinstance(message, RunCampaign)
        run = _Cycle(self.setup, self.result)
        await run.execute(message.deadline)
        return CampaignDone(stop=self.result.stop)  # type: ignore[arg-type]


class _Cycle:
    """One cycle's mutable state: parent, best, seen digests, rejected memory, stall count."""

    def __init__(self, setup: CampaignSetup, result: CampaignResult) -> None:
        self.s, self.r = setup, result
        self.config = setup.config
        self.parent = setup.parent_ref
        self.parent_units: list[dict[str, Any]] = []
        self.seen: set[str] = {setup.parent_ref.digest, *setup.seen}
        self.r.best_ref, self.r.stalled = setup.parent_ref, setup.stalled
        self.r.rejected = list(setup.rejected)

    # ----- the cycle ---------------------------------------------------------------------

    async def execute(self, deadline: float | None) -> None:
        try:
            await self._execute(deadline)
        finally:
            self.r.seen = settled_digests(self.s.seen, self.r.book.decisions)

    async def _execute(self, deadline: float | None) -> None:
        with trio.CancelScope() as scope:
            if deadline is not None:
                scope.deadline = deadline
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_interrupt, scope)
                await self._run_stages()
                nursery.cancel_scope.cancel()
        if scope.cancelled_caught:
            timed_out = deadline is not None and trio.current_time() >= deadline
            self.r.wall_clock_hit = timed_out
            self.r.stop = "budget_limited" if timed_out else "interrupted"
            self.r.message = (
                "the wall-clock budget ran out" if timed_out else "interrupted: resumable"
            )

    async def _run_stages(self) -> None:
        try:
            await self._iterate()
        except Stopped as stopped:
            self.r.stop, self.r.message = stopped.stop, stopped.message
        if self.r.stop in ("finished", "exhausted"):  # a spent budget leaves no room to score
            try:
                await self._finalize()
            except Stopped as stopped:
                self.r.stop, self.r.message = stopped.stop, stopped.message

    async def _watch_interrupt(self, scope: trio.CancelScope) -> None:
        await self.s.interrupt.wait()
        scope.cancel()

    def emit(self, event: Any) -> None:
        self.s.bus.publish(event)

    async def _iterate(self) -> None:
        cycle = self.s.cycle
        await self._measure_parent(0)
        for iteration in range(self.config.iterations):
            signal = convergence(self.r.stalled, self.config.stall)
            self.emit(
                PhaseEvent(
                    run_id=self.s.run_id,
                    phase="optimize",
                    cycle=cycle,
                    iteration=iteration,
                    parent=self.parent.digest,
                    convergence=signal,
                )
            )
            if signal == "stop":
                raise Stopped(
                    "exhausted", f"{self.r.stalled} iterations without an accepted candidate"
                )
            accepted = await self._iteration(iteration, signal)
            self.s.bus.publish(await self._budget_event())
            if accepted is not None:
                await self._measure_parent(iteration + 1)
        if self.r.stalled >= self.config.stall:
            raise Stopped("exhausted", f"{self.r.stalled} iterations without an accepted candidate")

    async def _iteration(self, iteration: int, signal: str) -> SlotBook | None:
        standings = await trio.to_thread.run_sync(
            classify_cases, self.parent_units, self.s.store, self.config.gate.pass_score
        )
        focus = focus_cases(standings, self.config.focus, iteration)
        context = await trio.to_thread.run_sync(
            lambda: write_context(self.s.store, focus, self.parent_units, self.s.pipeline.case_refs)
        )
        prompts = [
            build_prompt(
                iteration=iteration,
                cycle=self.s.cycle,
                slot=slot,
                focus=self.config.focus,
                convergence=signal,  # type: ignore[arg-type]
                standings=standings,
                rejected=[(r.diff, r.reason) for r in self.r.rejected],
                protected=list(self.config.protected),
            )
            for slot in range(self.config.population)
        ]
        books = [
            SlotBook(self.s.cycle, iteration, slot, self._slot_id(iteration, slot))
            for slot in range(self.config.population)
        ]
        self.r.book.funnel.extend(books)
        accepted: list[Any] = []
        try:
            results = await self._propose(iteration, prompts, context)
            for slot, (book, result) in enumerate(zip(books, results, strict=True)):
                summary = await self._candidate(book, result)
                if summary is not None:
                    accepted.append((summary.gate.mean_delta, -slot, book, result))
        except BaseException as error:  # a stop mid-iteration keeps what was already verified
            reason = error.message if isinstance(error, Stopped) else "the run stopped first"
            for book in books:
                if not book.ended and book.decision != "accept":
                    book.end("not_run", f"not finished: {reason}")
            self._select(iteration, signal, books, accepted, partial=True)
            raise
        return self._select(iteration, signal, books, accepted)

    def _select(
        self,
        iteration: int,
        signal: str,
        books: list[SlotBook],
        accepted: list[Any],
        *,
        partial: bool = False,
    ) -> SlotBook | None:
        """Promote the iteration's best accepted candidate; count a stall when nothing was.

        A ``partial`` iteration (the run stopped in it) promotes what it verified but never
        counts as a stall: its remaining slots were not tried."""
        parent = self.parent
        chosen = None
        if accepted:
            delta, _, chosen, result = max(accepted, key=lambda a: (a[0], a[1]))
            for _, _, book, _ in accepted:
                if book is not chosen:
                    book.end(
                        "rejected", "accepted, but another candidate of the iteration did better"
                    )
            chosen.end("selected", f"accepted with mean delta {delta:+.3f}")
            self.parent = self.r.best_ref = result.tree_ref
            self.r.best_delta = delta
            self.r.stalled = 0
            self.r.book.lineage.append(
                LineageEntry(
                    digest=result.tree_ref.digest,
                    parent=parent.digest,
                    cycle=self.s.cycle,
                    iteration=iteration,
                    slot=chosen.slot,
                    mean_delta=delta,
                )
            )
        elif not partial and not all(book.decision == "indecisive" for book in books):
            self.r.stalled += 1  # tampering or infrastructure-only iterations do not count
        self.r.book.iterations.append(
            IterationRecord(
                cycle=self.s.cycle,
                iteration=iteration,
                parent=parent.digest,
                convergence=signal,
                accepted_slot=chosen.slot if chosen is not None else None,
                best_after=self.parent.digest,
            )
        )
        for book in books:
            self.emit(slot_event(self.s.run_id, book, book.terminal))  # type: ignore[arg-type]
        return chosen

    def _slot_id(self, iteration: int, slot: int) -> str:
        return f"c{self.s.cycle}.i{iteration}.s{slot}"

    # ----- proposals ---------------------------------------------------------------------

    async def _propose(
        self, iteration: int, prompts: list[dict[str, Any]], context: ArtifactRef
    ) -> list[ProposeResult]:
        results: list[ProposeResult | None] = [None] * len(prompts)
        lanes = trio.open_memory_channel[ActorRef](len(self.s.optimizers))
        for lane in self.s.optimizers:
            lanes[0].send_nowait(lane)

        async def one(slot: int) -> None:
            slot_id = self._slot_id(iteration, slot)
            restored = self.s.resume.proposals.get(slot_id)
            if restored is not None:
                results[slot] = restored.result
                await self._charge(slot_id, results[slot], stage="optimizer")
                return
            if not self.s.optimizer_allowed:
                results[slot] = not_stored(slot_id)
                return
            lane = await lanes[1].receive()
            try:
                results[slot] = await self._propose_one(
                    slot_id, iteration, slot, prompts[slot], context, lane
                )
            finally:
                lanes[0].send_nowait(lane)

        try:
            async with trio.open_nursery() as nursery:
                for slot in range(len(prompts)):
                    nursery.start_soon(one, slot)
        except BaseException as error:
            self.s.optimizer_board.stop_all()
            raise _stopped_in(error) from None
        done = [r for r in results if r is not None]
        assert len(done) == len(results), "every slot has a result once the nursery is done"
        return done

    async def _propose_one(
        self,
        slot_id: str,
        iteration: int,
        slot: int,
        prompt: dict[str, Any],
        context: ArtifactRef,
        lane: ActorRef,
    ) -> ProposeResult:
        reply: ReserveReply = await self.s.budget.ask(
            Reserve(stage="optimizer", item=slot_id, zero_cost=True), timeout=30
        )
        if not reply.granted:
            raise Stopped("budget_limited", f"the budget denied the optimizer: {reply.reason}")
        prompt_ref = await trio.to_thread.run_sync(
            lambda: self.s.store.put_bytes(encode_prompt(prompt), media_type="application/json")
        )
        job = ProposeJob(
            slot_id=slot_id,
            parent_ref=self.parent,
            prompt_ref=prompt_ref,
            context_ref=context,
            seed=slot_seed(self.config.seed, self.s.cycle, iteration, slot),
            timeout_seconds=self.config.optimizer_timeout,
            idle_seconds=self.config.optimizer_idle,
        )
        try:
            result: ProposeResult = await lane.ask(job, timeout=self.config.optimizer_timeout + 60)
        except ActorError as error:  # the lane broke, not the candidate: the slot is lost
            failure = FailureEvent(
                owner="framework",
                stage="optimizer",
                code=type(error).__name__,
                message=str(error)[:500],
            )
            result = ProposeResult(slot_id=slot_id, status="failed", failure=failure)
        await self.s.budget.ask(
            Debit(item=slot_id, actual=result.usage, complete=False), timeout=30
        )
        if result.status != "cancelled":
            record = {"type": "proposal", "slot": slot_id, "result": result.model_dump(mode="json")}
            await self.s.journal.append(record)
        return result

    async def _charge(self, item: str, result: ProposeResult, *, stage: str) -> None:
        debit = Debit(item=item, actual=result.usage, complete=False, stage=stage)
        await self.s.budget.ask(debit, timeout=30)

    # ----- one candidate through the funnel ------------------------------------------------

    async def _candidate(self, book: SlotBook, result: ProposeResult) -> MeasureSummary | None:
        """Take one proposal through the funnel; returns the summary when it was accepted."""
        book.optimizer = result.summary
        if result.failure is not None:
            self.r.book.fail(book.slot_id, result.failure)
        if result.status != "succeeded" or result.tree_ref is None:
            if result.gate is not None:
                book.reach("generated")
                book.gates.append(result.gate)
                book.reach("local_gates")
                book.end("rejected", f"{result.gate.gate}: {result.gate.reason}", "reject")
            else:
                book.end(
                    "blocked",
                    f"the optimizer {result.status}: {failure_text(result)}",
                    "indecisive",
                )
            self.r.book.decide(book, book.decision or "indecisive", book.reason)
            return None
        tree = result.tree_ref
        book.digest = tree.digest
        book.reach("generated")
        duplicate = tree.digest in self.seen and tree.digest != self.parent.digest
        book.reach("duplicate" if duplicate else "unique")
        gates = await run_local_gates(
            self.s.store,
            self.s.host,
            self.s.gates,
            self.parent,
            tree,
            self.seen - {self.parent.digest},
        )
        self.seen.add(tree.digest)
        book.gates.extend(gates)
        book.reach("local_gates")
        failed = next((g for g in gates if not g.passed), None)
        if failed is not None:
            decision = "indecisive" if failed.outcome == "indecisive" else "reject"
            book.end("rejected", f"{failed.gate}: {failed.reason}", decision)
            self.r.book.decide(book, decision, book.reason)
            remembered = decision == "reject" and failed.gate not in ("no_op", "duplicate")
            if remembered or failed.gate == "protected_paths":  # tampering is told too
                await self._remember(book, tree, book.reason)
            return None
        if self.config.screening and not await self._screen(book, tree):
            return None
        return await self._paired(book, tree)

    async def _screen(self, book: SlotBook, tree: ArtifactRef) -> bool:
        case = hardest_failing(self.parent_units, self.config.gate.pass_score)
        if case is None:
            return True
        book.reach("screening")
        request = MeasureRequest(
            measurement_id=f"{book.slot_id}.screen",
            baseline_ref=self.parent,
            candidate_ref=tree,
            case_ids=(case,),
            baseline_repetitions=1,
            candidate_repetitions=1,
            gate=self.config.gate.model_copy(update={"sequential": False}),
        )
        _, units = await self._measure(request, "screening", book.iteration, book.slot)
        base = arm_score(units, "baseline", confidence=0.95, seed=self.config.seed)
        cand = arm_score(units, "candidate", confidence=0.95, seed=self.config.seed)
        if base is None or cand is None:
            return True  # not comparable: screening cannot judge, the full measurement will
        if cand.mean > base.mean:
            return True
        reason = f"screening: no gain on the hardest failing case {case}"
        book.end("rejected", reason, "reject")
        self.r.book.decide(book, "reject", reason)
        await self._remember(book, tree, reason)
        return False

    async def _paired(self, book: SlotBook, tree: ArtifactRef) -> MeasureSummary | None:
        book.reach("paired_replay")
        request = MeasureRequest(
            measurement_id=book.slot_id,
            baseline_ref=self.parent,
            candidate_ref=tree,
            baseline_repetitions=self.config.baseline_replay_repetitions,
            candidate_repetitions=self.config.candidate_replay_repetitions,
            gate=self.config.gate,
        )
        summary, _ = await self._measure(request, "paired", book.iteration, book.slot)
        if summary.status == "budget_limited":  # part of the pairs: no decision to act on
            reason = summary.message or "the budget ran out"
            book.end("not_run", reason, "indecisive")
            self.r.book.decide(book, "indecisive", f"measurement cut short: {reason}")
            raise Stopped("budget_limited", reason)
        book.reach("evaluation")
        gate = summary.gate
        self.r.book.decide(book, gate.decision, gate.reason)
        self.emit(
            DecisionEvent(
                run_id=self.s.run_id,
                iteration=book.iteration,
                slot=book.slot,
                digest=tree.digest,
                decision=gate.decision,
                reason=gate.reason[:256],
                mean_delta=gate.mean_delta,
                ci_low=gate.ci_low,
                ci_high=gate.ci_high,
            )
        )
        if gate.decision == "accept":
            book.decision = "accept"
            return summary
        terminal = "rejected" if gate.decision == "reject" else "blocked"
        book.end(terminal, gate.reason, gate.decision)
        if gate.decision == "reject":
            await self._remember(book, tree, gate.reason)
        return None

    async def _remember(self, book: SlotBook, tree: ArtifactRef, reason: str) -> None:
        diff = await trio.to_thread.run_sync(edit_diff, self.s.store, self.parent, tree)
        self.r.rejected.append(
            RejectedEdit(slot=book.slot_id, diff=diff[:4096], reason=reason[:256])
        )
        del self.r.rejected[:-REJECTED_KEPT]

    # ----- measuring -----------------------------------------------------------------------

    async def _measure_parent(self, iteration: int) -> None:
        """The parent's val results (what the optimizer prompt is made of); mostly reused."""
        self.emit(
            PhaseEvent(
                run_id=self.s.run_id,
                phase="baseline",
                cycle=self.s.cycle,
                iteration=iteration,
                parent=self.parent.digest,
            )
        )
        request = MeasureRequest(
            measurement_id=f"c{self.s.cycle}.i{iteration}.base",
            baseline_ref=self.parent,
            baseline_repetitions=self.config.baseline_replay_repetitions,
            gate=self.config.gate,
        )
        summary, self.parent_units = await self._measure(request, "baseline", iteration, None)
        if summary.status == "budget_limited":
            raise Stopped("budget_limited", summary.message or "the budget ran out")
        if not arm_scores(self.parent_units, "baseline"):  # nothing to compare against
            why = f"no case of the parent could be scored: {first_failure(self.parent_units)}"
            self.emit(WarningEvent(run_id=self.s.run_id, message=why[:256]))
            raise Stopped("failed", why)

    async def _measure(
        self, request: MeasureRequest, purpose: Purpose, iteration: int | None, slot: int | None
    ) -> tuple[MeasureSummary, list[dict[str, Any]]]:
        summary = await self.s.pipeline.measure(request)
        raw = await trio.to_thread.run_sync(self.s.store.read_bytes, summary.units_ref)
        units: list[dict[str, Any]] = orjson.loads(raw)
        self.r.book.measured(
            summary,
            units,
            purpose=purpose,
            cycle=self.s.cycle,
            split=request.split,
            iteration=iteration,
            slot=slot,
        )
        gate = summary.gate
        self.emit(
            MeasureEvent(
                run_id=self.s.run_id,
                measurement_id=summary.measurement_id,
                pairs_done=gate.n,
                pairs_planned=gate.n_planned,
                mean_delta=gate.mean_delta,
                se=gate.se,
                finished=True,
                decision=gate.decision,
            )
        )
        if summary.status == "shared_failure":
            self.emit(WarningEvent(run_id=self.s.run_id, message=summary.message[:256]))
        return summary, units

    async def _budget_event(self) -> BudgetUpdate:
        ledger = await self.s.budget.ask(LedgerQuery(), timeout=30)
        return BudgetUpdate(
            run_id=self.s.run_id,
            spent=ledger.spent,
            reserved=ledger.reserved,
            ceilings=ledger.ceilings,
        )

    # ----- finalize ----------------------------------------------------------------------

    async def _finalize(self) -> None:
        """Score the seed and the best tree on val (mostly reused) and the sealed test split."""
        self.emit(PhaseEvent(run_id=self.s.run_id, phase="finalize", cycle=self.s.cycle))
        best = self.r.best_ref or self.s.seed_ref
        confidence, seed = self.config.gate.confidence, self.config.seed
        full = self.config.gate.model_copy(update={"sequential": False})
        scores: dict[str, Any] = {}
        splits = [("val", "final_val")] + ([("test", "final_test")] if self.s.has_test else [])
        for split, purpose in splits:
            request = MeasureRequest(
                measurement_id=f"c{self.s.cycle}.final.{split}",
                baseline_ref=self.s.seed_ref,
                candidate_ref=best,
                split=split,  # type: ignore[arg-type]
                baseline_repetitions=self.config.baseline_replay_repetitions,
                candidate_repetitions=self.config.candidate_replay_repetitions,
                gate=full,
            )
            summary, units = await self._measure(request, purpose, None, None)  # type: ignore[arg-type]
            if summary.status == "budget_limited":
                raise Stopped("budget_limited", "the budget ran out while finalizing")
            scores[f"baseline_{split}"] = arm_score(
                units, "baseline", confidence=confidence, seed=seed
            )
            scores[f"best_{split}"] = arm_score(
                units, "candidate", confidence=confidence, seed=seed
            )
            if split == "test":
                self.r.test = self.r.book.measurements[-1]
        self.r.scores = Scores(**scores)
        self.r.finalized = True


def _stopped_in(error: BaseException) -> BaseException:
    """A `Stopped` raised in a slot (out of a nursery's exception group), else ``error``."""
    leaves, pending = [], [error]
    while pending:
        current = pending.pop()
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        else:
            leaves.append(current)
    if leaves and all(isinstance(leaf, Stopped) for leaf in leaves):
        return leaves[0]
    return error
