"""A run from request to report: check the inputs, lay out the run, start its tree (see
`evolane.campaign._tree`), bound it by the wall-clock budget, then apply the best tree and
write the report. This is what ``evolane optimize`` and an embedding call."""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from evolane.actors import ActorRef
from evolane.campaign._alive import session_alive
from evolane.campaign._config import CampaignConfig
from evolane.campaign._containment import containment, host_warnings
from evolane.campaign._estimate import Estimate, rejudge_estimate
from evolane.campaign._finish import (
    Session,
    apply_unless_stopped,
    finish,
    monotonic_at,
    save_ended,
)
from evolane.campaign._held_out import SplitLooks
from evolane.campaign._lock import TargetLock, lock_target
from evolane.campaign._models import model_backends, model_warnings, plugin_backends
from evolane.campaign._prepare import Prepared, prepare_run
from evolane.campaign._report import Report
from evolane.campaign._runs import (
    RecoveredApply,
    ResolvedSetting,
    StoreLayout,
    load_run,
    recover_interrupted_applies,
)
from evolane.campaign._target import store_root
from evolane.campaign._test_budget import BUDGET_NOTE, reserve_split, split_notes, with_level
from evolane.campaign._tree import OptimizerParts, run_tree
from evolane.campaign._types import (
    CampaignServices,
    CampaignSetup,
    CycleOutcome,
    CycleState,
    RunSlots,
)
from evolane.lanes import Backend
from evolane.measure import (
    Ledger,
    LedgerSnapshot,
    MeasureContext,
    ProgressBus,
    RunJournal,
    measure_parts,
    open_measure_cluster,
    optimizer_settings,
    restored_debits,
    store_cases,
)
from evolane.messages import (
    MAX_PREFLIGHT_LINES,
    EstimateEvent,
    LedgerQuery,
    RunCampaign,
    RunStarted,
    StopAll,
    WarningEvent,
)
from evolane.sandbox import SandboxHost, open_sandbox
from evolane.store import (
    StorageFailure,
    describe_failure,
    refused_write,
    remove_atomic_temps,
    storage_failure,
)
from evolane.supervisors import Runtime, open_runtime

CAMPAIGN_ASK_TIMEOUT = float("inf")
"""The cycle bounds itself (the wall-clock budget is its deadline, every unit and proposal
has one) and the caller cancels it otherwise: waiting for its answer needs no timeout."""
SIGNAL_RETRY_INTERVAL = 0.01
"""How often an interrupt that found the campaign not yet serving is sent again."""
EXIT_FOR_STATUS = {"finished": 0, "budget_limited": 3, "interrupted": 130, "failed": 1}


@dataclass(frozen=True)
class RunRequest:
    """What to run: a fresh cycle, a new cycle of a campaign, or a resume of a run."""

    config: CampaignConfig
    resume_run: str | None = None
    resume_campaign: str | None = None
    rerun_from: str | None = None  # --from-run RUN_ID --rerun-evaluator
    dry_run: bool = False
    started: float | None = None  # time.time() the wall-clock budget counts from (default: now)
    settings: dict[str, ResolvedSetting] | None = None  # a new run's settings and their sources


@dataclass
class RunOutcome:
    """The result of `run_campaign`: the estimate, and the report unless it was a dry run."""

    estimate: Estimate
    report: Report | None = None
    run_dir: Path | None = None

    @property
    def exit_code(self) -> int:
        return 0 if self.report is None else EXIT_FOR_STATUS.get(self.report.status, 1)


@dataclass(frozen=True)
class Backends:
    """In-process replay, judge and optimizer callables that stand in for their commands."""

    replay: Backend | None = None
    judge: Backend | None = None
    optimizer: Backend | None = None


async def _with_models(backends: Backends | None, config: CampaignConfig) -> Backends:
    """``backends`` with the built-in model backends and the plugin backends ``config``
    names where none is given (a plugin factory that raises: `PluginError`, exit 2). The
    factories run in a worker thread, given up when the run is cancelled: found by review,
    one that blocked (a connect with no timeout) held the loop, and so Ctrl-C went unheard."""
    given = backends or Backends()
    judge, optimizer = model_backends(config)
    plugins = await trio.to_thread.run_sync(plugin_backends, config, abandon_on_cancel=True)
    return Backends(
        replay=given.replay or plugins.get("replay"),
        judge=given.judge or judge or plugins.get("judge"),
        optimizer=given.optimizer or optimizer or plugins.get("optimizer"),
    )


async def run_campaign(
    request: RunRequest,
    *,
    runtime: Runtime | None = None,
    interrupt: trio.Event | None = None,
    on_bus: Callable[[ProgressBus], object] | None = None,
    backends: Backends | None = None,
) -> RunOutcome:
    """Run one cycle of a campaign (or resume one) to its report, in ``runtime`` (or a runtime
    of its own). Bad input raises `InputError` before anything is written; ``interrupt``
    stops gracefully (resumable); cancelling the call kills every tree of the run.

    Every run but a dry run holds its target's lock (`evolane.campaign._lock`) from before
    it reads the target until it returns: while another run holds it, `InputError` names
    that run. Every start (but a dry run) then undoes any publish a crash left half done in
    the store, whichever run it belonged to, so the target is whole before it is read."""
    if request.dry_run:
        store_root(Path(request.config.store))  # a store that cannot be is refused first
        if Path(request.config.store).exists():
            return await _run(request, None, runtime, interrupt, on_bus, backends)
        # a dry run creates no store: it prepares in one of its own, removed (found by review)
        with tempfile.TemporaryDirectory(prefix="evolane-dry-run-") as scratch:
            config = request.config.model_copy(update={"store": str(Path(scratch, "store"))})
            request = dataclasses.replace(request, config=config)
            return await _run(request, None, runtime, interrupt, on_bus, backends)
    target = Path(request.config.target)
    lock = await trio.to_thread.run_sync(lock_target, target, request.resume_run)
    try:
        return await _run(request, lock, runtime, interrupt, on_bus, backends)
    finally:
        lock.release()


async def _run(
    request: RunRequest,
    lock: TargetLock | None,
    runtime: Runtime | None,
    interrupt: trio.Event | None,
    on_bus: Callable[[ProgressBus], object] | None,
    backends: Backends | None,
) -> RunOutcome:
    """`run_campaign` once the target is locked (``lock`` is None for a dry run)."""
    recovered: list[RecoveredApply] = []
    if lock is not None:
        layout = StoreLayout(Path(request.config.store))
        recovered = await trio.to_thread.run_sync(recover_interrupted_applies, layout)
    prepared = await trio.to_thread.run_sync(  # it writes no record: given up when cancelled
        prepare_run,  # (its read of a --from-trajectory pipe no one writes held a Ctrl-C)
        request.config,
        request.resume_run,
        request.resume_campaign,
        request.rerun_from,
        abandon_on_cancel=True,
    )
    if request.rerun_from is not None:  # judges the stored replays: it replays nothing
        stored = len(prepared.resume.units) + len(prepared.resume.replays)
        prepared.estimate = rejudge_estimate(prepared.estimate, prepared.config, stored)
    if lock is None:
        return RunOutcome(prepared.estimate)
    chosen = await _with_models(backends, prepared.config)  # a failing plugin: nothing written
    lock.name_run(prepared.run.run_id)
    started = request.started if request.started is not None else time.time()
    clock = monotonic_at(started)
    update: dict[str, object] = {"session_started": started}
    if request.settings is not None and request.resume_run is None:
        update["settings"] = request.settings
    prepared.run = prepared.run.model_copy(update=update)
    campaign_dir = prepared.layout.campaign_file(prepared.campaign.campaign_id).parent
    # what a kill cut between write and rename: this run alone writes here now (its lock)
    await trio.to_thread.run_sync(remove_atomic_temps, prepared.run_dir, campaign_dir)
    if prepared.split is not None and request.resume_run is None:  # durable before it is used
        await trio.to_thread.run_sync(_take_share, prepared)
    await trio.to_thread.run_sync(prepared.persist)
    bus = ProgressBus(prepared.run_dir / "events.jsonl", prepared.run.run_id)
    for undone in recovered:
        bus.publish(WarningEvent(run_id=prepared.run.run_id, message=undone.note))
    journal = RunJournal(prepared.run_dir / "journal.jsonl")
    try:
        if on_bus is not None:  # inside: a caller's hook that raises still ends the run
            on_bus(bus)
        context = _RunContext(
            Session(prepared, bus, started, _undone(recovered), clock),
            journal,
            interrupt if interrupt is not None else trio.Event(),
            chosen,
        )
        if runtime is not None:
            report = await _run_in(runtime, context)
        else:
            async with open_runtime() as own:
                report = await _run_in(own, context)
    except BaseException as error:
        failure = storage_failure(error)
        with trio.CancelScope(shield=True):  # cancelled at once: the journal is the checkpoint
            status = await trio.to_thread.run_sync(save_ended, prepared, clock, failure)
        if failure is not None:  # one line, not a traceback: the run ended failed
            line = describe_failure(failure, prepared.layout.root)
            if status == "interrupted" and refused_write(failure):  # nothing paid again
                line += f"; once fixed, continue the run with --resume {prepared.run.run_id}"
            raise StorageFailure(line) from error
        raise
    finally:
        journal.close()
        bus.close()
    return RunOutcome(prepared.estimate, report, prepared.run_dir)


def _take_share(prepared: Prepared) -> None:
    """Reserve the campaign's share of its test split's budget (``--test-budget store``)
    before ``run.json`` names its level: the one peeked, or, when a campaign started
    meanwhile took that one, the next (the run then confirms at that level, and the
    estimate's line says so). Blocking."""
    assert prepared.split is not None
    peeked = prepared.split
    held = reserve_split(prepared.layout.root, peeked, prepared.campaign.campaign_id)
    prepared.split = held
    if held.level == peeked.level:
        return
    prepared.config = with_level(prepared.config, held)
    prepared.run = prepared.run.model_copy(update={"config": with_level(prepared.run.config, held)})
    notes = split_notes(
        prepared.layout.root,
        prepared.dataset,
        prepared.campaign.campaign_id,
        prepared.config,
        held,
    )
    kept = [line for line in prepared.estimate.preflight if not line.startswith(BUDGET_NOTE)]
    preflight = (*notes[:1], *kept)[:MAX_PREFLIGHT_LINES]
    prepared.estimate = prepared.estimate.model_copy(update={"preflight": preflight})


def _undone(recovered: list[RecoveredApply]) -> str:
    """The report's note on the publishes this start undid (empty when none)."""
    if not recovered:
        return ""
    return f"(an interrupted apply was undone: run {', '.join(u.run_id for u in recovered)})"


@dataclass(frozen=True)
class _RunContext:
    """One session of a run: what it reports, its journal, its graceful stop, its backends."""

    session: Session
    journal: RunJournal
    interrupt: trio.Event
    backends: Backends


async def _run_in(runtime: Runtime, ctx: _RunContext) -> Report:
    """The run as a subtree of ``runtime``, removed (every tree killed) before apply and report."""
    prepared = ctx.session.prepared
    alive = session_alive(prepared.run_dir)  # a SIGKILL's resume counts this session's wall
    async with alive, open_sandbox(prepared.layout.sandbox, store=prepared.store) as host:
        deadline = left = None
        config, run = prepared.config, prepared.run
        if config.wall_clock_budget is not None:  # the whole campaign's: earlier sessions count
            used = prepared.campaign.elapsed_seconds + run.elapsed_seconds
            left = config.wall_clock_budget - used - ctx.session.seconds()
            deadline = trio.current_time() + left
        _announce(prepared, ctx.session.bus, host, left)
        outcome, ledger = await _cycle(runtime, host, ctx, deadline)
        outcome, applied = await apply_unless_stopped(prepared, host, outcome, ctx.interrupt)
        return await finish(ctx.session, outcome, ledger, applied, host)


def _announce(
    prepared: Prepared, bus: ProgressBus, host: SandboxHost, wall_left: float | None
) -> None:
    config, run = prepared.config, prepared.run
    contained = containment(config)
    bus.publish(
        RunStarted(
            run_id=run.run_id,
            campaign_id=run.campaign_id,
            cycle=run.cycle,
            iterations=config.iterations,
            population=config.population,
            replay_lanes=config.measure.replay_concurrency,
            judge_lanes=config.measure.judge_concurrency,
            resumed=not prepared.resume.empty,
            isolation=contained.description,
            wall_clock_budget=config.wall_clock_budget,
            wall_clock_left=wall_left,
            safeguards=host.mechanisms[:8],
        )
    )
    shared = prepared.estimate.model_dump(include=set(EstimateEvent.model_fields))
    bus.publish(EstimateEvent(run_id=run.run_id, **shared))
    if prepared.splits.optimistic:
        bus.publish(WarningEvent(run_id=run.run_id, message=prepared.splits.note[:256]))
    if contained.warning is not None:
        bus.publish(WarningEvent(run_id=run.run_id, message=contained.warning[:256]))
    for warning in (
        *model_warnings(prepared.config),
        *host_warnings(prepared.config, prepared.dataset),
    ):
        bus.publish(WarningEvent(run_id=run.run_id, message=warning[:256]))


async def _cycle(
    runtime: Runtime, host: SandboxHost, ctx: _RunContext, deadline: float | None
) -> tuple[CycleOutcome, LedgerSnapshot]:
    """Start the run's tree, ask its campaign for the cycle, read the ledger, stop the tree."""
    prepared = ctx.session.prepared
    config, store = prepared.config, prepared.store
    slots = RunSlots(f"run-{prepared.run.run_id}")
    context = MeasureContext(
        journal=ctx.journal,
        restored=prepared.resume.units,
        restored_replays=prepared.resume.replays,
        earlier=prepared.resume.earlier,
        on_progress=ctx.session.bus.publish,
        on_unit=ctx.session.bus.publish,
        rejudge=prepared.rejudge,
        replay_backend=ctx.backends.replay,
        judge_backend=ctx.backends.judge,
    )
    async with open_measure_cluster(config.measure, context, host, store) as cluster:
        try:
            between = _stop_storing(ctx.interrupt, deadline)
            cases = await trio.to_thread.run_sync(store_cases, store, prepared.dataset, between)
        except _StoringStopped:  # a large dataset takes minutes to store on a slow disk
            return _stopped_before_start(prepared, slots, deadline)
        cases = dataclasses.replace(cases, splits=prepared.splits.splits(cases.splits))
        services = CampaignServices(
            store=store,
            host=host,
            journal=ctx.journal,
            bus=ctx.session.bus,
            resume=prepared.resume,
            case_refs=cases.replay,
            clusters=cases.clusters,
            looks=SplitLooks(prepared.layout.root, prepared.dataset, prepared.run),
        )
        measure = measure_parts(
            config.measure,
            config.run_commands,
            context,
            dataset=prepared.dataset,
            cases=cases,
            seed=config.seed,
            min_cases=config.gate.min_cases,
            ledger=_ledger(prepared),
            host=host,
            store=store,
            cluster=cluster,
            models=config.models,
        )
        optimizer = OptimizerParts(
            optimizer_settings(
                config.propose.optimizer,
                config.run_commands,
                ctx.backends.optimizer,
                tree_limits=prepared.gates.tree_limits,  # the size gate, applied while walking
                prices=config.models.prices,
            ),
            config.propose.optimizer_concurrency,
        )
        await runtime.start_supervisor(
            run_tree(slots, measure, optimizer, _setup(prepared, slots), services)
        )
        try:
            campaign = runtime.lookup(slots.campaign)
            async with trio.open_nursery() as relay:
                relay.start_soon(_relay_interrupt, ctx.interrupt, campaign)
                done = await campaign.ask(
                    RunCampaign(deadline=deadline), timeout=CAMPAIGN_ASK_TIMEOUT
                )
                relay.cancel_scope.cancel()
            ledger = await runtime.lookup(slots.budget).ask(LedgerQuery())
        finally:
            with trio.CancelScope(shield=True):
                # The campaign starts no more work, and units and proposals in flight stop
                # through their lanes, before the tree is cancelled (the lanes' kill ladders
                # run either way).
                names = (slots.campaign, slots.scheduler, *slots.optimizers(optimizer.count))
                for name in names:
                    with contextlib.suppress(KeyError):
                        runtime.lookup(name).signal(StopAll())
                await runtime.root.stop_child(slots.prefix)
    raw = await trio.to_thread.run_sync(store.read_bytes, done.outcome)
    return CycleOutcome.model_validate_json(raw), ledger


class _StoringStopped(Exception):
    """The run was stopped (gracefully, or by its wall-clock deadline) while its cases were
    being stored, before its tree started."""


def _stop_storing(interrupt: trio.Event, deadline: float | None) -> Callable[[], None]:
    """What the thread storing the cases calls between batches: a cancel raises
    `trio.Cancelled`, a graceful stop or the deadline `_StoringStopped` (storing 100,000 cases
    took minutes on a loaded host, deaf to Ctrl-C and past the wall-clock budget)."""

    def stop_now() -> bool:
        return interrupt.is_set() or (deadline is not None and trio.current_time() >= deadline)

    def between() -> None:
        trio.from_thread.check_cancelled()
        if trio.from_thread.run_sync(stop_now):
            raise _StoringStopped

    return between


def _stopped_before_start(
    prepared: Prepared, slots: RunSlots, deadline: float | None
) -> tuple[CycleOutcome, LedgerSnapshot]:
    """The outcome of a cycle stopped before its tree started: nothing ran, the campaign's
    memory (stall, rejected edits, seen trees) carried over as the campaign would."""
    state = CycleState.starting(_setup(prepared, slots))
    state.stopped(deadline is not None and trio.current_time() >= deadline)
    return state.outcome(prepared.campaign.seen), _ledger(prepared).snapshot()


def _ledger(prepared: Prepared) -> Ledger:
    """The run's ledger: a resumed run's starts with what its earlier sessions spent: on
    units they cut short (the resume runs those again and pays only the new attempt) and on
    the units and replays it restores (`restored_debits`: not again as they are read). A
    re-judge pays none of the stored run's."""
    ledger = Ledger(ceilings=prepared.ceilings)
    if not prepared.rejudge:
        resume = prepared.resume
        restored = (restored_debits(r, resume.earlier) for r in resume.units.values())
        for debit in (*resume.unpaid, *(debit for debits in restored for debit in debits)):
            ledger.debit(debit.item, debit.actual, debit.complete, stage=debit.stage)
    return ledger


async def _relay_interrupt(interrupt: trio.Event, campaign: ActorRef) -> None:
    """The caller's graceful stop (its own event) reaches the campaign as a `StopAll` signal;
    until the actor serves, a signal finds no one, so it is sent again."""
    await interrupt.wait()
    while not campaign.signal(StopAll()):
        await trio.sleep(SIGNAL_RETRY_INTERVAL)


def _setup(prepared: Prepared, slots: RunSlots) -> CampaignSetup:
    """The campaign actor's setup: settings, the run's and the campaign's records, slots."""
    records = (prepared.config, prepared.gates, prepared.run, prepared.campaign)
    rejudge, tests = prepared.rejudge, prepared.test_cases
    return CampaignSetup(
        *records,
        slots,
        test_cases=tests,
        optimizer_allowed=not rejudge,
        feedback_split=prepared.splits.feedback,
        trace_reasons={
            case.id: str(case.metadata["trace_reason"])
            for case in prepared.dataset
            if case.metadata and case.metadata.get("trace_reason")
        },
    )


__all__ = ["EXIT_FOR_STATUS", "RunOutcome", "RunRequest", "load_run", "run_campaign"]
