"""Subprocess lanes at scale (issue 22): N sandboxed commands vs hand-written loops, same run.

Three ways run the same N commands (``sh -c 'echo 1 > "$1"/output.json'``, a fresh folder per
unit) with 8 at a time, every reference measured in the same run:

- the sandbox: `SandboxHost.run` per unit (session, cgroups, kill ladder, captured output),
  which is what every replay and judge lane runs on, through its spawn server and, for
  comparison, through the launcher chain it falls back to;
- the full pipeline: N/2 cases x 2 arms through `open_pipeline` (replay command, exact-match
  judge, run journal on), as a campaign measures;
- a hand-written ``trio.run_process`` loop (``CapacityLimiter(8)``) and an asyncio loop
  (``Semaphore(8)``, ``create_subprocess_exec``): the floor of spawning N processes.

It prints each wall and its ratio to the trio loop (target <= 1.3x for the sandbox and the
pipeline) and to the asyncio loop, and CPU ms per unit (process + children).

    python benchmarks/scale_subprocess.py [--units 512] [--lanes 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.pipeline_helpers import two_trees

from evolane.measure import (
    CommandSettings,
    MeasureContext,
    MeasureSettings,
    RunJournal,
)
from evolane.sandbox import SandboxSpec, open_sandbox
from evolane.store import BlobStore

SCRIPT = 'echo 1 > "$1"/output.json'


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _folders(root: Path, units: int) -> list[Path]:
    folders = [root / f"u{n}" for n in range(units)]
    for folder in folders:
        folder.mkdir(parents=True)
    return folders


async def trio_loop(root: Path, units: int, lanes: int) -> None:
    """The reference: one ``trio.run_process`` per unit, ``lanes`` at a time."""
    limiter = trio.CapacityLimiter(lanes)
    folders = _folders(root, units)

    async def one(folder: Path) -> None:
        async with limiter:
            await trio.run_process(["sh", "-c", SCRIPT, "u", str(folder)], capture_stdout=True)

    async with trio.open_nursery() as nursery:
        for folder in folders:
            nursery.start_soon(one, folder)


def asyncio_loop(root: Path, units: int, lanes: int) -> None:
    """The same loop in asyncio (``Semaphore``, ``create_subprocess_exec``)."""
    folders = _folders(root, units)

    async def main() -> None:
        gate = asyncio.Semaphore(lanes)

        async def one(folder: Path) -> None:
            async with gate:
                process = await asyncio.create_subprocess_exec(
                    "sh", "-c", SCRIPT, "u", str(folder), stdout=asyncio.subprocess.PIPE
                )
                await process.communicate()

        await asyncio.gather(*(one(folder) for folder in folders))

    asyncio.run(main())


async def sandbox_loop(root: Path, units: int, lanes: int, spawner: bool = True) -> None:
    """`SandboxHost.run` per unit (what a lane runs), ``lanes`` at a time; ``spawner``:
    through the spawn server (where it works), else the launcher chain."""
    limiter = trio.CapacityLimiter(lanes)
    store = BlobStore(root / "store")
    async with open_sandbox(root / "sb", store=store, use_spawner=spawner) as host:
        if spawner:
            assert host.spawner is not None, "no spawn server on this host"
        folders = _folders(root / "out", units)

        async def one(folder: Path) -> None:
            async with limiter:
                spec = SandboxSpec(argv=("sh", "-c", SCRIPT, "u", str(folder)), kill_grace=0.2)
                outcome = await host.run(spec)
                assert outcome.ok, outcome.error

        async with trio.open_nursery() as nursery:
            for folder in folders:
                nursery.start_soon(one, folder)


async def pipeline_run(root: Path, units: int, lanes: int) -> None:
    """``units`` / 2 cases x 2 arms through the measurement pipeline, journal on."""
    cases = units // 2
    rows = [{"id": f"c{i}", "input": i, "expected_output": 1} for i in range(cases)]
    replay = f"sh -c '{SCRIPT}' replay {{output_dir}}"
    config = MeasureSettings(replay=replay, replay_concurrency=lanes, judge_concurrency=2)
    commands = CommandSettings(kill_grace=0.2, isolation="process")
    journal = RunJournal(root / "journal.jsonl")
    try:  # two trees: no result is reused across the arms
        async with two_trees(root, rows, config, MeasureContext(journal), commands) as bench:
            summary = await bench.pipeline.measure(bench.request)
            assert summary.units_run == 2 * cases, summary
    finally:
        journal.close()


def _timed(run: Callable[[], Awaitable[None] | None]) -> tuple[float, float]:
    cpu, start = _cpu(), time.perf_counter()
    run()
    return time.perf_counter() - start, _cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=512)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the median counts")
    args = parser.parse_args()
    n, lanes = args.units, args.lanes
    ways: dict[str, Callable[[Path], None]] = {
        "trio.run_process loop": lambda r: trio.run(trio_loop, r, n, lanes),
        "asyncio loop": lambda r: asyncio_loop(r, n, lanes),
        "sandbox (SandboxHost.run)": lambda r: trio.run(sandbox_loop, r, n, lanes),
        "sandbox, launcher chain": lambda r: trio.run(sandbox_loop, r, n, lanes, False),
        "pipeline (replay+judge)": lambda r: trio.run(pipeline_run, r, n, lanes),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    with tempfile.TemporaryDirectory(prefix="scale-subprocess-") as tmp:
        for rep in range(args.repeat):  # interleaved: load drifts hit every way alike
            for number, (name, way) in enumerate(ways.items()):
                root = Path(tmp) / f"{number}-{rep}"
                root.mkdir()
                wall, cpu = _timed(lambda way=way, root=root: way(root))
                results[name].append((wall, cpu))
    print(f"{n} commands, {lanes} at a time, median of {args.repeat} (interleaved)")
    medians = {}
    for name in ways:
        runs = sorted(results[name])
        medians[name] = runs[len(runs) // 2]
    trio_wall, asyncio_wall = medians["trio.run_process loop"][0], medians["asyncio loop"][0]
    for name, (wall, cpu) in medians.items():
        print(
            f"  {name:27} wall {wall:6.2f} s  {wall / trio_wall:4.2f}x trio  "
            f"{wall / asyncio_wall:4.2f}x asyncio  CPU {cpu / n * 1000:6.2f} ms/unit"
        )
    print("  target: sandbox and pipeline <= 1.3x the trio loop")


if __name__ == "__main__":
    main()
