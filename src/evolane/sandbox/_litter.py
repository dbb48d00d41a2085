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
from functools import cache

from evolane.store import remove_tree

SYSV_TABLES = {"shm": "shmid", "msg": "msqid", "sem": "semid"}
"""/proc/sysvipc tables and the column naming each object's id."""
POSIX_FOLDERS = ("/dev/shm", "/dev/mqueue")
MAX_OBJECTS = 4096
"""Entries of one table or folder looked at, at most (a bounded walk)."""
MAX_TABLE_BYTES = 4 << 20
_IPC_RMID = 0


@cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def sysv_objects_of(uid: int, table: str, text: str) -> list[int]:
    """Ids of the objects in a /proc/sysvipc ``table`` (its ``text``) that ``uid`` owns or
    created."""
    lines = text.splitlines()[: MAX_OBJECTS + 1]
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


def remove_litter(uid: int) -> int:
    """Remove the IPC objects ``uid`` owns (see the module docstring); how many went.
    Errors are swallowed: what cannot go stays (litter, not damage)."""
    removed = 0
    for table in SYSV_TABLES:
        try:
            with open(f"/proc/sysvipc/{table}", "rb") as handle:
                text = handle.read(MAX_TABLE_BYTES).decode("ascii", "replace")
        except OSError:
            continue
        for ident in sysv_objects_of(uid, table, text):
            _remove_sysv(table, ident)
            removed += 1
    for folder in POSIX_FOLDERS:
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_OBJECTS:
                    break
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid == uid:
                        remove_tree(entry.path)  # a file, or a folder and all in it
                        removed += 1
    return removed
