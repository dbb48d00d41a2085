"""The `ask` scenario: an ask storm with random timeouts against slow, crashing and stopping
responders. Every ask must end in its reply or a typed error, none may hang (still in flight
past its timeout while the rest of the storm ended around it: `HANG_GRACE`), counts add up."""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass
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
    NotAnswered,
)
from evolane.messages import Message, Record, StressAction, StressAsk
from evolane.stress._harness import RoundResult, count_tasks, cpu_seconds, settle_tasks
from evolane.supervisors import ActorSpec, Runtime, SupervisorSpec, open_runtime

HANG_SLACK = 2.0
"""An ask that returns this long after its own timeout is late (counted, not a failure: on a
loaded host the loop itself runs late, found at load 8 where 19 asks took this long)."""
HANG_GRACE = 5.0
"""An ask still in flight past its own timeout once no ask at all has ended for this long is
hung: a loaded host makes asks end late, but they end; a hung one holds on while the rest of
the storm ends around it."""
HANG_TICKS = 20
"""The watchdog's ticks that must also pass with no ask ended (so `HANG_GRACE` seconds in
which the loop was starved, and so could end no ask, never count)."""


class AskConfig(Record):
    """The storm: responders (some temporary), asks from concurrent askers, fault rates."""

    responders: int = Field(default=64, ge=1, le=100_000)
    temporary_share: float = Field(default=0.125, ge=0.0, le=1.0)
    asks: int = Field(default=20_000, ge=1, le=10_000_000)
    askers: int = Field(default=64, ge=1, le=10_000)
    crash_rate: float = Field(default=0.05, ge=0.0, le=1.0)
    slow_rate: float = Field(default=0.05, ge=0.0, le=1.0)
    stop_rate: float = Field(default=0.001, ge=0.0, le=1.0)
    timeout_min: float = Field(default=0.005, gt=0.0, le=60.0)
    timeout_max: float = Field(default=0.25, gt=0.0, le=60.0)
    mailbox_size: int = Field(default=16, ge=1, le=1_000_000)
    seed: int = Field(default=0, ge=0)


@dataclass(frozen=True)
class PlannedAsk:
    """One ask of the seeded plan."""

    target: int
    action: StressAction
    delay: float
    timeout: float


def ask_plan(config: AskConfig) -> list[PlannedAsk]:
    """The seeded plan, ask by ask: target, what the responder does, its delay, the timeout."""
    rng = random.Random(config.seed)
    low, high = sorted((config.timeout_min, config.timeout_max))
    plan = []
    for _ in range(config.asks):
        target = rng.randrange(config.responders)
        timeout = rng.uniform(low, high)
        roll = rng.random()
        action: StressAction = "reply"
        delay = rng.uniform(0.0, 0.002) if rng.random() < 0.5 else 0.0
        if roll < config.stop_rate:
            action = "stop"
        elif roll < config.stop_rate + config.crash_rate:
            action = "crash"
        elif roll < config.stop_rate + config.crash_rate + config.slow_rate:
            action, delay = "slow", min(1.0, timeout * rng.uniform(1.2, 3.0))
        plan.append(PlannedAsk(target, action, delay, timeout))
    return plan


class Responder(Actor):
    """Sleeps the asked delay, then answers its sequence number, crashes or stops."""

    accepts = (StressAsk,)

    def __init__(self, stops: Counter[str]) -> None:
        self.stops = stops

    async def receive(self, message: Message) -> Any:
        assert isinstance(message, StressAsk)
        if message.delay:
            await trio.sleep(message.delay)
        if message.action == "crash":
            raise RuntimeError(f"injected crash at ask {message.seq}")
        if message.action == "stop":
            self.stops[self.context.name] += 1
            self.stop()
        return message.seq


class _Outcomes:
    """What the askers saw, kept outside the system under test."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.wrong: list[str] = []
        self.latencies: list[float] = []
        self.overshoot = 0.0
        self.late = 0
        self.in_flight: dict[int, tuple[trio.CancelScope, float]] = {}
        self.last_end = trio.current_time()
        self.quiet_ticks = 0  # watchdog ticks since an ask last ended


async def _watch_for_hangs(out: _Outcomes) -> None:
    """Cancel, as hung, the asks in flight past their own timeout once no ask has ended for
    `HANG_GRACE` seconds and `HANG_TICKS` ticks of this loop."""
    while True:
        await trio.sleep(HANG_GRACE / HANG_TICKS)
        out.quiet_ticks += 1
        now = trio.current_time()
        if out.quiet_ticks >= HANG_TICKS and now - out.last_end >= HANG_GRACE:
            for scope, due in list(out.in_flight.values()):
                if due < now:
                    scope.cancel()


async def _ask_one(
    ref: ActorRef, seq: int, planned: PlannedAsk, temporary: bool, out: _Outcomes
) -> None:
    message = StressAsk(seq=seq, action=planned.action, delay=planned.delay)
    started = time.perf_counter()
    outcome = "hung"  # unless it ends before the watchdog cancels it (`_watch_for_hangs`)
    with trio.CancelScope() as scope:
        out.in_flight[seq] = (scope, trio.current_time() + planned.timeout)
        try:
            value = await ref.ask(message, timeout=planned.timeout)
            outcome = "reply"
            if value != seq:
                out.wrong.append(f"ask {seq} got {value!r}")
        except AskTimeout:
            outcome = "timeout"
        except ActorCrashed:
            outcome = "crashed"
            if planned.action != "crash":
                out.wrong.append(f"ask {seq} ({planned.action}) got ActorCrashed")
        except NotAnswered:
            outcome = "not_answered"
        except ActorStopped:
            outcome = "stopped"
        except Exception as error:  # the invariant counts it; the storm goes on
            outcome = "untyped"
            out.wrong.append(f"ask {seq} raised {error!r}"[:200])
    del out.in_flight[seq]
    out.last_end, out.quiet_ticks = trio.current_time(), 0
    if outcome in ("not_answered", "stopped") and not temporary:
        out.wrong.append(f"ask {seq} to a permanent responder got {outcome}")
    elapsed = time.perf_counter() - started
    out.late += outcome != "hung" and elapsed > planned.timeout + HANG_SLACK
    out.seen[outcome] += 1
    out.latencies.append(elapsed)
    out.overshoot = max(out.overshoot, elapsed - planned.timeout)


async def _asker(
    refs: list[ActorRef],
    temporary: set[int],
    plan: list[PlannedAsk],
    indices: range,
    out: _Outcomes,
) -> None:
    for seq in indices:
        planned = plan[seq]
        await _ask_one(refs[planned.target], seq, planned, planned.target in temporary, out)


@dataclass
class _Observed:
    """The runtime's own counters once the storm has settled."""

    received: int
    processed: int
    dead: Counter[str]
    restarts: int
    expected_restarts: int
    retired: int
    retired_wrongly: list[str]
    tasks_before: int
    tasks_after: int = 0


def _observe(
    runtime: Runtime, refs: list[ActorRef], temporary: set[int], stops: Counter[str]
) -> _Observed:
    supervisor = runtime.supervisor("responders")
    stats = [ref.stats() for ref in refs]
    office = runtime.dead_letters
    restarts = expected = 0
    wrong = []
    for i, (ref, stat) in enumerate(zip(refs, stats, strict=True)):
        ended = stat.failed + stops[ref.name]
        if i in temporary:
            if ref.stopped != (ended > 0):
                wrong.append(f"{ref.name}: {ended} exits, retired {ref.stopped}")
        else:
            restarts += supervisor.restarts_of(ref.name)
            expected += ended
    return _Observed(
        received=sum(s.received for s in stats),
        processed=sum(s.processed for s in stats),
        dead=Counter(office.counts),
        restarts=restarts,
        expected_restarts=expected,
        retired=sum(ref.stopped for ref in refs),
        retired_wrongly=wrong,
        tasks_before=0,
    )


async def _settle(
    runtime: Runtime, refs: list[ActorRef], temporary: set[int], stops: Counter[str]
) -> _Observed:
    """Wait (bounded) until every enqueued ask is handled or dead-lettered and every exit of a
    responder is followed by its restart (permanent) or retirement (temporary)."""
    with trio.move_on_after(30.0):
        while True:
            seen = _observe(runtime, refs, temporary, stops)
            if (
                seen.received == seen.processed + sum(seen.dead.values())
                and seen.restarts == seen.expected_restarts
                and not seen.retired_wrongly
            ):
                return seen
            await trio.sleep(0.01)
    return _observe(runtime, refs, temporary, stops)


def _specs(config: AskConfig, stops: Counter[str]) -> tuple[SupervisorSpec, set[int]]:
    temporary = set(range(round(config.responders * config.temporary_share)))
    children = [
        ActorSpec(
            name=f"responder-{i}",
            actor=Responder,
            args=(stops,),
            restart="temporary" if i in temporary else "permanent",
            mailbox_size=config.mailbox_size,
            shutdown_grace=2.0,
        )
        for i in range(config.responders)
    ]
    spec = SupervisorSpec(
        name="responders", children=children, max_restarts=10**9, within_seconds=1.0
    )
    return spec, temporary


async def run_ask_storm(config: AskConfig) -> RoundResult:
    """One round of the ask storm; never raises for a failed invariant."""
    plan = ask_plan(config)
    stops: Counter[str] = Counter()
    spec, temporary = _specs(config, stops)
    out = _Outcomes()
    tasks_before = count_tasks()
    cpu, started = cpu_seconds(), time.perf_counter()
    async with open_runtime(name="ask-storm") as runtime:
        supervisor = await runtime.start_supervisor(spec)
        refs = [supervisor.ref(f"responder-{i}") for i in range(config.responders)]
        async with trio.open_nursery() as watching:
            watching.start_soon(_watch_for_hangs, out)
            async with trio.open_nursery() as nursery:
                for k in range(config.askers):
                    indices = range(k, config.asks, config.askers)
                    nursery.start_soon(_asker, refs, temporary, plan, indices, out)
            watching.cancel_scope.cancel()
        seconds = time.perf_counter() - started
        observed = await _settle(runtime, refs, temporary, stops)
    observed.tasks_before = tasks_before
    observed.tasks_after = await settle_tasks(tasks_before)
    return _result(config, plan, out, observed, seconds, cpu_seconds() - cpu)


def _result(
    config: AskConfig,
    plan: list[PlannedAsk],
    out: _Outcomes,
    seen_by_runtime: _Observed,
    seconds: float,
    cpu: float,
) -> RoundResult:
    seen, rt = out.seen, seen_by_runtime
    result = RoundResult(invariants={})
    # Ended in a reply or a typed error: found by review, this counted hung and untyped
    # outcomes as ended too, so it could never fail.
    ended = sum(seen.values()) - seen["hung"] - seen["untyped"]
    result.check(
        "every ask ended in a reply or a typed error",
        ended == config.asks,
        f"{ended} of {config.asks}",
    )
    quiet = f"in flight past their timeout while no ask ended for {HANG_GRACE:g} s"
    result.check("none hung", seen["hung"] == 0, f"{seen['hung']} hung ({quiet})")
    result.check("errors are typed", seen["untyped"] == 0, f"{seen['untyped']} untyped")
    result.check("replies and errors match the asks", not out.wrong, "; ".join(out.wrong[:3]))
    dead = sum(rt.dead.values())
    result.check(
        "enqueued == handled + dead-lettered",
        rt.received == rt.processed + dead,
        f"received {rt.received}, processed {rt.processed}, dead letters {dict(rt.dead)}",
    )
    crash_asks = sum(p.action == "crash" for p in plan)
    result.check(
        "ActorCrashed seen <= crashes handled <= crashes asked",
        seen["crashed"] <= rt.dead["crashed"] <= crash_asks,
        f"seen {seen['crashed']}, handled {rt.dead['crashed']}, asked {crash_asks}",
    )
    result.check(
        "every permanent exit restarted, every temporary one retired",
        rt.restarts == rt.expected_restarts and not rt.retired_wrongly,
        f"restarts {rt.restarts} of {rt.expected_restarts}; {rt.retired_wrongly[:2]}",
    )
    result.check(
        "no task leaked",
        rt.tasks_after == rt.tasks_before,
        f"{rt.tasks_before} -> {rt.tasks_after}",
    )
    latencies = np.array(out.latencies or [0.0]) * 1000
    result.counts = {
        "asks": config.asks,
        "replies": seen["reply"],
        "timeouts": seen["timeout"],
        "crashed": seen["crashed"],
        "not_answered": seen["not_answered"],
        "stopped": seen["stopped"],
        "hung": seen["hung"],
        "late": out.late,
        "untyped": seen["untyped"],
        "restarts": rt.restarts,
        "responders_retired": rt.retired,
        "dead_letters": dead,
    }
    result.measures = {
        "seconds": round(seconds, 3),
        "asks_per_second": round(config.asks / max(seconds, 1e-9), 1),
        "ask_p50_ms": round(float(np.percentile(latencies, 50)), 3),
        "ask_p99_ms": round(float(np.percentile(latencies, 99)), 3),
        "max_past_timeout_ms": round(out.overshoot * 1000, 3),
        "cpu_seconds": round(cpu, 3),
    }
    return result
