"""System calls of evolane's own process per sandboxed command (issue 22): a load-independent count.

Runs N units of ``sh -c 'echo 1 > "$1"/output.json'`` through `SandboxHost.run`, 8 at a time
(as ``scale_subprocess.py``'s sandbox loop), under ``strace -f``, and counts the system
calls of evolane's own threads only (not its children: the spawn server, the lifeline and the
commands) between two marks set after 16 warm-up units. The inline gates are held open and
found programs kept, as an unslowed run has them: strace slows each call, which would close
them and send layouts and spawns to threads. How many of the commands scanned the process's
children for orphans is told apart: that scan runs when any zombie child is waiting, which
depends on timing.

    python benchmarks/sandbox_syscalls.py [--units 300] [--top 12]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import trio

SCRIPT = 'echo 1 > "$1"/output.json'
WARM = 16
_MARKS = ("/nonexistent-evolane-mark-start", "/nonexistent-evolane-mark-end")
_LINE = re.compile(r"^(\d+)\s+(?:<\.\.\. (\w+) resumed>|(\w+)\()(.*)$")


async def _units(root: Path, units: int) -> None:
    """The traced side: warm-up units, a mark, ``units`` units, a mark."""
    from evolane.sandbox import SandboxSpec, open_sandbox

    limiter = trio.CapacityLimiter(8)
    async with open_sandbox(root / "sb") as host:
        for gate in (host.inline, host.inline_cleanup):
            gate.slow = gate.stall = float("inf")
        host.programs.seconds = float("inf")
        folders = [root / "out" / f"u{n}" for n in range(units + WARM)]
        for folder in folders:
            folder.mkdir(parents=True)

        async def one(folder: Path) -> None:
            async with limiter:
                spec = SandboxSpec(argv=("sh", "-c", SCRIPT, "u", str(folder)), kill_grace=0.2)
                outcome = await host.run(spec)
                assert outcome.ok, outcome.error

        for batch, mark in ((folders[:WARM], _MARKS[0]), (folders[WARM:], _MARKS[1])):
            async with trio.open_nursery() as nursery:
                for folder in batch:
                    nursery.start_soon(one, folder)
            await trio.to_thread.run_sync(host.settle)
            os.path.exists(mark)  # one stat the count starts or ends at


def count(log: Path) -> tuple[collections.Counter[str], int]:
    """System calls by name of the first process's threads between the marks, and how
    many orphan scans (listings of /proc/self/task) were among them."""
    threads: set[int] = set()
    pending: dict[int, str] = {}
    counts: collections.Counter[str] = collections.Counter()
    scans, counting = 0, False
    with open(log) as lines:
        for line in lines:
            found = _LINE.match(line)
            if found is None:
                continue
            tid, name, rest = int(found[1]), found[2] or found[3], found[4]
            threads = threads or {tid}
            if found[3] and rest.endswith("<unfinished ...>"):
                pending[tid] = rest
                continue
            full = pending.pop(tid, "") + rest if found[2] else rest
            if name in ("clone", "clone3") and tid in threads and "CLONE_THREAD" in full:
                child = re.search(r"= (\d+)", full)
                threads |= {int(child[1])} if child else set()
            if _MARKS[0] in full or _MARKS[1] in full:
                counting = _MARKS[0] in full
            elif counting and tid in threads:
                counts[name] += 1
                scans += name == "openat" and '"/proc/self/task",' in full
    return counts, scans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=300)
    parser.add_argument("--top", type=int, default=12, help="system calls named")
    parser.add_argument("--traced", help=argparse.SUPPRESS)  # the traced side's folder
    args = parser.parse_args()
    if args.traced:
        trio.run(_units, Path(args.traced), args.units)
        return
    if shutil.which("strace") is None:
        sys.exit("needs strace")
    with tempfile.TemporaryDirectory(prefix="sandbox-syscalls-") as tmp:
        log = Path(tmp) / "strace.log"
        traced = [sys.executable, __file__, "--units", str(args.units), "--traced", tmp]
        subprocess.run(["strace", "-f", "-qq", "-o", str(log), *traced], check=True)
        counts, scans = count(log)
    n = args.units
    print(f"{n} commands, 8 at a time: {sum(counts.values()) / n:.1f} system calls a command")
    print(f"  of evolane's own threads; orphan scans in {scans / n:.2f} of the commands")
    print("  " + ", ".join(f"{name} {k / n:.1f}" for name, k in counts.most_common(args.top)))


if __name__ == "__main__":
    main()
