"""Sandbox kill and capture figures (issue 3), each against a reference in the same run.

evil tree (~50 processes, TERM-ignorers, escapers): survivors, deadline -> all reaped
    reference: trio.run_process cancelled at the same deadline (survivors counted, then killed)
polite tree: deadline -> all gone
overhead: sandboxed `true` vs subprocess.run(["true"])
capture: 1 GiB on stdout, wall and RSS growth
concurrency: 200 sandboxed `sleep 1` at once

  python benchmarks/kill.py [--runs 100] [--grace 0.2] [--capture-mib 1024]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import psutil
import trio

from evolane.sandbox import SandboxHost, SandboxSpec, lease_holders, open_sandbox
from evolane.testing import EVIL_TREE_SH, POLITE_TREE_SH

READY_SECONDS = 0.5


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def evil_runs(host: SandboxHost, runs: int, grace: float) -> tuple[list[float], int]:
    """Deadline -> run returned (everything reaped), per run; total survivors."""
    latencies, survivors = [], 0
    for _ in range(runs):
        spec = SandboxSpec(argv=("sh", "-c", EVIL_TREE_SH), kill_grace=grace)
        deadline = trio.current_time() + READY_SECONDS
        await host.run(spec, deadline=deadline)
        latencies.append(trio.current_time() - deadline)
        survivors += len(lease_holders(host.lease))
    return latencies, survivors


async def trio_default_reference() -> int:
    """What trio.run_process's own cancel leaves of the same tree (then we kill it)."""
    marker = f"bench-reference-{os.getpid()}"
    env = {"PATH": os.defpath, "EVOLANE_LEASE": marker}
    with warnings.catch_warnings(), trio.move_on_after(READY_SECONDS):
        warnings.simplefilter("ignore", RuntimeWarning)  # trio's "ignored SIGTERM" notice
        await trio.run_process(["sh", "-c", EVIL_TREE_SH], env=env, stdout=subprocess.DEVNULL)
    await trio.sleep(0.2)
    left = lease_holders(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return len(left)


async def polite_runs(host: SandboxHost, runs: int) -> list[float]:
    latencies = []
    for _ in range(runs):
        deadline = trio.current_time() + READY_SECONDS
        await host.run(SandboxSpec(argv=("sh", "-c", POLITE_TREE_SH)), deadline=deadline)
        latencies.append(trio.current_time() - deadline)
    return latencies


async def overhead(host: SandboxHost, runs: int) -> tuple[float, float]:
    """Median seconds of sandboxed `true` and of a raw subprocess.run(["true"]), interleaved."""
    sandboxed, raw = [], []
    spec = SandboxSpec(argv=("true",))
    for _ in range(runs):
        start = time.perf_counter()
        await host.run(spec, timeout=10)
        sandboxed.append(time.perf_counter() - start)
        start = time.perf_counter()
        subprocess.run(["true"], check=True)
        raw.append(time.perf_counter() - start)
    return statistics.median(sandboxed), statistics.median(raw)


async def capture(host: SandboxHost, mib: int) -> tuple[float, float, int]:
    """Seconds to capture ``mib`` MiB of stdout, peak RSS growth (MiB), bytes counted."""
    me = psutil.Process()
    base = me.memory_info().rss
    peak = base

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, me.memory_info().rss)
            await trio.sleep(0.01)

    spec = SandboxSpec(argv=("head", "-c", str(mib << 20), "/dev/zero"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample)
        start = time.perf_counter()
        outcome = await host.run(spec, timeout=60)
        took = time.perf_counter() - start
        nursery.cancel_scope.cancel()
    return took, (peak - base) / 2**20, outcome.stdout.total_bytes


async def concurrent_sleeps(host: SandboxHost, count: int) -> tuple[float, int]:
    done = 0

    async def one() -> None:
        nonlocal done
        outcome = await host.run(SandboxSpec(argv=("sleep", "1")), timeout=30)
        done += outcome.ok

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    return time.perf_counter() - start, done


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as root:
        async with open_sandbox(Path(root)) as host:
            print(f"mechanisms: {', '.join(host.mechanisms + host.cgroups.mechanisms)}")
            latencies, survivors = await evil_runs(host, args.runs, args.grace)
            reference_left = await trio_default_reference()
            print(f"\nevil tree x{args.runs}, grace {args.grace}s")
            print(
                f"  survivors: {survivors} in {args.runs} runs (trio.run_process cancel leaves "
                f"{reference_left} of the tree alive in one run)"
            )
            med, p99 = statistics.median(latencies), pct(latencies, 99)
            print(
                f"  deadline -> all reaped: median {med * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms "
                f"= grace + {(med - args.grace) * 1000:.1f} / + {(p99 - args.grace) * 1000:.1f} ms "
                "(targets: + 50 / + 200)"
            )
            polite = statistics.median(await polite_runs(host, 20))
            print(f"\npolite tree x20: deadline -> all gone median {polite * 1000:.1f} ms (<= 50)")
            sandboxed, raw = await overhead(host, 200)
            print(
                f"\n`true`: sandboxed {sandboxed * 1000:.2f} ms, raw subprocess.run "
                f"{raw * 1000:.2f} ms: overhead {(sandboxed - raw) * 1000:.2f} ms "
                f"(target <= 10), ratio {sandboxed / raw:.1f}x"
            )
            took, growth, total = await capture(host, args.capture_mib)
            print(
                f"\ncapture {total / 2**20:.0f} MiB of stdout: {took:.2f} s "
                f"({total / 2**20 / took:.0f} MiB/s), RSS growth {growth:.1f} MiB "
                "(targets <= 2 s for 1 GiB, <= 64 MiB)"
            )
            wall, ok = await concurrent_sleeps(host, 200)
            leaks = len(lease_holders(host.lease))
            print(
                f"\n200 concurrent `sleep 1`: {ok} ok in {wall:.2f} s, {leaks} leaked "
                "(target <= 3 s, 0)"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--grace", type=float, default=0.2)
    parser.add_argument("--capture-mib", type=int, default=1024)
    trio.run(main, parser.parse_args())
