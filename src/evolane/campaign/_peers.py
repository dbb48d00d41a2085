"""The campaign actor's view of its run: its peers, found by slot name when it starts (the
scheduler, the budget, the optimizer lanes), the services it was given, and the asks it makes
of them (measure, budget) with the progress events they produce."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
import trio

from evolane.actors import ActorRef
from evolane.campaign._book import Book
from evolane.campaign._report import Purpose
from evolane.campaign._types import (
    CampaignServices,
    CampaignSetup,
    HostFailed,
    Stopped,
    shared_failure_line,
)
from evolane.campaign._verdict import arm_mean, decision_fields
from evolane.lanes import limiter_snapshot
from evolane.measure import Pipeline
from evolane.messages import (
    BudgetUpdate,
    DecisionEvent,
    EndpointLoad,
    GateConfig,
    GateResult,
    LedgerQuery,
    MeasureEvent,
    MeasureRequest,
    MeasureSummary,
    Message,
    ProgressEvent,
    StopAll,
    StopUnits,
    WarningEvent,
)


class Peers:
    """The refs and services one cycle works with (resolved once, when the actor starts)."""

    def __init__(
        self, setup: CampaignSetup, services: CampaignServices, lookup: Callable[[str], ActorRef]
    ) -> None:
        slots = setup.slots
        self.run_id, self.cycle, self.services = setup.run_id, setup.cycle, services
        self.budget = lookup(slots.budget)
        self.pipeline = Pipeline(lookup(slots.scheduler), self.budget)
        count = setup.config.propose.optimizer_concurrency
        self.optimizers = [lookup(name) for name in slots.optimizers(count)]

    def stop_optimizers(self, slot_ids: Sequence[str]) -> None:
        """Stop every proposal in flight (a `StopAll` signal to each optimizer lane) and these
        slots by name, since a job may still be queued in a lane's mailbox."""
        stops = StopUnits.batches(slot_ids)
        for lane in self.optimizers:
            lane.signal(StopAll())
            for stop in stops:
                lane.signal(stop)

    def emit(self, event: ProgressEvent) -> None:
        """Publish a progress event of the run."""
        self.services.bus.publish(event)

    async def ask_budget(self, message: Message) -> Any:
        """Ask the run's budget (reserve, debit, ledger)."""
        return await self.budget.ask(message)

    async def budget_event(self) -> BudgetUpdate:
        """The ledger as a progress event."""
        ledger = await self.ask_budget(LedgerQuery())
        return BudgetUpdate(
            run_id=self.run_id,
            spent=ledger.spent,
            reserved=ledger.reserved,
            ceilings=ledger.ceilings,
            by_role=ledger.by_role(),
            endpoints=endpoint_loads(),
        )

    async def measure(
        self,
        book: Book,
        request: MeasureRequest,
        purpose: Purpose,
        iteration: int | None,
        slot: int | None,
    ) -> tuple[MeasureSummary, list[dict[str, Any]]]:
        """Run one measurement, keep its record in ``book`` and tell the progress bus."""
        summary = await self.pipeline.measure(request)
        if summary.status == "cancelled":  # stopped from outside: nothing to decide on
            raise Stopped("interrupted", summary.message or "the measurement was cancelled")
        store = self.services.store
        raw = await trio.to_thread.run_sync(store.read_bytes, summary.units_ref)
        units: list[dict[str, Any]] = orjson.loads(raw)
        book.measured(
            summary,
            units,
            purpose=purpose,
            cycle=self.cycle,
            split=request.split,
            iteration=iteration,
            slot=slot,
        )
        gate = summary.gate
        evidence = gate.model_dump(include={"mean_delta", "se", "decision"})
        pairs = {"pairs_done": gate.n, "pairs_planned": gate.n_planned}
        if request.candidate_ref is None:  # the parent alone: cases scored, no decision
            scored = len({unit.get("case") for unit in units if unit.get("score") is not None})
            pairs = {"pairs_done": scored, "pairs_planned": max(gate.n_planned, scored)}
            evidence = {}
        done = MeasureEvent(
            run_id=self.run_id,
            measurement_id=summary.measurement_id,
            finished=True,
            parent_only=request.candidate_ref is None,
            purpose=purpose,
            split=request.split,
            iteration=iteration,
            baseline_mean=arm_mean(units, "baseline"),
            candidate_mean=arm_mean(units, "candidate"),
            **pairs,
            **evidence,
        )
        self.emit(done)
        self.emit(await self.budget_event())
        if summary.status == "shared_failure":  # the host's failure: no decision stands on it
            self.emit(WarningEvent(run_id=self.run_id, message=summary.message[:256]))
            raise HostFailed(shared_failure_line(summary))
        return summary, units

    def decided(
        self,
        where: tuple[int, int],
        digest: str,
        gate: GateResult,
        config: GateConfig,
        *,
        summary: str = "",
        units: list[dict[str, Any]] | None = None,
    ) -> None:
        """Tell the progress bus the gate's decision on a candidate (slot ``where``:
        iteration and slot), with the optimizer's ``summary`` of the edit, the rule's
        numbers and, from the measurement's ``units``, the cases it fixed and broke."""
        evidence = gate.model_dump(include={"decision", "mean_delta", "ci_low", "ci_high"})
        self.emit(
            DecisionEvent(
                run_id=self.run_id,
                iteration=where[0],
                slot=where[1],
                digest=digest,
                reason=gate.reason[:256],
                summary=" ".join(summary.split())[:256],
                **evidence,
                **decision_fields(gate, config, units),
            )
        )


def endpoint_loads() -> tuple[EndpointLoad, ...]:
    """The model endpoints' limits (`evolane.lanes.limiter_snapshot`), at most 8."""
    loads = [
        EndpointLoad(
            endpoint=_shown(key)[:256],
            limit=state["limit"],
            in_flight=state["in_flight"],
            rate_limited=state["rate_limited"],
        )
        for key, state in limiter_snapshot().items()
    ]
    return tuple(loads[:8])


def _shown(url: str) -> str:
    """``url`` without any user or password it carries (events are stored and shown)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=host))
