"""The `actors` stress scenario: N actors, M messages, seeded handler crashes, zero loss."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import numpy as np
import trio
from pydantic import Field

from evolane.actors import (
    Actor,
    ActorCrashed,
    ActorRef,
    ActorStopped,
    AskTimeout,
    MailboxFull,
    NotAnswered,
)
from evolane.messages import Message, Record, StressWork
from evolane.stress._harness import RoundResult, cpu_seconds, long_lived_heap, peak_rss_mb
from evolane.supervisors import ActorSpec, SupervisorSpec, open_runtime


class StressConfig(Record):
    """What to run: actors, messages, the crash rate and the traffic mix, all seeded.

    The sizes are bounded so that a run fits in a few GiB (an actor holds ~12 KiB, the plan
    ~100 bytes a message): found by review, ``--actors 1000000 --messages 100000000`` was
    accepted and would have held ~22 GiB."""

    actors: int = Field(default=2000, ge=1, le=100_000)
    messages: int = Field(default=200_000, ge=1, le=10_000_000)
    faults: float = Field(default=0.01, ge=0.0, le=1.0)
    seed: int = Field(default=0, ge=0)
    ask_ratio: float = Field(default=0.02, ge=0.0, le=1.0)
    nowait_ratio: float = Field(default=0.05, ge=0.0, le=1.0)
    producers: int = Field(default=8, ge=1, le=1024)
    actors_per_supervisor: int = Field(default=100, ge=1, le=1_000_000)
    mailbox_size: int = Field(default=64, ge=1, le=1_000_000)
    gc_tuning: bool = True
    """Freeze the started tree out of the cyclic GC (see `long_lived_heap`)."""


class StressReport(Record):
    """What happened: every sent message is delivered, dead-lettered or refused (lost = 0)."""

    config: StressConfig
    sent: int
    delivered: int
    dead_lettered: int
    refused: int
    lost: int
    restarts: int
    asks: int
    ask_timeouts: int
    seconds: float
    throughput_per_second: float
    ask_p50_ms: float
    ask_p99_ms: float
    peak_rss_mb: float
    cpu_seconds: float = 0.0
    invariants: dict[str, bool]

    @property
    def ok(self) -> bool:
        return all(self.invariants.values())


class _Tally:
    """Counters the harness keeps outside the system under test, to check it against."""

    def __init__(self) -> None:
        self.sent = 0
        self.delivered = 0
        self.refused = 0
        self.refused_crashes = 0  # refused messages that were marked to crash
        self.asks = 0
        self.ask_timeouts = 0
        self.latencies: list[float] = []


class StressWorker(Actor):
    """Counts what it handles; raises on messages marked to crash (a seeded fault)."""

    accepts = (StressWork,)

    def __init__(self, tally: _Tally) -> None:
        self.tally = tally

    async def receive(self, message: Message) -> Any:
        assert isinstance(message, StressWork)
        if message.crash:
            raise RuntimeError(f"injected fault at message {message.seq}")
        self.tally.delivered += 1
        return message.seq


def fault_schedule(config: StressConfig) -> list[tuple[int, bool, str]]:
    """The seeded plan, message by message: (target actor, crash?, send mode)."""
    rng = random.Random(config.seed)
    plan = []
    for _ in range(config.messages):
        target = rng.randrange(config.actors)
        crash = rng.random() < config.faults
        roll = rng.random()
        mode = (
            "ask"
            if roll < config.ask_ratio
            else ("nowait" if roll < config.ask_ratio + config.nowait_ratio else "tell")
        )
        plan.append((target, crash, mode))
    return plan


async def _produce(
    refs: list[ActorRef], plan: list[tuple[int, bool, str]], indices: range, tally: _Tally
) -> None:
    clock = time.perf_counter
    for seq in indices:
        target, crash, mode = plan[seq]
        message = StressWork(seq=seq, crash=crash)
        ref = refs[target]
        tally.sent += 1
        try:
            if mode == "tell":
                await ref.tell(message)
            elif mode == "nowait":
                ref.tell_nowait(message)
            else:
                tally.asks += 1
                started = clock()
                try:
                    await ref.ask(message, timeout=10.0)
                except (ActorCrashed, NotAnswered):
                    pass  # accepted into the mailbox; counted as a dead letter by the office
                except AskTimeout:
                    tally.ask_timeouts += 1
                tally.latencies.append(clock() - started)
        except (MailboxFull, ActorStopped):
            tally.refused += 1
            tally.refused_crashes += crash


async def run_actor_stress(config: StressConfig) -> StressReport:
    """Run the scenario once and check its invariants; never raises for a failed invariant."""
    tally = _Tally()
    plan = fault_schedule(config)
    size = config.actors_per_supervisor
    groups = [
        SupervisorSpec(
            name=f"group-{g}",
            children=[
                ActorSpec(
                    name=f"worker-{i}",
                    actor=StressWorker,
                    args=(tally,),
                    mailbox_size=config.mailbox_size,
                )
                for i in range(g * size, min(config.actors, (g + 1) * size))
            ],
            max_restarts=config.messages + 1,
            within_seconds=1.0,
        )
        for g in range((config.actors + size - 1) // size)
    ]
    started, cpu = time.perf_counter(), cpu_seconds()
    async with open_runtime(name="stress") as runtime:
        for group in groups:
            await runtime.start_supervisor(group)
        refs = [runtime.lookup(f"worker-{i}") for i in range(config.actors)]
        share = (config.messages + config.producers - 1) // config.producers
        with long_lived_heap(config.gc_tuning):
            async with trio.open_nursery() as nursery:
                for p in range(config.producers):
                    indices = range(p * share, min(config.messages, (p + 1) * share))
                    nursery.start_soon(_produce, refs, plan, indices, tally)
            await _until_drained(refs, deadline=60.0)

        def restarts_so_far() -> int:
            return sum(
                runtime.supervisor(group.name).restarts_of(child.name)
                for group in groups
                for child in group.children
            )

        # A crash is counted as a dead letter before its supervisor restarts the actor:
        # give the supervisors a bounded moment to catch up before checking the invariant.
        with trio.move_on_after(5.0):
            while restarts_so_far() < runtime.dead_letters.counts["crashed"]:
                await trio.sleep(0.01)
        restarts = restarts_so_far()
        received = sum(ref.stats().received for ref in refs)
    seconds = time.perf_counter() - started
    office = runtime.dead_letters
    dead = office.total
    lost = tally.sent - tally.delivered - dead - tally.refused
    latencies = np.array(tally.latencies or [0.0]) * 1000
    invariants = _invariants(tally, office.counts, plan, received, restarts)
    return StressReport(
        config=config,
        sent=tally.sent,
        delivered=tally.delivered,
        dead_lettered=dead,
        refused=tally.refused,
        lost=lost,
        restarts=restarts,
        asks=tally.asks,
        ask_timeouts=tally.ask_timeouts,
        seconds=round(seconds, 3),
        throughput_per_second=round(tally.sent / seconds, 1),
        ask_p50_ms=round(float(np.percentile(latencies, 50)), 3),
        ask_p99_ms=round(float(np.percentile(latencies, 99)), 3),
        peak_rss_mb=peak_rss_mb(),
        cpu_seconds=round(cpu_seconds() - cpu, 3),
        invariants=invariants,
    )


def _invariants(
    tally: _Tally,
    dead: Counter[str],
    plan: list[tuple[int, bool, str]],
    received: int,
    restarts: int,
) -> dict[str, bool]:
    """The invariants, from the harness's tally and the dead letters by reason.

    A dead letter is accounted for, not lost: only a crash may make one here (found by
    review: a runtime that dropped a crashed actor's queue as dead letters passed)."""
    total = sum(dead.values())
    crashes = sum(1 for _, crash, _ in plan if crash)
    return {
        "lost == 0": tally.sent - tally.delivered - total - tally.refused == 0,
        "enqueued == delivered + dead-lettered": received == tally.delivered + total,
        "every dead letter is a crash": total == dead["crashed"],
        "restarts == crashes handled": restarts == dead["crashed"],
        "crashes handled == crashes planned and accepted": (
            dead["crashed"] == crashes - tally.refused_crashes
        ),
        "no ask timed out": tally.ask_timeouts == 0,
    }


async def _until_drained(refs: list[ActorRef], deadline: float) -> None:
    """Wait until every mailbox is empty (all traffic handled), at most ``deadline`` seconds."""
    with trio.move_on_after(deadline):
        while any(ref.stats().mailbox_depth for ref in refs):
            await trio.sleep(0.01)


async def run_actor_round(config: StressConfig) -> RoundResult:
    """`run_actor_stress` as one round of the harness (invariants, counts, measures)."""
    report = await run_actor_stress(config)
    counts = ("sent", "delivered", "dead_lettered", "refused", "lost", "restarts", "asks",
              "ask_timeouts")  # fmt: skip
    measures = ("seconds", "throughput_per_second", "ask_p50_ms", "ask_p99_ms", "peak_rss_mb",
                "cpu_seconds")  # fmt: skip
    return RoundResult(
        invariants=dict(report.invariants),
        counts={name: getattr(report, name) for name in counts},
        measures={name: getattr(report, name) for name in measures},
    )
