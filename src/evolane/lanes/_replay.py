"""Replay and judge lanes: actors that run one unit at a time through the sandbox.

A lane prepares a scratch directory under the sandbox root (the case file, the candidate
tree, a workspace, an output directory), renders the command template, runs it, stores
what it produced, and answers with a typed result. A timeout or a kill is an
infrastructure outcome, never a score.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import trio

from evolane.inputs import CommandTemplate, PriceTable, read_usage_document
from evolane.lanes._backends import Backend, BackendCall, run_backend
from evolane.lanes._inproc import hand_over, make_unit_dir, read_case, shared_tree
from evolane.lanes._limits import note_limits
from evolane.lanes._program import arm_owner, blame_tree
from evolane.lanes._replay_failure import (
    classify,
    may_pass,
    refused_for_now,
    stopped_waiting,
    with_spend,
)
from evolane.lanes._scratch import UnitScratch, replay_environment, replay_name
from evolane.lanes._stop import StoppableLane
from evolane.messages import (
    ArtifactRef,
    FailureEvent,
    Message,
    ReplayJob,
    ReplayResult,
    Usage,
)
from evolane.sandbox import (
    INLINE_BYTES,
    INLINE_FILES,
    INLINE_FOLDER_BYTES,
    Isolation,
    Limits,
    ProcessOutcome,
    SandboxHost,
    SandboxSpec,
    UnitStop,
    View,
    commands_run_unprivileged,
)
from evolane.store import (
    FATAL_ERRNOS,
    BlobStore,
    StoreError,
    TreeLimitError,
    TreeLimits,
    UnsafeEntryError,
    UnsupportedEntryError,
    check_contained,
    open_below,
    read_regular_file,
    scan_tree,
    store_scan,
)

QUOTE_BYTES = 200
MAX_OUTPUT_BYTES = 256 << 20
"""Bytes of all the files a replay leaves in its output folder: the answer, usage and what a
judge command reads; more is a runaway writer, refused before anything is hashed."""
OUTPUT_LIMITS = TreeLimits(max_files=10_000, max_folders=10_000, max_bytes=MAX_OUTPUT_BYTES)
"""Caps on a replay's output folder, checked while it is walked (`scan_tree`)."""
MAX_USAGE_BYTES = 64 << 10
"""Bytes read of a ``usage.json`` a command wrote (it holds two numbers)."""


@dataclass(frozen=True)
class LaneSettings:
    """How a lane runs its command: template, limits, grace, retries, environment."""

    template: CommandTemplate | None
    workspace_seed: ArtifactRef | None = None
    limits: Limits = field(default_factory=Limits)
    kill_grace: float = 2.0
    retries: int = 0
    pass_env: tuple[str, ...] = ()
    keep_failed: bool = False
    isolation: Isolation = "process"
    view: View = field(default_factory=View)
    """What the command sees when confined (its unit directory is added per unit)."""
    backend: Backend | None = None  # an in-process callable instead of the command
    output_limits: TreeLimits = OUTPUT_LIMITS
    """Caps on a replay's output folder (over one: the replay failed, by its own fault)."""
    prices: PriceTable | None = None
    """The run's price table: usage documents naming a model are priced by it."""


def excerpt(data: bytes) -> str:
    return data[:QUOTE_BYTES].decode("utf-8", "replace")


async def run_lane_command(
    host: SandboxHost,
    settings: LaneSettings,
    argv: tuple[str, ...],
    scratch: UnitScratch,
    label: str,
    env: dict[str, str],
    deadline: float,
    stop: UnitStop,
    setup: Callable[[], object] | None = None,
    small_layout: bool = False,
) -> ProcessOutcome:
    """Run a lane's command (or its in-process backend); ``setup`` lays the scratch
    directory out first (``small_layout``: on the event loop where the sandbox may, see
    `SandboxHost.run`; else in the worker thread that spawns the command)."""
    if settings.backend is not None:
        if setup is not None:
            await trio.to_thread.run_sync(setup)
        call = BackendCall(
            role="judge" if label == "judge" else "replay",
            workspace=scratch.work,
            seed=int(env.get("EVOLANE_SEED", "0")),
            env=env,
            case=orjson.loads(scratch.case_file.read_bytes()),
            candidate=scratch.candidate if scratch.candidate.exists() else None,
            output_dir=scratch.out,
            usage_file=scratch.usage_file(label),
            attempt=scratch.attempt,
        )
        return await run_backend(settings.backend, call, deadline, stop)
    spec = SandboxSpec(
        argv=argv,
        workspace=str(scratch.work),
        env=env,
        pass_env=settings.pass_env,
        limits=settings.limits,
        kill_grace=settings.kill_grace,
        isolation=settings.isolation,
        view=settings.view.model_copy(update={"own": scratch.own()}),
        drop_root=True,
        label=label,
    )
    outcome = await host.run(
        spec, deadline=deadline, stop=stop, setup=setup, small_layout=small_layout
    )
    return note_limits(outcome, settings.limits)  # a limit hit says which, and its flag


class CommandLane(StoppableLane):
    """Base of the replay and judge lanes: each job runs one command (or the in-process
    backend) on ``host``, reading its inputs from and storing its outputs in ``store``."""

    def __init__(self, host: SandboxHost, store: BlobStore, settings: LaneSettings) -> None:
        super().__init__()
        # New blobs skip their own fsync: a journal's group commit (or any durable write)
        # flushes them before anything durable names them.
        self.host, self.store, self.settings = host, store.deferring(), settings

    def begin(self, unit_id: str, timeout: float) -> tuple[float, float, UnitStop]:
        """A job starts: (now, its deadline, its stop event)."""
        started = trio.current_time()
        return started, started + timeout, self.stops.arm(unit_id)


class ReplayLane(CommandLane):
    """Runs `ReplayJob`s: one sandboxed replay per job, retried on infrastructure failures
    while the unit's hard deadline allows."""

    accepts = (ReplayJob,)

    def __init__(self, host: SandboxHost, store: BlobStore, settings: LaneSettings) -> None:
        assert settings.template is not None or settings.backend is not None
        super().__init__(host, store, settings)

    async def receive(self, job: Message) -> ReplayResult:
        assert isinstance(job, ReplayJob)
        started, deadline, stop = self.begin(job.unit_id, job.timeout_seconds)
        in_process = self.settings.backend is not None and self.settings.workspace_seed is None
        if not in_process and job.name is None:  # one name for every attempt, on any lane
            job = job.model_copy(update={"name": replay_name(job)})
        try:
            attempt, refusals, result, ran = 0, 0, None, []
            while True:
                attempt += 1
                if result is not None and (
                    result.failure is None or result.failure.code != "spawn_failed"
                ):
                    ran.append(result)  # an attempt that ran, tried again: its spend counts
                result = await self._attempt(job, attempt, deadline, stop)
                wait = refused_for_now(result, refusals)
                if wait is not None and trio.current_time() + wait < deadline:
                    refusals += 1
                    with trio.move_on_after(wait):
                        await stop.wait()
                    if not stop.is_set():
                        continue
                    result = stopped_waiting(result)
                tries = attempt - refusals  # refused spawns ran nothing: not a retry spent
                if not may_pass(result) or tries > self.settings.retries:
                    break
                if trio.current_time() >= deadline:
                    break
            name = None if in_process else job.name  # a backend is trusted: the unit id
            update = {"attempts": attempt, "wall_seconds": trio.current_time() - started}
            return with_spend(result, ran).model_copy(update={**update, "name": name})
        finally:
            self.stops.disarm(job.unit_id)

    async def _attempt(
        self, job: ReplayJob, attempt: int, deadline: float, stop: UnitStop
    ) -> ReplayResult:
        if self.settings.backend is not None and self.settings.workspace_seed is None:
            return await self._in_process(job, attempt, deadline, stop)
        name = replay_name(job)
        scratch = UnitScratch(self.host, self.store, name, attempt)
        if self._share():
            scratch.share_candidate(await shared_tree(self.host, self.store, job.tree_ref))
        lay_out = partial(scratch.prepare, job.case_ref, job.tree_ref, self.settings.workspace_seed)
        # A shared candidate, no workspace seed, a case of bounded size, nothing left to
        # remove first (a kept unit's folder): a few small files.
        small = scratch.shared and self.settings.workspace_seed is None
        small = small and job.case_ref.size <= INLINE_BYTES and not scratch.dir.exists()
        keep, done = False, False
        try:
            template = self.settings.template  # None: a plugin backend, which takes no argv
            argv = template.render(scratch.placeholders(job.seed)) if template else ()
            env = replay_environment(job, name)
            outcome = await run_lane_command(
                self.host,
                self.settings,
                argv,
                scratch,
                "replay",
                env,
                deadline,
                stop,
                lay_out,
                small,
            )
            result = await self._collected(job, scratch, outcome)
            if outcome.status == "spawn_failed":  # its program may be the tree's, broken
                result = await trio.to_thread.run_sync(blame_tree, result, argv, scratch.candidate)
            keep = self.settings.keep_failed and result.status != "succeeded"
            done = True
            return result
        finally:
            if done and not keep:  # a few files on the loop; a candidate's copy in a thread
                self.host.remove_soon(scratch.dir, small)
            elif not keep:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(scratch.remove)

    def _share(self) -> bool:
        """Whether a command may run on the shared read-only candidate tree rather than a
        copy of its own: only where it cannot write to it (its files are the store's
        read-only blobs, hard-linked): confined (a read-only mount), or run as a unit uid
        of its own (evolane is root, `setpriv` switches uids). Else a command could chmod
        it and write through."""
        return self.settings.isolation == "confined" or commands_run_unprivileged()

    async def _in_process(
        self, job: ReplayJob, attempt: int, deadline: float, stop: UnitStop
    ) -> ReplayResult:
        """An in-process backend's replay: a fresh unit folder (``work``, ``out``), the shared
        read-only candidate tree and the case as read from the store, no copies; the output
        stored (`_collected`), its folder then handed to the unit's judge."""
        assert self.settings.backend is not None
        scratch = UnitScratch(self.host, self.store, job.unit_id, attempt)
        kept = False
        try:
            candidate = await shared_tree(self.host, self.store, job.tree_ref)
            case = read_case(self.store, job.case_ref)
            make_unit_dir(scratch.dir, "work", "out")
            call = BackendCall(
                role="replay",
                workspace=scratch.work,
                seed=job.seed,
                env=replay_environment(job, job.unit_id),
                case=case,
                candidate=candidate,
                output_dir=scratch.out,
                usage_file=scratch.usage_file("replay"),
                attempt=attempt,
            )
            outcome = await run_backend(self.settings.backend, call, deadline, stop)
            result = await self._collected(job, scratch, outcome)
            if result.status == "succeeded" and result.output_ref is not None:
                hand_over(self.host, job.unit_id, result.output_ref, scratch.dir)
                kept = True
            else:
                kept = self.settings.keep_failed
            return result
        finally:
            if not kept:
                self.host.remove_soon(scratch.dir)  # on the loop while small, else a thread

    async def _collected(
        self, job: ReplayJob, scratch: UnitScratch, outcome: ProcessOutcome
    ) -> ReplayResult:
        """The replay's result, its output stored: inline when the output is small and the
        host's inline gate is open, else in one thread hop."""
        await trio.lowlevel.checkpoint_if_cancelled()  # as the thread hop would
        result = self.host.inline.attempt(partial(self._collect_small, job, scratch, outcome))
        if result is None:
            result = await trio.to_thread.run_sync(self._collect, job, scratch, outcome)
        return result

    def _collect_small(
        self, job: ReplayJob, scratch: UnitScratch, outcome: ProcessOutcome
    ) -> ReplayResult | None:
        """`_collect` when the output is small: within `INLINE_FILES`, `INLINE_BYTES` and
        `INLINE_FOLDER_BYTES`, no symlink (resolving one may walk long targets). None when
        it is not: `_collect` walks it again with its own limits (the same verdict)."""
        limits, settings = self.settings.output_limits, self.settings
        small = replace(
            limits,
            max_files=min(limits.max_files, INLINE_FILES),
            max_folders=min(limits.max_folders, INLINE_FILES),
            max_bytes=min(limits.max_bytes, INLINE_BYTES),
            max_folder_bytes=INLINE_FOLDER_BYTES,
        )
        try:
            return collect_replay(
                self.store, job, scratch, outcome, small, settings.prices, small=True
            )
        except _NotSmall:
            return None

    def _collect(
        self, job: ReplayJob, scratch: UnitScratch, outcome: ProcessOutcome
    ) -> ReplayResult:
        settings = self.settings
        return collect_replay(
            self.store, job, scratch, outcome, settings.output_limits, settings.prices
        )


class _NotSmall(Exception):
    """An output that is not small enough to be stored inline (`collect_replay`'s ``small``)."""


def collect_replay(
    store: BlobStore,
    job: ReplayJob,
    scratch: UnitScratch,
    outcome: ProcessOutcome,
    limits: TreeLimits = OUTPUT_LIMITS,
    prices: PriceTable | None = None,
    small: bool = False,
) -> ReplayResult:
    """Turn a finished replay into its result; outputs go to ``store`` (blocking I/O), walked
    within ``limits`` first: an output over a cap or holding what a tree cannot record is
    the replay's failure (``output_over_limit``, ``output_unsupported``), nothing stored.
    ``small``: an output over a cap, or holding a symlink, raises `_NotSmall` instead."""
    base: dict[str, Any] = {
        "unit_id": job.unit_id,
        "case_id": job.case_id,
        "arm": job.arm,
        "repetition": job.repetition,
        "stdout_ref": outcome.stdout.ref,
        "stderr_ref": outcome.stderr.ref,
    }
    failure = classify(outcome, job.arm)
    # The command may have swapped its output folder for a symlink to anywhere: nothing
    # below its unit folder is followed, read or written through.
    usage_file = scratch.usage_file("replay")
    usage, complete = read_usage(usage_file, outcome, prices, below=scratch.dir)
    base.update(usage=usage, usage_complete=complete)
    if failure is not None:
        status = {"timed_out": "timed_out", "cancelled": "cancelled"}.get(outcome.status, "failed")
        return ReplayResult(status=status, failure=failure, **base)  # type: ignore[arg-type]
    if outcome.stdout.total_bytes and not outcome.stdout.truncated:
        with contextlib.suppress(OSError):  # one it wrote itself stays; a symlink: refused
            _write_new(scratch.dir, "out/output.json", outcome.stdout.head + outcome.stdout.tail)
    stored = _store_output(store, job, scratch.out, limits, small)
    if isinstance(stored, ArtifactRef):
        return ReplayResult(status="succeeded", output_ref=stored, **base)
    return ReplayResult(status="failed", failure=stored, **base)


def _store_output(
    store: BlobStore, job: ReplayJob, out: Path, limits: TreeLimits, small: bool = False
) -> ArtifactRef | FailureEvent:
    """The output folder stored as a tree, or the replay's failure: over a cap, holding
    what a tree cannot record, or empty. The store's own errors (a full disk) propagate.
    ``small``: over a cap or holding a symlink raises `_NotSmall` (see `collect_replay`)."""
    try:
        scan = scan_tree(out, limits)
    except TreeLimitError as error:
        if small:
            raise _NotSmall from error
        return _output_failure(job, "output_over_limit", error)
    except (UnsupportedEntryError, OSError) as error:  # a FIFO, a folder made unreadable...
        return _output_failure(job, "output_unsupported", error)
    if small and any(entry.kind == "symlink" for entry in scan.entries):
        raise _NotSmall
    try:  # what a judge laying the output out would refuse (found by hostile review: an
        check_contained(scan)  # absolute link into it was stored, then crashed the judges)
    except UnsafeEntryError as error:
        return _output_failure(job, "output_unsupported", error)
    if not scan.entries:
        return FailureEvent(
            owner=arm_owner(job.arm),  # type: ignore[arg-type]
            stage="replay",
            code="no_output",
            message="the replay exited 0 but wrote no output",
        )
    try:
        return store_scan(store, scan)
    except TreeLimitError as error:  # a file grew after the walk
        if small:
            raise _NotSmall from error
        return _output_failure(job, "output_over_limit", error)
    except (UnsupportedEntryError, OSError) as error:  # a symlink or FIFO since the walk, a
        return _output_failure(job, "output_unsupported", error)  # file made unreadable


def _output_failure(job: ReplayJob, code: str, error: BaseException) -> FailureEvent:
    if isinstance(error, OSError) and error.errno in FATAL_ERRNOS:  # the store's own (a full
        raise error  # disk), or evolane's open files ran out: never the replay's failure
    return FailureEvent(
        owner=arm_owner(job.arm),  # type: ignore[arg-type]
        stage="replay",
        code=code,
        message=f"the replay's output folder was refused: {error}"[:512],
    )


def _write_new(folder: Path, relative: str, data: bytes) -> None:
    """Create ``folder``/``relative`` holding ``data``: never an existing file, nor through
    a symlink anywhere below ``folder`` (`open_below`)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    with os.fdopen(open_below(folder, relative, flags), "wb") as out:
        out.write(data)


def read_usage(
    path: Path,
    outcome: ProcessOutcome,
    prices: PriceTable | None = None,
    below: Path | None = None,
) -> tuple[Usage, bool]:
    """The usage document at ``path`` (`evolane.inputs.read_usage_document`) priced by
    ``prices``, plus the wall time: complete when it counts its tokens and is not
    ``partial``, dollars or not (the ledger keeps each dimension apart; complete only with
    dollars, no token estimate came without `--prices`). Anything else a command wrote there
    is its mistake, never a crash of the lane."""
    wall = outcome.wall_seconds
    with contextlib.suppress(OSError, ValueError, TypeError, StoreError):
        data = orjson.loads(read_regular_file(path, MAX_USAGE_BYTES, below=below))
        if isinstance(data, dict):
            reading = read_usage_document(data, prices)
            usage = Usage(
                tokens=reading.tokens,
                cost_usd=reading.cost_usd,
                wall_seconds=wall,
                cached=reading.cached,
            )
            return usage, reading.tokens is not None and not reading.partial
    return Usage(wall_seconds=wall), False
