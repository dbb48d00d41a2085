"""The `budget` scenario: many lanes reserve, work and debit against one ceiling through the
budget actor, with random usage, releases, incomplete charges and overruns. Spending never
exceeds the ceiling plus the largest single reservation (plus the overruns, each recorded)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Literal

import trio
from pydantic import Field

from evolane.actors import ActorError, ActorRef
from evolane.measure import OVERRUNS_KEPT, BudgetActor, Ledger, LedgerSnapshot
from evolane.messages import Debit, LedgerQuery, Record, Release, Reserve, ReserveReply, Usage
from evolane.stress._harness import RoundResult, cpu_seconds
from evolane.supervisors import open_runtime

Ending = Literal["debit", "release", "incomplete", "overrun"]
CENTS = 100
ANSWER_SECONDS = 60.0


class BudgetConfig(Record):
    """Lanes and units against token and cost ceilings; demand is about twice the ceiling."""

    lanes: int = Field(default=64, ge=1, le=10_000)
    units: int = Field(default=5_000, ge=1, le=10_000_000)
    ceiling_tokens: int = Field(default=1_000_000, ge=1, le=10**12)
    ceiling_cents: int = Field(default=10_000, ge=1, le=10**12)
    max_estimate_tokens: int = Field(default=1_500, ge=1, le=10**9)
    release_rate: float = Field(default=0.05, ge=0.0, le=1.0)
    incomplete_rate: float = Field(default=0.05, ge=0.0, le=1.0)
    overrun_rate: float = Field(default=0.01, ge=0.0, le=1.0)
    max_work_seconds: float = Field(default=0.005, ge=0.0, le=10.0)
    seed: int = Field(default=0, ge=0)


@dataclass(frozen=True)
class PlannedUnit:
    """One unit of the seeded plan: its estimate, what it really uses, how it ends."""

    tokens: int
    cents: int
    used_tokens: int
    used_cents: int
    ending: Ending
    work: float


def budget_plan(config: BudgetConfig) -> list[PlannedUnit]:
    """The seeded plan, unit by unit (usage in whole tokens and cents, so sums are exact)."""
    rng = random.Random(config.seed)
    plan = []
    for _ in range(config.units):
        tokens = rng.randint(1, config.max_estimate_tokens)
        cents = rng.randint(1, max(1, tokens // 100))
        roll = rng.random()
        ending: Ending = "debit"
        if roll < config.overrun_rate:
            ending = "overrun"
        elif roll < config.overrun_rate + config.release_rate:
            ending = "release"
        elif roll < config.overrun_rate + config.release_rate + config.incomplete_rate:
            ending = "incomplete"
        factor = rng.uniform(1.1, 2.0) if ending == "overrun" else rng.uniform(0.0, 1.0)
        used = (round(tokens * factor), round(cents * factor))
        if ending == "overrun":
            used = (max(used[0], tokens + 1), max(used[1], cents + 1))
        work = rng.uniform(0.0, config.max_work_seconds)
        plan.append(PlannedUnit(tokens, cents, used[0], used[1], ending, work))
    return plan


@dataclass
class _Books:
    """The harness's own accounts, to check the ledger against."""

    granted: int = 0
    denied: int = 0
    largest_tokens: int = 0
    largest_cents: int = 0
    charged_tokens: int = 0
    charged_cents: int = 0
    overrun_tokens: int = 0
    overrun_cents: int = 0
    overruns: int = 0  # units that used more than they reserved
    overrun_entries: int = 0  # the ledger's overruns: one per unit and dimension
    endings: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def _charge(unit: PlannedUnit, books: _Books) -> Debit | Release:
    """The message that ends ``unit``, booking what the ledger must charge for it."""
    item_tokens, item_cents = unit.used_tokens, unit.used_cents
    books.endings[unit.ending] = books.endings.get(unit.ending, 0) + 1
    if unit.ending == "release":
        return Release(item="-")
    if unit.ending == "incomplete":  # charged at least the reservation
        item_tokens, item_cents = max(item_tokens, unit.tokens), max(item_cents, unit.cents)
    if unit.ending == "overrun":  # the plan makes it use more tokens and more cents
        books.overruns += 1
        books.overrun_entries += (item_tokens > unit.tokens) + (item_cents > unit.cents)
        books.overrun_tokens += item_tokens - unit.tokens
        books.overrun_cents += item_cents - unit.cents
    books.charged_tokens += item_tokens
    books.charged_cents += item_cents
    usage = Usage(tokens=unit.used_tokens, cost_usd=unit.used_cents / CENTS)
    return Debit(item="-", actual=usage, complete=unit.ending != "incomplete")


async def _lane(budget: ActorRef, plan: list[PlannedUnit], indices: range, books: _Books) -> None:
    for index in indices:
        unit = plan[index]
        item = f"unit-{index}"
        estimate = Usage(tokens=unit.tokens, cost_usd=unit.cents / CENTS)
        try:
            reply: ReserveReply = await budget.ask(
                Reserve(stage="replay", item=item, estimate=estimate), timeout=ANSWER_SECONDS
            )
            if not reply.granted:
                books.denied += 1
                continue
            books.granted += 1
            books.largest_tokens = max(books.largest_tokens, unit.tokens)
            books.largest_cents = max(books.largest_cents, unit.cents)
            await trio.sleep(unit.work)
            ending = _charge(unit, books).model_copy(update={"item": item})
            await budget.ask(ending, timeout=ANSWER_SECONDS)
        except ActorError as error:  # the invariant counts it; the other lanes go on
            books.errors.append(f"{item}: {error!r}"[:200])


async def run_budget_storm(config: BudgetConfig) -> RoundResult:
    """One round: every lane works through its share of the plan; then the books are compared."""
    plan = budget_plan(config)
    books = _Books()
    ceilings = Usage(tokens=config.ceiling_tokens, cost_usd=config.ceiling_cents / CENTS)
    ledger = Ledger(ceilings=ceilings)
    cpu, started = cpu_seconds(), time.perf_counter()
    async with open_runtime(name="budget-storm") as runtime:
        budget = await runtime.spawn(BudgetActor, ledger, name="budget")
        async with trio.open_nursery() as nursery:
            for lane in range(config.lanes):
                indices = range(lane, config.units, config.lanes)
                nursery.start_soon(_lane, budget, plan, indices, books)
        snapshot: LedgerSnapshot = await budget.ask(LedgerQuery(), timeout=60)
    return _result(config, books, snapshot, time.perf_counter() - started, cpu_seconds() - cpu)


def _result(
    config: BudgetConfig, books: _Books, snapshot: LedgerSnapshot, seconds: float, cpu: float
) -> RoundResult:
    spent_tokens = snapshot.spent.tokens or 0.0
    spent_cents = (snapshot.spent.cost_usd or 0.0) * CENTS
    bound_tokens = config.ceiling_tokens + books.largest_tokens + books.overrun_tokens
    bound_cents = config.ceiling_cents + books.largest_cents + books.overrun_cents
    result = RoundResult(invariants={})
    result.check("every budget request answered", not books.errors, "; ".join(books.errors[:3]))
    result.check(
        "tokens spent <= ceiling + largest reservation + overruns",
        spent_tokens <= bound_tokens,
        f"spent {spent_tokens:g}, bound {bound_tokens}",
    )
    result.check(
        "cost spent <= ceiling + largest reservation + overruns",
        spent_cents <= bound_cents + 1e-6,
        f"spent {spent_cents:g} cents, bound {bound_cents}",
    )
    result.check(
        "ledger charges == the lanes' charges",
        spent_tokens == books.charged_tokens and abs(spent_cents - books.charged_cents) < 1e-6,
        f"ledger {spent_tokens:g} tokens / {spent_cents:g} cents, lanes {books.charged_tokens}"
        f" / {books.charged_cents}",
    )
    kept = {overrun.item for overrun in snapshot.overruns}  # a unit overruns per dimension
    all_kept = len(snapshot.overruns) == books.overrun_entries and len(kept) == books.overruns
    result.check(
        "every overrun recorded",
        snapshot.overruns_total == books.overrun_entries
        and (all_kept or len(snapshot.overruns) == OVERRUNS_KEPT),
        f"{snapshot.overruns_total} counted of {books.overrun_entries}, {len(kept)} units kept"
        f" of {books.overruns}",
    )
    result.check("nothing left reserved", snapshot.in_flight == 0, f"{snapshot.in_flight} held")
    result.counts = {
        "units": config.units,
        "granted": books.granted,
        "denied": books.denied,
        "overruns": books.overruns,
        **{f"ended_{name}": count for name, count in sorted(books.endings.items())},
    }
    result.measures = {
        "tokens_spent_over_ceiling": round(spent_tokens / config.ceiling_tokens, 4),
        "tokens_past_ceiling": max(0.0, spent_tokens - config.ceiling_tokens),
        "largest_reservation_tokens": float(books.largest_tokens),
        "seconds": round(seconds, 3),
        "operations_per_second": round((2 * books.granted + books.denied) / seconds, 1),
        "cpu_seconds": round(cpu, 3),
    }
    return result
