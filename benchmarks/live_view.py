"""The live view's refresh rate and cost: the self-evolution example under a pseudo-terminal
with ``--progress rich`` against the same run with ``--progress none``, alternated.

    python benchmarks/live_view.py [--iterations 4] [--pairs 2]

Prints frames per second of the live view (target >= 2) and the wall of each mode; the ratio
rich / none is the view's cost (target <= 1.05). Same seed, same machine, same invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import subprocess
import sys
import tempfile
import threading
from pathlib import Path


def _run(root: Path, mode: str, iterations: int) -> tuple[float, int]:
    """One run; returns the run's wall (from its report) and the frames the view drew."""
    master, slave = pty.openpty()
    command = [sys.executable, "-m", "evolane", "optimize", "--example", "self-evolution",
               "--example-dir", str(root / "ex"), "--store", str(root / f"store-{mode}"),
               "--progress", mode, "--iterations", str(iterations)]  # fmt: skip
    env = {**os.environ, "COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color"}
    process = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 1 << 16)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    assert process.wait() == 0
    reader.join(timeout=10)
    os.close(master)
    (path,) = (root / f"store-{mode}").glob("runs/*/report.json")
    wall = json.loads(path.read_text())["wall_seconds"]
    frames = b"".join(chunks).count(b"evolane r-")
    return wall, frames


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    walls: dict[str, list[float]] = {"none": [], "rich": []}
    rates = []
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            for mode in ("none", "rich") if pair % 2 == 0 else ("rich", "none"):
                root = Path(tmp) / f"{mode}-{pair}"
                root.mkdir()
                wall, frames = _run(root, mode, args.iterations)
                walls[mode].append(wall)
                if mode == "rich":
                    rates.append(frames / wall)
                print(f"{mode:5s} run {pair + 1}: wall {wall:6.2f} s, frames {frames}")
    none, rich = sum(walls["none"]) / args.pairs, sum(walls["rich"]) / args.pairs
    rate = min(rates)
    print(f"live view: {rate:.1f} frames/s (lowest run; target >= 2)")
    print(f"wall: none {none:.2f} s, rich {rich:.2f} s, ratio rich/none {rich / none:.3f} "
          "(target <= 1.05)")  # fmt: skip
    return 0 if rate >= 2 and rich / none <= 1.05 else 1


if __name__ == "__main__":
    sys.exit(main())
