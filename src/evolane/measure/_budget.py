"""The budget: an IO-free ledger (reserve / debit / release against ceilings) and its actor.

Policy: a reservation is granted while room remains under every active ceiling, so at most
one in-flight reservation can carry spending past a ceiling; spending therefore never
exceeds ceiling + the largest single reservation, as long as units stay within what they
reserved. A unit that does not is charged in full and recorded as an overrun, never silently.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from evolane.actors import Actor, ActorRef
from evolane.messages import (
    DIMENSIONS,
    BudgetEvent,
    Debit,
    Dimension,
    LedgerQuery,
    Message,
    Record,
    Release,
    Reserve,
    ReserveReply,
    Usage,
)

SAMPLES_KEPT = 64
OVERRUNS_KEPT = 1024
"""Overruns (and their events) the ledger keeps, the first ones; later ones are counted
(`Ledger.overruns_total`) and still published, so a ledger's memory stays bounded however
many units run (a quarter of units can overrun their wall-clock estimate)."""
LEVELS = ((0.5, "50%"), (0.8, "80%"), (1.0, "100%"))


ROLES = ("optimizer", "replay", "judge")
"""Who spends: the ledger's stages as a report names them."""

PROBE_RUNNING = "no estimate yet: waiting for the stage's first unit to finish"
"""Why a reservation without an estimate is refused for now: one probe unit of a stage runs
at a time under an active ceiling until its usage gives the ledger an estimate."""
PROBE_POLL_SECONDS = 0.05
"""How often a unit waiting for the budget's first estimate of its stage asks again."""


class Overrun(Record):
    """A unit that used more than it reserved."""

    item: str
    dimension: Dimension
    reserved: float
    charged: float


class LedgerSnapshot(Record):
    """The ledger's state: ceilings, spent (in all and by stage), reserved, overruns, events."""

    ceilings: Usage
    spent: Usage
    reserved: Usage
    spent_by_stage: dict[str, Usage]
    cached_by_stage: dict[str, int] = {}
    """Charges of answers taken from a response cache (free), by stage."""
    in_flight: int
    overruns: tuple[Overrun, ...]
    """The first `OVERRUNS_KEPT` overruns."""
    overruns_total: int = 0
    """Every overrun, counted."""
    events: tuple[BudgetEvent, ...]
    """The levels crossed, and the events of the overruns kept."""

    def by_role(self) -> dict[str, Usage]:
        """Spent by each role (`ROLES`) that spent anything, in that order."""
        return {role: self.spent_by_stage[role] for role in ROLES if role in self.spent_by_stage}


@dataclass
class _Held:
    stage: str
    estimate: Usage


def upper_quartile(samples: deque[float]) -> float:
    """The 75th percentile of ``samples`` (not empty) exactly as ``numpy.percentile`` computes
    it by default (linear interpolation, numpy's two-sided lerp), without numpy's per-call
    overhead: the ledger asks once per reservation."""
    ordered = sorted(samples)
    virtual = (len(ordered) - 1) * 0.75
    below = math.floor(virtual)
    low, high = ordered[below], ordered[min(below + 1, len(ordered) - 1)]
    weight, step = virtual - below, high - low
    return high - step * (1 - weight) if weight >= 0.5 else low + step * weight


def _value(usage: Usage | None, dimension: Dimension) -> float:
    value = usage.get(dimension) if usage is not None else None
    return value or 0.0


@dataclass
class Ledger:
    """Reservations and charges per dimension (tokens, cost_usd, wall_seconds).

    ``deadline`` (a ``clock()`` time) is the wall-clock ceiling: a unit whose wall estimate
    cannot finish before it is denied. ``cold_start`` gives per-unit estimates per stage
    until real samples exist; afterwards the estimate is the upper quartile of the last 64.
    A unit answered from a cache (``Usage.cached``) is no sample: it costs nothing and says
    nothing of what a fresh call costs (found by review: after cached judgements the
    estimate was 0, and every judge lane's first fresh calls went out at once, reserving
    nothing, 60 % past a cost ceiling)."""

    ceilings: Usage = field(default_factory=Usage)
    deadline: float | None = None
    cold_start: Mapping[str, Usage] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    _held: dict[str, _Held] = field(default_factory=dict)
    _spent: dict[Dimension, float] = field(default_factory=lambda: dict.fromkeys(DIMENSIONS, 0.0))
    _by_stage: dict[str, dict[Dimension, float]] = field(default_factory=dict)
    _samples: dict[tuple[str, Dimension], deque[float]] = field(default_factory=dict)
    _crossed: set[tuple[Dimension, str]] = field(default_factory=set)
    _cached: dict[str, int] = field(default_factory=dict)
    _estimates: dict[str, Usage | None] = field(default_factory=dict)  # per stage, 1 unit
    overruns: list[Overrun] = field(default_factory=list)  # the first OVERRUNS_KEPT
    overruns_total: int = 0
    events: list[BudgetEvent] = field(default_factory=list)  # levels, and overruns kept

    def _active(self) -> list[tuple[Dimension, float]]:
        return [(d, c) for d in ("tokens", "cost_usd") if (c := self.ceilings.get(d)) is not None]

    def reserved(self, dimension: Dimension) -> float:
        return sum(_value(held.estimate, dimension) for held in self._held.values())

    def reserve(
        self, stage: str, item: str, estimate: Usage | None, zero_cost: bool = False
    ) -> tuple[bool, str]:
        """Grant or deny room for ``item``; a denial changes nothing."""
        if item in self._held:
            return False, f"{item} already holds a reservation"
        active = self._active()
        unknown = estimate is None or any(estimate.get(d) is None for d, _ in active)
        probing = any(held.stage == stage for held in self._held.values())
        if unknown and active and not zero_cost and probing:
            return False, PROBE_RUNNING
        for dimension, ceiling in active:
            if self._spent[dimension] + self.reserved(dimension) >= ceiling:
                return False, f"{dimension} ceiling {ceiling:g} reached"
        wall = _value(estimate, "wall_seconds")
        if self.deadline is not None and self.clock() + wall > self.deadline:
            return False, "cannot finish before the wall-clock budget ends"
        self._held[item] = _Held(stage, estimate if estimate is not None else Usage())
        return True, "granted"

    def release(self, item: str) -> None:
        """Drop ``item``'s reservation without a charge."""
        self._held.pop(item, None)

    def debit(
        self, item: str, actual: Usage, complete: bool = True, stage: str | None = None
    ) -> list[BudgetEvent]:
        """Charge ``item``: its actual use, but at least its reservation where ``actual`` is
        incomplete or unknown. Returns the events this charge caused."""
        held = self._held.pop(item, None)
        stage = held.stage if held is not None else (stage or "unreserved")
        reserved = held.estimate if held is not None else Usage()
        caused: list[BudgetEvent] = []
        stage_totals = self._by_stage.setdefault(stage, dict.fromkeys(DIMENSIONS, 0.0))
        if actual.cached:
            self._cached[stage] = self._cached.get(stage, 0) + 1
        for dimension in DIMENSIONS:
            known = actual.get(dimension)
            charged = (
                known
                if (complete and known is not None)
                else max(known or 0.0, _value(reserved, dimension))
            )
            self._spent[dimension] += charged
            stage_totals[dimension] += charged
            if known is not None and complete and not actual.cached:
                self._samples.setdefault((stage, dimension), deque(maxlen=SAMPLES_KEPT)).append(
                    known
                )
                self._estimates.pop(stage, None)
            held_amount = _value(reserved, dimension)
            if held is not None and charged > held_amount and reserved.get(dimension) is not None:
                self._overrun(caused, item, dimension, held_amount, charged)
            self._check_levels(caused, dimension)
        return caused

    def _overrun(
        self,
        caused: list[BudgetEvent],
        item: str,
        dimension: Dimension,
        reserved: float,
        charged: float,
    ) -> None:
        """Count an overrun; keep it (and its event) while fewer than `OVERRUNS_KEPT` are."""
        self.overruns_total += 1
        event = self._event(dimension, "overrun", item)
        caused.append(event)
        if len(self.overruns) < OVERRUNS_KEPT:
            self.overruns.append(
                Overrun(item=item, dimension=dimension, reserved=reserved, charged=charged)
            )
            self.events.append(event)

    def _check_levels(self, caused: list[BudgetEvent], dimension: Dimension) -> None:
        ceiling = self.ceilings.get(dimension)
        if not ceiling:
            return
        for fraction, level in LEVELS:
            if (
                self._spent[dimension] >= fraction * ceiling
                and (dimension, level) not in self._crossed
            ):
                self._crossed.add((dimension, level))
                caused.append(self._event(dimension, level))
                self.events.append(caused[-1])

    def _event(self, dimension: Dimension, level: str, item: str | None = None) -> BudgetEvent:
        return BudgetEvent(
            dimension=dimension,
            level=level,  # type: ignore[arg-type]
            spent=self._spent[dimension],
            ceiling=self.ceilings.get(dimension),
            item=item,
        )

    def estimate(self, stage: str, units: int = 1) -> Usage | None:
        """Robust per-unit estimate x ``units``: the upper quartile of recent samples, else
        the stage's cold-start value; None when neither exists. The per-unit estimate is
        kept until the stage's next sample."""
        if stage not in self._estimates:
            self._estimates[stage] = self._unit_estimate(stage)
        estimate = self._estimates[stage]
        if estimate is None or units == 1:
            return estimate
        values = {d: v * units if (v := estimate.get(d)) is not None else None for d in DIMENSIONS}
        return Usage(**values)

    def _unit_estimate(self, stage: str) -> Usage | None:
        values: dict[str, float | None] = {}
        cold = self.cold_start.get(stage)
        for dimension in DIMENSIONS:
            samples = self._samples.get((stage, dimension))
            if samples:
                values[dimension] = upper_quartile(samples)
            else:
                fallback = cold.get(dimension) if cold is not None else None
                values[dimension] = fallback
        if all(v is None for v in values.values()):
            return None
        return Usage(**values)

    def snapshot(self) -> LedgerSnapshot:
        """The current state as a frozen record."""
        return LedgerSnapshot(
            ceilings=self.ceilings,
            spent=Usage(**self._spent),
            reserved=Usage(**{d: self.reserved(d) for d in DIMENSIONS}),
            spent_by_stage={stage: Usage(**totals) for stage, totals in self._by_stage.items()},
            cached_by_stage=dict(self._cached),
            in_flight=len(self._held),
            overruns=tuple(self.overruns),
            overruns_total=self.overruns_total,
            events=tuple(self.events),
        )


class BudgetActor(Actor):
    """Serialises all ledger changes; tells budget events to an optional observer."""

    accepts = (Reserve, Debit, Release, LedgerQuery)

    def __init__(self, ledger: Ledger, observer: ActorRef | None = None) -> None:
        self.ledger = ledger
        self.observer = observer
        self.events_dropped = 0

    async def receive(self, message: Message) -> Any:
        if isinstance(message, Reserve):
            estimate = message.estimate or self.ledger.estimate(message.stage)
            granted, reason = self.ledger.reserve(
                message.stage, message.item, estimate, message.zero_cost
            )
            return ReserveReply(granted=granted, reason=reason[:256], retry=reason == PROBE_RUNNING)
        if isinstance(message, Debit):
            events = self.ledger.debit(
                message.item, message.actual, message.complete, stage=message.stage
            )
            for event in events:
                self._publish(event)
            return None
        if isinstance(message, Release):
            self.ledger.release(message.item)
            return None
        return self.ledger.snapshot()

    def _publish(self, event: BudgetEvent) -> None:
        if self.observer is None:
            return
        try:
            self.observer.tell_nowait(event)
        except Exception:  # a slow or gone observer loses events (counted here), never spend
            self.events_dropped += 1


async def reserve_when_known(
    ask: Callable[[Reserve], Awaitable[ReserveReply]],
    reserve: Callable[[], Reserve],
    wait: float,
    stopped: Callable[[], bool] = lambda: False,
) -> ReserveReply | None:
    """Ask for ``reserve()`` until it is granted or refused for good: a refusal while the
    stage's first unit runs alone (`PROBE_RUNNING`) is asked again every
    `PROBE_POLL_SECONDS`, for at most ``wait`` seconds (then None) or until ``stopped()``."""
    with trio.move_on_after(wait):
        while True:
            reply = await ask(reserve())
            if reply.granted or not reply.retry or stopped():
                return reply
            await trio.sleep(PROBE_POLL_SECONDS)
    return None
