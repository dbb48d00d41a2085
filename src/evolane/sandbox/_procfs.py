"""One reader of ``/proc/<pid>/status``: the fields the sandbox asks of a process it did not
start (its state, real uid and thread count), read bounded, for the scans that find a dead
holder's processes, a tree's zombies and a user's tasks; and `read_proc_file`, the plain
bounded read those scans make of each file."""

from __future__ import annotations

import os
from typing import NamedTuple

STATUS_BYTES = 4096
"""Bytes of a status file read at most: State, Uid and Threads come within its first 1 KiB."""


_READ_BYTES = 1 << 16  # one read's buffer (a larger one is allocated whole for each read)


def read_proc_file(path: str, limit: int) -> bytes:
    """At most ``limit`` bytes of a /proc file, in plain ``open``/``read``/``close`` calls:
    a scan reads one per process or thread, and Python's ``open`` adds an ``fstat``, an
    ``ioctl`` and ``lseek`` calls to each (issue 22). Raises `OSError`."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        left = limit
        while left > 0 and (chunk := os.read(fd, min(left, _READ_BYTES))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class ProcStatus(NamedTuple):
    """What `proc_status` reads of one process."""

    state: str
    """The state's letter: ``R``, ``S``, ``D``, ``Z`` (a zombie), ``X`` (dead)..."""
    uid: int
    """Its real uid."""
    threads: int


def proc_status(pid: int | str) -> ProcStatus | None:
    """``pid``'s state, real uid and threads (None: gone, or its status unreadable)."""
    try:
        text = read_proc_file(f"/proc/{pid}/status", STATUS_BYTES)
        state = text.split(b"\nState:", 1)[1].split(None, 1)[0].decode()
        uid = int(text.split(b"\nUid:", 1)[1].split(None, 1)[0])
        threads = int(text.split(b"\nThreads:", 1)[1].split(None, 1)[0])
    except (OSError, ValueError, IndexError):
        return None
    return ProcStatus(state, uid, threads)


def live_uid(pid: int | str) -> int | None:
    """The real uid of ``pid`` while it lives (None: gone, a zombie, or dead)."""
    found = proc_status(pid)
    return None if found is None or found.state in ("Z", "X") else found.uid
