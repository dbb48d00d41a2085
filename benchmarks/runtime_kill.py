"""A SIGKILLed runtime takes every sandboxed tree with it: runtime SIGKILL -> no process of its
lease alive (target: within 1 s), and -> its workspace directory removed (reported).

    python benchmarks/runtime_kill.py [--rounds 5] [--trees 100] [--tree evil|polite]

Each round starts a runtime (a child Python process with ``open_sandbox``) running ``--trees``
trees at once (evil: ~38 processes each, TERM-ignorers, setsid and double-fork escapers),
SIGKILLs it and times the lifeline's sweep. Reference, same round, same poll: the same trees
started directly, every process group they made (escapers' too, listed beforehand) killed with
``os.killpg`` from here: the kernel's kill alone, nothing to detect or search. The poll re-reads
/proc/PID/stat of the processes listed before the kill (a full lease scan of ~4,000 processes
takes ~80 ms), then confirms with a full ``lease_holders`` scan. Exit 1 if the target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from evolane.sandbox import LEASE_VARIABLE, lease_holders
from evolane.sandbox._lifeline import stat_fields
from evolane.testing import EVIL_TREE_SH, POLITE_TREE_SH

TREES = {"evil": (EVIL_TREE_SH, 38), "polite": (POLITE_TREE_SH, 11)}  # script, processes
TARGET, DEADLINE = 1.0, 10.0
RUNTIME = """import functools, sys, trio
from evolane.sandbox import SandboxSpec, open_sandbox
async def main(root, trees, script):
    async with open_sandbox(root) as host, trio.open_nursery() as nursery:
        print(host.lease, flush=True)
        for _ in range(trees):
            spec = SandboxSpec(argv=("sh", "-c", script))
            nursery.start_soon(functools.partial(host.run, spec, timeout=600))
trio.run(main, sys.argv[1], int(sys.argv[2]), sys.argv[3])
"""


def _live(procs: dict[int, bytes]) -> dict[int, bytes]:
    """Those of ``procs`` (pid -> start time) still running: not zombies, pid not reused."""
    return {
        p: t for p, t in procs.items() if (f := stat_fields(p)) and f[0] not in b"ZX" and f[19] == t
    }


def _listing(lease: str, want: int = 0) -> dict[int, bytes]:
    """The live processes of ``lease`` (pid -> start time), once there are ``want`` (30 s max)."""
    deadline = time.monotonic() + 30
    while (count := len(lease_holders(lease))) < want:
        if time.monotonic() > deadline:
            raise RuntimeError(f"trees did not start: {count} of {want} processes")
        time.sleep(0.1)
    time.sleep(0.5 if want else 0)  # let the double-fork escapers settle
    return _live({pid: f[19] for pid in lease_holders(lease) if (f := stat_fields(pid))})


def _watch(lease: str, procs: dict[int, bytes], t0: float, path: Path | None) -> list[float]:
    """Seconds from ``t0`` until no process of ``lease`` lives, and until ``path`` is removed."""
    gone = removed = math.inf
    while time.monotonic() - t0 < DEADLINE and (math.isinf(gone) or math.isinf(removed)):
        if math.isinf(gone) and not (procs := _live(procs)):
            at = time.monotonic() - t0
            procs = _listing(lease)  # anything new since the list was made?
            gone = math.inf if procs else at
        if math.isinf(removed) and (path is None or not path.exists()):
            removed = time.monotonic() - t0
        time.sleep(0.002)
    return [gone, removed]


def _kill_lease(lease: str) -> None:
    """SIGKILL every live process of ``lease`` (only ever ones this benchmark started)."""
    for _ in range(5):  # again: one may have forked meanwhile
        for pid in lease_holders(lease):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def lifeline_round(root: Path, trees: int, script: str, want: int) -> list[float]:
    """Runtime SIGKILL -> lease empty, and -> workspace removed (seconds)."""
    argv = [sys.executable, "-c", RUNTIME, str(root), str(trees), script]
    runtime = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    lease, lifeline = "", list[psutil.Process]()
    try:
        assert runtime.stdout is not None
        if not (lease := runtime.stdout.readline().strip()).startswith("rt-"):
            raise RuntimeError(f"the runtime did not start: {lease!r}")
        procs = _listing(lease, want)
        for child in psutil.Process(runtime.pid).children():
            with contextlib.suppress(psutil.Error):  # the trees' zombies
                lifeline += [child] if "_lifeline" in " ".join(child.cmdline()) else []
        runtime.send_signal(signal.SIGKILL)
        return _watch(lease, procs, time.monotonic(), root / lease)
    finally:
        runtime.kill()
        runtime.wait(timeout=5)
        for process in psutil.wait_procs(lifeline, timeout=5)[1]:  # it exits once it has swept
            process.kill()
        if lease.startswith("rt-"):  # what a failed lifeline left; not sweep_stale_leases:
            _kill_lease(lease)  # that makes its caller the subreaper of every later orphan
            shutil.rmtree(root / lease, ignore_errors=True)


def killpg_round(trees: int, script: str, want: int) -> float:
    """The same trees started here; killpg of all their groups -> lease empty (seconds)."""
    lease = f"bench-ref-{secrets.token_hex(4)}"
    env = {"PATH": os.defpath, LEASE_VARIABLE: lease}
    out, argv = subprocess.DEVNULL, ["sh", "-c", script]
    shells = [subprocess.Popen(argv, env=env, stdout=out, stderr=out, start_new_session=True)
              for _ in range(trees)]  # fmt: skip
    try:
        procs = _listing(lease, want)
        groups, t0 = {int(f[2]) for pid in procs if (f := stat_fields(pid))}, time.monotonic()
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        return _watch(lease, procs, t0, None)[0]
    finally:
        _kill_lease(lease)
        for shell in shells:
            shell.kill()
            shell.wait(timeout=5)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--tree", choices=sorted(TREES), default="evil")
    args = parser.parse_args()
    script, size = TREES[args.tree]
    want = int(0.95 * size * args.trees)  # the loops' short `sleep 1`s come and go
    runs: list[list[float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            lifeline = lifeline_round(Path(tmp) / "sandbox", args.trees, script, want)
            runs.append([*lifeline, killpg_round(args.trees, script, want)])
            g, r, k = (x * 1000 for x in runs[-1])
            print(f"round {i + 1}: lease empty {g:.0f} ms, workspace removed {r:.0f} ms; "
                  f"reference killpg {k:.0f} ms")  # fmt: skip
    (gone, top), (removed, rtop), (ref, _) = (
        (statistics.median(c) * 1000, max(c) * 1000) for c in zip(*runs, strict=True)
    )
    print(f"{args.trees} {args.tree} trees (>= {want} processes): lease empty median {gone:.0f} "
          f"ms, max {top:.0f} ms (target: all gone within {TARGET:.0f} s of the runtime's "
          f"SIGKILL); workspace removed median {removed:.0f} ms, max {rtop:.0f} ms; reference "
          f"killpg median {ref:.0f} ms: {gone / ref:.1f}x")  # fmt: skip
    return 0 if top <= TARGET * 1000 and rtop < math.inf else 1


if __name__ == "__main__":
    sys.exit(main())
