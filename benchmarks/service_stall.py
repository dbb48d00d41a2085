"""Background evolution's cost to the agent's loop: an asyncio agent records the traces
example's tasks into an `EvolveService` (``evolane.aio``) while its jobs run in the same
loop; a 10 ms ticker's worst delay while a job runs is compared with the README's aio
figure (the same ticker beside a sleeper campaign, `aio_latency.py`), measured in this run.

    python benchmarks/service_stall.py [--tasks 60] [--every 20]

Prints both worst delays and their ratio; exits 1 when the service's worst delay exceeds
the aio target (50 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import evolane.aio
from aio_latency import TICK, _config, _line, _measure
from evolane.embed import EvolvePolicy, ServiceSettings
from evolane.examples.traces import campaign_settings, task_record, write_traces_workspace

TARGET = 0.05
JOBS_TIMEOUT = 1800.0


async def _agent(root: Path, tasks: int, every: int) -> tuple[list[float], float, int]:
    """Ticker delays while a job ran, the wall time, and the jobs that finished."""
    write_traces_workspace(root / "work")
    settings = {**campaign_settings(root / "work"), "iterations": 1}
    service_settings = ServiceSettings(mode="shadow", policy=EvolvePolicy(every=every))
    delays: list[float] = []
    started = time.monotonic()
    async with (
        evolane.aio.open_runtime(store=settings["store"]) as runtime,
        runtime.evolve_service(settings, service_settings) as evolve,
    ):

        async def ticker() -> None:
            while True:
                before = time.monotonic()
                await asyncio.sleep(TICK)
                if evolve.service.running is not None:
                    delays.append(time.monotonic() - before - TICK)

        tick = asyncio.create_task(ticker())
        for index in range(tasks):  # the agent: a task, its record, the next task
            record = await asyncio.to_thread(task_record, root / "work" / "target", index)
            await evolve.record(record)  # the agent computes its task off the loop
            await asyncio.sleep(0.05)
        deadline = time.monotonic() + JOBS_TIMEOUT
        while len(evolve.finished) < tasks // every and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        tick.cancel()
        finished = len(evolve.finished)
    return delays, time.monotonic() - started, finished


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=3, help="of the aio reference")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="service-stall-") as tmp:
        root = Path(tmp)
        reference, ref_wall = asyncio.run(_measure(_config(root / "ref", args.iterations), 0))
        delays, wall, jobs = asyncio.run(_agent(root, args.tasks, args.every))
    if not delays:
        print("no ticks while a job ran: nothing measured")
        return 1
    print(_line("aio ref", reference, ref_wall))
    print(_line("service", delays, wall) + f", {jobs} jobs")
    worst, ref = max(delays), max(reference)
    print(
        f"worst delay with a background job: {worst * 1e3:.1f} ms vs aio reference "
        f"{ref * 1e3:.1f} ms: ratio {worst / ref:.2f} (target <= {TARGET * 1e3:.0f} ms)"
    )
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
