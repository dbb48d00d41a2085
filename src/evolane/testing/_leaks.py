"""Leak detection: find processes a test (or a run) left behind."""

from __future__ import annotations

import time

import psutil

from evolane.sandbox import LEASE_VARIABLE, lease_holders

__all__ = ["LEASE_VARIABLE", "descendants", "kill_processes", "leaked_processes", "lease_holders"]


def descendants() -> set[int]:
    """PIDs of every living descendant of this process (zombies excluded)."""
    found: set[int] = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                found.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return found


def leaked_processes(before: set[int], lease: str | None, settle: float = 1.0) -> list[str]:
    """Describe processes alive now that were not in ``before``, after up to ``settle`` seconds.

    Returns one line per leaked process (pid and command line); empty when nothing leaked.
    """
    deadline = time.monotonic() + settle
    while True:
        leaked = descendants() - before
        if lease:
            leaked |= lease_holders(lease) - before
        if not leaked or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    lines = []
    for pid in sorted(leaked):
        try:
            command = " ".join(psutil.Process(pid).cmdline())
        except psutil.NoSuchProcess:
            continue
        if _INTERPRETER_HELPER in command:
            continue  # Python's own per-interpreter helper, started lazily; it exits with us
        lines.append(f"pid {pid}: {command[:200]}")
    return lines


_INTERPRETER_HELPER = "from multiprocessing.resource_tracker import main"
"""The command line of multiprocessing's resource tracker (a library may start it in the test's
own process; it is not a process the code under test left behind)."""


def kill_processes(lines: list[str]) -> None:
    """SIGKILL the processes named by `leaked_processes` lines (only those, by PID)."""
    for line in lines:
        pid = int(line.split()[1].rstrip(":"))
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            continue
