"""Running one pending job: the one place that turns a job into a run, shared by the
background worker (`EvolveService`) and ``evolane drain``.

A job runs as a campaign from its own trajectory file with its stored settings, the mode
deciding the apply policy (`job_config`). Once its run has begun, the run id is written to
``job.json`` (state ``started``), so after a crash the job resumes that run (``--resume``:
finished units are not paid again) instead of starting over. A run that ends
``interrupted`` (or is cancelled) leaves the job pending; any other end retires it to
``evolve/done/``. A lock per job (``pending/<id>/.lock``, flock) keeps two processes off
the same job, and the job is read again once the lock is held (a listed copy may be stale).

An online job takes its share of its target's error budget when it first starts, before its
run (`embed._budget`: reserved in the budget file, then recorded in ``job.json``), confirms
at that share's level, and spends or gives it back when it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio

from evolane.campaign import CampaignConfig, RunOutcome, StoreLayout, campaign_alpha, load_run
from evolane.embed._budget import reached_test, reserve_share, settle_share
from evolane.embed._pending import (
    JOB_FILE,
    EvolveMode,
    PendingJob,
    StoreDirs,
    load_jobs,
    read_job,
    retire_job,
    save_job,
)
from evolane.embed._request import OptimizeRequest
from evolane.store import close_fd, close_in_forks, read_json

if TYPE_CHECKING:
    from evolane.embed._runtime import EmbeddedRuntime, RunHandle

APPLY_FOR_MODE: dict[EvolveMode, str] = {"shadow": "proposal", "online": "auto_verified"}
"""The apply policy of each mode: shadow only proposes; online publishes a verified candidate
through the campaign's journaled publish (post-apply check, rollback on failure)."""
ONLINE_ERROR_CONTROL: Final = "confirm"
"""The error control of an online job: a best is published only once the held-out test
split confirmed it (``none`` published an unconfirmed best; ``auto`` without test cases,
a job of few sessions, fell back to online control, also without the test split)."""


def job_config(dirs: StoreDirs, job: PendingJob) -> CampaignConfig:
    """The campaign a job runs: its stored config in this store, with the apply policy of
    its mode (so a shadow job never publishes, whatever its file says) and, online, the
    confirmation on the test split at the level of its share of the target's budget."""
    update: dict[str, Any] = {"apply": APPLY_FOR_MODE[job.mode], "store": str(dirs.root)}
    if job.mode == "online":
        update["error_control"] = ONLINE_ERROR_CONTROL
        if job.level is not None:  # its share of the target's budget
            update["error_budget"] = job.level
    return job.config.model_copy(update=update)


def job_request(dirs: StoreDirs, job: PendingJob) -> OptimizeRequest | None:
    """The request that runs ``job`` now: a resume of its run when it started one that did
    not end, a fresh run otherwise; None when its run already ended (a crash came between
    the end and the job's retirement)."""
    if job.run_id is not None:
        layout = StoreLayout(dirs.root)
        report = layout.run_dir(job.run_id) / "report.json"
        if report.exists():
            status = read_json(report).get("status")
            if status != "interrupted":
                return None
            return OptimizeRequest(resume=job.run_id)
        with contextlib.suppress(FileNotFoundError, ValueError, OSError):
            load_run(layout, job.run_id)
            return OptimizeRequest(resume=job.run_id)
    return OptimizeRequest(config=job_config(dirs, job))


@contextlib.contextmanager
def job_lock(dirs: StoreDirs, job: PendingJob) -> Iterator[PendingJob | None]:
    """Hold ``job``'s lock for the block: yields the job as its ``job.json`` says once the
    lock is held (another process may have started, resumed or retired it since it was
    listed: run the listed copy and a half-run job would start over), None when another
    live process runs it or it has left ``pending/``. Raises `InputError` for a damaged
    ``job.json``."""
    path = dirs.pending / job.job_id / ".lock"
    try:
        fd = close_in_forks(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644))
    except FileNotFoundError:  # retired meanwhile by another process
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        yield _locked_job(dirs, job, fd)
    finally:
        close_fd(fd)


def _locked_job(dirs: StoreDirs, job: PendingJob, fd: int) -> PendingJob | None:
    """``job`` read afresh under the lock held on ``fd``; None when its folder was retired
    (moved to ``evolve/done/``, the lock file with it) after ``fd`` was opened."""
    folder = dirs.pending / job.job_id
    try:
        now = os.stat(folder / ".lock")
    except FileNotFoundError:
        return None
    held = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
        return None
    return read_job(folder / JOB_FILE)


async def start_job(
    runtime: EmbeddedRuntime, dirs: StoreDirs, job: PendingJob, **options: Any
) -> tuple[PendingJob, RunHandle | None]:
    """Start ``job``'s run (``options`` go to `EmbeddedRuntime.start_optimize`) and record
    its run id in ``job.json``; the handle is None for a job whose run had already ended
    (it is retired here). Raises `InputError` for a job whose settings are refused."""
    if job.mode == "online" and job.run_id is None:
        job = await trio.to_thread.run_sync(take_share, dirs, job)
    request = job_request(dirs, job)
    if request is None:
        return await finish_job(dirs, job, _stored_status(dirs, job)), None
    handle = await runtime.start_optimize(request, **options)
    job = job.model_copy(update={"state": "started", "run_id": handle.run_id})
    await trio.to_thread.run_sync(save_job, dirs, job)
    return job, handle


def take_share(dirs: StoreDirs, job: PendingJob) -> PendingJob:
    """``job`` with its share of its target's error budget (the one it holds already, after
    a crash), reserved in the budget file (journal) and then in its ``job.json`` (state).
    Blocking."""
    alpha = campaign_alpha(job.config.model_copy(update={"error_budget": None}))
    held, left = reserve_share(dirs.root, job.config.target, job.job_id, alpha)
    update = {"share": held.index, "level": held.level, "budget_left": left}
    if all(getattr(job, key) == value for key, value in update.items()):
        return job
    job = job.model_copy(update=update)
    save_job(dirs, job)
    return job


def settle(dirs: StoreDirs, job: PendingJob) -> PendingJob:
    """``job`` once its share is spent (its run reached a confirmation: `reached_test`) or
    given back; a job with no share as it is. Blocking."""
    if job.share is None:
        return job
    report = _run_report(dirs, job) if job.run_id is not None else {}
    spent = reached_test(report)
    left = settle_share(dirs.root, job.config.target, job.job_id, spent)
    return job.model_copy(update={"spent": spent, "budget_left": left})


async def finish_job(dirs: StoreDirs, job: PendingJob, status: str | None) -> PendingJob:
    """Record how ``job``'s run ended (``status``: the report's; None when cancelled): an
    ``interrupted`` or cancelled run keeps the job pending (resumable), anything else
    retires it."""
    from evolane.campaign import EXIT_FOR_STATUS

    if status is None or status == "interrupted":
        return job
    state = "failed" if status == "failed" else "done"
    code = EXIT_FOR_STATUS.get(status, 1)
    job = job.model_copy(update={"state": state, "status": status, "exit_code": code})
    job = await trio.to_thread.run_sync(settle, dirs, job)
    await trio.to_thread.run_sync(retire_job, dirs, job)
    return job


async def fail_job(dirs: StoreDirs, job: PendingJob, error: BaseException) -> PendingJob:
    """Retire ``job`` as failed with ``error``'s line as its status (its settings were
    refused, or its run broke): a broken job must not block the queue behind it."""
    from evolane.inputs import InputError

    line = f"failed: {error}" if isinstance(error, InputError) else f"failed: {error!r}"
    code = 2 if isinstance(error, InputError) else 1
    job = job.model_copy(update={"state": "failed", "status": line[:256], "exit_code": code})
    job = await trio.to_thread.run_sync(settle, dirs, job)
    await trio.to_thread.run_sync(retire_job, dirs, job)
    return job


def outcome_status(outcome: RunOutcome | None) -> str | None:
    """The report status of a run's outcome (None when it has no report)."""
    return None if outcome is None or outcome.report is None else outcome.report.status


def _stored_status(dirs: StoreDirs, job: PendingJob) -> str | None:
    assert job.run_id is not None
    report = StoreLayout(dirs.root).run_dir(job.run_id) / "report.json"
    return read_json(report).get("status")


def _run_report(dirs: StoreDirs, job: PendingJob) -> dict[str, Any] | None:
    """The ``report.json`` of ``job``'s run; None when it has none (or it is unreadable)."""
    assert job.run_id is not None
    path = StoreLayout(dirs.root).run_dir(job.run_id) / "report.json"
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


class PendingJobs:
    """The pending jobs of one store, as ``evolane drain`` and the service run them."""

    def __init__(self, store: Path) -> None:
        self.dirs = StoreDirs(store)

    def list(self, damaged: list[str] | None = None) -> list[PendingJob]:
        """The pending jobs, oldest first; a damaged ``job.json`` is `InputError`, or, given
        ``damaged``, set aside with its reason added there (`load_jobs`)."""
        return load_jobs(self.dirs, damaged=damaged)

    def lock(self, job: PendingJob) -> contextlib.AbstractContextManager[PendingJob | None]:
        """`job_lock`: inside the block, ``job`` as it is now when this process holds it,
        None when another process runs it or has retired it."""
        return job_lock(self.dirs, job)

    async def start(
        self, runtime: EmbeddedRuntime, job: PendingJob, **options: Any
    ) -> tuple[PendingJob, RunHandle | None]:
        """`start_job` in this store."""
        return await start_job(runtime, self.dirs, job, **options)

    async def finish(self, job: PendingJob, outcome: RunOutcome | None) -> PendingJob:
        """`finish_job` with the outcome's report status."""
        return await finish_job(self.dirs, job, outcome_status(outcome))

    async def fail(self, job: PendingJob, error: BaseException) -> PendingJob:
        """`fail_job`: retire ``job`` as failed with ``error``."""
        return await fail_job(self.dirs, job, error)
