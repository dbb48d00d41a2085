"""Where a measurement's peak RSS is made (issue 22): `scale.py`'s evolane run in this
process, with RSS sampled every 2 ms by a thread and each sample tagged with the phase it
falls in (loading the dataset, storing the cases, making the plan, running the units, the
units blob, the decision). Prints each phase's RSS at its start and its peak, in MiB.

    python benchmarks/rss_phases.py [--cases 100000] [--allocator fixed|as-is]

``--allocator fixed`` (the default) sets the policy the CLI sets (`fix_mmap_threshold`).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import trio

import scale
from evolane.measure import _pipeline, _plan
from evolane.supervisors import fix_mmap_threshold

_PAGE = 4096


def _rss_mib() -> float:
    with open("/proc/self/statm") as stat:
        return int(stat.read().split()[1]) * _PAGE / (1 << 20)


class Sampler:
    """A thread reading RSS every ``period`` seconds into the current phase's peak."""

    def __init__(self, period: float = 0.002) -> None:
        self.period, self.phase = period, "start-up"
        self.phases: dict[str, list[float]] = {}  # phase -> [RSS at its start, its peak]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def enter(self, phase: str) -> None:
        """Tag the samples from now on with ``phase``."""
        self.phase = phase
        now = _rss_mib()
        self.phases.setdefault(phase, [now, now])

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            now = _rss_mib()
            figures = self.phases.setdefault(self.phase, [now, now])
            figures[1] = max(figures[1], now)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _tagged(sampler: Sampler, phase: str, then: str, real: Callable[..., Any]) -> Any:
    """``real``, entering ``phase`` on each call and ``then`` when it returns."""

    def call(*args: Any, **kwargs: Any) -> Any:
        sampler.enter(phase)
        try:
            return real(*args, **kwargs)
        finally:
            sampler.enter(then)

    return call


def _tagged_chunks(sampler: Sampler, real: Callable[..., Iterator[bytes]]) -> Any:
    """``real`` (a generator of the units blob's chunks), tagged while it is iterated."""

    def call(*args: Any, **kwargs: Any) -> Iterator[bytes]:
        sampler.enter("units blob")
        try:
            yield from real(*args, **kwargs)
        finally:
            sampler.enter("end")

    return call


def run(cases: int) -> Sampler:
    """`scale.evolane_run` at ``cases`` with its phases tagged."""
    sampler = Sampler()
    scale.load_dataset = _tagged(sampler, "load", "after load", scale.load_dataset)
    _pipeline.store_cases = _tagged(sampler, "store cases", "running", _pipeline.store_cases)
    init = _plan.MeasurePlan.__init__
    _plan.MeasurePlan.__init__ = _tagged(sampler, "plan", "running", init)  # type: ignore[method-assign]
    _plan.unit_records_chunks = _tagged_chunks(sampler, _plan.unit_records_chunks)
    _plan.decision = _tagged(sampler, "decision", "end", _plan.decision)
    with sampler, tempfile.TemporaryDirectory(prefix="rss-") as tmp:
        trio.run(scale.evolane_run, Path(tmp), cases, 8, scale.Counters())
    return sampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--allocator", choices=("fixed", "as-is"), default="fixed")
    args = parser.parse_args()
    if args.allocator == "fixed":
        fix_mmap_threshold()
    started = time.perf_counter()
    sampler = run(args.cases)
    print(f"N = {args.cases}, allocator {args.allocator}, {time.perf_counter() - started:.0f} s")
    print(f"{'phase':<14} {'start MiB':>9} {'peak MiB':>9}")
    for phase, (start, peak) in sampler.phases.items():
        print(f"{phase:<14} {start:>9.1f} {peak:>9.1f}")
    print(f"peak {max(peak for _, peak in sampler.phases.values()):.1f} MiB")


if __name__ == "__main__":
    main()
