"""Model calls through `evolane.lanes.chat` against the chat-completions stub (issue 18).

64 calls, 8 callers at a time (a trio CapacityLimiter(8)), the stub answering after 200 ms:
the ideal wall time is 64 / 8 x 0.2 = 1.6 s; target: at most 1.2x. Printed against the same
pattern of plain ``trio.sleep(0.2)`` calls in the same process (the reference). Then the
same with the stub answering 429 to 30% of the requests: the ratio, and the endpoint
limiter's lowest and highest limit (AIMD halves on 429 and grows back by one per window).

The stub runs as its own process (``python -m evolane.testing._chat_stub``), one per
scenario, so its threads do not share this process's GIL.

    python benchmarks/llm_lanes.py [--calls 64] [--concurrency 8] [--latency 0.2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import orjson
import trio

from evolane.lanes import Endpoint, chat
from evolane.lanes._llm_limit import LimiterSettings, limiter_for

TARGET_RATIO = 1.2


@contextlib.contextmanager
def stub_process(root: Path, name: str, script: dict) -> Iterator[tuple[str, Path]]:
    """A stub server process; yields its base URL and the file recording its requests."""
    (root / f"{name}.json").write_bytes(orjson.dumps(script))
    port_file, record = root / f"{name}.port", root / f"{name}.jsonl"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "evolane.testing._chat_stub",
            "--port-file",
            str(port_file),
            "--script",
            str(root / f"{name}.json"),
            "--record",
            str(record),
        ]
    )
    try:
        for _ in range(500):
            if port_file.exists():
                break
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port_file.read_text()}/v1", record
    finally:
        process.terminate()
        process.wait(timeout=30)


async def fan_out(call: Callable[[int], Awaitable[object]], calls: int, concurrency: int) -> float:
    """Seconds to run ``call(0..calls-1)`` with ``concurrency`` callers at a time."""
    limit = trio.CapacityLimiter(concurrency)

    async def one(index: int) -> None:
        async with limit:
            await call(index)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for index in range(calls):
            nursery.start_soon(one, index)
    return time.perf_counter() - started


def chat_call(endpoint: Endpoint, round_: int) -> Callable[[int], Awaitable[object]]:
    async def call(index: int) -> None:
        messages = [{"role": "user", "content": f"round {round_} call {index}"}]
        await chat(endpoint, messages, seed=round_, sample=index, deadline=trio.current_time() + 60)

    return call


async def scenario(base_url: str, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Wall times of the chat fan-out and of the sleep reference, alternating."""
    endpoint = Endpoint("bench", base_url=base_url, timeout=30)
    walls, references = [], []
    await chat_call(endpoint, -1)(0)  # warm up: client, connection, imports
    for round_ in range(args.rounds):
        walls.append(await fan_out(chat_call(endpoint, round_), args.calls, args.concurrency))
        references.append(
            await fan_out(lambda _: trio.sleep(args.latency), args.calls, args.concurrency)
        )
    return walls, references


def report(title: str, walls: list[float], references: list[float], ideal: float) -> float:
    wall, reference = statistics.median(walls), statistics.median(references)
    ratio = wall / ideal
    print(
        f"{title}: median wall {wall:.3f} s over {len(walls)} rounds (each: "
        + ", ".join(f"{w:.3f}" for w in walls)
        + ")"
    )
    print(f"  ideal {ideal:.3f} s, trio.sleep reference {reference:.3f} s")
    print(f"  ratio to ideal {ratio:.2f}x, to reference {wall / reference:.2f}x")
    return ratio


async def main(args: argparse.Namespace) -> None:
    ideal = args.calls / args.concurrency * args.latency
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with stub_process(root, "plain", {"latency": args.latency}) as (url, _):
            walls, references = await scenario(url, args)
        ratio = report("no 429", walls, references, ideal)
        verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
        print(f"  target <= {TARGET_RATIO}x: {verdict}")

        script = {"latency": args.latency, "rate_limit_fraction": 0.3, "retry_after": 0.05}
        with stub_process(root, "storm", {**script, "seed": 1}) as (url, record):
            walls, references = await scenario(url, args)
            lines = record.read_text().splitlines()
        limited = sum(orjson.loads(line)["rate_limited"] for line in lines)
        report("30% 429 (Retry-After 0.05 s)", walls, references, ideal)
        limiter = limiter_for(url, LimiterSettings())
        history = list(limiter.history)
        print(f"  requests {len(lines)}, answered 429: {limited}")
        print(
            f"  limiter: start {history[0]}, min {min(history)}, max {max(history)}, "
            f"now {limiter.limit}, {len(history) - 1} changes"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=3)
    trio.run(main, parser.parse_args())
