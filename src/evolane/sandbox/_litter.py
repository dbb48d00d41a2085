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
from collections.abc import Collection
from functools import cache

from evolane.sandbox._procfs import live_uid
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


def _uid_set(uid: int | Collection[int]) -> frozenset[int]:
    return frozenset((uid,)) if isinstance(uid, int) else frozenset(uid)


def sysv_objects_of(uid: int | Collection[int], table: str, text: str) -> list[int]:
    """Ids of the objects in a /proc/sysvipc ``table`` (its ``text``) that ``uid`` (or one
    of several) owns or created."""
    named = {str(one) for one in _uid_set(uid)}
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
        if len(fields) > max(at_id, at_uid, at_cuid) and (
            fields[at_uid] in named or fields[at_cuid] in named
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


def remove_litter(uid: int | Collection[int], small: bool = False) -> bool:
    """Remove the IPC objects ``uid`` (or any of several, in one pass) owns (see the module
    docstring); True when the sweep is whole. ``small`` (on the event loop): False, with
    what is left still there, at a table over `SMALL_TABLE_BYTES`, a folder over
    `SMALL_OBJECTS` entries or a folder the uid made (a unit once left a million files
    in /dev/shm). Errors are swallowed: what cannot go stays (litter, not damage)."""
    uids = _uid_set(uid)
    cap = SMALL_TABLE_BYTES if small else MAX_TABLE_BYTES
    for table in SYSV_TABLES:
        try:
            with open(f"/proc/sysvipc/{table}", "rb") as handle:
                data = handle.read(cap + 1)
        except OSError:
            continue
        if small and len(data) > cap:
            return False
        for ident in sysv_objects_of(uids, table, data[:cap].decode("ascii", "replace")):
            _remove_sysv(table, ident)
    limit = SMALL_OBJECTS if small else MAX_OBJECTS
    return all(_sweep_folder(folder, uids, limit, small) for folder in POSIX_FOLDERS)


def _sweep_folder(folder: str, uids: frozenset[int], limit: int, small: bool) -> bool:
    """Remove the entries of ``folder`` that one of ``uids`` owns; False when ``small`` and
    it is not (too many entries, or a folder of their own to walk)."""
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for count, entry in enumerate(entries):
            if count >= limit:
                return not small
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid not in uids:
                    continue
                if small and entry.is_dir(follow_symlinks=False):
                    return False
                remove_tree(entry.path)  # a file, or a folder and all in it
    return True


KILL_ROUNDS = 40
"""Scans of /proc for a dead holder's processes, at most, each after the kills of the last
(a tree forking as it is killed): about 0.2 s of waiting in all."""


def processes_of(uid: int | Collection[int]) -> list[int]:
    """Live processes whose real uid is ``uid`` (or one of several), by a scan of /proc."""
    uids = _uid_set(uid)
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    return [int(name) for name in names if name.isdigit() and live_uid(name) in uids]


def end_uid(uid: int, small: bool = False) -> bool:
    """End what a unit uid's holder left when it died holding the uid (a runtime killed,
    its lifeline not yet done or killed too): kill every process of the uid, then
    `remove_litter`; True when both are whole, so the uid may serve another unit. Found
    by review: a SIGKILLed runtime's claims were free at once, before its lifeline killed
    its trees, and what they made outside their folders was never removed, so the next
    unit given the uid met a live tree it could signal and the last one's IPC objects.
    ``small`` (on the event loop): one scan of /proc and no wait, False once it found a
    process (killed, not waited for), as `remove_litter` is False past its small bounds."""
    return uid in end_uids((uid,), small)


def end_uids(uids: Collection[int], small: bool = False) -> set[int]:
    """`end_uid` of several uids at once, each scan of /proc and each IPC table and
    folder looked at once for all of them (found by review: a sweep of 64 stale claims
    scanned /proc 64 times); the uids ended. ``small``: as `end_uid`'s."""
    pending = _uid_set(uids)
    alive = pending
    for _ in range(1 if small else KILL_ROUNDS):
        alive = frozenset(kill_processes_of(alive).values())
        if not alive or small:
            break
        time.sleep(0.005)
    dead = pending - alive  # a uid killed in the last round is not known dead
    return set(dead) if dead and remove_litter(dead, small) else set()


def kill_processes_of(uid: int | Collection[int]) -> dict[int, int]:
    """SIGKILL every live process of ``uid`` (or of one of several) found by one scan of
    /proc; their pids, each with its uid."""
    uids = _uid_set(uid)
    killed = {}
    for pid in processes_of(uids):
        with contextlib.suppress(OSError):
            fd = os.pidfd_open(pid)
            try:  # held by its pidfd: the uid read again is this process's, not a reuse
                if (owner := live_uid(pid)) in uids:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    killed[pid] = owner
            finally:
                os.close(fd)
    return killed


def kill_claim_openers(folder: str, uids: Collection[int]) -> int:
    """SIGKILL every live process of ``uids`` (the unit uid span) holding a file of the
    claims ``folder`` open, and wait (about 0.2 s at most) until they have let go; how
    many. Units keep CAP_DAC_READ_SEARCH, so they may open the claim files (never given
    one: evolane's are close-on-exec and closed in forks), and one that locks its uid's
    once the runtime holding it died makes the uid look held by a live runtime, never to
    be ended (found by review: an escapee of a host with no cgroup lived on so). A
    runtime's claims are root's: no process of ``uids`` holds one of a live runtime's."""
    span = _uid_set(uids)
    prefix = folder.rstrip("/") + "/"
    killed = [pid for pid in processes_of(span) if _holds_under(pid, prefix)]
    for pid in killed:
        with contextlib.suppress(OSError):
            fd = os.pidfd_open(pid)
            try:  # held by its pidfd: the uid read again is this process's, not a reuse
                if live_uid(pid) in span:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            finally:
                os.close(fd)
    for _ in range(KILL_ROUNDS if killed else 0):  # its files are closed as it exits
        if all(live_uid(pid) not in span for pid in killed):
            break
        time.sleep(0.005)
    return len(killed)


def _holds_under(pid: int, prefix: str) -> bool:
    """Whether ``pid`` holds a file whose path starts with ``prefix`` open."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for name in names:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{name}").startswith(prefix):
                return True
    return False
