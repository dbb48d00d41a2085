"""Where memory grows with a measurement's size (issue 22): traced bytes per case, by line.

Runs `scale.evolane_run` (in-process backends, 8 lanes, the journal on) at two sizes, each in
a fresh process under `tracemalloc`, snapshots the traced heap at its peak (sampled every
second), and prints the growth per added case: in all, and for the lines that allocate most
of it. What does not grow with N (imports, interned names, bounded lists) cancels out; a
buffer of fixed size live at one run's peak and not at the other's (the units blob's 1 MiB
chunks, written at the end) shows up as growth: compare two runs before reading much into a
line that allocates few objects.

    python benchmarks/memory_slope.py [--cases 2000 8000] [--top 25]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scale


async def _peak_snapshot(root: Path, cases: int) -> tuple[int, tracemalloc.Snapshot]:
    """Run one measurement; the largest traced total seen and its snapshot."""
    best: list[Any] = [0, tracemalloc.take_snapshot()]

    async def sample() -> None:
        while True:
            await trio.sleep(1.0)
            current, _ = tracemalloc.get_traced_memory()
            if current > best[0]:
                best[:] = [current, tracemalloc.take_snapshot()]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample)
        await scale.evolane_run(root, cases, 8, scale.Counters())
        nursery.cancel_scope.cancel()
    return best[0], best[1]


def worker(cases: int) -> None:
    """In this (fresh) process: one run under tracemalloc; its peak by line, as JSON."""
    tracemalloc.start(1)
    with tempfile.TemporaryDirectory(prefix="memory-slope-") as tmp:
        total, snapshot = trio.run(_peak_snapshot, Path(tmp), cases)
    lines = {}
    for stat in snapshot.statistics("lineno"):
        frame = stat.traceback[0]
        lines["/".join(Path(frame.filename).parts[-2:]) + f":{frame.lineno}"] = stat.size
    sys.stdout.write(orjson.dumps({"total": total, "lines": lines}).decode() + "\n")


def measure(cases: int) -> dict[str, Any]:
    """`worker` in a fresh subprocess."""
    done = subprocess.run(
        [sys.executable, __file__, "--worker", str(cases)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"memory_slope: the run at N = {cases} failed:\n{done.stderr[-4000:]}")
    return orjson.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(args: argparse.Namespace) -> None:
    small, large = args.cases
    low, high = measure(small), measure(large)
    added = large - small
    print(f"traced peak, N = {small}: {low['total'] / 2**20:.1f} MiB; N = {large}: "
          f"{high['total'] / 2**20:.1f} MiB; growth {(high['total'] - low['total']) / added:.0f} "
          "bytes per added case")  # fmt: skip
    names = set(low["lines"]) | set(high["lines"])
    growth = {n: (high["lines"].get(n, 0) - low["lines"].get(n, 0)) / added for n in names}
    for name, per_case in sorted(growth.items(), key=lambda item: -item[1])[: args.top]:
        print(f"  {per_case:8.1f} bytes per case  {name}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, nargs=2, default=[2000, 8000])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.worker:
        worker(parsed.worker)
    else:
        main(parsed)
