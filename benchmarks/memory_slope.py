"""Where memory grows with a measurement's size (issue 22): traced bytes per case, by line.

Runs `scale.evolane_run` (in-process backends, 8 lanes, the journal on) at two sizes, each in
a fresh process under `tracemalloc`, snapshots the traced heap when every unit has ended
(as the units blob is about to be written: all that a measurement holds), and prints the
growth per added case: in all, and for the lines that allocate most of it. What does not
grow with N (imports, interned names, bounded lists) cancels out.

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
from evolane.measure._plan import MeasurePlan


def _snapshot_at_the_end(cases: int) -> tuple[int, tracemalloc.Snapshot]:
    """Run one measurement; the traced total and a snapshot when every unit has ended and
    its records are about to be written (all a measurement holds, before the blob's
    buffers)."""
    taken: list[Any] = []
    original = MeasurePlan.records_chunks

    def records_chunks(plan: MeasurePlan) -> Any:
        if not taken:
            taken.extend([tracemalloc.get_traced_memory()[0], tracemalloc.take_snapshot()])
        return original(plan)

    MeasurePlan.records_chunks = records_chunks  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory(prefix="memory-slope-") as tmp:
            trio.run(scale.evolane_run, Path(tmp), cases, 8, scale.Counters())
    finally:
        MeasurePlan.records_chunks = original  # type: ignore[method-assign]
    return taken[0], taken[1]


def worker(cases: int) -> None:
    """In this (fresh) process: one run under tracemalloc; its held memory by line, as JSON."""
    tracemalloc.start(1)
    total, snapshot = _snapshot_at_the_end(cases)
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
    print(f"traced at the end, N = {small}: {low['total'] / 2**20:.1f} MiB; N = {large}: "
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
