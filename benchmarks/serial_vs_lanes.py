"""The serial way vs evolane's lanes, same workload, same machine, same run (issue 5).

Serial (how peer tools verify): members one after another; for each member every baseline
replay before any candidate replay, one replay and one judge at a time, baselines re-run
for every member. Lanes: one pipeline, 8 replay lanes, 4 judge lanes, control before
treatment per pair, baselines reused across members. Both run every subprocess through
the same sandbox, on the sleeper workload, full evaluation.

    python benchmarks/serial_vs_lanes.py [--cases 16] [--members 3] [--sleep 0.2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.pipeline_helpers import JUDGE, REPLAY, Bench, sleeper_bench

from evolane.messages import GateConfig, MeasureRequest
from evolane.sandbox import SandboxSpec
from evolane.store import materialize_tree


async def serial(bench: Bench, members: list[float]) -> float:
    """Every unit one at a time through the sandbox, baselines again for each member."""
    scratch = bench.root / "serial"
    cases = [c for c in bench.dataset.split("val")]
    trees = {}
    for effect in [0.0, *members]:
        path = scratch / f"tree-{effect}"
        materialize_tree(bench.store, bench.tree(effect), path, link=False)
        trees[effect] = path
    start = time.perf_counter()
    for member in members:
        for effect in (0.0, member):  # all baselines, then all candidates
            for case in cases:
                unit = scratch / f"{member}-{effect}-{case.id}"
                (unit / "out").mkdir(parents=True)
                (unit / "case.json").write_text(case.model_dump_json())
                values = {
                    "case_file": str(unit / "case.json"),
                    "candidate": str(trees[effect]),
                    "output_dir": str(unit / "out"),
                    "seed": "1",
                }
                for template in (REPLAY, JUDGE):  # replay, then its judge: one at a time
                    argv = tuple(part.format(**values) for part in template.split())
                    await bench.host.run(SandboxSpec(argv=argv), timeout=60)
    return time.perf_counter() - start


async def lanes(bench: Bench, members: list[float]) -> float:
    start = time.perf_counter()
    for index, member in enumerate(members):
        await bench.pipeline.measure(
            MeasureRequest(
                measurement_id=f"m{index}",
                baseline_ref=bench.tree(0.0),
                candidate_ref=bench.tree(member),
                gate=GateConfig(sequential=False),
            )
        )
    return time.perf_counter() - start


async def main(args: argparse.Namespace) -> None:
    members = [0.05 * (i + 1) for i in range(args.members)]
    with tempfile.TemporaryDirectory() as tmp:
        async with sleeper_bench(
            Path(tmp),
            cases=args.cases,
            median=args.sleep,
            replay_concurrency=8,
            judge_concurrency=4,
        ) as bench:
            fast = await lanes(bench, members)
            slow = await serial(bench, members)
    print(f"{args.members} members x {args.cases} cases, replays of {args.sleep * 1000:.0f} ms")
    print(f"  serial way : {slow:6.2f} s")
    print(f"  lanes      : {fast:6.2f} s")
    print(f"  ratio      : {slow / fast:.1f}x faster with lanes")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=16)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=0.2)
    trio.run(main, parser.parse_args())
