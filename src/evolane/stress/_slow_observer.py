"""The `slow-observer` scenario: the measurement pipeline on the sleeper, publishing to a
progress bus whose observer never reads, against the same measurement with no observer.
The observer may lose events, the run may not slow down (wall grows at most ``max_ratio``)
and the bus's file journal keeps every event (sequence numbers contiguous)."""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio
from pydantic import Field

from evolane.examples.sleeper.commands import main as sleeper
from evolane.inputs import Dataset, load_dataset
from evolane.measure import (
    CommandSettings,
    MeasureContext,
    MeasureSettings,
    ProgressBus,
    open_pipeline,
)
from evolane.messages import ArtifactRef, GateConfig, MeasureRequest, Record, WarningEvent
from evolane.sandbox import SandboxHost, open_sandbox
from evolane.store import BlobStore, read_journal, snapshot_tree
from evolane.stress._harness import RoundResult, cpu_seconds
from evolane.supervisors import Runtime, open_runtime

SLEEPER = "{python} -m evolane.examples.sleeper"
REPLAY = (
    "{sleeper} replay --case-file {{case_file}} --candidate {{candidate}} "
    "--output-dir {{output_dir}} --seed {{seed}}"
)
JUDGE = "{sleeper} judge --case-file {{case_file}} --output-dir {{output_dir}} --seed {{seed}}"


class ObserverConfig(Record):
    """The measurement (cases, sleep, lanes), how many alternated pairs, the extra event rate."""

    cases: int = Field(default=16, ge=2, le=10_000)
    median_seconds: float = Field(default=0.3, ge=0.0, le=60.0)
    lanes: int = Field(default=8, ge=1, le=256)
    pairs: int = Field(default=4, ge=1, le=100)
    events_per_second: float = Field(default=500.0, ge=0.0, le=100_000.0)
    observer_capacity: int = Field(default=4, ge=1, le=100_000)
    max_ratio: float = Field(default=1.05, ge=1.0, le=100.0)
    seed: int = Field(default=0, ge=0)


@dataclass
class _Arm:
    """One measurement's wall and its bus's books."""

    observed: bool
    wall: float
    published: int
    journaled_in_order: bool
    queued: int = 0
    dropped: int = 0


@dataclass
class _Bench:
    """The sleeper workload, the trees to compare and the open host and runtime."""

    root: Path
    dataset: Dataset
    store: BlobStore
    baseline: ArtifactRef
    candidate: ArtifactRef
    arms: list[_Arm] = field(default_factory=list)


def _workload(root: Path, config: ObserverConfig) -> tuple[Dataset, Path]:
    """Write the sleeper workspace with every case in the ``val`` split."""
    work = root / "work"
    argv = ["init", str(work), "--cases", str(config.cases), "--seed", str(config.seed),
            "--median-seconds", str(config.median_seconds), "--spread", "0"]  # fmt: skip
    if sleeper(argv) != 0:
        raise RuntimeError("the sleeper could not write its workspace")
    rows = [json.loads(line) for line in (work / "dataset.jsonl").read_text().splitlines()]
    lines = "".join(json.dumps({**row, "split": "val"}) + "\n" for row in rows)
    (work / "dataset.jsonl").write_text(lines)
    return load_dataset(work / "dataset.jsonl"), work / "target"


def _tree(store: BlobStore, target: Path, root: Path, effect: float) -> ArtifactRef:
    folder = root / f"tree-{effect}"
    shutil.copytree(target, folder)
    (folder / "effect.json").write_text(json.dumps({"effect": effect}))
    return snapshot_tree(store, folder)


async def _chatter(bus: ProgressBus, rate: float) -> None:
    """Publish extra events at ``rate`` per second (the same load in both arms)."""
    if rate <= 0:
        return
    interval, count = 1.0 / rate, 0
    started = trio.current_time()
    while True:
        count += 1
        bus.publish(WarningEvent(run_id="-", message=f"chatter {count}"))
        await trio.sleep_until(started + count * interval)


async def _measure(
    runtime: Runtime, host: SandboxHost, bench: _Bench, config: ObserverConfig, index: int,
    observed: bool,
) -> _Arm:  # fmt: skip
    """One measurement with its own bus (and a never-reading observer when ``observed``)."""
    path = bench.root / f"events-{index}.jsonl"
    bus = ProgressBus(path, f"m{index}")
    feed, subscription = bus.subscribe(config.observer_capacity) if observed else (None, None)
    sleeper_cmd = SLEEPER.format(python=sys.executable)
    settings = MeasureSettings(
        replay=REPLAY.format(sleeper=sleeper_cmd),
        judge=JUDGE.format(sleeper=sleeper_cmd),
        replay_concurrency=config.lanes,
        judge_concurrency=max(1, config.lanes // 2),
    )
    request = MeasureRequest(
        measurement_id=f"m{index}",
        baseline_ref=bench.baseline,
        candidate_ref=bench.candidate,
        gate=GateConfig(sequential=False),
    )
    async with (
        open_pipeline(
            runtime,
            host,
            bench.store,
            bench.dataset,
            settings,
            commands=CommandSettings(kill_grace=0.2, isolation="process"),
            context=MeasureContext(on_progress=bus.publish),
            seed=config.seed,
            name=f"measure-{index}",
        ) as pipe,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(_chatter, bus, config.events_per_second)
        started = time.perf_counter()
        await pipe.measure(request)
        wall = time.perf_counter() - started
        nursery.cancel_scope.cancel()
    bus.close()
    seqs = [record.get("seq") for record in read_journal(path).records]
    arm = _Arm(observed, wall, bus.seq, seqs == list(range(1, bus.seq + 1)))
    if feed is not None and subscription is not None:
        arm.queued = _count_queued(feed)
        arm.dropped = subscription.dropped
    return arm


def _count_queued(feed: trio.MemoryReceiveChannel[object]) -> int:
    count = 0
    while True:
        try:
            feed.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            return count
        count += 1


async def run_slow_observer(config: ObserverConfig) -> RoundResult:
    """One round: ``pairs`` pairs of the same measurement, observed and not, in ABBA order;
    the wall ratio is the median of the pairs' ratios."""
    root = Path(tempfile.mkdtemp(prefix="evolane-stress-"))
    cpu = cpu_seconds()
    try:
        dataset, target = await trio.to_thread.run_sync(_workload, root, config)
        store = BlobStore(root / "store")
        baseline = await trio.to_thread.run_sync(_tree, store, target, root, 0.0)
        candidate = await trio.to_thread.run_sync(_tree, store, target, root, 0.1)
        bench = _Bench(root, dataset, store, baseline, candidate)
        async with open_sandbox(root / "sandbox", store=store) as host, open_runtime() as runtime:
            for pair in range(config.pairs):
                order = (False, True) if pair % 2 == 0 else (True, False)
                for observed in order:
                    index = len(bench.arms)
                    bench.arms.append(await _measure(runtime, host, bench, config, index, observed))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return _result(config, bench.arms, cpu_seconds() - cpu)


def _result(config: ObserverConfig, arms: list[_Arm], cpu: float) -> RoundResult:
    observed = [arm for arm in arms if arm.observed]
    alone = [arm for arm in arms if not arm.observed]
    wall_observed = sum(arm.wall for arm in observed)
    wall_alone = sum(arm.wall for arm in alone)
    # Each pair ran back to back (ABBA); the median pair ratio shrugs off a burst of load
    # from other processes on the host that hit one measurement.
    ratio = statistics.median(o.wall / a.wall for o, a in zip(observed, alone, strict=True))
    result = RoundResult(invariants={})
    result.check(
        f"wall with a blocked observer <= {config.max_ratio:g} x without",
        ratio <= config.max_ratio,
        f"median pair ratio {ratio:.3f}; {wall_observed:.3f} s vs {wall_alone:.3f} s in all",
    )
    result.check(
        "the journal has every event, seq contiguous",
        all(arm.journaled_in_order for arm in arms),
    )
    result.check(
        "observer: queued + dropped == published",
        all(arm.queued + arm.dropped == arm.published for arm in observed),
        "; ".join(f"{a.queued}+{a.dropped} of {a.published}" for a in observed),
    )
    result.check("the observer lost events (it blocked)", all(arm.dropped > 0 for arm in observed))
    result.counts = {
        "measurements": len(arms),
        "events_published": sum(arm.published for arm in arms),
        "events_dropped_by_observer": sum(arm.dropped for arm in observed),
    }
    result.measures = {
        "wall_ratio": round(ratio, 4),
        "wall_ratio_of_totals": round(wall_observed / wall_alone, 4),
        "wall_observed_seconds": round(wall_observed, 3),
        "wall_alone_seconds": round(wall_alone, 3),
        "cpu_seconds": round(cpu, 3),
    }
    return result
