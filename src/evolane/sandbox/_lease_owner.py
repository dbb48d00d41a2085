"""Whose a lease is, and whether its owner is alive: what a runtime sweeping a shared
sandbox folder may take for dead (a lease it sweeps loses its folder and its units).

The owner holds an exclusive lock on its lease's `LOCK_FILE` for its whole life; the kernel
drops it when the owner dies, however it dies. A lock held is a live owner and a lock free a
dead one, whichever host (a network folder whose locks work) or pid namespace (a container
sharing the store) it ran in: a pid names nothing there. Found by review: a runtime taking
the other's pid for its own swept a live run, its units failed; checked by pid and namespace
alone, a container restarted left its dead runs' leases to litter the store for ever. A
lease without a lock file (an older evolane's, a store whose locks cannot be taken) is
judged by its owner's pid, in the same host and pid namespace only."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import stat
import time
from pathlib import Path

import psutil

from evolane.sandbox._lifeline import (
    LOCK_FILE,
    OWNER_FILE,
    cgroup_dirs,
    read_cgroup_file,
    read_pids,
)
from evolane.store import StoreError, read_regular_file, write_json_atomic

_OWNER_MAX_BYTES = 4096  # a pid and a time; a command could have replaced the file
CGROUP_NAME = re.compile(r"evolane-rt-(\d+)(n\d+)?-[0-9a-f]+")
"""A runtime's cgroup: its pid, its pid namespace's tag (none: an older evolane's)."""


def _process_identity(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _read_link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def process_space() -> dict[str, str | None]:
    """Where this process's pids mean something: the host's name, its boot and the pid
    namespace (an owner's pid is looked up only in the same space)."""
    return {
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "pid_ns": _read_link("/proc/self/ns/pid"),
    }


def namespace_tag() -> str:
    """``n<inode>`` of this process's pid namespace (empty when unreadable): part of the
    lease's name, so a cgroup is swept only by a runtime whose pids mean the same."""
    try:
        return f"n{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def claim(lease_dir: Path) -> int | None:
    """Make ``lease_dir`` this process's: lock its `LOCK_FILE` (the descriptor, to keep open
    until the lease is gone; None where the folder's file system takes no lock) and write
    its `OWNER_FILE`. The lock file appears locked or not at all (locked under a temporary
    name, then renamed): one seen unlocked is never a live owner's."""
    temporary = lease_dir / f".{LOCK_FILE}.new"
    fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    held: int | None = fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(temporary, lease_dir / LOCK_FILE)
    except OSError:  # ENOLCK (a network folder without locks): judged by pid, as before
        os.close(fd)
        held = None
        with contextlib.suppress(OSError):
            temporary.unlink()
    owner = {"pid": os.getpid(), "create_time": _process_identity(os.getpid())}
    write_json_atomic(lease_dir / OWNER_FILE, {**owner, **process_space()})
    return held


def _lock_held(lease_dir: Path) -> bool | None:
    """Whether the lease's owner holds its lock (True), nobody does (False), or this cannot
    tell (None: no lock file, not a regular file, a file system without locks)."""
    try:
        fd = os.open(
            lease_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        )
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a probe: dropped with the fd
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)
    return False


def _pids_comparable(owner: dict[str, object], here: dict[str, str | None]) -> bool | None:
    """Whether the owner's pid can be looked up here (True), its host rebooted since, so it
    is dead (None), or its pids belong to another host or pid namespace (False). An owner
    file without these fields (an older evolane's) is taken as of this space."""
    boot, namespace = owner.get("boot_id"), owner.get("pid_ns")
    if boot is not None and boot != here["boot_id"]:
        same_host = owner.get("host") is not None and owner.get("host") == here["host"]
        return None if same_host and here["boot_id"] is not None else False
    return namespace is None or namespace == here["pid_ns"]


def owner_is_dead(lease_dir: Path) -> bool:
    """Whether the lease's owner is provably dead: its lock is free; without a lock to
    read, its pid names no process of its identity in this host and pid namespace (or its
    host has rebooted since). Anything unreadable is left alone."""
    held = _lock_held(lease_dir)
    if held is not None:
        return not held
    try:
        owner = json.loads(read_regular_file(lease_dir / OWNER_FILE, _OWNER_MAX_BYTES))
        comparable = _pids_comparable(owner, process_space())
        if comparable is None:
            return True
        return comparable and _process_identity(int(owner["pid"])) != owner["create_time"]
    except FileNotFoundError:
        try:  # no owner file: a host being created right now, or one that died doing so
            return time.time() - lease_dir.stat().st_mtime > 60
        except OSError:
            return False
    except (OSError, ValueError, KeyError, TypeError, AttributeError, StoreError):
        return False


def _pid_namespace(pid: int | str) -> int | None:
    """The pid namespace of process ``pid`` ("self": this one), None when unreadable."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def holds_foreign_processes(path: Path) -> bool:
    """Whether the cgroup tree at ``path`` holds a process of another pid namespace: one
    this namespace sees in another, or one it cannot see at all (the tree is populated, or
    counts more processes, than the members it lists): not this namespace's to judge by the
    pid in its name."""
    own, seen = _pid_namespace("self"), set()
    for directory in cgroup_dirs(path):
        seen |= read_pids(directory)
    if any(_pid_namespace(pid) not in (own, None) for pid in seen):
        return True
    if "populated 1" in read_cgroup_file(path / "cgroup.events") and not seen:
        return True
    count = read_cgroup_file(path / "pids.current").strip()
    return count.isdigit() and int(count) > len(seen)
