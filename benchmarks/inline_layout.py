"""Unit layouts on the event loop vs in a worker thread (issue 22), both measured in the same run.

N sandboxed `true` units with memory and process limits (their own folders and three cgroups
to lay out), 16 at a time, while a heartbeat task measures how late the event loop runs and a
victim unit (``sleep 30``, 0.3 s deadline) measures how late its kill comes. Two ways,
interleaved: the host's inline gate as it is (layouts inline while they stay fast), and the
gate held closed (every layout in a thread, as before). Prints CPU ms per unit (process and
its threads), the loop's lateness at its 99th percentile, the victim's worst overshoot past its
deadline, and how often the gate closed; then the ratio of inline CPU to thread CPU.

    python benchmarks/inline_layout.py [--units 600] [--lanes 16] [--repeat 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import trio

from evolane.sandbox import Limits, SandboxSpec, open_sandbox

_BEAT = 0.002  # seconds the heartbeat sleeps; its lateness is the loop's


def _p99(values: list[float]) -> float:
    return sorted(values)[int(0.99 * (len(values) - 1))] if values else 0.0


async def run(root: Path, units: int, lanes: int, inline: bool) -> dict[str, float]:
    """One way: CPU ms per unit, loop lateness p99 (ms), victim overshoot max (ms), closings."""
    async with open_sandbox(root / "sandbox") as host:
        if not inline:  # closed for the whole run: every layout goes to a thread
            host.inline.pause = float("inf")
            host.inline.took(float("inf"), time.monotonic())
        late: list[float] = []
        over: list[float] = []

        async def beat() -> None:
            while True:
                start = time.monotonic()
                await trio.sleep(_BEAT)
                late.append(time.monotonic() - start - _BEAT)

        async def victim() -> None:
            while True:
                start = trio.current_time()
                spec = SandboxSpec(argv=("sleep", "30"), kill_grace=0.1)
                await host.run(spec, timeout=0.3)
                over.append(trio.current_time() - start - 0.3)

        limiter = trio.CapacityLimiter(lanes)
        limits = Limits(memory_bytes=256 << 20, processes=64)

        async def unit() -> None:
            async with limiter:
                outcome = await host.run(SandboxSpec(argv=("true",), limits=limits), timeout=30)
                assert outcome.ok, outcome

        cpu = time.process_time()
        async with trio.open_nursery() as watchers:
            watchers.start_soon(beat)
            watchers.start_soon(victim)
            async with trio.open_nursery() as nursery:
                for _ in range(units):
                    nursery.start_soon(unit)
            watchers.cancel_scope.cancel()
        return {
            "cpu_ms": (time.process_time() - cpu) / units * 1000,
            "late_p99_ms": _p99(late) * 1000,
            "overshoot_ms": max(over, default=0.0) * 1000,
            "closings": float(host.inline.closings),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=600)
    parser.add_argument("--lanes", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=2, help="rounds of both ways")
    args = parser.parse_args()
    cpu: dict[bool, list[float]] = {True: [], False: []}
    print(f"{args.units} units of `true` with limits, {args.lanes} at a time")
    with tempfile.TemporaryDirectory(prefix="inline-layout-") as tmp:
        for round_ in range(args.repeat):
            for inline in (True, False):  # interleaved: load drifts hit both ways
                root = Path(tmp) / f"{round_}-{inline}"
                figures = trio.run(run, root, args.units, args.lanes, inline)
                cpu[inline].append(figures["cpu_ms"])
                print(
                    f"  {'inline' if inline else 'thread'}: CPU {figures['cpu_ms']:.2f} ms/unit, "
                    f"loop late p99 {figures['late_p99_ms']:.1f} ms, victim overshoot max "
                    f"{figures['overshoot_ms']:.0f} ms, gate closings {figures['closings']:.0f}"
                )
    ratio = sorted(cpu[True])[len(cpu[True]) // 2] / sorted(cpu[False])[len(cpu[False]) // 2]
    print(f"  inline / thread CPU per unit (medians): {ratio:.2f}x")


if __name__ == "__main__":
    main()
