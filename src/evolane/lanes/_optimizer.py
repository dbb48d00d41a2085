"""The optimizer lane: runs the optimizer command once per `ProposeJob`, through the sandbox.

Each job gets a scratch directory under the sandbox lease: ``workdir/`` (a writable copy
of the parent tree, edited in place and the process's working directory), ``prompt.json``
and ``context/`` (read-only, never part of the candidate). The run is bounded by the job's
deadline and by an idle watchdog: no output and no file change in the workdir for
``idle_seconds`` stops it. An optimizer that fails or hangs costs its slot only: the lane
answers with a `ProposeResult` and never raises for it.

With ``settings.agent`` (``--optimizer agent:NAME``, `evolane.lanes._agents`) the command is
the coding-agent CLI's: the prompt is rendered as text to ``prompt.md`` first, and the CLI's
stdout gives the usage document (unless it wrote one) and the summary.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import trio

from evolane.inputs import CommandTemplate, PriceTable
from evolane.lanes._agents import AGENT_TAIL_BYTES, AgentCommand, captured_bytes
from evolane.lanes._backends import ENDPOINT_EXIT, Backend, BackendCall, run_backend
from evolane.lanes._entries import check_entries
from evolane.lanes._limits import note_limits
from evolane.lanes._replay import read_usage
from evolane.lanes._replay_failure import SPAWN_REFUSALS, refusal_wait, spawn_refused
from evolane.lanes._scratch import SlotScratch
from evolane.lanes._stop import StoppableLane
from evolane.messages import (
    ArtifactRef,
    FailureEvent,
    LocalGateResult,
    Message,
    ProposeJob,
    ProposeResult,
    printable,
)
from evolane.sandbox import (
    Isolation,
    Limits,
    OutputCaps,
    ProcessOutcome,
    SandboxHost,
    SandboxSpec,
    UnitStop,
    View,
)
from evolane.store import (
    FATAL_ERRNOS,
    BlobStore,
    StoreError,
    SymlinkEntry,
    TreeLimitError,
    TreeLimits,
    TreeScan,
    UnsupportedEntryError,
    load_manifest,
    scan_tree,
    store_scan,
)

_POLL_MAX_SECONDS = 1.0
_SHORT = 256
SIGNATURE_MAX_ENTRIES = 100_000
"""Entries the idle watchdog looks at per poll: a workdir bigger than that is refused at the
end anyway, and each poll must stay cheap."""


@dataclass(frozen=True)
class OptimizerSettings:
    """How the lane runs the optimizer: template, limits, grace, passed-through variables."""

    template: CommandTemplate | None  # {workdir} {prompt_file} {seed} {workspace}; None: backend
    """The command; with ``agent`` it only names the agent CLI (`AgentCommand.template`)."""
    limits: Limits = field(default_factory=Limits)
    kill_grace: float = 2.0
    pass_env: tuple[str, ...] = ()
    isolation: Isolation = "process"
    view: View = field(default_factory=View)
    """What the command sees when confined (its job directory is added per job)."""
    backend: Backend | None = None  # an in-process callable instead of the command
    tree_limits: TreeLimits = field(default_factory=TreeLimits)
    """Caps on the workdir, checked while it is walked, before anything of it is stored
    (a campaign passes its size gate's: `GateSettings.tree_limits`)."""
    prices: PriceTable | None = None
    """The run's price table: a usage document naming a model is priced by it."""
    agent: AgentCommand | None = None
    """A coding-agent CLI run instead of ``template`` (``--optimizer agent:NAME``)."""


def workdir_signature(root: Path, max_entries: int = SIGNATURE_MAX_ENTRIES) -> bytes:
    """A digest of every entry's path, type, size and mtime under ``root`` (no symlinks
    followed): it changes whenever a file is created, removed, written or touched. Only the
    first ``max_entries`` entries met count (the walk is bounded like every other)."""
    digest = hashlib.blake2b(digest_size=16)
    pending = [root]
    seen = 0
    while pending and seen < max_entries:
        folder = pending.pop()
        try:
            with os.scandir(folder) as scan:
                children = sorted(scan, key=lambda child: child.name)
        except OSError:
            continue
        for child in children[: max_entries - seen]:
            seen += 1
            try:
                info = child.stat(follow_symlinks=False)
            except OSError:
                continue
            digest.update(os.fsencode(child.path))
            digest.update(f"\0{info.st_mode}:{info.st_size}:{info.st_mtime_ns}\0".encode())
            if stat.S_ISDIR(info.st_mode):
                pending.append(Path(child.path))
    return digest.digest()


class _IdleWatch:
    """Sets ``stop`` once neither output nor a workdir change was seen for ``idle`` seconds."""

    def __init__(self, workdir: Path, idle: float, stop: UnitStop) -> None:
        self.workdir, self.idle, self.stop = workdir, idle, stop
        self.last = trio.current_time()
        self.fired = False

    def activity(self) -> None:
        """Called by the sandbox for every chunk of stdout or stderr."""
        self.last = trio.current_time()

    async def run(self) -> None:
        interval = min(_POLL_MAX_SECONDS, self.idle / 4)
        seen = await trio.to_thread.run_sync(
            workdir_signature, self.workdir, abandon_on_cancel=True
        )
        while True:
            await trio.sleep(interval)
            now = await trio.to_thread.run_sync(
                workdir_signature, self.workdir, abandon_on_cancel=True
            )
            if now != seen:
                seen = now
                self.activity()
            if trio.current_time() - self.last >= self.idle:
                self.fired = True
                self.stop.set()
                return


class OptimizerLane(StoppableLane):
    """Runs `ProposeJob`s: one sandboxed optimizer run per job, answered by a `ProposeResult`.

    A `StopUnits` signal naming the job's slot id (or `StopAll`) stops it (status cancelled).
    """

    accepts = (ProposeJob,)

    def __init__(
        self,
        host: SandboxHost,
        store: BlobStore,
        settings: OptimizerSettings,
    ) -> None:
        super().__init__()
        self.host, self.store, self.settings = host, store, settings

    async def receive(self, message: Message) -> ProposeResult:
        assert isinstance(message, ProposeJob)
        job, started = message, trio.current_time()
        scratch = SlotScratch(self.host, job.slot_id)
        stop = self.stops.arm(job.slot_id)
        try:
            try:
                await trio.to_thread.run_sync(scratch.prepare, self.store, job)
                spec = None
                if self.settings.backend is None:
                    spec = await trio.to_thread.run_sync(self._spec, job, scratch)
            except (StoreError, OSError, ValueError) as error:
                if isinstance(error, OSError) and error.errno in FATAL_ERRNOS:
                    raise  # the store's own (a full disk): the run ends failed, as a replay's
                failure = FailureEvent.of(
                    error, owner="framework", stage="optimizer", code="prepare_failed"
                )
                return ProposeResult(slot_id=job.slot_id, status="failed", failure=failure)
            deadline = started + job.timeout_seconds
            outcome, idle = await self._run(job, scratch, spec, deadline, stop)
            for refusals in range(SPAWN_REFUSALS):  # the host's for a moment: no command ran
                if outcome.status != "spawn_failed" or not spawn_refused(outcome.spawn_errno):
                    break
                with trio.move_on_at(min(deadline, trio.current_time() + refusal_wait(refusals))):
                    await stop.wait()  # a stop ends the wait, and the tries
                if stop.is_set() or trio.current_time() >= deadline:
                    break
                outcome, idle = await self._run(job, scratch, spec, deadline, stop)
            result = await trio.to_thread.run_sync(self._collect, job, scratch, outcome, idle)
            return result.model_copy(update={"wall_seconds": trio.current_time() - started})
        finally:
            self.stops.disarm(job.slot_id)
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(scratch.remove)

    async def _run(
        self,
        job: ProposeJob,
        scratch: SlotScratch,
        spec: SandboxSpec | None,
        deadline: float,
        stop: UnitStop,
    ) -> tuple[ProcessOutcome, bool]:
        """Run ``spec`` (None: the backend) until ``deadline`` or ``stop``; returns the
        outcome and whether the idle watchdog stopped it."""
        if spec is None:
            assert self.settings.backend is not None
            return await self._run_backend(
                self.settings.backend, job, scratch, deadline, stop
            ), False
        watch = _IdleWatch(scratch.workdir, job.idle_seconds, stop)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run)
            outcome = await self.host.run(
                spec, deadline=deadline, stop=stop, activity=watch.activity
            )
            outcome = note_limits(outcome, self.settings.limits)
            nursery.cancel_scope.cancel()
        return outcome, watch.fired and outcome.status == "cancelled"

    def _spec(self, job: ProposeJob, scratch: SlotScratch) -> SandboxSpec:
        """The job's sandbox spec: the command rendered, or the agent CLI's command line
        (its prompt written to ``prompt.md`` first; blocking I/O: run it in a thread).
        Raises ValueError or OSError when it cannot be laid out."""
        env = {
            "EVOLANE_CONTEXT_DIR": str(scratch.context),
            "EVOLANE_SLOT": job.slot_id,
            "EVOLANE_SEED": str(job.seed),
            "EVOLANE_PROMPT_FILE": str(scratch.prompt_file),
            "EVOLANE_USAGE_FILE": str(scratch.dir / "usage.json"),
        }
        agent, output = self.settings.agent, OutputCaps()
        if agent is None:
            assert self.settings.template is not None  # no backend: a command
            argv = self.settings.template.render(scratch.placeholders(job.seed))
        else:
            call = agent.call(
                scratch.prompt_file, scratch.prompt_text_file, scratch.workdir, scratch.context
            )
            argv = agent.argv(call)
            env = {**agent.preset.env, **env}
            output = OutputCaps(tail_bytes=AGENT_TAIL_BYTES)
        return SandboxSpec(
            argv=argv,
            workspace=str(scratch.workdir),
            env=env,
            pass_env=self.settings.pass_env,
            limits=self.settings.limits,
            output=output,
            kill_grace=self.settings.kill_grace,
            isolation=self.settings.isolation,
            view=self.settings.view.model_copy(update={"own": scratch.own()}),
            drop_root=True,
            label="optimizer",
        )

    async def _run_backend(
        self,
        backend: Backend,
        job: ProposeJob,
        scratch: SlotScratch,
        deadline: float,
        stop: UnitStop,
    ) -> ProcessOutcome:
        prompt = orjson.loads(await trio.to_thread.run_sync(scratch.prompt_file.read_bytes))
        call = BackendCall(
            role="optimizer",
            workspace=scratch.context,
            seed=job.seed,
            env={"EVOLANE_SLOT": job.slot_id},
            workdir=scratch.workdir,
            prompt=prompt,
            context_dir=scratch.context,
            usage_file=scratch.dir / "usage.json",
        )
        return await run_backend(backend, call, deadline, stop)

    def _collect(
        self, job: ProposeJob, scratch: SlotScratch, outcome: ProcessOutcome, idle: bool
    ) -> ProposeResult:
        summary = _summary(outcome)
        if self.settings.agent is not None:
            out = outcome.stdout
            stdout = captured_bytes(out.head, out.tail, out.truncated)
            self.settings.agent.record_usage(scratch.dir / "usage.json", stdout)
            summary = self.settings.agent.summary(stdout)
        usage, complete = read_usage(scratch.dir / "usage.json", outcome, self.settings.prices)
        base = {
            "slot_id": job.slot_id,
            "stdout_ref": outcome.stdout.ref,
            "stderr_ref": outcome.stderr.ref,
            "usage": usage,
            "usage_complete": complete,
        }
        if not outcome.ok:
            backend = self.settings.backend is not None
            status, failure = _failure(outcome, idle, job.idle_seconds, backend)
            return ProposeResult(status=status, failure=failure, **base)  # type: ignore[arg-type]
        gate, tree = self._gate_and_store(job, scratch)
        if gate is None and isinstance(tree, FailureEvent):
            return ProposeResult(status="failed", failure=tree, **base)
        if gate is None:
            return ProposeResult(status="succeeded", tree_ref=tree, summary=summary, **base)
        return ProposeResult(status="rejected", gate=gate, summary=summary, **base)

    def _gate_and_store(
        self, job: ProposeJob, scratch: SlotScratch
    ) -> tuple[LocalGateResult | None, ArtifactRef | FailureEvent | None]:
        """Walk the workdir within the caps, gate its entries, then store it: (the gate that
        refused it, None) or (None, the tree ref) or (None, a failure of the store)."""
        limits = self.settings.tree_limits
        scan: TreeScan | StoreError | OSError
        try:
            scan = scan_tree(scratch.workdir, limits)
        except TreeLimitError as error:
            return _over_cap(error), None
        except (UnsupportedEntryError, OSError) as error:  # check_entries says which and why
            scan = error
        parent = load_manifest(self.store, job.parent_ref)
        kept = {path: e.target for path, e in parent.items() if isinstance(e, SymlinkEntry)}
        bound = limits.max_files + limits.max_folders
        gate = check_entries(scratch.workdir, kept, max_entries=bound)
        if not gate.passed:
            return gate, None
        try:
            if isinstance(scan, BaseException):
                raise scan
            return None, store_scan(self.store, scan)
        except TreeLimitError as error:
            return _over_cap(error), None
        except UnsupportedEntryError as error:
            reason = str(error)[:_SHORT]
            return LocalGateResult(gate="disallowed_entries", outcome="reject", reason=reason), None
        except (StoreError, OSError) as error:
            return None, FailureEvent.of(
                error, owner="infrastructure", stage="optimizer", code="snapshot_failed"
            )


def _over_cap(error: TreeLimitError) -> LocalGateResult:
    """The candidate's fault: its workdir is over a cap (named in the reason)."""
    reason = f"the workdir is over a cap, refused before storing: {error}"
    return LocalGateResult(gate="size_limit", outcome="reject", reason=reason[:_SHORT])


def _summary(outcome: ProcessOutcome) -> str:
    lines = outcome.stdout.head.decode("utf-8", "replace").splitlines()
    return printable(lines[0].strip()[:_SHORT]) if lines else ""


OPTIMIZER_ENDPOINT_FAILED = "endpoint_failed"
"""The code of an in-process optimizer whose model endpoint failed (`ENDPOINT_EXIT`)."""


def _failure(
    outcome: ProcessOutcome, idle: bool, idle_seconds: float, backend: bool = False
) -> tuple[str, FailureEvent]:
    """The result status and failure of a run that did not exit 0 (``backend``: an
    in-process one, whose `ENDPOINT_EXIT` says its model endpoint failed)."""
    wall = outcome.wall_seconds
    if backend and outcome.exit_code == ENDPOINT_EXIT:
        message = outcome.stderr.text()[-500:]
        return "failed", FailureEvent(
            owner="infrastructure",
            stage="optimizer",
            code=OPTIMIZER_ENDPOINT_FAILED,
            message=message,
        )
    if idle:
        message = f"no output and no file change for {idle_seconds:g}s; stopped after {wall:.1f}s"
        return "idle_killed", FailureEvent(
            owner="infrastructure", stage="optimizer", code="idle", message=message
        )
    if outcome.status == "timed_out":
        message = outcome.error or f"killed at the deadline after {wall:.1f}s"
        return "timed_out", FailureEvent(
            owner="infrastructure", stage="optimizer", code="timeout", message=message
        )
    if outcome.status == "cancelled":
        return "cancelled", FailureEvent(owner="framework", stage="optimizer", code="cancelled")
    if outcome.status == "spawn_failed":
        return "failed", FailureEvent(
            owner="infrastructure",
            stage="optimizer",
            code="spawn_failed",
            message=outcome.error[:512],
            spawn_errno=outcome.spawn_errno,
        )
    if outcome.status == "limit_exceeded":
        code, why = f"limit_{'_'.join(outcome.limits_hit)}", outcome.error[:512]
        return "failed", FailureEvent(
            owner="infrastructure", stage="optimizer", code=code, message=why
        )
    code = (
        f"exit_{outcome.exit_code}" if outcome.exit_code is not None else f"signal_{outcome.signal}"
    )
    message = outcome.stderr.text()[-500:]
    return "failed", FailureEvent(owner="candidate", stage="optimizer", code=code, message=message)


__all__ = [
    "OPTIMIZER_ENDPOINT_FAILED",
    "OptimizerLane",
    "OptimizerSettings",
    "workdir_signature",
]
