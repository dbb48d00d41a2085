"""Telling a damaged or full store apart from other errors, and saying so in one line.

A run that cannot write its journal or blobs (a full disk, a read-only or failing device),
or that reads back a blob or journal line that is not what was written, cannot go on: it
ends ``failed`` with the line `describe_failure` gives, never ``complete``.
"""

from __future__ import annotations

import errno
import os
import resource

from evolane.store._blobs import CorruptBlobError, MissingBlobError, StoreError
from evolane.store._journal import JournalCorruptError, JournalWriteError

WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG})
"""The errno values that mean the store's device refuses writes (full, quota, read-only,
failing, file too large), as opposed to a command's own file errors."""

HOST_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
"""The errno values that mean evolane's own process ran out of open files (its ``ulimit -n``,
or the system's file table): never a command's doing to charge to it, and no unit can go on
(found by review: under ``ulimit -n 32`` a candidate's replay was scored 0 for the store's
EMFILE, and the run ended failed saying ``not run: shared_failure``)."""
FATAL_ERRNOS = WRITE_ERRNOS | HOST_ERRNOS
"""The errno values that end a run ``failed``, wherever evolane's own process meets them."""
_NO_THREAD = "can't start new thread"
"""What ``threading.Thread.start`` raises (a ``RuntimeError``) when the host refuses evolane
a thread: a pid limit enclosing it (a cgroup's ``pids.max``), ``ulimit -u`` or ``ulimit -v``."""

_MAX_WALK = 1000  # exceptions looked at: groups and causes are walked, never recursed


class StorageFailure(StoreError):
    """The store could not be written, or read back whole: the run ended ``failed``; its
    message is the one line to show (it names the path, and ``evolane fsck`` for damage)."""

    resumable = False
    """Whether nothing the run journaled is lost (a disk short of room, not damage)."""


_DAMAGE = (
    StorageFailure,
    CorruptBlobError,
    MissingBlobError,
    JournalCorruptError,
    JournalWriteError,
)


def host_refused(error: BaseException) -> bool:
    """Whether ``error`` is the host refusing evolane's own process a thread or memory (found
    by review: under a full ``pids.max`` a trio worker thread's refusal ended the run as
    ``internal error: RuntimeError: can't start new thread``, and under ``ulimit -v`` as
    ``internal error: MemoryError``)."""
    if isinstance(error, MemoryError):
        return True
    return type(error) is RuntimeError and str(error) == _NO_THREAD


def storage_failure(error: BaseException) -> BaseException | None:
    """The write error, store damage, exhausted open files, or a thread or memory the host
    refused inside ``error`` (its exception groups and ``__cause__`` chain, walked iteratively), or
    None when there is none."""
    pending, seen = [error], 0
    while pending and seen < _MAX_WALK:
        current = pending.pop()
        seen += 1
        if isinstance(current, _DAMAGE):
            return current
        if isinstance(current, OSError) and current.errno in FATAL_ERRNOS:
            return current
        if host_refused(current):
            return current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(reversed(current.exceptions))
        if current.__cause__ is not None:
            pending.append(current.__cause__)
    return None


def store_refused(error: BaseException, root: os.PathLike[str] | str) -> bool:
    """Whether ``error`` is a write that the store at ``root`` refused (a `WRITE_ERRNOS`
    ``OSError`` naming a file in it), as opposed to one of a target outside it."""
    if not isinstance(error, OSError) or error.errno not in WRITE_ERRNOS or not error.filename:
        return False
    named, store = os.path.abspath(error.filename), os.path.abspath(root)
    return os.path.commonpath([named, store]) == store


def refused_write(failure: BaseException) -> bool:
    """Whether ``failure`` (what `storage_failure` found) is a write the store's device
    refused, the disk's floor crossed, open files, threads or memory run out, as opposed to damage:
    nothing the run journaled is lost, so once there is room (or files) it can go on from it."""
    if isinstance(failure, JournalWriteError) or getattr(failure, "resumable", False):
        return True
    if host_refused(failure):
        return True
    return isinstance(failure, OSError) and failure.errno in FATAL_ERRNOS


def _refusal_line(failure: BaseException) -> str:
    """The line for a thread or memory the host refused evolane: the limits that may have
    refused it (its address space named when ``ulimit -v`` sets one)."""
    space = resource.getrlimit(resource.RLIMIT_AS)[0]
    virtual = (
        f"its address-space limit (`ulimit -v`) of {space >> 20} MiB"
        if space != resource.RLIM_INFINITY
        else None
    )
    if isinstance(failure, MemoryError):
        limit = virtual or "the host's memory (a cgroup's memory limit, or the machine's)"
        return f"evolane ran out of memory (MemoryError): {limit} is reached: raise it"
    limits = ["a pid limit enclosing evolane (a cgroup's pids.max)", "its `ulimit -u`"]
    limits += [virtual] if virtual else []
    return (
        f"the host refused evolane a thread (can't start new thread): {', '.join(limits[:-1])} "
        f"or {limits[-1]} is reached: raise it"
    )


def describe_failure(failure: BaseException, store: os.PathLike[str] | str) -> str:
    """One plain line for a failure `storage_failure` found in the store at ``store``."""
    if isinstance(failure, StorageFailure | JournalWriteError):
        return str(failure)
    if host_refused(failure):
        return _refusal_line(failure)
    if isinstance(failure, OSError) and failure.errno in HOST_ERRNOS:
        named = f"cannot open {failure.filename}: " if failure.filename is not None else ""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return (
            f"{named}{failure.strerror or failure}: evolane's open-file limit (`ulimit -n`) "
            f"is {soft}: raise it"
        )
    if isinstance(failure, OSError) and not isinstance(failure, MissingBlobError):
        where = failure.filename if failure.filename is not None else store
        return f"cannot write {where}: {failure.strerror or failure}"
    return f"{failure}; run `evolane fsck --store {store}` to find and quarantine it"
