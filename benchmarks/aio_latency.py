"""The asyncio host's cost to its loop: a campaign on the sleeper runs in the same asyncio
loop as a 10 ms ticker; the ticker's worst delay must stay at or below 50 ms.

    python benchmarks/aio_latency.py [--iterations 3]

Also prints the ticker's delays with no campaign running (the reference, same process).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import evolane.aio
from evolane.campaign import CampaignConfig
from evolane.cli._examples import SLEEPER_DEFAULTS, example_settings
from evolane.embed import OptimizeRequest

TICK = 0.01


async def _ticker(delays: list[float]) -> None:
    while True:
        before = time.monotonic()
        await asyncio.sleep(TICK)
        delays.append(time.monotonic() - before - TICK)


def _config(root: Path, iterations: int) -> CampaignConfig:
    settings = example_settings("sleeper", root / "ex")
    keys = ("target", "dataset", "replay", "judge", "optimizer")
    return CampaignConfig(
        **{k: settings[k] for k in keys},
        required_files=tuple(settings["required_files"]),
        store=str(root / "store"),
        **{**SLEEPER_DEFAULTS, "iterations": iterations},
    )


async def _measure(config: CampaignConfig | None, seconds: float) -> tuple[list[float], float]:
    delays: list[float] = []
    tick = asyncio.create_task(_ticker(delays))
    started = time.monotonic()
    if config is None:
        await asyncio.sleep(seconds)
    else:
        async with evolane.aio.open_runtime(store=config.store) as runtime:
            report = await runtime.optimize(OptimizeRequest(config=config))
            assert report is not None and report.status == "finished"
    wall = time.monotonic() - started
    tick.cancel()
    return delays, wall


def _line(name: str, delays: list[float], wall: float) -> str:
    p99 = statistics.quantiles(delays, n=100)[98] * 1000 if len(delays) > 100 else float("nan")
    return (f"{name:9s} {wall:6.1f} s, {len(delays)} ticks, worst delay {max(delays) * 1000:6.1f}"
            f" ms, p99 {p99:5.1f} ms")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = _config(Path(tmp), args.iterations)
        busy, wall = asyncio.run(_measure(config, 0))
        idle, idle_wall = asyncio.run(_measure(None, 5.0))
    print(_line("idle loop", idle, idle_wall))
    print(_line("campaign", busy, wall))
    print(f"worst delay with a campaign: {max(busy) * 1000:.1f} ms (target <= 50 ms)")
    return 0 if max(busy) <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
