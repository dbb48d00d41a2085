"""Typed actor messaging against raw trio primitives, same process, same run.

Prints each rate and the ratios the runtime must reach (issue 2):
  tell (validated typed messages)   >= 0.5 x raw bounded channel (same send idiom)
  ask round trip                    <= 3 x raw Event-based request/reply

    python benchmarks/mailbox.py [--messages N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

import evolane
from evolane.messages import Message, Ping

CAPACITY = 64


async def raw_channel(n: int, nowait_fast_path: bool) -> float:
    """Producer -> bounded memory channel -> consumer; seconds for n messages."""
    send, receive = trio.open_memory_channel[Any](CAPACITY)
    done = trio.Event()

    async def consume() -> None:
        count = 0
        async for _ in receive:
            count += 1
            if count == n:
                done.set()
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        start = time.perf_counter()
        for i in range(n):
            item = (i, None)
            if nowait_fast_path:
                try:
                    send.send_nowait(item)
                    continue
                except trio.WouldBlock:
                    pass
            await send.send(item)
        await done.wait()
        return time.perf_counter() - start


class Sink(evolane.Actor):
    """Counts messages and wakes the benchmark when the last one arrives."""

    accepts = (Ping,)

    def __init__(self, n: int, done: trio.Event) -> None:
        self.n, self.done, self.count = n, done, 0

    async def receive(self, message: Message) -> Any:
        self.count += 1
        if self.count == self.n:
            self.done.set()
        return message


async def actor_tell(n: int) -> float:
    """Build a validated Ping and `tell` it, n times; seconds until the actor handled all."""
    done = trio.Event()
    async with evolane.open_runtime() as rt:
        ref = await rt.spawn(Sink, n, done, name="sink")
        start = time.perf_counter()
        for i in range(n):
            await ref.tell(Ping(seq=i))
        await done.wait()
        return time.perf_counter() - start


async def actor_ask(n: int) -> float:
    """n sequential `ask` round trips with validated messages."""
    async with evolane.open_runtime() as rt:
        ref = await rt.spawn(Sink, n + 1, trio.Event(), name="sink")
        start = time.perf_counter()
        for i in range(n):
            await ref.ask(Ping(seq=i), timeout=10)
        return time.perf_counter() - start


async def raw_request_reply(n: int) -> float:
    """n sequential request/reply round trips: a channel carries (request, Event, slot)."""
    send, receive = trio.open_memory_channel[Any](CAPACITY)

    async def respond() -> None:
        async for request, event, slot in receive:
            slot.append(request)
            event.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(respond)
        start = time.perf_counter()
        for i in range(n):
            event, slot = trio.Event(), []
            await send.send((i, event, slot))
            await event.wait()
            _ = slot[0]
        elapsed = time.perf_counter() - start
        await send.aclose()
        return elapsed


def measure(rounds: int, cases: dict[str, Callable[[], Awaitable[float]]]) -> dict[str, float]:
    """Median seconds per case over ``rounds`` interleaved rounds (noise hits all alike)."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, case in cases.items():
            samples[name].append(trio.run(case))
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--asks", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    n, k = args.messages, args.asks
    seconds = measure(
        args.rounds,
        {
            "raw channel, await send": lambda: raw_channel(n, nowait_fast_path=False),
            "raw channel, nowait fast path": lambda: raw_channel(n, nowait_fast_path=True),
            "ActorRef.tell, validated Ping": lambda: actor_tell(n),
            "raw Event request/reply": lambda: raw_request_reply(k),
            "ActorRef.ask, validated Ping": lambda: actor_ask(k),
        },
    )
    counts = {name: (k if "ask" in name or "request" in name else n) for name in seconds}
    rates = {name: counts[name] / seconds[name] for name in seconds}
    print(f"{'case':34} {'rate':>14}")
    for name, rate in rates.items():
        print(f"{name:34} {rate:>11,.0f} /s")
    tell = rates["ActorRef.tell, validated Ping"]
    like_for_like = tell / rates["raw channel, nowait fast path"]
    versus_blocking = tell / rates["raw channel, await send"]
    ask_cost = rates["raw Event request/reply"] / rates["ActorRef.ask, validated Ping"]
    print()
    print(f"tell / raw channel (same nowait idiom): {like_for_like:.2f}  (target >= 0.50)")
    print(f"tell / raw channel (await send):        {versus_blocking:.2f}")
    print(f"ask round-trip cost / raw Event:        {ask_cost:.2f}x (target <= 3.00)")
    print(f"ask round trip: {1e6 / rates['ActorRef.ask, validated Ping']:.1f} us")


if __name__ == "__main__":
    main()
