"""What the preflight's scan for copies of the held-out cases costs (`campaign._copies`).

Writes a dataset of C cases (half of them val/test, their strings 30-60 characters), a
folder of F text files (B MiB in all: JSON lines of made-up sessions, a few files holding
held-out cases) and one trajectory log of T MiB, then times, best of R rounds on a warm
page cache:

- a plain ``os.walk`` and read of each file (the floor: what any look at the bytes costs);
- `scan_folders` on the same tree (its walk, its caps, the matching);

and prints the ratio of each pair. Then it times the scan every start of this host makes
for a replay run by this Python (``{sys.executable} proj/agent.py``): the folders such a
run's commands are shown (`shown_folders`: its program's prefix, the interpreter's own),
walked as the preflight walks them (run it with another checkout's ``src`` on
``PYTHONPATH`` for that code's figure).

    python benchmarks/held_out_copies.py [--root DIR] [--files 10000] [--mib 200]
        [--log-mib 100] [--cases 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from evolane.campaign import CampaignConfig
from evolane.campaign._copies import held_out_tokens, scan_folders, shown_folders
from evolane.campaign._splits import split_ids
from evolane.inputs import load_dataset
from trajectory_ingest import best_of  # benchmarks/ is on sys.path: run as a script

WORDS = [
    "agent",
    "tool",
    "call",
    "returned",
    "the",
    "result",
    "of",
    "a",
    "search",
    "over",
    "files",
    "error",
    "retry",
    "plan",
    "step",
    "user",
    "asked",
    "for",
    "summary",
    "answer",
    "context",
    "window",
    "token",
    "budget",
    "cache",
    "hit",
    "miss",
    "latency",
    "request",
]


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def write_dataset(path: Path, cases: int, rng: random.Random) -> list[dict[str, object]]:
    rows = []
    for i in range(cases):
        split = ("train", "val", "test", "train")[i % 4]
        rows.append(
            {
                "id": f"c{i}",
                "split": split,
                "input": {"task": f"{sentence(rng, 5)} number {i}?"},
                "expected_output": f"{sentence(rng, 4)} {i * 7919}",
            }
        )
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def session_lines(rng: random.Random, size: int, start: int) -> str:
    """About ``size`` bytes of made-up JSON lines (no case's strings)."""
    lines, total, n = [], 0, start
    while total < size:
        row = {"session_id": f"s{n}", "messages": [
            {"role": "user", "content": sentence(rng, 12)},
            {"role": "assistant", "content": sentence(rng, 40)},
        ]}  # fmt: skip
        line = json.dumps(row) + "\n"
        lines.append(line)
        total += len(line)
        n += 1
    return "".join(lines)


def write_tree(root: Path, files: int, mib: int, rows: list[dict[str, object]]) -> None:
    rng = random.Random(1)
    per_file = (mib << 20) // files
    block = session_lines(rng, 4 * per_file + 4096, 0)  # sliced per file, shifted
    held = [row for row in rows if row["split"] != "train"]
    for i in range(files):
        folder = root / f"d{i % 100:02d}" / f"e{i % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        start = (i * 7919) % (len(block) - per_file)
        text = f"file {i}\n" + block[start : start + per_file]
        if i % 1000 == 0:  # a few copies of held-out cases
            text += "".join(json.dumps(row) + "\n" for row in held[:20])
        (folder / f"f{i}.jsonl").write_text(text)


def plain_read(top: str) -> int:
    read = 0
    for folder, _, names in os.walk(top):
        for name in names:
            with open(os.path.join(folder, name), "rb") as handle:
                while chunk := handle.read(4 << 20):
                    read += len(chunk)
    return read


def start_scan(root: Path, tokens: dict[bytes, int], rounds: int) -> None:
    """Time the scan of what a run whose replay is this Python is shown, as a start does."""
    proj = root / "proj"
    proj.mkdir(exist_ok=True)
    (proj / "agent.py").write_text("print('x')\n")
    config = CampaignConfig(
        target=str(root / "tree"), dataset=str(root / "dataset.jsonl"), optimizer="true",
        replay=f"{sys.executable} {proj / 'agent.py'} {{output_dir}}",
    )  # fmt: skip
    folders = shown_folders(config)
    scan = scan_folders(folders, (), tokens, 3)
    took = best_of(rounds, lambda: scan_folders(folders, (), tokens, 3))
    print(
        f"start ({sys.executable} replays; {len(folders)} folders shown: {', '.join(folders)}): "
        f"scan {took:.2f} s; {scan.files} files, {scan.read >> 20} MiB read, "
        f"cut short: {scan.partial or 'no'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", type=Path, default=None)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--log-mib", type=int, default=100)
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="held-out-copies-"))
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    rows = write_dataset(root / "dataset.jsonl", args.cases, rng)
    dataset = load_dataset(root / "dataset.jsonl")
    started = time.perf_counter()
    tokens = held_out_tokens(dataset, split_ids(dataset))
    print(f"{len(tokens)} distinctive strings of {args.cases // 2} held-out cases in "
          f"{time.perf_counter() - started:.3f} s")  # fmt: skip
    tree, logs = root / "tree", root / "logs"
    write_tree(tree, args.files, args.mib, rows)
    logs.mkdir()
    log_text = session_lines(random.Random(2), args.log_mib << 20, 0)
    (logs / "traces.jsonl").write_text(log_text + json.dumps(rows[1]) + "\n")
    for name, top, what in (
        ("tree", tree, f"{args.files} files, {args.mib} MiB"),
        ("log", logs, f"one trajectory file, {args.log_mib} MiB"),
    ):
        plain_read(str(top))  # warm the page cache
        floor = best_of(args.rounds, lambda top=top: plain_read(str(top)))
        scan = scan_folders([str(top)], (), tokens, 3)
        took = best_of(args.rounds, lambda top=top: scan_folders([str(top)], (), tokens, 3))
        print(
            f"{name} ({what}): plain walk+read {floor:.2f} s, scan {took:.2f} s, "
            f"{took / floor:.1f}x; {scan.files} files, {scan.read >> 20} MiB read, "
            f"{len(scan.copies)} copies found, cut short: {scan.partial or 'no'}"
        )
    start_scan(root, tokens, args.rounds)


if __name__ == "__main__":
    main()
