"""`EvolveService`: record each agent task, improve the agent in the background.

    async with evolane.open_runtime(store=".evolane") as runtime:
        async with open_evolve_service(runtime, config, ServiceSettings(mode="shadow")) as evolve:
            while True:
                trajectory = await agent.run_task(...)
                await evolve.record(trajectory)

- ``record`` appends the trajectory to a bounded durable queue in the store (one atomic file,
  written from a worker thread: the host loop is never blocked by the disk) and returns; it
  never waits for a job. A full queue (``max_queue`` records) refuses the record with
  `QueueFull` and counts it in ``refused``: nothing is dropped silently.
- The `EvolvePolicy` (every N records, N failures, or an interval) turns the queued records
  into a pending job (`evolane.embed._pending`: journal before state).
- One background task runs pending jobs one at a time, oldest first, each a campaign from the
  job's trajectory file under the service's settings: its own ceilings (``max_tokens``,
  ``max_cost_usd``, a wall clock), one lane per role, and the job's commands run under
  ``nice`` (`ServiceSettings.nice`) so that they yield the CPU to the agent's own work.
- ``shadow`` never changes the target (apply = proposal: the report and the proposal are
  written, the target is not); ``online`` publishes a verified candidate file by file, each
  file replaced atomically (apply = auto_verified: the campaign's journaled publish, its
  post-check, a rollback when the check fails), so the agent reads the new version at its
  next task; a task that reads the target during a publish may see files of both versions.
- Closing the service (or the process dying) leaves the running job pending with its run id:
  the next service start, or ``evolane drain``, resumes it.
- A background step that fails (the disk refuses the job's files, a ``job.json`` is
  damaged, another run holds the target) never ends the agent's task: it is noted in
  ``faults`` (and warned once) and tried again after ``retry_interval``; its records stay
  queued (a job on a held target stays pending), so the queue bound still holds.
"""

from __future__ import annotations

import math
import shlex
import time
import warnings
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio
from pydantic import Field, ValidationError, model_validator

from evolane.campaign import Backends, CampaignConfig, TargetLocked, store_root
from evolane.embed._budget import BudgetDamaged
from evolane.embed._pending import (
    MAX_QUEUE,
    EvolveMode,
    PendingJob,
    QueueFull,
    RecordQueue,
    StoreDirs,
    load_jobs,
    record_bytes,
)
from evolane.embed._pending_run import (
    APPLY_FOR_MODE,
    ONLINE_ERROR_CONTROL,
    fail_job,
    finish_job,
    job_lock,
    outcome_status,
    start_job,
)
from evolane.embed._runtime import RUNTIME_CLOSED, EmbeddedRuntime, check_backend_kinds
from evolane.inputs import InputError, first_problem
from evolane.messages import Record

_COMMAND_ROLES = ("replay", "judge", "optimizer", "validator", "check")
MAX_FAULTS = 100
"""Background faults an `EvolveService` keeps in ``faults`` (the newest)."""


class EvolvePolicy(Record):
    """When queued records become a pending job: ``every`` records, ``failures`` failed
    records, or ``interval`` seconds since the last job (with ``min_records`` queued);
    whichever comes first. All None: only `EvolveService.flush` makes jobs."""

    every: int | None = Field(default=50, ge=1, le=MAX_QUEUE)
    failures: int | None = Field(default=None, ge=1, le=MAX_QUEUE)
    interval: float | None = Field(default=None, gt=0, le=365 * 86_400.0)
    min_records: int = Field(default=1, ge=1, le=MAX_QUEUE)

    def due(self, queued: int, failed: int, since_last: float) -> bool:
        """Whether a job is due with ``queued`` records (``failed`` of them failures)
        ``since_last`` seconds after the last job (or the service's start). No IO."""
        if queued == 0:
            return False
        if self.every is not None and queued >= self.every:
            return True
        if self.failures is not None and failed >= self.failures:
            return True
        return (
            self.interval is not None
            and since_last >= self.interval
            and (queued >= self.min_records)
        )


class ServiceSettings(Record):
    """How the service queues, when it makes jobs, and how a job runs."""

    mode: EvolveMode = "shadow"
    policy: EvolvePolicy = EvolvePolicy()
    max_queue: int = Field(default=1000, ge=1, le=MAX_QUEUE)
    """The queue's bound: a record beyond it is refused (`QueueFull`)."""
    max_job_records: int = Field(default=1000, ge=1, le=MAX_QUEUE)
    """Records one job takes at most (the oldest queued)."""
    max_pending_jobs: int = Field(default=16, ge=1, le=1000)
    """No new job while this many wait: records stay queued (then the queue bound holds)."""
    job_wall_clock: float = Field(default=1800.0, gt=0, le=365 * 86_400.0)
    """A job's wall-clock budget when its config sets none."""
    lanes: int = Field(default=1, ge=1, le=64)
    """Replay, judge and optimizer lanes of a job (each at most its config's own)."""
    nice: int = Field(default=10, ge=0, le=19)
    """Niceness of a job's commands (``nice -n N`` before each template; 0: none)."""
    run_jobs: bool = True
    """False: the service records and makes jobs but runs none (``evolane drain`` does)."""
    check_interval: float = Field(default=1.0, gt=0, le=3600.0)
    """How often the worker looks at the policy's interval when no record arrives."""
    retry_interval: float = Field(default=30.0, gt=0, le=86_400.0)
    """How long the job maker or the runner waits after a step failed (the disk refused a
    write, a ``job.json`` is damaged) before trying again; the failure is in ``faults``."""

    @model_validator(mode="after")
    def _bounded(self) -> ServiceSettings:
        if self.max_job_records > self.max_queue:
            raise ValueError("max_job_records must not exceed max_queue")
        return self


_INPUTS = ("dataset", "from_trajectory", "group")


def job_template(
    config: CampaignConfig | Mapping[str, Any], settings: ServiceSettings
) -> dict[str, Any]:
    """The flat settings every job of the service runs with: ``config`` (a `CampaignConfig`
    or its flat fields; its input is replaced by each job's trajectories) with small lanes,
    a wall clock, nice'd commands and the apply policy of the mode (online: with the
    confirmation on the test split; an error control that would skip it is `InputError`)."""
    flat = dict(config.model_dump(mode="json") if isinstance(config, CampaignConfig) else config)
    for key in _INPUTS:
        flat.pop(key, None)
    checked = trajectory_config(flat, Path("trajectories.jsonl"))  # validates the settings
    for key, value in (
        ("replay_concurrency", checked.measure.replay_concurrency),
        ("judge_concurrency", checked.measure.judge_concurrency),
        ("optimizer_concurrency", checked.propose.optimizer_concurrency),
    ):
        flat[key] = min(value, settings.lanes)
    if checked.wall_clock_budget is None:
        flat["wall_clock_budget"] = settings.job_wall_clock
    if settings.nice:
        for role in _COMMAND_ROLES:
            if flat.get(role):
                flat[role] = niced(flat[role], settings.nice)
    flat["apply"] = APPLY_FOR_MODE[settings.mode]
    if settings.mode == "online":
        if checked.error_control in ("none", "online"):
            raise InputError(
                f"evolve service config: error_control {checked.error_control!r}: online "
                "mode publishes only a best the held-out test split confirmed (auto or confirm)"
            )
        flat["error_control"] = ONLINE_ERROR_CONTROL
    return flat


def trajectory_config(flat: Mapping[str, Any], path: Path) -> CampaignConfig:
    """A campaign from the trajectory file ``path`` with the flat settings ``flat``; raises
    `InputError` (naming the setting) for a refused one."""
    try:
        return CampaignConfig(**flat, from_trajectory=(str(path),))
    except ValidationError as error:
        raise InputError(f"evolve service config: {first_problem(error, 'config')}") from None
    except TypeError as error:
        raise InputError(f"evolve service config: {error}") from None


def niced(template: str | None, nice: int) -> str | None:
    """A command template run under ``nice -n N``; a built-in (``llm:``, ``agent:``, a
    plugin ``NAME:ARGS`` with no space) or an already nice'd one is left as it is."""
    if not template or template.startswith(("nice ", "llm:", "agent:")):
        return template
    first = template.split(maxsplit=1)[0]
    if ":" in first and "/" not in first:  # a plugin name
        return template
    return f"nice -n {nice} {template}" if shlex.split(template) else template


class EvolveService:
    """Background evolution in an agent process: `record` after each task; jobs run in the
    background (see the module docstring). Open it with `open_evolve_service`."""

    def __init__(
        self,
        runtime: EmbeddedRuntime,
        config: CampaignConfig | Mapping[str, Any],
        settings: ServiceSettings,
        backends: Backends | None = None,
    ) -> None:
        self.runtime, self.settings, self.backends = runtime, settings, backends
        self.template = job_template(config, settings)
        self.dirs = StoreDirs(store_root(runtime.store))
        self.queue: RecordQueue | None = None
        self.recorded = 0
        self.refused = 0
        self.finished: list[PendingJob] = []
        """Jobs this service ran to an end, in order (bounded: the last 100)."""
        self.running: PendingJob | None = None
        self.faults: list[str] = []
        """Why a background step failed, oldest first (bounded: the last `MAX_FAULTS`); the
        step is tried again after ``retry_interval``, its records kept in the queue."""
        self._lock = trio.Lock()
        """One append at a time."""
        self._making = trio.Lock()
        """One job in the making at a time (the job maker and `flush`); never held by
        `record`, which must not wait while a job's records are read and written."""
        self._wake = trio.Event()
        self._job_made = trio.Event()
        self._last_job = time.monotonic()

    async def record(self, trajectory: Any) -> None:
        """Append one trajectory record (a pydantic model or a JSON object) to the durable
        queue. Raises `QueueFull` when the queue is at its bound (the record is not kept;
        ``refused`` counts it), `InputError` for a record that is no JSON object, and
        `RuntimeError` once the service is closed (the record is not kept)."""
        data, failed = record_bytes(trajectory)
        queue = self._queue()
        async with self._lock:
            try:
                await trio.to_thread.run_sync(queue.append, data, failed)
            except QueueFull:
                self.refused += 1
                raise
        self.recorded += 1
        self._wake.set()

    async def flush(self) -> PendingJob | None:
        """Turn whatever is queued into a pending job now (None when nothing is queued)."""
        return await self._make_job(force=True)

    def pending(self) -> list[PendingJob]:
        """The pending jobs in the store, oldest first (blocking read: a small folder); a
        damaged one is set aside and noted in ``faults``."""
        damaged: list[str] = []
        return self._noting(load_jobs(self.dirs, damaged=damaged), damaged)

    async def _pending_jobs(self) -> list[PendingJob]:
        """`pending`, read in a worker thread; the faults noted here, on the loop."""
        damaged: list[str] = []
        jobs = await trio.to_thread.run_sync(partial(load_jobs, self.dirs, damaged=damaged))
        return self._noting(jobs, damaged)

    def _noting(self, jobs: list[PendingJob], damaged: list[str]) -> list[PendingJob]:
        """``jobs``, once each job `load_jobs` found damaged is noted in ``faults``."""
        for reason in damaged:
            self._note("jobs", reason)
        return jobs

    @property
    def queued(self) -> int:
        """Records waiting in the queue."""
        return len(self._queue().names)

    def _queue(self) -> RecordQueue:
        if self.queue is None:
            raise RuntimeError("the service is not open: use open_evolve_service")
        return self.queue

    async def _make_job(self, *, force: bool = False) -> PendingJob | None:
        queue = self._queue()
        async with self._making:
            since = time.monotonic() - self._last_job
            due = self.settings.policy.due(len(queue.names), queue.failures, since)
            if not queue.names or not (force or due):
                return None
            if not force and len(await self._pending_jobs()) >= (self.settings.max_pending_jobs):
                return None
            limit = self.settings.max_job_records
            mode, template = self.settings.mode, self.template

            def make_config(path: Path) -> CampaignConfig:
                return trajectory_config(template, path)

            job = await trio.to_thread.run_sync(queue.take, mode, make_config, limit)
            self._last_job = time.monotonic()
            return job

    async def _make_jobs(self) -> None:
        """The job maker: on each record (and each ``check_interval`` when the policy has
        an interval), make the job the policy asks for and wake the runner. A job it cannot
        write is a fault (the agent goes on; its records stay queued) tried again later."""
        while True:
            self._wake = trio.Event()
            try:
                made = await self._make_job()
            except (OSError, InputError) as error:
                await self._fault("making a job", error)
                continue
            if made is not None:
                self._job_made.set()
                continue
            with trio.move_on_after(self._next_check()):
                await self._wake.wait()

    async def _run_jobs(self) -> None:
        """The runner: pending jobs one at a time, oldest first (those of a crash too). A
        store it cannot read or write, or a target another run holds (another agent's
        service, a command-line run), is a fault (the agent goes on; the job stays pending),
        tried again later."""
        while True:
            self._job_made = trio.Event()
            try:
                ran = await self._run_next()
            except (OSError, InputError) as error:
                await self._fault("running a job", error)
                continue
            if not ran:
                with trio.move_on_after(self.settings.check_interval * 10):
                    await self._job_made.wait()

    async def _run_next(self) -> bool:
        """Run the oldest pending job no other process holds; True when one ran."""
        for job in await self._pending_jobs():
            if await self._run_one(job):
                return True
        return False

    async def _fault(self, step: str, error: Exception) -> None:
        """Note a failed background step in ``faults`` (and as a `RuntimeWarning`), then
        wait ``retry_interval``: background evolution must never stop the agent."""
        self._note(step, str(error))
        await trio.sleep(self.settings.retry_interval)

    def _note(self, step: str, what: str) -> None:
        """Keep ``what`` went wrong in ``faults`` (the newest `MAX_FAULTS`) and warn."""
        line = f"{step}: {what}"
        self.faults = [*self.faults[-(MAX_FAULTS - 1) :], line]
        warnings.warn(f"evolve service: {line}", RuntimeWarning, stacklevel=1)

    def _next_check(self) -> float:
        interval = self.settings.policy.interval
        return self.settings.check_interval if interval is not None else math.inf

    async def _run_one(self, job: PendingJob) -> bool:
        """Run ``job`` to its end unless another process holds it; True when it ran."""
        with job_lock(self.dirs, job) as locked:
            if locked is None:
                return False
            job = self.running = locked
            try:
                job = await self._run_job(job)
            except (TargetLocked, BudgetDamaged):  # the job waits: it is noted in faults
                raise
            except Exception as error:  # a refused or broken job must not stop the agent
                job = await fail_job(self.dirs, job, error)
            finally:
                self.running = None
        self.finished = [*self.finished[-99:], job]
        return True

    async def _run_job(self, job: PendingJob) -> PendingJob:
        job, handle = await start_job(self.runtime, self.dirs, job, backends=self.backends)
        if handle is None:
            return job
        self.running = job
        try:
            outcome = await handle.result()
        except BaseException:  # closing: the run's trees go first; the job stays pending
            await handle._cancel_and_wait()
            raise
        return await finish_job(self.dirs, job, outcome_status(outcome))


@asynccontextmanager
async def open_evolve_service(
    runtime: EmbeddedRuntime,
    config: CampaignConfig | Mapping[str, Any],
    settings: ServiceSettings | None = None,
    *,
    backends: Backends | None = None,
) -> AsyncIterator[EvolveService]:
    """Open the record queue in ``runtime``'s store and run the background worker for the
    body of the ``async with``. ``config`` is the campaign every job runs (a `CampaignConfig`
    or its flat fields; each job's trajectories replace its input). At exit the worker is
    cancelled: a running job's trees are killed and the job stays pending (resumable).
    Raises `InputError` for a bad store or campaign settings, and when another service
    has this store's queue open (one per store; `evolane drain` may run alongside);
    `check_service_arguments` for an argument of the wrong kind or a closed runtime."""
    check_service_arguments(runtime, config, settings, backends)
    service = EvolveService(runtime, config, settings or ServiceSettings(), backends)
    service.queue = queue = await trio.to_thread.run_sync(
        RecordQueue.open, service.dirs, service.settings.max_queue
    )
    for reason in queue.damaged:
        service._note("jobs", reason)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(service._make_jobs)
            if service.settings.run_jobs:
                nursery.start_soon(service._run_jobs)
            try:
                yield service
            finally:
                nursery.cancel_scope.cancel()
    finally:
        queue.close()


def check_service_arguments(
    runtime: object, config: object, settings: object, backends: object
) -> None:
    """Refuse, before anything is written, an argument of `open_evolve_service` of the wrong
    kind (one `TypeError` naming it) and a runtime whose ``async with`` has ended (a
    `RuntimeError`). Found by review: a settings dict was an `AttributeError` from inside,
    and a service on a closed runtime took the records and retired each job as failed, its
    records never measured."""
    if not isinstance(runtime, EmbeddedRuntime):
        raise TypeError(
            f"runtime: the runtime of evolane.open_runtime, not {type(runtime).__name__} "
            "(from asyncio: runtime.evolve_service(...))"
        )
    if not isinstance(config, CampaignConfig | Mapping):
        raise TypeError(
            f"config: a CampaignConfig or a dict of its flat fields, not {type(config).__name__}"
        )
    if settings is not None and not isinstance(settings, ServiceSettings):
        raise TypeError(
            f"settings: a ServiceSettings(mode=..., policy=EvolvePolicy(...)), not "
            f"{type(settings).__name__}"
        )
    check_backend_kinds(backends)
    if runtime.closed:
        raise RuntimeError(RUNTIME_CLOSED)
