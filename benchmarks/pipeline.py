"""Measurement pipeline throughput (issues 5 and 22), every reference measured in the same run.

64 cases x 1 repetition x 2 arms, each replay sleeping 200 ms, full evaluation, with the run
journal on (every unit durably journaled before it counts, as a campaign runs), on two
workloads: the sleeper (a Python replay and a Python judge process per unit) and a bare
``sleep`` replay judged in-process by exact match (what the pipeline itself costs).
For each: wall with 8 lanes (the median of ``--repeat`` runs: a shared machine is noisy) vs
the bound max(critical path, CPU floor) (target <= 1.1x): the critical path is units x 0.2 s
/ 8, the CPU floor all CPU used / cores (no schedule can beat either); and the speed-up over
1 lane (target >= 7x).

    python benchmarks/pipeline.py [--cases 64] [--sleep 0.2] [--lanes 8] [--repeat 3] [--launcher]

``--launcher`` adds both workloads with every command started by the launcher chain (what
a host without a working spawn server does) instead of the spawn server.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.pipeline_helpers import sleeper_bench, two_trees

from evolane.measure import (
    CommandSettings,
    MeasureContext,
    MeasureSettings,
    RunJournal,
)
from evolane.messages import GateConfig, MeasureRequest
from evolane.sandbox._spawner import Spawner

FULL = GateConfig(sequential=False)


def _cpu() -> float:
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


async def sleeper_run(root: Path, cases: int, sleep: float, lanes: int) -> tuple[float, float]:
    async with sleeper_bench(
        root,
        cases=cases,
        median=sleep,
        replay_concurrency=lanes,
        judge_concurrency=max(2, lanes // 2),
        journal_path=root / "journal.jsonl",
    ) as bench:
        base, cand = bench.tree(0.0), bench.tree(0.1)
        cpu, start = _cpu(), time.perf_counter()
        await bench.pipeline.measure(
            MeasureRequest(measurement_id="b", baseline_ref=base, candidate_ref=cand, gate=FULL)
        )
        return time.perf_counter() - start, _cpu() - cpu


async def bare_run(root: Path, cases: int, sleep: float, lanes: int) -> tuple[float, float]:
    root.mkdir(parents=True)
    rows = [{"id": f"c{i}", "input": i, "expected_output": 1} for i in range(cases)]
    replay = f"sh -c 'sleep {sleep}; echo 1 > \"$1\"/output.json' replay {{output_dir}}"
    config = MeasureSettings(
        replay=replay, replay_concurrency=lanes, judge_concurrency=max(2, lanes // 2)
    )
    commands = CommandSettings(kill_grace=0.2, isolation="process")
    journal = RunJournal(root / "journal.jsonl")
    try:  # two different trees: no result is reused across the arms
        async with two_trees(root, rows, config, MeasureContext(journal), commands) as bench:
            cpu, start = _cpu(), time.perf_counter()
            await bench.pipeline.measure(bench.request)
            return time.perf_counter() - start, _cpu() - cpu
    finally:
        journal.close()


@contextlib.contextmanager
def _launcher_only() -> Iterator[None]:
    """Sandboxes opened meanwhile start no spawn server: their commands go through the
    launcher chain (the fallback), for comparison."""
    real = Spawner.__dict__["start"]
    Spawner.start = classmethod(lambda cls, *probe: None)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        Spawner.start = real  # type: ignore[method-assign]


async def main(args: argparse.Namespace) -> None:
    units, cores = 2 * args.cases, os.cpu_count() or 1
    bound = units * args.sleep / args.lanes
    print(
        f"{units} replay units of {args.sleep * 1000:.0f} ms on {cores} cores; "
        f"critical-path bound with {args.lanes} lanes: {bound:.2f} s"
    )
    workloads: list[tuple[str, Callable[..., Awaitable[tuple[float, float]]], bool]] = [
        ("bare sleep + exact match", bare_run, False),
        ("sleeper (python)", sleeper_run, False),
    ]
    if args.launcher:  # the same runs with commands started by the launcher chain
        workloads.insert(1, ("bare, launcher chain", bare_run, True))
        workloads.append(("sleeper, launcher chain", sleeper_run, True))
    with tempfile.TemporaryDirectory() as tmp:
        for name, run, chain in workloads:
            runs = []
            for i in range(args.repeat):
                with _launcher_only() if chain else contextlib.nullcontext():
                    root = Path(tmp) / f"{name[:5]}{chain}8-{i}"
                    runs.append(await run(root, args.cases, args.sleep, args.lanes))
            wide, cpu = sorted(runs)[len(runs) // 2]
            with _launcher_only() if chain else contextlib.nullcontext():
                root = Path(tmp) / f"{name[:5]}{chain}1"
                narrow, _ = await run(root, args.cases, args.sleep, 1)
            floor = cpu / cores
            walls = " ".join(f"{w:.2f}" for w, _ in runs)
            print(
                f"  {name:26} {args.lanes} lanes {wide:6.2f} s (median of {walls}), journal on: "
                f"{wide / max(floor, bound):.2f}x max(critical path {bound:.2f} s, CPU floor "
                f"{floor:.2f} s) (target <= 1.1); {wide / bound:.2f}x the critical path; "
                f"1 lane {narrow:6.2f} s: speed-up {narrow / wide:.1f}x (target >= 7)"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=64)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="8-lane runs; the median counts")
    parser.add_argument(
        "--launcher", action="store_true", help="also both workloads through the launcher chain"
    )
    trio.run(main, parser.parse_args())
