"""Measurement pipeline throughput (issues 5 and 22), every reference measured in the same run.

64 cases x 1 repetition x 2 arms, each replay sleeping 200 ms, full evaluation, with the run
journal on (every unit durably journaled before it counts, as a campaign runs), on two
workloads: the sleeper (a Python replay and a Python judge process per unit) and a bare
``sleep`` replay judged in-process by exact match (what the pipeline itself costs).
For each: wall with 8 lanes (the median of ``--repeat`` runs: a shared machine is noisy) vs
the bound max(critical path, CPU floor) (target <= 1.1x): the critical path is units x 0.2 s
/ 8, the CPU floor all CPU used / cores (no schedule can beat either); the speed-up over
1 lane (target >= 7x); and the wall of a hand-written trio loop running the same commands
with the same lanes (no orchestration: a folder and a case file per unit, the replay under
``CapacityLimiter(8)``, the judge command under the judge lanes' limiter or the exact match
inline, one orjson line per unit, fsync every 64): what the workload itself reaches.

    python benchmarks/pipeline.py [--cases 64] [--sleep 0.2] [--lanes 8] [--repeat 3] [--launcher]

``--launcher`` adds both workloads with every command started by the launcher chain (what
a host without a working spawn server does) instead of the spawn server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import orjson
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.pipeline_helpers import JUDGE, REPLAY, sleeper_bench, two_trees

from evolane.examples.sleeper.commands import main as sleeper
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
    replay = _bare_replay(sleep)
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


def _bare_replay(sleep: float) -> str:
    return f"sh -c 'sleep {sleep}; echo 1 > \"$1\"/output.json' replay {{output_dir}}"


async def hand_run(
    root: Path, cases: int, sleep: float, lanes: int, python: bool
) -> tuple[float, float]:
    """The same commands in a hand-written trio loop (``python``: the sleeper's replay and
    judge, else the bare replay and an exact match); the arms' trees differ as above."""
    work, units = root / "work", root / "units"
    if python:
        args = ["--cases", str(cases), "--median-seconds", str(sleep), "--spread", "0"]
        assert sleeper(["init", str(work), *args]) == 0
        rows = [json.loads(line) for line in (work / "dataset.jsonl").read_text().splitlines()]
    else:
        rows = [{"id": f"c{i}", "input": i, "expected_output": 1} for i in range(cases)]
    trees = []
    for effect in (0.0, 0.1):
        tree = root / f"tree-{effect}"
        shutil.copytree(work / "target", tree) if python else tree.mkdir(parents=True)
        (tree / "effect.json").write_text(json.dumps({"effect": effect}))
        trees.append(tree)
    replays, judges = trio.CapacityLimiter(lanes), trio.CapacityLimiter(max(2, lanes // 2))
    journal, done = (root / "journal.jsonl").open("ab"), 0

    async def unit(index: int, row: dict[str, object], tree: Path) -> None:
        nonlocal done
        folder = units / f"{index}-{tree.name}"
        (folder / "out").mkdir(parents=True)
        (folder / "case.json").write_bytes(orjson.dumps(row))
        paths = {"case_file": folder / "case.json", "candidate": tree, "output_dir": folder / "out"}
        # Seed 0 for all: with no spread and no faults, every seed sleeps the median.
        fields = {"seed": "0", **{key: shlex.quote(str(path)) for key, path in paths.items()}}
        replay = REPLAY if python else _bare_replay(sleep)
        async with replays:
            await trio.run_process(shlex.split(replay.format(**fields)), capture_stdout=True)
        if python:
            async with judges:
                judged = await trio.run_process(
                    shlex.split(JUDGE.format(**fields)), capture_stdout=True
                )
            score: object = judged.stdout.decode()
        else:
            score = float((folder / "out" / "output.json").read_bytes().strip() == b"1")
        journal.write(orjson.dumps({"unit": folder.name, "score": score}) + b"\n")
        done += 1
        if done % 64 == 0:
            journal.flush()
            os.fsync(journal.fileno())

    cpu, start = _cpu(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for index, row in enumerate(rows):
            for tree in trees:
                nursery.start_soon(unit, index, row, tree)
    journal.flush()
    os.fsync(journal.fileno())
    journal.close()
    return time.perf_counter() - start, _cpu() - cpu


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
    hands: dict[bool, list[float]] = {}  # the hand-written loop's walls, by workload
    with tempfile.TemporaryDirectory() as tmp:
        for name, run, chain in workloads:
            runs, python = [], run is sleeper_run
            # Interleaved with the hand loop: drifts hit both (the launcher-chain rows reuse
            # the loop's runs beside the server rows).
            for i in range(args.repeat):
                with _launcher_only() if chain else contextlib.nullcontext():
                    root = Path(tmp) / f"{name[:5]}{chain}8-{i}"
                    runs.append(await run(root, args.cases, args.sleep, args.lanes))
                if not chain:
                    root = Path(tmp) / f"{name[:5]}hand-{i}"
                    hand = await hand_run(root, args.cases, args.sleep, args.lanes, python)
                    hands.setdefault(python, []).append(hand[0])
            wide, cpu = sorted(runs)[len(runs) // 2]
            with _launcher_only() if chain else contextlib.nullcontext():
                root = Path(tmp) / f"{name[:5]}{chain}1"
                narrow, _ = await run(root, args.cases, args.sleep, 1)
            floor = cpu / cores
            walls = " ".join(f"{w:.2f}" for w, _ in runs)
            hand_walls = sorted(hands[python])
            hand_wall = hand_walls[len(hand_walls) // 2]
            print(
                f"  {name:26} {args.lanes} lanes {wide:6.2f} s (median of {walls}), journal on: "
                f"{wide / max(floor, bound):.2f}x max(critical path {bound:.2f} s, CPU floor "
                f"{floor:.2f} s) (target <= 1.1); {wide / bound:.2f}x the critical path; "
                f"1 lane {narrow:6.2f} s: speed-up {narrow / wide:.1f}x (target >= 7); "
                f"hand-written loop of the same commands {hand_wall:.2f} s "
                f"({hand_wall / bound:.2f}x the critical path): {wide / hand_wall:.2f}x it"
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
