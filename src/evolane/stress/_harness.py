"""What every scenario shares: the round result, the report, soak rounds, task and GC helpers."""

from __future__ import annotations

import gc
import resource
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from evolane.messages import Record

MAX_DETAILS = 20


@dataclass
class RoundResult:
    """One round of a scenario: the invariants it checked, its counts and its measures.

    Counts add up over the rounds of a soak; measures keep the worst round's value.
    """

    invariants: dict[str, bool]
    counts: dict[str, int] = field(default_factory=dict)
    measures: dict[str, float] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)

    def check(self, name: str, held: bool, detail: str = "") -> None:
        """Record invariant ``name``; a failed one may say why in ``detail``."""
        self.invariants[name] = self.invariants.get(name, True) and held
        if not held and detail:
            self.details.append(f"{name}: {detail}"[:512])


class ScenarioReport(Record):
    """A scenario's outcome over all its rounds (one, or as many as a soak's duration allows)."""

    scenario: str
    seed: int
    rounds: int
    seconds: float
    config: dict[str, Any]
    invariants: dict[str, bool]
    counts: dict[str, int]
    measures: dict[str, float]
    failed_round: int | None = None
    details: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when every invariant held in every round."""
        return all(self.invariants.values())


RoundRunner = Callable[[Any], Awaitable[RoundResult]]


@dataclass(frozen=True)
class Scenario:
    """A named scenario: its config model, its quick preset and how to run one round."""

    name: str
    summary: str
    config: type[Record]
    run: RoundRunner
    quick: Mapping[str, Any] = field(default_factory=dict)
    higher_is_better: frozenset[str] = frozenset()


def make_config(
    scenario: Scenario, seed: int = 0, quick: bool = False, options: Mapping[str, Any] | None = None
) -> Record:
    """The scenario's config: defaults, then the quick preset, then ``options``; validated."""
    values = {**(scenario.quick if quick else {}), **(options or {}), "seed": seed}
    return scenario.config(**values)


async def run_rounds(
    scenario: Scenario, config: Record, duration: float | None = None
) -> ScenarioReport:
    """Run one round, or rounds until ``duration`` seconds have passed (a soak).

    Round ``r`` runs with seed ``seed + r``, so a failing round replays alone with that seed.
    A soak stops at the first round in which an invariant fails.
    """
    seed = int(getattr(config, "seed", 0))
    started = time.monotonic()
    merged = RoundResult(invariants={})
    rounds, failed = 0, None
    while True:
        round_config = config.model_copy(update={"seed": seed + rounds}) if rounds else config
        result = await scenario.run(round_config)
        _merge(merged, result, scenario.higher_is_better, first=rounds == 0)
        rounds += 1
        if not all(result.invariants.values()):
            failed = rounds - 1
            break
        if duration is None or time.monotonic() - started >= duration:
            break
    return ScenarioReport(
        scenario=scenario.name,
        seed=seed,
        rounds=rounds,
        seconds=round(time.monotonic() - started, 3),
        config=config.model_dump(mode="json"),
        invariants=merged.invariants,
        counts=merged.counts,
        measures=merged.measures,
        failed_round=failed,
        details=tuple(merged.details[:MAX_DETAILS]),
    )


def _merge(into: RoundResult, result: RoundResult, higher: frozenset[str], first: bool) -> None:
    for name, held in result.invariants.items():
        into.invariants[name] = into.invariants.get(name, True) and held
    for name, count in result.counts.items():
        into.counts[name] = into.counts.get(name, 0) + count
    for name, value in result.measures.items():
        if first or name not in into.measures:
            into.measures[name] = value
        else:
            pick = min if name in higher else max
            into.measures[name] = pick(into.measures[name], value)
    into.details.extend(result.details)


def count_tasks() -> int:
    """How many trio tasks are alive in this run (the root task included)."""
    stack = [trio.lowlevel.current_root_task()]
    total = 0
    while stack:
        task = stack.pop()
        total += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return total


async def settle_tasks(expected: int, seconds: float = 2.0) -> int:
    """Wait (bounded) for the task count to come back to ``expected``; returns the last count."""
    with trio.move_on_after(seconds):
        while count_tasks() != expected:
            await trio.sleep(0.005)
    return count_tasks()


def cpu_seconds() -> float:
    """User + system CPU time of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


@contextmanager
def long_lived_heap(enabled: bool = True, young: int = 50_000) -> Iterator[None]:
    """Freeze the objects alive now out of the cyclic GC and collect the young less often.

    A runtime holding many thousands of idle actors otherwise spends most of its time in
    full collections that walk those long-lived objects again and again.
    """
    if not enabled:
        yield
        return
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(young, 20, 20)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
