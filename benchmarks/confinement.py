"""What confinement costs: a confined spawn over a bare one, and the example campaign's wall
time confined vs ``--isolation process`` (issue 17).

Spawn: ``true`` run 200 times each way, in turns of 25 of a kind (see `BLOCK`): bare
``subprocess.run``, bare under the confined level's bwrap namespaces, the sandbox with
``process`` isolation, the sandbox ``confined``; medians, and the overhead of confined
over bare (target <= 15 ms) and over process. Example: ``benchmarks/campaign_example.py``
run alternately confined and with process isolation, ``--pairs`` times (ABBA order); the
ratio of the median walls (target <= 1.1x).

    python benchmarks/confinement.py [--spawns 200] [--pairs 1]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from evolane.sandbox import SandboxHost, SandboxSpec, View, open_sandbox
from evolane.sandbox._confine import bwrap_argv, confinement_problem

BLOCK = 25
"""Spawns of one kind back to back: a spawn in a namespace leaves the kernel tearing that
namespace down after it exits, which slows the next spawns' cgroup work, so each kind is
timed in runs of its own (teardown included), the kinds taking turns."""


async def _spawns(count: int) -> dict[str, list[float]]:
    bwrap = [*bwrap_argv(View(), own=(), workspace=Path("/")), "true"]  # its namespaces alone
    times: dict[str, list[float]] = {"bare": [], "bwrap": [], "process": [], "confined": []}
    with tempfile.TemporaryDirectory() as tmp:
        async with open_sandbox(Path(tmp) / "sandbox") as host:
            for turn in range(max(1, count // BLOCK)):
                kinds = list(times) if turn % 2 == 0 else list(reversed(times))
                for kind in kinds:
                    for _ in range(BLOCK):
                        times[kind].append(await _spawn(host, kind, bwrap))
    return times


async def _spawn(host: SandboxHost, kind: str, bwrap: list[str]) -> float:
    started = time.perf_counter()
    if kind in ("bare", "bwrap"):
        subprocess.run(["true"] if kind == "bare" else bwrap, check=True)
    else:
        spec = SandboxSpec(argv=("true",), isolation=kind)  # type: ignore[arg-type]
        outcome = await host.run(spec, timeout=60)
        assert outcome.ok and outcome.isolation == kind, outcome
    return time.perf_counter() - started


def _example(isolation: str) -> float:
    script = Path(__file__).with_name("campaign_example.py")
    done = subprocess.run(
        [sys.executable, str(script), "--isolation", isolation],
        capture_output=True,
        text=True,
        check=False,
    )
    match = re.search(r"wall ([0-9.]+) s", done.stdout)
    if match is None:
        raise SystemExit(f"the example failed under {isolation}: {done.stdout}{done.stderr}")
    print(f"  {isolation}: {done.stdout.splitlines()[0]}; {done.stdout.splitlines()[1]}")
    return float(match.group(1))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spawns", type=int, default=200)
    parser.add_argument("--pairs", type=int, default=1, help="example pairs (0: skip)")
    args = parser.parse_args()
    problem = confinement_problem()
    if problem is not None:
        print(f"cannot confine here: {problem}")
        return 1
    times = trio.run(_spawns, args.spawns)
    median = {name: statistics.median(values) * 1000 for name, values in times.items()}
    print(
        f"spawn of `true`, median of {args.spawns}: bare {median['bare']:.1f} ms, "
        f"bwrap alone {median['bwrap']:.1f} ms, sandbox process {median['process']:.1f} ms, "
        f"sandbox confined {median['confined']:.1f} ms"
    )
    overhead = median["confined"] - median["bare"]
    print(
        f"confined over bare: +{overhead:.1f} ms (target <= 15 ms); "
        f"over process: +{median['confined'] - median['process']:.1f} ms"
    )
    ok = overhead <= 15
    if args.pairs:
        walls: dict[str, list[float]] = {"auto": [], "process": []}
        for index in range(args.pairs):
            order = ("auto", "process") if index % 2 == 0 else ("process", "auto")
            for isolation in order:
                walls[isolation].append(_example(isolation))
        ratio = statistics.median(walls["auto"]) / statistics.median(walls["process"])
        print(
            f"example wall, median of {args.pairs}: confined {statistics.median(walls['auto']):.1f}"
            f" s vs process {statistics.median(walls['process']):.1f} s = {ratio:.3f}x "
            "(target <= 1.1x)"
        )
        ok = ok and ratio <= 1.1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
