"""Trajectory ingestion (issue 21): what ``--from-trajectory`` costs before a run starts.

Writes N sessions of T turns each (every third turn a follow-up, one session in ten with a
turn gap, long assistant answers so that eviction works), then times, best of R rounds:

- `evolane.inputs.ingest_trajectories` on that file (read, validate, sessions, chains,
  groups, split, the `Dataset`);
- against the reference `load_dataset` of the resulting cases written as a dataset JSONL
  (what a run from a hand-written dataset already pays), compared per MiB read.

    python benchmarks/trajectory_ingest.py [--sessions 2000] [--turns 6] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from evolane.inputs import ingest_trajectories, load_dataset


def best_of(rounds: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def write_log(path: Path, sessions: int, turns: int) -> int:
    lines = 0
    with path.open("w") as out:
        for s in range(sessions):
            for t in range(turns):
                if s % 10 == 0 and t == 1:
                    continue  # a gap: the follow-ups after it lack context
                text = f"and now step {t}" if t % 3 else f"Analyse https://d.io/{s} task {s % 7}"
                row = {
                    "session_id": f"s{s}",
                    "turn": t,
                    "target": f"family{s % 5}",
                    "messages": [
                        {"role": "user", "content": text},
                        {"role": "assistant", "content": "x" * 3000},
                    ],
                    "outcome": {"status": "failure" if (s + t) % 4 == 0 else "success"},
                }
                out.write(json.dumps(row) + "\n")
                lines += 1
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="i21a-bench-") as folder:
        log = Path(folder) / "agent.jsonl"
        lines = write_log(log, args.sessions, args.turns)
        derived = ingest_trajectories([log], group="family0")
        cases = Path(folder) / "cases.jsonl"
        cases.write_bytes(derived.dataset.canonical_jsonl())
        ingest = best_of(args.rounds, lambda: ingest_trajectories([log], group="family0"))
        load = best_of(args.rounds, lambda: load_dataset(cases))
        size = log.stat().st_size / (1 << 20)
        case_size = cases.stat().st_size / (1 << 20)
        print(f"trajectory file: {lines} records, {size:.1f} MiB")
        print(f"group family0: {len(derived.dataset)} cases ({case_size:.1f} MiB as a dataset)")
        print(f"ingest_trajectories: {ingest:.3f} s, {size / ingest:.1f} MiB/s")
        print(f"load_dataset of the cases (reference): {load:.3f} s, {case_size / load:.1f} MiB/s")
        print(f"throughput ratio reference / ingest: {(case_size / load) / (size / ingest):.2f}x")


if __name__ == "__main__":
    main()
