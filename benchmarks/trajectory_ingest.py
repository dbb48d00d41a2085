"""Trajectory ingestion (issue 21): what ``--from-trajectory`` costs before a run starts.

Writes N sessions of T turns each (every third turn a follow-up, one session in ten with a
turn gap, long assistant answers so that eviction works), then times, best of R rounds:

- `evolane.inputs.ingest_trajectories` on that file (read, validate, sessions, chains,
  groups, split, the `Dataset`);
- against the reference `load_dataset` of the resulting cases written as a dataset JSONL
  (what a run from a hand-written dataset already pays), compared per MiB read.

``--tiny N...`` instead writes N tiny records (~50-70 bytes each: sessions of 5 turns of
one target, so one group, one turn in four a failure; ``--shape chat``: plain
``{"messages": [...]}`` lines, each a session and a group of its own) and runs ``evolane
dataset from-trajectory`` on them in a fresh process: its wall time and peak RSS
(``wait4``), with the records and the file size.

    python benchmarks/trajectory_ingest.py [--sessions 2000] [--turns 6] [--rounds 3]
    python benchmarks/trajectory_ingest.py --tiny 100000 1000000 [--shape turns|chat]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
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


def write_tiny(path: Path, records: int, shape: str) -> None:
    """``records`` tiny records (~50 bytes a line) of ``shape`` (``turns`` or ``chat``)."""
    with path.open("w") as out:
        for n in range(records):
            if shape == "chat":
                out.write(f'{{"messages":[{{"role":"user","content":"q{n}"}}]}}\n')
                continue
            fails = ',"outcome":{"status":"failure"}' if n % 4 == 0 else ""
            row = f'"session_id":"s{n // 5}","turn":{n % 5},"task":"t{n}","target":"g"{fails}'
            out.write(f"{{{row}}}\n")


def run_tiny(records: int, shape: str) -> None:
    """``evolane dataset from-trajectory`` on ``records`` tiny records in a fresh process:
    prints its exit code, wall time and peak RSS."""
    with tempfile.TemporaryDirectory(prefix="traj-tiny-") as folder:
        log = Path(folder) / "tiny.jsonl"
        write_tiny(log, records, shape)
        command = [sys.executable, "-c", "from evolane.cli import main; main()"]
        command += ["dataset", "from-trajectory", str(log), "-o", str(Path(folder) / "c.jsonl")]
        started = time.perf_counter()
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        error = child.stderr.read().decode().strip() if child.stderr else ""
        size = log.stat().st_size / (1 << 20)
        print(
            f"{shape} {records:>9,} records ({size:6.1f} MiB): exit {child.returncode}, "
            f"{wall:6.1f} s, peak RSS {usage.ru_maxrss / 1024:7.1f} MiB "
            f"({usage.ru_maxrss * 1024 / records:.0f} B a record) {error[:200]}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tiny", type=int, nargs="+", default=[])
    parser.add_argument("--shape", choices=("turns", "chat"), default="turns")
    args = parser.parse_args()
    if args.tiny:
        for records in args.tiny:
            run_tiny(records, args.shape)
        return
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
