"""The stress harness's figures (issue 8), each from the scenario the CLI runs:

- processes: 500 trees, 20% killed by their deadline, 5% with a setsid escaper -> 0 survivors
  (``evolane stress --scenario processes --trees 500``);
- actors: 10,000 actors, 1,000,000 messages, 1% crashes -> lost = 0 in under 120 s
  (``evolane stress --scenario actors --actors 10000 --messages 1000000``); with
  ``--compare-gc`` also without the harness's GC setting, to show what it is worth;
- slow-observer: the sleeper pipeline with a never-reading observer vs none, 4 ABBA pairs ->
  median pair wall ratio <= 1.05 (``evolane stress --scenario slow-observer``).

    python benchmarks/stress_figures.py [--seed 0] [--only processes,actors,slow-observer]
                                        [--compare-gc]

Wall and CPU seconds are both printed: on a shared host the CPU time is the steadier figure.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import trio

from evolane.stress import ScenarioReport, run_scenario

FIGURES: dict[str, dict[str, Any]] = {
    "processes": {"trees": 500},
    "actors": {"actors": 10_000, "messages": 1_000_000},
    "slow-observer": {},
}


def _line(name: str, report: ScenarioReport) -> str:
    counts, measures = report.counts, report.measures
    failed = [k for k, held in report.invariants.items() if not held]
    verdict = "all invariants ok" if not failed else f"FAILED: {', '.join(failed)}"
    if name == "processes":
        deadline = counts.get("planned_deadline", 0) / counts["trees"]
        escapers = (counts.get("planned_escaper", 0) + counts.get("planned_daemon", 0)) / counts[
            "trees"
        ]
        figure = (
            f"{counts['trees']} trees ({deadline:.0%} deadline, {escapers:.0%} escapers), "
            f"survivors {counts['survivors']} (target 0), {measures['seconds']:.1f} s"
        )
    elif name == "actors":
        figure = (
            f"sent {counts['sent']:,}, lost {counts['lost']} (target 0), wall "
            f"{measures['seconds']:.1f} s, CPU {measures['cpu_seconds']:.1f} s (target < 120 s), "
            f"{measures['throughput_per_second']:,.0f} msg/s, peak RSS {measures['peak_rss_mb']} MB"
        )
    else:
        figure = (
            f"median pair wall ratio observed/alone {measures['wall_ratio']:.3f} (target <= 1.05; "
            f"of totals {measures['wall_ratio_of_totals']:.3f}): "
            f"{measures['wall_observed_seconds']:.2f} s vs {measures['wall_alone_seconds']:.2f} s, "
            f"{counts['events_dropped_by_observer']} events dropped by the observer"
        )
    return f"{name:14s} {figure}; {verdict}"


async def main(args: argparse.Namespace) -> int:
    wanted = args.only.split(",") if args.only else list(FIGURES)
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    ok = True
    for name in wanted:
        report = await run_scenario(name, seed=args.seed, options=FIGURES[name])
        print(_line(name, report), flush=True)
        ok &= report.ok
        if name == "actors" and args.compare_gc:
            options = {**FIGURES[name], "gc_tuning": False}
            plain = await run_scenario(name, seed=args.seed, options=options)
            print("  without the GC setting: " + _line(name, plain), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="")
    parser.add_argument("--compare-gc", action="store_true")
    sys.exit(trio.run(main, parser.parse_args()))
