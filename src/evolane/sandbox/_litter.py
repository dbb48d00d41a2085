"""What a unit uid's command leaves outside its folders, removed when its unit ends.

Under ``process`` isolation a root evolane runs each command as a uid of its own, in the
host's IPC namespace: System V shared memory, message queues and semaphores, and POSIX
shared memory (``/dev/shm``) and message queues (``/dev/mqueue``) it made outlived its tree
and evolane, were open to later units when made mode 0666, and pinned memory outside its
memory cgroup (2.2 GiB past ``--max-memory 256M``: found by review). The uid is the unit's
alone while it lives, so whatever it owns there once its tree is dead is litter. Files it
left in the shared ``/tmp`` and ``/var/tmp`` are not swept (the README says so).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from functools import cache

from evolane.store import remove_tree

SYSV_TABLES = {"shm": "shmid", "msg": "msqid", "sem": "semid"}
"""/proc/sysvipc tables and the column naming each object's id."""
POSIX_FOLDERS = ("/dev/shm", "/dev/mqueue")
MAX_OBJECTS = 1_000_000
"""Entries of one table or folder looked at, at most (in the cleanup thread)."""
MAX_TABLE_BYTES = 256 << 20
SMALL_OBJECTS = 64
"""Entries of one folder, or table rows, a sweep on the event loop looks at: past them (or
at a folder the uid made) it stops and leaves the sweep to the cleanup thread."""
SMALL_TABLE_BYTES = 64 << 10
_IPC_RMID = 0


@cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def sysv_objects_of(uid: int, table: str, text: str) -> list[int]:
    """Ids of the objects in a /proc/sysvipc ``table`` (its ``text``) that ``uid`` owns or
    created."""
    lines = text.splitlines()
    if not lines:
        return []
    names = lines[0].split()
    try:
        at_id, at_uid, at_cuid = (names.index(n) for n in (SYSV_TABLES[table], "uid", "cuid"))
    except ValueError:  # a kernel with other columns: nothing is removed blindly
        return []
    found = []
    for line in lines[1:]:
        fields = line.split()
        if len(fields) > max(at_id, at_uid, at_cuid) and str(uid) in (
            fields[at_uid],
            fields[at_cuid],
        ):
            found.append(int(fields[at_id]))
    return found


def _remove_sysv(table: str, ident: int) -> None:
    libc = _libc()
    if table == "shm":
        libc.shmctl(ident, _IPC_RMID, None)
    elif table == "msg":
        libc.msgctl(ident, _IPC_RMID, None)
    else:
        libc.semctl(ident, 0, _IPC_RMID)


def remove_litter(uid: int, small: bool = False) -> bool:
    """Remove the IPC objects ``uid`` owns (see the module docstring); True when the sweep
    is whole. ``small`` (on the event loop): False, with what is left still there, at a
    table over `SMALL_TABLE_BYTES`, a folder over `SMALL_OBJECTS` entries or a folder the
    uid made (a unit once left a million files in /dev/shm). Errors are swallowed: what
    cannot go stays (litter, not damage)."""
    cap = SMALL_TABLE_BYTES if small else MAX_TABLE_BYTES
    for table in SYSV_TABLES:
        try:
            with open(f"/proc/sysvipc/{table}", "rb") as handle:
                data = handle.read(cap + 1)
        except OSError:
            continue
        if small and len(data) > cap:
            return False
        for ident in sysv_objects_of(uid, table, data[:cap].decode("ascii", "replace")):
            _remove_sysv(table, ident)
    limit = SMALL_OBJECTS if small else MAX_OBJECTS
    return all(_sweep_folder(folder, uid, limit, small) for folder in POSIX_FOLDERS)


def _sweep_folder(folder: str, uid: int, limit: int, small: bool) -> bool:
    """Remove the entries of ``folder`` that ``uid`` owns; False when ``small`` and it is
    not (too many entries, or a folder of its own to walk)."""
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for count, entry in enumerate(entries):
            if count >= limit:
                return not small
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if small and entry.is_dir(follow_symlinks=False):
                    return False
                remove_tree(entry.path)  # a file, or a folder and all in it
    return True


KILL_ROUNDS = 40
"""Scans of /proc for a dead holder's processes, at most, each after the kills of the last
(a tree forking as it is killed): about 0.2 s of waiting in all."""


def real_uid(pid: int) -> int | None:
    """The real uid of ``pid`` while it lives (None: gone, or a zombie)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            text = status.read(4096)
        state = text.split(b"\nState:", 1)[1].split()[0]
        return None if state in (b"Z", b"X") else int(text.split(b"\nUid:", 1)[1].split()[0])
    except (OSError, ValueError, IndexError):
        return None


def processes_of(uid: int) -> list[int]:
    """Live processes whose real uid is ``uid``, by a scan of /proc."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    return [int(name) for name in names if name.isdigit() and real_uid(int(name)) == uid]


def end_uid(uid: int, small: bool = False) -> bool:
    """End what a unit uid's holder left when it died holding the uid (a runtime killed,
    its lifeline not yet done or killed too): kill every process of the uid, then
    `remove_litter`; True when both are whole, so the uid may serve another unit. Found
    by review: a SIGKILLed runtime's claims were free at once, before its lifeline killed
    its trees, and what they made outside their folders was never removed, so the next
    unit given the uid met a live tree it could signal and the last one's IPC objects."""
    for _ in range(KILL_ROUNDS):
        if not kill_processes_of(uid):
            return remove_litter(uid, small)
        time.sleep(0.005)
    return False


def kill_processes_of(uid: int) -> set[int]:
    """SIGKILL every live process of ``uid`` found by one scan of /proc; their pids."""
    killed = set()
    for pid in processes_of(uid):
        with contextlib.suppress(OSError):
            fd = os.pidfd_open(pid)
            try:  # held by its pidfd: the uid read again is this process's, not a reuse
                if real_uid(pid) == uid:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    killed.add(pid)
            finally:
                os.close(fd)
    return killed
