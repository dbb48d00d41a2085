"""One run per target at a time: an exclusive lock on the target for the whole run.

Two runs publishing to one target would publish over each other, and one run's snapshot
could read the other's half-done publish. So every run but a dry run holds an exclusive
`fcntl.flock` on a lock file for its target, from before it reads the target or writes
anything for the run until it returns. A second run on the same target (the same resolved
path, whichever store it uses) is refused with one line naming the holder's run id and pid.

Where the lock file lives: ``.<name>.evolane-lock`` in the folder that holds the target,
beside it. Not inside the target (only a publish changes the target); not in the store (two
stores would hold two locks on one target); beside the target, every store, user and
process that can publish there finds the same file. Where that folder is not writable (a
run that only proposes may still use a target there), the lock goes to a per-user runtime
folder (``$XDG_RUNTIME_DIR``, else the temp folder), keyed by a hash of the resolved path:
that excludes only the same user's runs, as such a target can be published by no one else
through evolane anyway.

A holder that dies releases its flock with its last descriptor; the file may stay behind
(a stale file blocks nothing). A clean release removes it while still holding the lock, and
a taker checks after locking that the path still names the file it locked, so a file
removed under it is never taken for the lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import orjson

from evolane.inputs import InputError
from evolane.store import close_fd, close_in_forks, same_file

LOCK_SUFFIX: Final = ".evolane-lock"
"""The lock file's name is ``.<target name>`` followed by this."""
_TAKE_ATTEMPTS: Final = 50
"""How often a lock file removed between open and flock is opened again before giving up."""
_HOLDER_BYTES: Final = 4096
_UNWRITABLE: Final = (errno.EACCES, errno.EPERM, errno.EROFS)


class TargetLocked(InputError):
    """The target is locked by another run (or a resume of the run is going on elsewhere):
    nothing is wrong with the request, and it may start once that run ends."""


@dataclass(slots=True)
class TargetLock:
    """A held lock on a target; `release` (or process death) frees it."""

    target: Path
    """The target's resolved path."""
    path: Path
    """The lock file."""
    fd: int | None

    def name_run(self, run_id: str) -> None:
        """Record the run holding the lock (and this pid) for whoever is refused by it."""
        if self.fd is None:
            return
        data = orjson.dumps({"run_id": run_id, "pid": os.getpid(), "target": str(self.target)})
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        """Remove the lock file (while still holding it) and let go; idempotent."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            with contextlib.suppress(OSError):
                if same_file(self.path, fd):
                    os.unlink(self.path)
        finally:
            close_fd(fd)


def lock_path(target: Path) -> Path:
    """The lock file of ``target`` beside it (see the module docstring)."""
    resolved = Path(target).resolve()
    return resolved.parent / f".{resolved.name}{LOCK_SUFFIX}"


def fallback_lock_path(target: Path) -> Path:
    """The per-user lock file of ``target``, for a target whose folder is not writable."""
    resolved = Path(target).resolve()
    digest = hashlib.sha256(os.fsencode(resolved)).hexdigest()[:32]
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"evolane-{os.getuid()}" / "locks" / f"{digest}{LOCK_SUFFIX}"


def lock_target(target: Path, run_id: str | None = None) -> TargetLock:
    """Take the exclusive lock on ``target`` without waiting, naming ``run_id`` if known.

    Raises `TargetLocked` (one line: the holder's run id and pid) while another run holds it.
    A target whose folder does not exist gets a lock that holds nothing (the run refuses
    the missing target itself, with its own message).
    """
    resolved = Path(target).resolve()
    if not resolved.parent.is_dir():
        return TargetLock(resolved, lock_path(resolved), None)
    try:
        lock = _take(resolved, lock_path(resolved), run_id)
    except OSError as exc:
        if exc.errno not in _UNWRITABLE:
            raise
        fallback = fallback_lock_path(resolved)
        _own_folder(fallback.parent)
        lock = _take(resolved, fallback, run_id)
    if run_id is not None:
        lock.name_run(run_id)
    return lock


def _own_folder(folder: Path) -> None:
    """Make ``folder`` (``evolane-<uid>/locks``) private to this user, or `InputError` when
    it, or ``evolane-<uid>`` above it, is a folder of another user's, writable by others, or
    no folder at all: in a shared temp folder anyone may make them first (found by hostile
    review: a command's unit uid could make ``/tmp/evolane-0`` and then remove or hold
    every root run's lock there, letting two runs publish to one target, or none)."""
    folder.parent.parent.mkdir(parents=True, exist_ok=True)  # the temp or runtime folder
    for step in (folder.parent, folder):
        with contextlib.suppress(FileExistsError):
            os.mkdir(step, 0o700)
        info = os.lstat(step)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise InputError(
                f"{step}: the per-user lock folder is not this user's own private folder "
                "(another user made it, or others may write it): remove it, then start again"
            )


def _take(target: Path, path: Path, run_id: str | None = None) -> TargetLock:
    for _ in range(_TAKE_ATTEMPTS):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            if run_id is not None and holder.startswith(f"run {run_id} "):  # a resume of it
                pid = holder.removeprefix(f"run {run_id}")
                raise TargetLocked(
                    f"--resume {run_id}: the run is going on in another process{pid}; "
                    f"follow it with `evolane watch {run_id}`"
                ) from None
            raise TargetLocked(
                f"target {target} is locked by {holder}; wait for it to end (or stop it), "
                "then start again"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        if same_file(path, fd):  # held until `release`, never by a forked child
            return TargetLock(target, path, close_in_forks(fd))
        os.close(fd)  # its holder removed it between our open and flock: open it again
    raise InputError(f"target {target}: could not take its lock {path} (it keeps being replaced)")


def _holder(fd: int) -> str:
    """Who holds the lock, as its file says (a run still starting may not have said yet)."""
    try:
        record = orjson.loads(os.pread(fd, _HOLDER_BYTES, 0))
        run_id, pid = str(record["run_id"]), int(record["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return "another run (still starting)"
    return f"run {run_id} (pid {pid})"


def holder_pid(target: Path, run_id: str) -> int | None:
    """The pid of the process running ``run_id`` on ``target``, as the target's lock file
    says (None when no lock file names that run: it ended, or it is still starting)."""
    for path in (lock_path(target), fallback_lock_path(target)):
        try:
            with path.open("rb") as source:
                record = orjson.loads(source.read(_HOLDER_BYTES))
            if str(record["run_id"]) == run_id:
                return int(record["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None
