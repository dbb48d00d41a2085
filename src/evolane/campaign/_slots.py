"""One iteration's slots: their proposals from the optimizer lanes (concurrently, restored
from the journal on a resume), then each candidate through the funnel in slot order: unique
-> local gates -> screening -> paired measurement -> evaluation."""

from __future__ import annotations

from typing import Any

import trio

from evolane.actors import ActorCrashed, ActorError, ActorRef
from evolane.campaign._book import SlotBook, arm_score, hardest_failing, online_deltas
from evolane.campaign._continue import DROPPED_ON_HOST, HOST_FAILED_RUNS
from evolane.campaign._gates import run_local_gates
from evolane.campaign._online import RECHECKED, earlier_window
from evolane.campaign._peers import Peers
from evolane.campaign._prompt import edit_diff, encode_prompt
from evolane.campaign._runs import REJECTED_KEPT, RejectedEdit
from evolane.campaign._types import (
    CampaignServices,
    CampaignSetup,
    CycleState,
    HostFailed,
    Stopped,
    failure_text,
    not_stored,
    slot_id,
    slot_seed,
)
from evolane.measure import reserve_when_known
from evolane.messages import (
    ArtifactRef,
    Debit,
    FailureEvent,
    GateResult,
    MeasureRequest,
    MeasureSummary,
    ProposalRecord,
    ProposeJob,
    ProposeResult,
    Reserve,
    ReserveReply,
    StopUnits,
    WarningEvent,
)
from evolane.store import storage_failure
from evolane.supervisors import leaf_exceptions

PROPOSAL_REPLY_SLACK = 60.0
CUT_DEBIT_SECONDS = 10.0
"""How long a cut proposal's debit may hold a cancel (shielded): a stuck ledger never holds
a Ctrl-C for good (the journal has the proposal: a resume charges it)."""
"""What an optimizer lane may take beyond the proposal's deadline before it answers: its kill
ladder, then snapshotting the workdir into the store."""
ESTIMATE_WAIT = 2.0
"""Optimizer timeouts a call waits for the first call's usage to give an estimate."""


class Slots:
    """Proposes and funnels the slots of a cycle's iterations (state in `CycleState`)."""

    def __init__(
        self, setup: CampaignSetup, services: CampaignServices, peers: Peers, state: CycleState
    ) -> None:
        self.s, self.services, self.peers, self.state = setup, services, peers, state
        self.config = setup.config
        self.probed = False  # a call succeeded without a whole usage: none will give one
        self.looked = False  # the val ledger was told that the online budget is being spent
        self.last_crash: str | None = None  # an optimizer lane's last crash (`optimizer_down`)

    def slot_id(self, iteration: int, slot: int) -> str:
        """The slot's id, the same on a resume: ``c<cycle>.i<iteration>.s<slot>``."""
        return slot_id(self.s.cycle, iteration, slot)

    # ----- proposals ---------------------------------------------------------------------

    async def propose(
        self, iteration: int, prompts: list[dict[str, Any]], context: ArtifactRef
    ) -> list[ProposeResult]:
        """Every slot's proposal, from the journal or from a free optimizer lane."""
        results: list[ProposeResult | None] = [None] * len(prompts)
        optimizers = self.peers.optimizers
        lanes = trio.open_memory_channel[ActorRef](len(optimizers))
        for lane in optimizers:
            lanes[0].send_nowait(lane)

        async def one(slot: int) -> None:
            slot_id = self.slot_id(iteration, slot)
            restored = self.services.resume.proposals.get(slot_id)
            if restored is not None:
                results[slot] = restored.result
                if self.s.optimizer_allowed:  # a re-judge reads proposals it did not pay for
                    await self._charge(slot_id, results[slot], stage="optimizer")
                return
            if not self.s.optimizer_allowed:
                results[slot] = not_stored(slot_id)
                return
            earlier = self.services.resume.earlier_proposals.get(
                (slot_id, self.state.parent.digest)
            )
            if earlier is not None:  # a stopped run of this cycle asked it: in the books already
                results[slot] = earlier.result
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
            self.peers.stop_optimizers([self.slot_id(iteration, s) for s in range(len(prompts))])
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
        reply = await self._reserve(slot_id)
        if not reply.granted:
            raise Stopped("budget_limited", f"the budget denied the optimizer: {reply.reason}")
        store = self.services.store
        prompt_ref = await trio.to_thread.run_sync(
            lambda: store.put_bytes(encode_prompt(prompt), media_type="application/json")
        )
        propose = self.config.propose
        job = ProposeJob(
            slot_id=slot_id,
            parent_ref=self.state.parent,
            prompt_ref=prompt_ref,
            context_ref=context,
            seed=slot_seed(self.config.seed, self.s.cycle, iteration, slot),
            timeout_seconds=propose.optimizer_timeout,
            idle_seconds=propose.optimizer_idle,
        )
        result = await self._answer(lane, job)
        if result.status == "succeeded" and not result.usage_complete:
            self.probed = True  # it reports no whole usage: waiting for one would serialise
        return result

    async def _answer(self, lane: ActorRef, job: ProposeJob) -> ProposeResult:
        """``lane``'s proposal for ``job``, journaled and charged. A cancel (Ctrl-C, the wall
        clock) stops the job in the lane and still waits, shielded, up to
        `PROPOSAL_REPLY_SLACK` seconds, for its answer: what the cut call spent (a model's
        requests the provider may bill) is journaled, so a resume charges it too, and
        charged, before the cancel goes on (found by review: it was charged nowhere)."""
        answered: list[ProposeResult] = []
        cut: list[bool] = []
        waiting = trio.CancelScope(shield=True)

        async def stop_when_cancelled() -> None:
            try:
                await trio.sleep_forever()
            finally:  # cancelled from outside (else by the answer: then nothing is waiting)
                if not answered:
                    cut.append(True)
                    lane.signal(StopUnits(unit_ids=(job.slot_id,)))
                    waiting.deadline = trio.current_time() + PROPOSAL_REPLY_SLACK

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_when_cancelled)
            with waiting:
                answered.append(await self._ask(lane, job))
            result = answered[0] if answered else _cut(job.slot_id)
            await self._settle(result, job.parent_ref.digest, cut=bool(cut))
            nursery.cancel_scope.cancel()
        return result

    async def _ask(self, lane: ActorRef, job: ProposeJob) -> ProposeResult:
        """``lane``'s answer to ``job``; a broken lane fails the slot (not the candidate)."""
        timeout = job.timeout_seconds + PROPOSAL_REPLY_SLACK
        try:
            result: ProposeResult = await lane.ask(job, timeout=timeout)
        except ActorError as error:  # the lane broke, not the candidate: the slot is lost
            if storage_failure(error) is not None:  # unless the store cannot go on: the run
                raise
            if isinstance(error, ActorCrashed):
                self.last_crash = str(error)[:300]
            failure = FailureEvent(
                owner="framework",
                stage="optimizer",
                code=type(error).__name__,
                message=str(error)[:500],
            )
            result = ProposeResult(slot_id=job.slot_id, status="failed", failure=failure)
        return result

    async def _settle(self, result: ProposeResult, parent: str, *, cut: bool = False) -> None:
        """Journal ``result`` (a proposal for the tree ``parent``), then charge it. Journal
        first (a shielded append): a cancel between the two then loses no paid proposal,
        since a resume takes it from the journal and charges it again; a cancelled one that
        spent is journaled too, a resume charges it (`ResumeState.unpaid`) and asks its slot
        again. A ``cut`` call (a cancel came while it ran) is charged under a shield too, but
        for at most `CUT_DEBIT_SECONDS` (found by the suite: an unbounded shield held a
        cancel for good behind a stuck debit)."""
        cancelled = result.status == "cancelled"
        if not cancelled or result.usage.tokens or result.usage.cost_usd:
            record = ProposalRecord(slot=result.slot_id, result=result, parent=parent)
            with trio.CancelScope(shield=True):
                await self.services.journal.append(record)
        complete = result.usage_complete and not cancelled
        debit = Debit(item=result.slot_id, actual=result.usage, complete=complete)
        with trio.CancelScope(shield=cut) as scope:
            if cut:
                scope.deadline = trio.current_time() + CUT_DEBIT_SECONDS
            await self.peers.ask_budget(debit)

    async def _reserve(self, slot_id: str) -> ReserveReply:
        """Room in the budget for one optimizer call, at what such calls have cost: under a
        token or dollar ceiling the first runs alone until its usage gives the ledger an
        estimate (found by review: reserving nothing, a population of calls started past
        the ceiling, 40x over it). An optimizer whose usage gives none (a script that
        reports nothing) is not held to one call at a time for it: it reserves nothing."""
        wait = self.config.propose.optimizer_timeout * ESTIMATE_WAIT + PROPOSAL_REPLY_SLACK
        reply = await reserve_when_known(
            self.peers.ask_budget,
            lambda: Reserve(stage="optimizer", item=slot_id, zero_cost=self.probed),
            wait,
        )
        if reply is None:
            return ReserveReply(granted=False, reason="no optimizer call's cost was known in time")
        return reply

    async def _charge(self, item: str, result: ProposeResult, *, stage: str) -> None:
        debit = Debit(item=item, actual=result.usage, complete=False, stage=stage)
        await self.peers.ask_budget(debit)

    # ----- one candidate through the funnel ------------------------------------------------

    async def candidate(self, book: SlotBook, result: ProposeResult) -> MeasureSummary | None:
        """Take one proposal through the funnel; returns the summary when it was accepted."""
        state = self.state
        book.optimizer = result.summary
        if result.failure is not None:
            state.book.fail(book.slot_id, result.failure)
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
            state.book.decide(book, book.decision or "indecisive", book.reason)
            return None
        tree = result.tree_ref
        book.digest = tree.digest
        book.reach("generated")
        duplicate = tree.digest in state.seen and tree.digest != state.parent.digest
        book.reach("duplicate" if duplicate else "unique")
        gates = await run_local_gates(
            self.services.store,
            self.services.host,
            self.s.gates,
            state.parent,
            tree,
            state.seen - {state.parent.digest},
        )
        state.seen.add(tree.digest)
        book.gates.extend(gates)
        book.reach("local_gates")
        failed = next((g for g in gates if not g.passed), None)
        if failed is not None:
            decision = "indecisive" if failed.outcome == "indecisive" else "reject"
            book.end("rejected", f"{failed.gate}: {failed.reason}", decision)
            state.book.decide(book, decision, book.reason)
            remembered = decision == "reject" and failed.gate not in ("no_op", "duplicate")
            if remembered or failed.gate == "protected_paths":  # tampering is told too
                await self._remember(book, tree, book.reason)
            return None
        if self._host_failed_too_often(book, tree):
            return None
        try:
            if self.config.screening and not await self._screen(book, tree):
                return None
            return await self._paired(book, tree)
        except HostFailed as failed:
            if len(self._host_failed_in(book, tree)) + 1 < HOST_FAILED_RUNS:
                raise
            told = f"{failed.message}; this proposal's measurement stopped so in"
            then = "the next run drops it unmeasured, as indecisive"
            raise HostFailed(f"{told} {HOST_FAILED_RUNS} runs now: {then}") from None

    def _host_failed_in(self, book: SlotBook, tree: ArtifactRef) -> tuple[str, ...]:
        """The earlier runs of the cycle that failed on the host's failure in measuring the
        slot's proposal ``tree``."""
        return self.services.resume.host_failed.get((book.slot_id, tree.digest), ())

    def _host_failed_too_often(self, book: SlotBook, tree: ArtifactRef) -> bool:
        """Drop, as indecisive, a proposal whose measurement stopped on the host's failure in
        `HOST_FAILED_RUNS` earlier runs of the cycle (never a loss: nothing is remembered
        against it, and alone it makes no stall); whether it was dropped."""
        runs = self._host_failed_in(book, tree)
        if len(runs) < HOST_FAILED_RUNS:
            return False
        reason = (
            f"{DROPPED_ON_HOST}: its measurement stopped on the host's failure in {len(runs)} "
            f"runs ({', '.join(runs[-HOST_FAILED_RUNS:])}); not a loss of the candidate"
        )
        book.end("blocked", reason, "indecisive")
        self.state.book.decide(book, "indecisive", reason)
        self.peers.emit(
            WarningEvent(run_id=self.s.run_id, message=f"{book.slot_id} {reason}"[:256])
        )
        return True

    async def _screen(self, book: SlotBook, tree: ArtifactRef) -> bool:
        state, seed = self.state, self.config.seed
        case = hardest_failing(state.parent_units, self.config.gate.pass_score)
        if case is None:
            return True
        book.reach("screening")
        request = MeasureRequest(
            measurement_id=f"{book.slot_id}.screen",
            baseline_ref=state.parent,
            candidate_ref=tree,
            split=self.s.feedback_split,  # the case's: the parent's units are of that split
            case_ids=(case,),
            baseline_repetitions=1,
            candidate_repetitions=1,
            gate=self.config.gate.model_copy(update={"sequential": False}),
        )
        _, units = await self.peers.measure(
            state.book, request, "screening", book.iteration, book.slot
        )
        base = arm_score(units, "baseline", confidence=0.95, seed=seed)
        cand = arm_score(units, "candidate", confidence=0.95, seed=seed)
        if base is None or cand is None:
            return True  # not comparable: screening cannot judge, the full measurement will
        if cand.mean > base.mean:
            return True
        reason = f"screening: no gain on the hardest failing case {case}"
        book.end("rejected", reason, "reject")
        state.book.decide(book, "reject", reason)
        await self._remember(book, tree, reason)
        return False

    def _screened_on_val(self) -> tuple[str, ...]:
        """The case a screening chose the candidate on when it is a val case (val feeds the
        optimizer): the gate leaves it out. Found by audit: its pair, selected for a gain,
        was reused in the gate, so a screened-in candidate's p-value was not valid, and
        online error control, which spends its level per candidate tested, was broken."""
        if not self.config.screening or self.s.feedback_split != "val":
            return ()
        case = hardest_failing(self.state.parent_units, self.config.gate.pass_score)
        return () if case is None else (case,)

    async def _paired(self, book: SlotBook, tree: ArtifactRef) -> MeasureSummary | None:
        state = self.state
        book.reach("paired_replay")
        if state.online is not None:
            await self._val_look()
        summary, units = await self._measure_pair(book, tree, fresh=False)
        book.reach("evaluation")
        gate = summary.gate
        if state.online is not None:  # the campaign's rule: the gate and the online budget
            summary, units, gate = await self._online(book, tree, summary, units)
        state.book.decide(book, gate.decision, gate.reason)
        self.peers.decided(
            (book.iteration, book.slot),
            tree.digest,
            gate,
            self.config.gate,
            summary=book.optimizer,
            units=units,
        )
        if gate.decision == "accept":
            book.decision = "accept"
            return summary
        terminal = "rejected" if gate.decision == "reject" else "blocked"
        book.end(terminal, gate.reason, gate.decision)
        if gate.decision == "reject":
            await self._remember(book, tree, self._told(gate.reason))
        return None

    async def _val_look(self) -> None:
        """Record in the val split's ledger, before the run's first candidate is measured,
        that the campaign's online budget is being spent on these cases (`SplitLooks.val`)."""
        budget, looks = self.s.online_budget(), self.services.looks
        if self.looked or looks is None or budget is None:
            return
        self.looked = True
        await trio.to_thread.run_sync(looks.val, budget.alpha)

    async def _measure_pair(
        self, book: SlotBook, tree: ArtifactRef, *, fresh: bool
    ) -> tuple[MeasureSummary, list[dict[str, Any]]]:
        """The candidate paired with the parent on val (``fresh``: both arms replayed anew,
        `MeasureRequest.fresh`); `Stopped` when the budget cut it short."""
        state = self.state
        request = MeasureRequest(
            measurement_id=f"{book.slot_id}.recheck" if fresh else book.slot_id,
            baseline_ref=state.parent,
            candidate_ref=tree,
            baseline_repetitions=self.config.baseline_replay_repetitions,
            candidate_repetitions=self.config.candidate_replay_repetitions,
            gate=self.config.gate,
            early_accept=state.online is None,  # online control reads the full evaluation
            fresh=fresh,
            skip_case_ids=self._screened_on_val(),
        )
        summary, units = await self.peers.measure(
            state.book, request, "paired", book.iteration, book.slot
        )
        if summary.status == "budget_limited":  # part of the pairs: no decision to act on
            reason = summary.message or "the budget ran out"
            book.end("not_run", reason, "indecisive")
            state.book.decide(book, "indecisive", f"measurement cut short: {reason}")
            raise Stopped("budget_limited", reason)
        return summary, units

    async def _online(
        self,
        book: SlotBook,
        tree: ArtifactRef,
        summary: MeasureSummary,
        units: list[dict[str, Any]],
    ) -> tuple[MeasureSummary, list[dict[str, Any]], GateResult]:
        """The campaign's decision under online error control. A candidate it would accept
        on baseline replays from an earlier window (reused from the parent's measurement,
        or restored from an earlier session) is measured again beside fresh replays of the
        parent, and decided on those pairs alone: a drift of the replays' world since (an
        endpoint or a judge scoring higher) would otherwise favour it (`earlier_window`)."""
        online = self.state.online
        assert online is not None
        p_value = self._p_value(summary.gate, units)
        rechecked = online.would_accept(summary.gate, p_value) and earlier_window(units)
        if rechecked:
            summary, units = await self._measure_pair(book, tree, fresh=True)
            p_value = self._p_value(summary.gate, units)
        gate = online.decide(book.slot_id, summary.gate, p_value)
        if rechecked:
            reason = f"{RECHECKED}; {gate.reason}"[:256]
            gate = gate.model_copy(update={"reason": reason})
        return summary, units, gate

    def _p_value(self, gate: GateResult, units: list[dict[str, Any]]) -> float | None:
        """`OnlineRule.p_value` of a measurement's pairs; clustered cases give each cluster's
        mean delta, read with the betting bound (a cluster's mean is rarely a full gain)."""
        online = self.state.online
        assert online is not None
        deltas, by_case = online_deltas(units, self.services.clusters)
        return online.p_value(gate, deltas, self.config.gate, self.config.pass_fail and by_case)

    def _told(self, reason: str) -> str:
        """What the optimizer is told of a rejection: the gate's reason carries val outcomes
        (its mean, SE and p-value), a channel for fitting val that honest splits close (found
        by review), so it is withheld unless val feeds the optimizer anyway."""
        if self.s.feedback_split == "val":
            return reason
        return "rejected on the val cases (the gate's numbers are withheld: val is held out)"

    async def _remember(self, book: SlotBook, tree: ArtifactRef, reason: str) -> None:
        store, state = self.services.store, self.state
        diff = await trio.to_thread.run_sync(edit_diff, store, state.parent, tree)
        state.rejected.append(
            RejectedEdit(slot=book.slot_id, diff=diff[:4096], reason=reason[:256])
        )
        del state.rejected[:-REJECTED_KEPT]


def _cut(slot_id: str) -> ProposeResult:
    """A proposal cut off with no answer from its lane in time: what it spent is unknown
    (charged as reserved)."""
    failure = FailureEvent(owner="framework", stage="optimizer", code="cancelled")
    return ProposeResult(slot_id=slot_id, status="cancelled", failure=failure)


def _stopped_in(error: BaseException) -> BaseException:
    """A `Stopped` raised in a slot (out of a nursery's exception group), else ``error``."""
    leaves = leaf_exceptions(error)
    if all(isinstance(leaf, Stopped) for leaf in leaves):
        return leaves[-1]
    return error
