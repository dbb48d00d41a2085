"""The durable side of background evolution: the record queue and the pending jobs.

Layout in the store (all writes atomic: temp file, fsync, rename, fsync folder)::

    evolve/queue/<seq>-<f|o>.json        one recorded trajectory per file (f: a failure)
    evolve/queue.lock                    held (flock) by the one service that owns the queue
    pending/<job_id>/trajectories.jsonl  a job's records, written first
    pending/<job_id>/job.json            the job (`PendingJob`): its commit point
    evolve/done/<job_id>/                a finished job, moved here (the last `KEEP_DONE`)

Journal before state: a job's records leave the queue only once its ``job.json`` is durable,
and a queue file named in a job's ``consumed`` list is removed at the next start
(`RecordQueue.open`), so a crash between the two neither loses nor doubles a record. A
``pending/<id>/`` folder without ``job.json`` is a job that was never committed: removed.

One service owns a store's queue at a time (`RecordQueue.open` holds ``evolve/queue.lock``
until `RecordQueue.close`): a second one, in this process or another, is refused rather than
let two writers number their records alike (one would replace the other's file) and take
each other's records.

These are plain blocking functions; the service calls them from a worker thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import Field, ValidationError

from evolane.campaign import CampaignConfig
from evolane.inputs import InputError, TrajectoryRecord, first_problem
from evolane.messages import Name, Record, ShortText
from evolane.store import (
    close_fd,
    close_in_forks,
    fsync_dir,
    read_json,
    remove_tree,
    write_bytes_atomic,
    write_json_atomic,
)

EvolveMode = Literal["shadow", "online"]
"""``shadow``: measure and report, never change the target; ``online``: publish a verified
candidate to the target (with its post-check; a failed check rolls back)."""
JobState = Literal["pending", "started", "done", "failed"]
MAX_QUEUE = 100_000
"""The largest queue bound a service accepts."""
MAX_RECORD_BYTES = 4 * 1024 * 1024
"""The largest recorded trajectory, serialised: a larger one is refused."""
MAX_PENDING_SCAN = 10_000
"""Pending job folders read at most (oldest first)."""
KEEP_DONE = 100
"""Finished jobs kept under ``evolve/done/`` (older ones are removed)."""
TRAJECTORIES = "trajectories.jsonl"
JOB_FILE = "job.json"


class QueueFull(Exception):
    """The record queue holds its bound: the record was refused (not kept)."""


class PendingJob(Record):
    """One background evolution job: the records it took, the campaign it runs, its run."""

    job_id: Name
    created: float
    mode: EvolveMode
    records: int = Field(ge=0)
    failures: int = Field(ge=0)
    consumed: tuple[Name, ...] = Field(default=(), max_length=MAX_QUEUE)
    """The queue files this job took (removed once the job is durable)."""
    config: CampaignConfig
    """The campaign the job runs: the service's settings, the job's ``trajectories.jsonl``
    as its input."""
    state: JobState = "pending"
    run_id: Name | None = None
    """The run this job started: a crash resumes it (``--resume``) rather than start over."""
    status: ShortText | None = None
    """The run's report status once it ended (``finished``, ``budget_limited``, ...)."""
    exit_code: int | None = None
    share: int | None = Field(default=None, ge=1)
    """Online: the index of the job's share of its target's error budget (`embed._budget`),
    fixed when the job first started, before its campaign saw any of its data."""
    level: float | None = Field(default=None, gt=0.0, lt=1.0)
    """Online: the job's error budget, alpha * s(share): its best is confirmed on the test
    split at this level (over its cycles), so a no-gain best is published with at most it."""
    spent: bool | None = None
    """Online, once ended: whether the job reached a confirmation and spent its share
    (False: it was given back for a later job)."""
    budget_left: float | None = None
    """Online: the target's error budget no job holds or spent, when this job last
    reserved or settled its share."""


@dataclass(frozen=True)
class StoreDirs:
    """The service's folders in a store."""

    root: Path

    @property
    def queue(self) -> Path:
        return self.root / "evolve" / "queue"

    @property
    def pending(self) -> Path:
        return self.root / "pending"

    @property
    def done(self) -> Path:
        return self.root / "evolve" / "done"

    @property
    def damaged(self) -> Path:
        return self.root / "evolve" / "damaged"

    @property
    def queue_lock(self) -> Path:
        return self.root / "evolve" / "queue.lock"


def record_bytes(record: Any) -> tuple[bytes, bool]:
    """A trajectory record (an `evolane.inputs.TrajectoryRecord` or its JSON object) as one
    checked JSON line, and whether its outcome is a failure. Raises `InputError` for a record
    that is not a valid trajectory record or is larger than `MAX_RECORD_BYTES`."""
    if not isinstance(record, TrajectoryRecord):
        try:
            record = TrajectoryRecord.model_validate(record)
        except ValidationError as error:
            problem = first_problem(error)
            raise InputError(f"record: not a trajectory record ({problem})") from None
    try:
        data = orjson.dumps(record.model_dump(mode="json", exclude_none=True))
    except orjson.JSONEncodeError as error:  # a lone surrogate, an integer over 64 bits
        raise InputError(f"record: cannot be written as JSON ({error})") from None
    if len(data) > MAX_RECORD_BYTES:
        raise InputError(f"record: {len(data)} bytes, over the {MAX_RECORD_BYTES} bound")
    failed = record.outcome is not None and record.outcome.status == "failure"
    return data + b"\n", failed


class RecordQueue:
    """The bounded durable queue of recorded trajectories (blocking; one owner at a time)."""

    def __init__(self, dirs: StoreDirs, bound: int) -> None:
        self.dirs, self.bound = dirs, bound
        self.names: list[str] = []  # queued file names, oldest first
        self._names_lock = threading.Lock()  # `append` and `take` change them from threads
        self._seq = 0
        self._lock_fd: int | None = None
        self.damaged: list[str] = []  # damaged jobs set aside when it opened (`load_jobs`)

    @classmethod
    def open(cls, dirs: StoreDirs, bound: int) -> RecordQueue:
        """Take the queue's lock, create the folders, finish what a crash left half done,
        and read the queue. Raises `InputError` when another service (in this process or
        another) has the queue open; `close` releases it."""
        queue = cls(dirs, bound)
        dirs.queue.mkdir(parents=True, exist_ok=True)
        dirs.pending.mkdir(parents=True, exist_ok=True)
        queue._lock_fd = _lock_queue(dirs)
        try:
            queue._read()
        except BaseException:
            queue.close()
            raise
        return queue

    def close(self) -> None:
        """Release the queue's lock (idempotent): another service may open it then, and this
        queue refuses appends and takes from then on."""
        with self._names_lock:
            if self._lock_fd is not None:
                close_fd(self._lock_fd)
                self._lock_fd = None

    def _owned(self) -> None:
        """Raise `RuntimeError` unless this queue holds its lock (called under the names'
        lock). Found by review: a record to a closed service was written without it, its
        number the next owner's, and replaced that owner's record of the same number."""
        if self._lock_fd is None:
            raise RuntimeError(f"{self.dirs.queue}: the evolve service is closed (not kept)")

    def _read(self) -> None:
        dirs, bound = self.dirs, self.bound
        jobs = load_jobs(dirs, clean=True, damaged=self.damaged)  # what they took is unknown
        taken = {name for job in jobs for name in job.consumed}
        names = []
        for entry in sorted(os.listdir(dirs.queue))[: bound + len(taken) + 1000]:
            if entry.startswith(".") or not entry.endswith(".json"):
                continue  # a temp file of an interrupted append
            if entry in taken:
                os.unlink(dirs.queue / entry)
            else:
                names.append(entry)
        self.names = names
        self._seq = max((int(name.split("-")[0]) for name in names), default=0)

    @property
    def failures(self) -> int:
        """Queued records whose outcome is a failure."""
        names = self.names
        return sum(name.endswith("-f.json") for name in names)

    def append(self, data: bytes, failed: bool) -> str:
        """Write one record durably; raises `QueueFull` when the queue holds ``bound``. One
        append at a time; it may run while `take` makes a job (it never waits for one)."""
        with self._names_lock:
            self._owned()
            if len(self.names) >= self.bound:
                raise QueueFull(f"the evolve queue holds {self.bound} records (its bound)")
            self._seq += 1
            name = f"{self._seq:012d}-{'f' if failed else 'o'}.json"
        write_bytes_atomic(self.dirs.queue / name, data)
        with self._names_lock:
            self.names.append(name)
        return name

    def take(
        self, mode: EvolveMode, make_config: Callable[[Path], CampaignConfig], limit: int
    ) -> PendingJob:
        """Turn up to ``limit`` queued records into a durable pending job whose campaign is
        ``make_config(its trajectory file)``, then remove them from the queue (journal
        before state: see the module docstring). One take at a time; appends may go on
        meanwhile (they add after the records taken)."""
        with self._names_lock:
            self._owned()
            names = self.names[:limit]
        job_id = f"job-{time.time_ns() // 1_000_000:013d}-{uuid.uuid4().hex[:6]}"
        folder = self.dirs.pending / job_id
        folder.mkdir()
        try:  # until job.json is in place nothing is taken: a failure leaves no folder
            lines = b"".join((self.dirs.queue / name).read_bytes() for name in names)
            write_bytes_atomic(folder / TRAJECTORIES, lines)
            job = PendingJob(
                job_id=job_id,
                created=time.time(),
                mode=mode,
                records=len(names),
                failures=sum(name.endswith("-f.json") for name in names),
                consumed=tuple(names),
                config=make_config(folder / TRAJECTORIES),
            )
            write_json_atomic(folder / JOB_FILE, job)
        except BaseException:
            remove_tree(folder)
            raise
        with self._names_lock:  # the job has them (a crash: `open` removes them)
            self.names = self.names[len(names) :]
        fsync_dir(self.dirs.pending)
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.dirs.queue / name)
        fsync_dir(self.dirs.queue)
        return job


def _lock_queue(dirs: StoreDirs) -> int:
    """The descriptor holding ``evolve/queue.lock``; `InputError` when another holds it."""
    fd = os.open(dirs.queue_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise InputError(
            f"{dirs.queue}: the evolve queue is open in another service (one per store; "
            "evolane drain runs its pending jobs alongside)"
        ) from None
    return close_in_forks(fd)  # a forked child never holds the queue


def load_jobs(
    dirs: StoreDirs, *, clean: bool = False, damaged: list[str] | None = None
) -> list[PendingJob]:
    """The pending jobs, oldest first (at most `MAX_PENDING_SCAN`), skipping a job folder with
    no ``job.json`` yet; with ``clean`` (crash recovery, when the queue opens and no job can be
    in the making) such a folder is removed. A damaged ``job.json`` raises `InputError`
    naming it; given ``damaged``, its folder is set aside in ``evolve/damaged/`` instead and
    the reason added there (found by review: one damaged job stopped every later one, for
    the service and for ``evolane drain``, until someone removed it by hand). Only damage
    read in the file sets a job aside: one that could not be read (EMFILE, EIO: nothing
    wrong with it) is left in place and told, one retired meanwhile by another process is
    skipped (found by review: either was set aside, the healthy job never to run)."""
    if not dirs.pending.is_dir():
        return []
    jobs = []
    for entry in sorted(os.listdir(dirs.pending))[:MAX_PENDING_SCAN]:
        folder = dirs.pending / entry
        if not entry.startswith("job-") or not folder.is_dir():
            continue
        if not (folder / JOB_FILE).exists():
            if clean:
                remove_tree(folder)
            continue
        try:
            jobs.append(read_job(folder / JOB_FILE))
        except JobUnreadable as error:  # no bytes read: nothing says the job is damaged
            if error.gone:  # run and retired by another process meanwhile: not pending
                continue
            if damaged is None:
                raise
            damaged.append(f"{error}; left in place, to be read again")
        except InputError as error:
            if damaged is None:
                raise
            damaged.append(f"{error}; {_set_aside(dirs, folder)}")
    return jobs


def _set_aside(dirs: StoreDirs, folder: Path) -> str:
    """Move a damaged job's folder to ``evolve/damaged/``; where it went, in words."""
    aside = dirs.damaged / folder.name
    try:
        aside.parent.mkdir(parents=True, exist_ok=True)
        if aside.exists():  # one of that name set aside before
            aside = aside.with_name(f"{folder.name}-{time.time_ns()}")
        os.replace(folder, aside)
    except OSError as error:
        return f"skipped (it could not be set aside: {error.strerror or error})"
    return f"set aside in {aside}"


class JobUnreadable(InputError):
    """A ``job.json`` that could not be read (`OSError`): no sign of damage in the job
    itself. ``gone``: it no longer exists (another process retired the job meanwhile)."""

    def __init__(self, message: str, gone: bool) -> None:
        super().__init__(message)
        self.gone = gone


def read_job(path: Path) -> PendingJob:
    """One ``job.json``; `InputError` (one line naming the file) when it is not valid,
    `JobUnreadable` when it cannot be read."""
    try:
        return PendingJob.model_validate(read_json(path))
    except ValidationError as error:
        problem = first_problem(error)
        raise InputError(f"{path}: not a valid pending job ({problem})") from None
    except OSError as error:
        gone = isinstance(error, FileNotFoundError)
        raise JobUnreadable(f"{path}: cannot read the pending job ({error})", gone) from None
    except ValueError as error:
        raise InputError(f"{path}: cannot read the pending job ({error})") from None


def save_job(dirs: StoreDirs, job: PendingJob) -> None:
    """Write ``job`` over its ``job.json`` (atomic)."""
    write_json_atomic(dirs.pending / job.job_id / JOB_FILE, job)


def retire_job(dirs: StoreDirs, job: PendingJob) -> Path:
    """Move a finished job out of ``pending/`` (one rename) and keep the last `KEEP_DONE`."""
    save_job(dirs, job)
    dirs.done.mkdir(parents=True, exist_ok=True)
    target = dirs.done / job.job_id
    os.replace(dirs.pending / job.job_id, target)
    fsync_dir(dirs.pending)
    _trim(sorted(p for p in os.listdir(dirs.done) if p.startswith("job-")), dirs.done)
    return target


def _trim(names: Iterable[str], folder: Path) -> None:
    names = list(names)
    for name in names[: max(0, len(names) - KEEP_DONE)]:
        remove_tree(folder / name)  # iterative: however deep
