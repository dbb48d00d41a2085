"""A command that hit a resource limit: which limits, and the failure that says so.

A judge, an optimizer, the validator gate or the apply check that hits a limit ran out of
the room the run gave it: an infrastructure outcome, never a score. A replay that hits one
failed because of the tree it ran (`evolane.lanes._replay`): a candidate's case scores 0,
so no candidate drops the cases it fails from the comparison by exhausting a limit. The
reason names the limit, its value and the flag that raises it, e.g. ``memory limit 4 GiB
hit (--max-memory)``.

The sandbox reports what it saw (`ProcessOutcome.limits_hit`: a SIGXFSZ or SIGXCPU death,
the memory cgroup's OOM kill, the pids cgroup's refused forks). Two limits end a program
without a signal: a write past RLIMIT_FSIZE fails with EFBIG when SIGXFSZ is ignored (Python
ignores it), and an open past RLIMIT_NOFILE fails with EMFILE. For those a failed command's
stderr naming the error (``File too large``, ``Too many open files``) is the evidence.
"""

from __future__ import annotations

import errno
import os

from evolane.sandbox import Limits, ProcessOutcome

LIMIT_FLAGS = {
    "processes": "--max-procs",
    "memory": "--max-memory",
    "file_size": "--max-file-size",
    "open_files": "--max-open-files",
}
"""The flag that raises each limit the sandbox reports (`ProcessOutcome.limits_hit` names)."""
HOST_LIMITS = {
    "host_processes": "the host refused a process: a pid limit enclosing evolane (a cgroup's "
    "pids.max), not --max-procs",
}
"""Limits the sandbox reports that are the host's, not the run's (no flag raises them)."""
_STDERR_EVIDENCE = {
    "file_size": os.strerror(errno.EFBIG),
    "open_files": os.strerror(errno.EMFILE),
}


def format_size(value: int) -> str:
    """``value`` bytes for people: ``4 GiB``, ``512 MiB``, ``1.5 GiB``, ``100 bytes``."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value} bytes"


def _value(name: str, limits: Limits) -> str:
    shown = {
        "processes": limits.processes,
        "memory": format_size(limits.memory_bytes) if limits.memory_bytes else None,
        "file_size": format_size(limits.file_size_bytes) if limits.file_size_bytes else None,
        "open_files": limits.open_files,
        "cpu": f"{limits.cpu_seconds} s" if limits.cpu_seconds else None,
    }.get(name)
    return f" {shown}" if shown is not None else ""


def limits_hit(outcome: ProcessOutcome, limits: Limits) -> tuple[str, ...]:
    """The limits a finished command hit: what the sandbox saw, plus EFBIG / EMFILE named
    on the stderr of a command that failed while that limit was set. Empty for a clean exit
    (a command that recovered from a refused fork or open is not a failure)."""
    if outcome.ok or outcome.status in ("spawn_failed", "cancelled"):
        return ()
    hit = list(outcome.limits_hit)
    text = outcome.stderr.text()
    for name, evidence in _STDERR_EVIDENCE.items():
        set_ = limits.file_size_bytes if name == "file_size" else limits.open_files
        if name not in hit and set_ is not None and evidence in text:
            hit.append(name)
    return tuple(hit)


def limit_reason(hit: tuple[str, ...], limits: Limits) -> str:
    """``memory limit 4 GiB hit (--max-memory)``, one clause per limit in ``hit``."""
    clauses = []
    for name in hit:
        if name in HOST_LIMITS:
            clauses.append(HOST_LIMITS[name])
            continue
        flag = LIMIT_FLAGS.get(name)
        label = name.replace("_", " ")
        clause = f"{label} limit{_value(name, limits)} hit"
        if name == "processes" and limits.processes_asked is not None:
            flag = (  # found by review: "(--max-procs)" alone, where 512 was asked
                f"{flag} {limits.processes_asked} lowered to each command tree's share of the "
                "host's pid limit: fewer lanes or a higher pids.max raise it"
            )
        clauses.append(f"{clause} ({flag})" if flag else clause)
    return "; ".join(clauses)


def note_limits(outcome: ProcessOutcome, limits: Limits) -> ProcessOutcome:
    """``outcome`` as a limit hit when it hit one (`limits_hit`): status ``limit_exceeded``,
    the limits in ``limits_hit`` and the reason (`limit_reason`) as its ``error``; else
    ``outcome`` itself. Lanes classify such an outcome as an infrastructure failure."""
    hit = limits_hit(outcome, limits)
    if not hit:
        return outcome
    return outcome.model_copy(
        update={"status": "limit_exceeded", "limits_hit": hit, "error": limit_reason(hit, limits)}
    )
