"""The `processes` scenario: many sandboxed process trees at once, with random deadlines,
external kills (the ``stop`` event), callers that give up, and trees with setsid escapers.
Invariant: every run returns as planned and, before the host closes, nothing of the lease
survives (scanned in /proc by the lease marker, and among this process's descendants)."""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import trio
from pydantic import Field, model_validator

from evolane.messages import Record
from evolane.sandbox import (
    LEASE_FILES,
    ProcessOutcome,
    SandboxHost,
    SandboxSpec,
    lease_holders,
    open_sandbox,
)
from evolane.stress._harness import RoundResult, cpu_seconds
from evolane.testing import DAEMON_AFTER_EXIT_SH, EVIL_TREE_SH, descendants

Kind = Literal["normal", "deadline", "stopped", "abandoned", "escaper", "daemon"]

NORMAL_SH = "sleep {a} & sleep {b} & (sleep {a}; echo inner) & wait; echo done"
LINGER_SH = "(trap '' TERM; sleep 1000) & sleep 1000 & (sleep 1000 & wait) & echo ready; wait"
EXPECTED: dict[Kind, str] = {
    "normal": "exited",
    "deadline": "timed_out",
    "stopped": "cancelled",
    "abandoned": "abandoned",
    "escaper": "timed_out",
    "daemon": "exited",
}


class ProcessConfig(Record):
    """How many trees, how many at once, and the shares of each fate (the rest exit normally)."""

    trees: int = Field(default=500, ge=1, le=100_000)
    concurrency: int = Field(default=50, ge=1, le=5_000)
    deadline_share: float = Field(default=0.20, ge=0.0, le=1.0)
    escaper_share: float = Field(default=0.05, ge=0.0, le=1.0)
    stop_share: float = Field(default=0.10, ge=0.0, le=1.0)
    abandon_share: float = Field(default=0.05, ge=0.0, le=1.0)
    max_deadline: float = Field(default=0.5, gt=0.0, le=600.0)
    seed: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _fits_the_host(self) -> ProcessConfig:
        """Refuse a plan that may run more than `MAX_PROCESSES` processes at once: found by
        review, ``concurrency=5000`` over 100,000 trees asked for ~160,000 (a host's pid space is
        often 32,768, shared with everything else on it)."""
        at_once = peak_processes(self)
        if at_once > MAX_PROCESSES:
            raise ValueError(
                f"--set concurrency: {min(self.concurrency, self.trees):,} trees at once may run "
                f"{at_once:,} processes; at most {MAX_PROCESSES:,} (lower concurrency or "
                "escaper_share)"
            )
        return self


MAX_PROCESSES = 8192
"""Processes a plan may run at once, at worst (see `peak_processes`)."""
EVIL_TREE_PROCESSES = 60  # EVIL_TREE_SH: ~50, and the children that fork again on SIGTERM
TREE_PROCESSES = 5  # every other script


def peak_processes(config: ProcessConfig) -> int:
    """The most processes the plan can run at once: every evil tree (half the escapers) in a
    slot of its own, the other slots running the largest other script."""
    slots = min(config.concurrency, config.trees)
    evil = min(slots, (round(config.trees * config.escaper_share) + 1) // 2)
    return evil * EVIL_TREE_PROCESSES + (slots - evil) * TREE_PROCESSES


@dataclass(frozen=True)
class PlannedTree:
    """One tree of the seeded plan: its fate, its script, and when it is ended."""

    kind: Kind
    script: str
    timeout: float
    end_after: float  # the stop event or the caller's cancel fires after this many seconds
    grace: float


def process_plan(config: ProcessConfig) -> list[PlannedTree]:
    """The seeded plan, tree by tree: exactly the configured share of each fate, shuffled.

    Half the escapers are killed at a deadline (setsid and double-fork children), half exit
    at once leaving a setsid daemon behind.
    """
    rng = random.Random(config.seed)
    counts: list[tuple[Kind, float]] = [
        ("deadline", config.deadline_share),
        ("stopped", config.stop_share),
        ("abandoned", config.abandon_share),
    ]
    kinds: list[Kind] = []
    escapers = round(config.trees * config.escaper_share)
    kinds += ["escaper" if i % 2 == 0 else "daemon" for i in range(escapers)]
    for kind, share in counts:
        kinds += [kind] * round(config.trees * share)
    kinds = kinds[: config.trees]
    kinds += ["normal"] * (config.trees - len(kinds))
    rng.shuffle(kinds)
    return [_planned(kind, rng, config.max_deadline) for kind in kinds]


def _planned(kind: Kind, rng: random.Random, max_deadline: float) -> PlannedTree:
    moment = rng.uniform(0.02, max_deadline)
    grace = rng.uniform(0.05, 0.3)
    if kind == "normal":
        a, b = rng.choice((0, 0.01, 0.05)), rng.choice((0, 0.02, 0.1))
        return PlannedTree(kind, NORMAL_SH.format(a=a, b=b), 60.0, 0.0, grace)
    if kind in ("deadline", "escaper"):
        script = LINGER_SH if kind == "deadline" else EVIL_TREE_SH
        return PlannedTree(kind, script, moment, 0.0, grace)
    if kind == "daemon":
        return PlannedTree(kind, DAEMON_AFTER_EXIT_SH, 60.0, 0.0, grace)
    return PlannedTree(kind, LINGER_SH, 60.0, moment, grace)


@dataclass
class _Tally:
    """What the runs returned, kept outside the sandbox."""

    outcomes: list[tuple[PlannedTree, ProcessOutcome | None]] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    hung: int = 0
    peak_processes: int = 0


async def _run_tree(
    host: SandboxHost, index: int, tree: PlannedTree, limiter: trio.CapacityLimiter, tally: _Tally
) -> None:
    spec = SandboxSpec(argv=("sh", "-c", tree.script), kill_grace=tree.grace, label=tree.kind)
    async with limiter:
        outcome: ProcessOutcome | None = None
        try:
            outcome = await _run_guarded(host, spec, tree, tally)
        except Exception as error:  # the sandbox failed: an invariant fails, the storm goes on
            tally.wrong.append(f"tree {index} ({tree.kind}) raised {error!r}"[:300])
            tally.outcomes.append((tree, None))
            return
    tally.outcomes.append((tree, outcome))
    status = "abandoned" if outcome is None else outcome.status
    expected = EXPECTED[tree.kind]
    clean_exit = outcome is None or outcome.status != "exited" or outcome.exit_code == 0
    if status != expected or not clean_exit:
        code = None if outcome is None else outcome.exit_code
        tally.wrong.append(f"tree {index} ({tree.kind}): {status}, exit code {code}")


async def _run_guarded(
    host: SandboxHost, spec: SandboxSpec, tree: PlannedTree, tally: _Tally
) -> ProcessOutcome | None:
    """Run one tree to its planned end; None when its caller gave up on it (or it hung)."""
    outcome = None
    with trio.move_on_after(tree.timeout + tree.end_after + 30.0) as guard:
        async with trio.open_nursery() as nursery:
            stop = trio.Event()
            if tree.kind == "stopped":
                nursery.start_soon(_set_after, stop, tree.end_after)
            if tree.kind == "abandoned":
                with trio.move_on_after(tree.end_after):
                    outcome = await host.run(spec, timeout=tree.timeout)
            else:
                outcome = await host.run(spec, timeout=tree.timeout, stop=stop)
            nursery.cancel_scope.cancel()
    if guard.cancelled_caught:
        tally.hung += 1
    return outcome


async def _set_after(event: trio.Event, seconds: float) -> None:
    await trio.sleep(seconds)
    event.set()


async def _sample(host: SandboxHost, tally: _Tally) -> None:
    while True:
        alive = await trio.to_thread.run_sync(lease_holders, host.lease)
        tally.peak_processes = max(tally.peak_processes, len(alive))
        await trio.sleep(0.25)


def _leftovers(host: SandboxHost) -> list[str]:
    """Unit directories still under the lease (the spool, the owner and lock files belong to
    the host) and unit cgroups still under the host's."""
    own = {host.spool_dir.name, *LEASE_FILES}
    left = sorted(p.name for p in host.lease_dir.iterdir() if p.name not in own)
    # The units' cgroups too: found by review, a sandbox that never removed them (the host
    # removes its whole cgroup tree when it closes, so they pile up only while it runs) passed.
    for root in host.cgroups.roots():
        left += sorted(f"cgroup {p}" for p in root.iterdir() if p.is_dir())
    return left


async def run_process_storm(config: ProcessConfig) -> RoundResult:
    """One round: every planned tree runs (``concurrency`` at a time); then survivors are
    counted while the host is still open, so its own cleanup cannot hide them."""
    plan = process_plan(config)
    tally = _Tally()
    root = Path(tempfile.mkdtemp(prefix="evolane-stress-"))
    before = descendants()
    cpu, started = cpu_seconds(), time.perf_counter()
    try:
        async with open_sandbox(root / "sandbox") as host:
            before |= descendants()  # the host's lifeline
            limiter = trio.CapacityLimiter(config.concurrency)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_sample, host, tally)
                async with trio.open_nursery() as trees:
                    for index, tree in enumerate(plan):
                        trees.start_soon(_run_tree, host, index, tree, limiter, tally)
                nursery.cancel_scope.cancel()
            seconds = time.perf_counter() - started
            survivors = await trio.to_thread.run_sync(lease_holders, host.lease)
            survivors |= descendants() - before
            await trio.to_thread.run_sync(host.settle)  # finished units' deferred removals
            leftovers = _leftovers(host)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return _result(config, plan, tally, survivors, leftovers, seconds, cpu_seconds() - cpu)


def _result(
    config: ProcessConfig,
    plan: list[PlannedTree],
    tally: _Tally,
    survivors: set[int],
    leftovers: list[str],
    seconds: float,
    cpu: float,
) -> RoundResult:
    outcomes = [outcome for _, outcome in tally.outcomes if outcome is not None]
    reported = sum(outcome.survivors for outcome in outcomes)
    result = RoundResult(invariants={})
    result.check(
        "every run returned",
        len(tally.outcomes) == config.trees and not tally.hung,
        f"{len(tally.outcomes)} of {config.trees} returned, {tally.hung} hung",
    )
    result.check("0 survivors", not survivors, f"pids {sorted(survivors)[:10]}")
    result.check("0 survivors reported by the kill ladder", reported == 0, f"{reported}")
    result.check("every tree ended as planned", not tally.wrong, "; ".join(tally.wrong[:3]))
    result.check("no unit directory or cgroup left", not leftovers, ", ".join(leftovers[:5]))
    escapers = [o for t, o in tally.outcomes if t.kind in ("escaper", "daemon") and o is not None]
    latencies = [o.kill_latency_seconds for o in outcomes if o.kill_latency_seconds is not None]
    ms = np.array(latencies or [0.0]) * 1000
    kinds = Counter(tree.kind for tree in plan)
    statuses = Counter(outcome.status for outcome in outcomes)
    result.counts = {
        "trees": config.trees,
        **{f"planned_{kind}": count for kind, count in sorted(kinds.items())},
        **{f"status_{status}": count for status, count in sorted(statuses.items())},
        "abandoned_by_caller": sum(1 for _, o in tally.outcomes if o is None),
        "pids_killed": sum(o.pids_killed for o in outcomes),
        "escapees_found": sum(o.escaped_found for o in escapers),
        "survivors": len(survivors),
    }
    result.measures = {
        "seconds": round(seconds, 3),
        "trees_per_second": round(config.trees / seconds, 2),
        "kill_latency_p50_ms": round(float(np.percentile(ms, 50)), 1),
        "kill_latency_p99_ms": round(float(np.percentile(ms, 99)), 1),
        "peak_processes": float(tally.peak_processes),
        "cpu_seconds": round(cpu, 3),
    }
    return result
