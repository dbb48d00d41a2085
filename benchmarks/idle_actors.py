"""10,000 idle actors under one supervisor: RSS added, start time, ordered shutdown time.

Targets (issue 2): at most 150 MB RSS added; start all and shut all down in order, each <= 2 s.
The reference is an equal number of bare trio tasks parked on their own memory channel,
measured in the same run, so the ratio shows what the actor machinery costs on top.

    python benchmarks/idle_actors.py [--actors N]
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

import psutil
import trio

import evolane
from evolane.messages import Message, Ping
from evolane.supervisors import ActorSpec, SupervisorSpec


class Idle(evolane.Actor):
    """Does nothing until told; answers Ping."""

    accepts = (Ping,)

    async def receive(self, message: Message) -> Any:
        return message


def rss_mb() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


async def _park(receive: trio.MemoryReceiveChannel[Any]) -> None:
    async for _ in receive:
        pass


async def bare_tasks(n: int) -> tuple[float, float, float]:
    """Reference: n tasks, each parked on a capacity-64 channel; start s, stop s, MB added."""
    before = rss_mb()
    channels = []
    async with trio.open_nursery() as nursery:
        start = time.perf_counter()
        for _ in range(n):
            send, receive = trio.open_memory_channel[Any](64)
            channels.append(send)
            nursery.start_soon(_park, receive)
        await trio.sleep(0)
        started = time.perf_counter() - start
        added = rss_mb() - before
        start = time.perf_counter()
        for send in reversed(channels):
            await send.aclose()
    return started, time.perf_counter() - start, added


async def actors(n: int) -> tuple[float, float, float]:
    """n idle actors under one supervisor; start s, ordered shutdown s, MB added."""
    async with evolane.open_runtime() as rt:
        before = rss_mb()
        spec = SupervisorSpec(
            name="idle", children=[ActorSpec(name=f"idle-{i}", actor=Idle) for i in range(n)]
        )
        start = time.perf_counter()
        supervisor = await rt.start_supervisor(spec)
        started = time.perf_counter() - start
        added = rss_mb() - before
        assert await supervisor.ref(f"idle-{n - 1}").ask(Ping(seq=1), timeout=5)
        start = time.perf_counter()
        await rt.root.stop_child("idle")
        stopped = time.perf_counter() - start
    return started, stopped, added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=10_000)
    args = parser.parse_args()
    n = args.actors
    ref_start, ref_stop, ref_mb = trio.run(bare_tasks, n)
    start, stop, mb = trio.run(actors, n)
    print(f"{'case':28} {'start s':>8} {'stop s':>8} {'RSS MB':>8}")
    print(f"{'bare parked trio tasks':28} {ref_start:8.3f} {ref_stop:8.3f} {ref_mb:8.1f}")
    print(f"{f'{n} idle actors':28} {start:8.3f} {stop:8.3f} {mb:8.1f}")
    print()
    print(
        f"start {start:.2f} s (target <= 2), ordered shutdown {stop:.2f} s (target <= 2), "
        f"RSS added {mb:.0f} MB (target <= 150)"
    )
    print(
        f"ratios vs bare tasks: start {start / ref_start:.1f}x, stop {stop / ref_stop:.1f}x, "
        f"memory {mb / max(ref_mb, 0.1):.1f}x"
    )


if __name__ == "__main__":
    main()
