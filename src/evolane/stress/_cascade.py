"""The `cascade` scenario: nested supervisors whose restart intensity is exceeded at random
depths. A model of OTP supervision predicts every start, stop and restart; the real tree must
match it exactly (escalation reaches the right level), stop in reverse start order and leak no
task."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import trio
from pydantic import Field

from evolane.actors import Actor, ActorCrashed, ActorError, ActorRef
from evolane.messages import Message, Record, StressWork
from evolane.stress._harness import RoundResult, count_tasks, cpu_seconds, settle_tasks
from evolane.supervisors import ActorSpec, Runtime, Strategy, SupervisorSpec, open_runtime

STRATEGIES: tuple[Strategy, ...] = ("one_for_one", "one_for_all", "rest_for_one")
EVENT_WAIT = 10.0
"""Seconds to wait for the events the model predicts for one crash."""

Event = tuple[str, str]  # ("start" | "stop", worker name)


class CascadeConfig(Record):
    """A chain of nested supervisors, each with random strategy and intensity, and crash bursts."""

    depth: int = Field(default=6, ge=1, le=50)
    faults: int = Field(default=200, ge=0, le=100_000)
    max_burst: int = Field(default=4, ge=1, le=100)
    max_intensity: int = Field(default=3, ge=0, le=100)
    seed: int = Field(default=0, ge=0)


class Worker(Actor):
    """Logs its starts and graceful stops; crashes on a `StressWork` marked ``crash``."""

    accepts = (StressWork,)

    def __init__(self, log: list[Event]) -> None:
        self.log = log

    async def started(self) -> None:
        self.log.append(("start", self.context.name))

    async def stopped(self) -> None:
        self.log.append(("stop", self.context.name))

    async def receive(self, message: Message) -> Any:
        assert isinstance(message, StressWork)
        if message.crash:
            raise RuntimeError(f"injected crash {message.seq}")
        return message.seq


@dataclass
class Node:
    """The model's view of one slot: a worker or a supervisor with its limits and children."""

    name: str
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)
    strategy: Strategy = "one_for_one"
    max_restarts: int = 0
    level: int = 0
    count: int = 0  # restarts counted by this supervisor in its current incarnation
    restarts: int = 0  # times this slot was restarted by its parent
    gave_up: int = 0
    running: bool = True

    @property
    def is_worker(self) -> bool:
        return not self.name.startswith("sup")


class Model:
    """OTP supervision as the spec promises it, on the worker start/stop events it causes."""

    def __init__(self, top: Node) -> None:
        self.top = top
        self.events: list[Event] = []

    def start(self, node: Node) -> None:
        node.running = True
        if node.is_worker:
            self.events.append(("start", node.name))
            return
        node.count = 0
        for child in node.children:
            self.start(child)

    def stop(self, node: Node) -> None:
        if not node.running:
            return
        node.running = False
        if node.is_worker:
            self.events.append(("stop", node.name))
            return
        for child in reversed(node.children):
            self.stop(child)

    def crash(self, worker: Node) -> None:
        """A worker's handler raised: its supervisor restarts by strategy or gives up."""
        self.exit(worker)

    def exit(self, child: Node) -> None:
        parent = child.parent
        assert parent is not None
        child.running = False
        parent.count += 1
        if parent.count > parent.max_restarts:
            parent.gave_up += 1
            for sibling in reversed(parent.children):
                self.stop(sibling)
            self.exit(parent)
            return
        index = parent.children.index(child)
        group = {
            "one_for_one": [child],
            "one_for_all": parent.children,
            "rest_for_one": parent.children[index:],
        }[parent.strategy]
        for sibling in reversed(group):
            if sibling is not child:
                self.stop(sibling)
        for member in group:
            member.restarts += 1
            self.start(member)


def build_tree(config: CascadeConfig) -> tuple[Node, list[Node], list[Node]]:
    """The seeded chain: level L has workers ``wL.a``, ``wL.b`` around supervisor L+1."""
    rng = random.Random(config.seed)
    top = Node("sup0", max_restarts=10**9)
    supervisors, workers = [top], []
    parent: Node = top
    for level in range(config.depth + 1):
        first = Node(f"w{level}.a", parent=parent, level=level)
        last = Node(f"w{level}.b", parent=parent, level=level)
        workers += [first, last]
        inner = None
        if level < config.depth:
            inner = Node(
                f"sup{level + 1}",
                parent=parent,
                level=level + 1,
                strategy=rng.choice(STRATEGIES),
                max_restarts=rng.randint(0, config.max_intensity),
            )
            supervisors.append(inner)
        parent.children = [first, *([inner] if inner else []), last]
        parent = inner or parent
    return top, supervisors, workers


def fault_plan(config: CascadeConfig, workers: list[Node]) -> list[tuple[str, int]]:
    """The seeded bursts: (worker name, how many crashes in a row)."""
    rng = random.Random(config.seed * 7919 + 1)
    return [
        (rng.choice(workers).name, rng.randint(1, config.max_burst)) for _ in range(config.faults)
    ]


def to_spec(node: Node, log: list[Event]) -> SupervisorSpec | ActorSpec:
    """The real spec for a model node (the intensity window is long: counts never expire)."""
    if node.is_worker:
        return ActorSpec(name=node.name, actor=Worker, args=(log,), shutdown_grace=2.0)
    return SupervisorSpec(
        name=node.name,
        children=[to_spec(child, log) for child in node.children],
        strategy=node.strategy,
        max_restarts=node.max_restarts,
        within_seconds=3600.0,
        shutdown_grace=10.0,
    )


@dataclass
class _Run:
    """The real tree's log and what differs from the model."""

    log: list[Event] = field(default_factory=list)
    checked: int = 0  # events of the log already found equal to the model's
    problems: list[str] = field(default_factory=list)
    tasks_steady: int = 0
    task_drift: int = 0


async def _wait_for(run: _Run, count: int) -> None:
    with trio.move_on_after(EVENT_WAIT):
        while len(run.log) < count:
            await trio.sleep(0.001)


async def _inject(
    runtime: Runtime, model: Model, nodes: dict[str, Node], plan: list[tuple[str, int]], run: _Run
) -> None:
    for burst, (name, crashes) in enumerate(plan):
        ref: ActorRef = runtime.lookup(name)
        for k in range(crashes):
            try:
                await ref.ask(StressWork(seq=burst * 1000 + k, crash=True), timeout=EVENT_WAIT)
                run.problems.append(f"crash {burst}.{k} at {name} was answered")
            except ActorCrashed:
                pass
            except ActorError as error:
                run.problems.append(f"crash {burst}.{k} at {name}: {error!r}")
                return
            model.crash(nodes[name])
            await _wait_for(run, len(model.events))
            # Only the events since the last check: found by review, comparing the whole log
            # after every crash made a long run quadratic (2,000 bursts: 454 s, 500: 61 s).
            if run.log[run.checked :] != model.events[run.checked :]:
                run.problems.append(_first_difference(run.log, model.events, f"{burst}.{k}"))
                return
            run.checked = len(model.events)
        now = await settle_tasks(run.tasks_steady)
        run.task_drift = max(run.task_drift, abs(now - run.tasks_steady))


def _first_difference(actual: list[Event], expected: list[Event], where: str) -> str:
    for i, (seen, wanted) in enumerate(zip(actual, expected, strict=False)):
        if seen != wanted:
            return f"after crash {where}, event {i}: got {seen}, model says {wanted}"
    return f"after crash {where}: {len(actual)} events, model says {len(expected)}"


async def run_cascade(config: CascadeConfig) -> RoundResult:
    """One round: build the tree, inject the bursts, compare with the model, shut down."""
    top, supervisors, workers = build_tree(config)
    nodes = {node.name: node for node in [*supervisors, *workers]}
    plan = fault_plan(config, workers)
    model, run = Model(top), _Run()
    tasks_before = count_tasks()
    cpu, started = cpu_seconds(), time.perf_counter()
    async with open_runtime(name="cascade-root") as runtime:
        await runtime.start_child(to_spec(top, run.log))
        model.start(top)
        run.tasks_steady = count_tasks()
        await _inject(runtime, model, nodes, plan, run)
        before_shutdown = len(run.log)
        restarts = {
            node.name: runtime.supervisor(node.parent.name).restarts_of(node.name)
            for node in nodes.values()
            if node.parent is not None
        }
    tasks_after = await settle_tasks(tasks_before)
    shutdown = run.log[before_shutdown:]
    model.stop(top)
    return _result(
        plan, model, run, nodes, restarts, shutdown, tasks_before, tasks_after,
        time.perf_counter() - started, cpu_seconds() - cpu,
    )  # fmt: skip


def _result(
    plan: list[tuple[str, int]],
    model: Model,
    run: _Run,
    nodes: dict[str, Node],
    restarts: dict[str, int],
    shutdown: list[Event],
    tasks_before: int,
    tasks_after: int,
    seconds: float,
    cpu: float,
) -> RoundResult:
    result = RoundResult(invariants={})
    result.check("starts and stops follow the model", not run.problems, "; ".join(run.problems))
    wrong = [
        f"{name}: {count} restarts, model {nodes[name].restarts}"
        for name, count in restarts.items()
        if count != nodes[name].restarts
    ]
    result.check("escalation reaches the right level", not wrong, "; ".join(wrong[:3]))
    starts = [name for kind, name in _preorder(model.top)]
    stops = [name for kind, name in shutdown]
    result.check(
        "shutdown order is reverse start order",
        stops == list(reversed(starts)) and all(kind == "stop" for kind, _ in shutdown),
        f"stopped {stops[:6]}..., started {starts[:6]}...",
    )
    result.check("task count steady across restarts", run.task_drift == 0, f"{run.task_drift}")
    result.check("no task leaked", tasks_after == tasks_before, f"{tasks_before} -> {tasks_after}")
    gave_up = {node.level: node.gave_up for node in nodes.values() if not node.is_worker}
    reached = min((level for level, times in gave_up.items() if times), default=-1)
    result.counts = {
        "supervisors": len(gave_up),
        "crashes": sum(crashes for _, crashes in plan),
        "restarts": sum(restarts.values()),
        "escalations": sum(gave_up.values()),
        "events": len(run.log),
        **{f"given_up_at_level_{level}": times for level, times in sorted(gave_up.items())},
    }
    result.measures = {
        "highest_level_given_up": float(reached),
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu, 3),
    }
    return result


def _preorder(node: Node) -> list[Event]:
    if node.is_worker:
        return [("start", node.name)]
    return [event for child in node.children for event in _preorder(child)]
