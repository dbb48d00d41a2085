"""The campaign actor: hill-climbs from the parent tree, one iteration at a time.

An iteration asks the optimizer lanes for up to ``population`` candidates (concurrently),
sends each through the funnel (unique -> local gates -> screening -> paired measurement ->
evaluation) in slot order, and promotes the best accepted one to parent. The optimizer is
shown the parent's results on the feedback split (train; val only when asked or when no
train could be carved: `campaign._splits`), never the val cases the gate decides on. After
the last iteration the seed and the best tree are scored on the val split and the sealed
test split (never used to decide), the apply policy runs, and the report is written.

Everything that decides is deterministic given the seed: slot seeds, measurement ids and unit
ids are derived, candidates are measured in slot order, and early stopping is judged on the
plan-ordered prefix. So a resumed run, which takes finished units and proposals from the
journal, reaches the decisions of an uninterrupted one.
"""

from __future__ import annotations

from typing import Any

import trio

from evolane.actors import Actor
from evolane.campaign._book import (
    SlotBook,
    arm_score,
    first_failure,
)
from evolane.campaign._confirm import confirm_best, confirm_repetitions, tested_before
from evolane.campaign._peers import Peers
from evolane.campaign._prompt import (
    build_prompt,
    classify_cases,
    convergence,
    focus_cases,
    write_context,
)
from evolane.campaign._report import IterationRecord, LineageEntry, Scores
from evolane.campaign._slots import Slots
from evolane.campaign._types import (
    CampaignServices,
    CampaignSetup,
    CycleState,
    Stopped,
    optimizer_down,
    slot_event,
)
from evolane.messages import (
    ArtifactRef,
    CampaignDone,
    MeasureRequest,
    Message,
    PhaseEvent,
    RunCampaign,
    StopAll,
    WarningEvent,
)
from evolane.store import describe_failure, host_refused, storage_failure
from evolane.views import arm_scores, left_out_at_zero

__all__ = ["Campaign"]


class Campaign(Actor):
    """Drives one cycle of a campaign (see the module docstring); its peers are found by
    slot name when it starts, and its outcome is stored and referenced in `CampaignDone`."""

    accepts = (RunCampaign,)
    signals = (StopAll,)  # a graceful stop: the cycle ends at once, resumable

    def __init__(self, setup: CampaignSetup, services: CampaignServices) -> None:
        self.setup, self.services = setup, services
        self.peers: Peers | None = None
        self.interrupted = trio.Event()

    def on_signal(self, message: Message) -> None:
        if isinstance(message, StopAll):
            self.interrupted.set()

    async def started(self) -> None:
        self.peers = Peers(self.setup, self.services, self.context.lookup)

    async def receive(self, message: Message) -> CampaignDone:
        assert isinstance(message, RunCampaign) and self.peers is not None
        cycle = _Cycle(self.setup, self.services, self.peers)
        await cycle.execute(message.deadline, self.interrupted)
        outcome = cycle.state.outcome(self.setup.campaign.seen)
        store = self.services.store
        ref = await trio.to_thread.run_sync(
            lambda: store.put_bytes(
                outcome.model_dump_json().encode(), media_type="application/json"
            )
        )
        return CampaignDone(stop=outcome.stop, message=outcome.message, outcome=ref)


class _Cycle:
    """One cycle: iterations from the parent, then the final scores (state in `CycleState`)."""

    def __init__(self, setup: CampaignSetup, services: CampaignServices, peers: Peers) -> None:
        self.s, self.services, self.peers = setup, services, peers
        self.config = setup.config
        self.state = CycleState.starting(setup)
        self.slots = Slots(setup, services, peers, self.state)

    async def execute(self, deadline: float | None, interrupted: trio.Event) -> None:
        """Run the cycle to its end, its deadline (``budget_limited``) or ``interrupted``."""
        with trio.CancelScope() as scope:
            if deadline is not None:
                scope.deadline = deadline
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_when, interrupted, scope)
                await self._run_stages()
                nursery.cancel_scope.cancel()
        if scope.cancelled_caught:
            self.state.stopped(deadline is not None and trio.current_time() >= deadline)

    async def _run_stages(self) -> None:
        state = self.state
        try:
            await self._iterate()
        except Stopped as stopped:
            state.stop, state.message = stopped.stop, stopped.message
        except Exception as error:  # a full disk or a damaged store ends the run failed
            failure = storage_failure(error)
            if failure is None or host_refused(failure):  # a thread or memory refused: the
                raise  # run's end names the limit and leaves it resumable, as anywhere else
            state.stop, state.message = "failed", describe_failure(failure, self.config.store)
        if state.stop in ("finished", "exhausted"):  # a spent budget leaves no room to score
            try:
                await self._finalize()
            except Stopped as stopped:
                state.stop, state.message = stopped.stop, stopped.message

    async def _iterate(self) -> None:
        state, cycle = self.state, self.s.cycle
        await self._measure_parent(0)
        for iteration in range(self.config.iterations):
            signal = convergence(state.stalled, self.config.stall)
            self.peers.emit(
                PhaseEvent(
                    run_id=self.s.run_id,
                    phase="optimize",
                    cycle=cycle,
                    iteration=iteration,
                    parent=state.parent.digest,
                    convergence=signal,
                )
            )
            if signal == "stop":
                raise Stopped(
                    "exhausted", f"{state.stalled} iterations without an accepted candidate"
                )
            accepted = await self._iteration(iteration, signal)
            self.peers.emit(await self.peers.budget_event())
            if accepted is not None and iteration + 1 < self.config.iterations:
                await self._measure_parent(iteration + 1)  # none for an iteration not to run
        if state.stalled >= self.config.stall:
            raise Stopped("exhausted", f"{state.stalled} iterations without an accepted candidate")

    async def _iteration(self, iteration: int, signal: str) -> SlotBook | None:
        state, store = self.state, self.services.store
        standings = await trio.to_thread.run_sync(
            classify_cases,
            state.parent_units,
            store,
            self.config.gate.pass_score,
            self.s.trace_reasons,
        )
        focus = focus_cases(standings, self.config.focus, iteration)
        case_refs = self.services.case_refs
        context = await trio.to_thread.run_sync(
            lambda: write_context(store, focus, state.parent_units, case_refs)
        )
        prompts = [
            build_prompt(
                iteration=iteration,
                cycle=self.s.cycle,
                slot=slot,
                focus=self.config.focus,
                convergence=signal,  # type: ignore[arg-type]
                standings=standings,
                rejected=[(r.diff, r.reason) for r in state.rejected],
                protected=list(self.config.guarded),
                recorded=self.s.trace_reasons,
            )
            for slot in range(self.config.population)
        ]
        books = [
            SlotBook(self.s.cycle, iteration, slot, self.slots.slot_id(iteration, slot))
            for slot in range(self.config.population)
        ]
        state.book.funnel.extend(books)
        accepted: list[Any] = []
        try:
            results = await self.slots.propose(iteration, prompts, context)
            down = optimizer_down(results, self.slots.last_crash)
            if down is not None:  # it ended finished, a campaign complete (found by review)
                for book, result in zip(books, results, strict=True):  # listed, as others are
                    if result.failure is not None:  # (found by review: failures was empty)
                        state.book.fail(book.slot_id, result.failure)
                raise Stopped("failed", f"iteration {iteration}: {down}")
            for slot, (book, result) in enumerate(zip(books, results, strict=True)):
                summary = await self.slots.candidate(book, result)
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
        state = self.state
        parent = state.parent
        chosen = None
        if accepted:
            delta, _, chosen, result = max(accepted, key=lambda a: (a[0], a[1]))
            for _, _, book, _ in accepted:
                if book is not chosen:
                    book.end(
                        "rejected", "accepted, but another candidate of the iteration did better"
                    )
            chosen.end("selected", f"accepted with mean delta {delta:+.3f}")
            state.parent = state.best_ref = result.tree_ref
            state.stalled = 0
            state.book.lineage.append(
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
            state.stalled += 1  # tampering or infrastructure-only iterations do not count
        state.book.iterations.append(
            IterationRecord(
                cycle=self.s.cycle,
                iteration=iteration,
                parent=parent.digest,
                convergence=signal,
                accepted_slot=chosen.slot if chosen is not None else None,
                best_after=state.parent.digest,
            )
        )
        for book in books:
            self.peers.emit(slot_event(self.s.run_id, book, book.terminal))
        return chosen

    async def _measure_parent(self, iteration: int) -> None:
        """The parent's val results (the baselines candidates are paired with; mostly reused)
        and, for an iteration still to come, its results on the feedback split (what the
        optimizer is shown: train unless val feeds it, see `campaign._splits`)."""
        state = self.state
        self.peers.emit(
            PhaseEvent(
                run_id=self.s.run_id,
                phase="baseline",
                cycle=self.s.cycle,
                iteration=iteration,
                parent=state.parent.digest,
            )
        )
        units = await self._measure_baseline(f"c{self.s.cycle}.i{iteration}.base", "val", iteration)
        if not arm_scores(units, "baseline"):  # nothing to compare against
            why = f"no case of the parent could be scored: {first_failure(units)}"
            self.peers.emit(WarningEvent(run_id=self.s.run_id, message=why[:256]))
            raise Stopped("failed", why)
        if self.s.feedback_split == "val":
            state.parent_units = units
        elif iteration < self.config.iterations:  # the last accepted parent gets no prompt
            mid = f"c{self.s.cycle}.i{iteration}.train"
            state.parent_units = await self._measure_baseline(mid, "train", iteration)

    async def _measure_baseline(
        self, measurement_id: str, split: str, iteration: int
    ) -> list[dict[str, Any]]:
        """The parent alone on ``split``: its units (`Stopped` when the budget ran out)."""
        state = self.state
        request = MeasureRequest(
            measurement_id=measurement_id,
            baseline_ref=state.parent,
            split=split,  # type: ignore[arg-type]
            baseline_repetitions=self.config.baseline_replay_repetitions,
            # alone, but told the repetitions its arm is told against a candidate (reused)
            candidate_repetitions=self.config.candidate_replay_repetitions,
            gate=self.config.gate,
        )
        summary, units = await self.peers.measure(state.book, request, "baseline", iteration, None)
        if summary.status == "budget_limited":
            raise Stopped("budget_limited", summary.message or "the budget ran out")
        return units

    async def _finalize(self) -> None:
        """Score the seed and the best tree on val (mostly reused) and the sealed test split."""
        state = self.state
        self.peers.emit(PhaseEvent(run_id=self.s.run_id, phase="finalize", cycle=self.s.cycle))
        best = state.best_ref or self.s.seed_ref
        confidence, seed = self.config.gate.confidence, self.config.seed
        full = self.config.gate.model_copy(update={"sequential": False})
        scores: dict[str, Any] = {}
        splits = [("val", "final_val")] + ([("test", "final_test")] if self.s.has_test else [])
        for split, purpose in splits:
            reps = (
                self.config.baseline_replay_repetitions,
                self.config.candidate_replay_repetitions,
            )
            confirming = self.s.confirms and best.digest != self.s.seed_ref.digest
            baseline = self.s.seed_ref
            if split == "test" and confirming:
                reps = (confirm_repetitions(self.config, self.s.test_cases),) * 2
                baseline = self.s.replaced_by(best)
                await self._test_begins(best)
            elif split == "test":  # scores seen, nothing confirmed: an uncontrolled look
                await self._seen(best, finished=False)
            request = MeasureRequest(
                measurement_id=f"c{self.s.cycle}.final.{split}",
                baseline_ref=baseline,
                candidate_ref=best,
                split=split,  # type: ignore[arg-type]
                baseline_repetitions=reps[0],
                candidate_repetitions=reps[1],
                gate=full,
            )
            summary, units = await self.peers.measure(state.book, request, purpose, None, None)  # type: ignore[arg-type]
            if summary.status == "budget_limited":
                raise Stopped("budget_limited", "the budget ran out while finalizing")
            scores[f"baseline_{split}"] = arm_score(
                units, "baseline", confidence=confidence, seed=seed
            )
            scores[f"best_{split}"] = arm_score(
                units, "candidate", confidence=confidence, seed=seed
            )
            if split == "test":
                state.test = state.book.measurements[-1]
                if not confirming:
                    await self._seen(best, finished=True)
                else:  # confirm before publish, under the campaign's budget
                    budget = self.s.confirmation_budget()
                    arms = (arm_scores(units, "baseline"), arm_scores(units, "candidate"))
                    worst = left_out_at_zero(units, arms[0])
                    against = "seed" if baseline == self.s.seed_ref else "published"
                    state.confirmation, state.confirmations = confirm_best(
                        budget,
                        best,
                        arms,
                        self.config,
                        self.s.test_cases,
                        against,
                        clusters=self.services.clusters,
                        worst=worst,
                    )
        state.scores = Scores(**scores)

    async def _test_begins(self, best: ArtifactRef) -> None:
        """Record in the test split's ledger that ``best``'s confirmation begins, at the level
        it is tested at, before any test replay runs (a tree tested before keeps its verdict:
        no new level is spent on it)."""
        looks = self.services.looks
        budget = self.s.confirmation_budget()
        if looks is None or tested_before(budget, best) is not None:
            return
        warning = await trio.to_thread.run_sync(looks.test, best.digest, budget.next_level)
        if warning is not None:
            self.peers.emit(WarningEvent(run_id=self.s.run_id, message=warning[:256]))

    async def _seen(self, best: ArtifactRef, finished: bool) -> None:
        """Record in the test split's ledger that ``best`` is scored on it with no
        confirmation (an uncontrolled look, `SplitLooks.seen`): before any test replay
        runs, then once measured (``finished``)."""
        looks = self.services.looks
        if looks is None:
            return
        warning = await trio.to_thread.run_sync(looks.seen, best.digest, finished)
        if warning is not None and not finished:  # the same ledger: warned once
            self.peers.emit(WarningEvent(run_id=self.s.run_id, message=warning[:256]))


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
