"""A run from request to report: check the inputs, lay out the run, start the run tree
(measurement pipeline, optimizer lanes, campaign actor), bound it by the wall-clock budget,
then apply and write the report. This is what ``evolane optimize`` and an embedding call.

    run-<id> (one_for_all)
    ├── run-<id>.measure      budget, replay lanes, judge lanes, scheduler
    ├── run-<id>.optimizers   optimizer lanes
    └── run-<id>.campaign     the campaign actor
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from evolane.actors import ActorRef
from evolane.campaign._actor import Campaign, CampaignResult, CampaignSetup, RunCampaign
from evolane.campaign._apply import JOURNAL_NAME, ApplyJournal, apply_candidate
from evolane.campaign._config import CampaignConfig
from evolane.campaign._estimate import Estimate
from evolane.campaign._prepare import Prepared, prepare_run
from evolane.campaign._report import (
    ApplyRecord,
    BudgetRecord,
    Report,
    render_markdown,
)
from evolane.campaign._runs import (
    SEEN_KEPT,
    CampaignState,
    RecoveredApply,
    RunRecord,
    StoreLayout,
    load_run,
    recover_interrupted_applies,
    save_campaign,
    save_run,
)
from evolane.inputs import OPTIMIZER_PLACEHOLDERS, CommandTemplate
from evolane.lanes import Backend, OptimizerLane, OptimizerSettings, StopBoard
from evolane.measure import LedgerSnapshot, PipelineConfig, ProgressBus, RunJournal, open_pipeline
from evolane.messages import (
    ArtifactRef,
    EstimateEvent,
    LedgerQuery,
    RunFinished,
    RunStarted,
    Usage,
    WarningEvent,
)
from evolane.sandbox import SandboxHost, open_sandbox
from evolane.store import read_json, write_bytes_atomic, write_json_atomic
from evolane.supervisors import ActorSpec, Runtime, SupervisorSpec, open_runtime

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

    Every start (but a dry run) first undoes any publish a crash left half done in the
    store, whichever run it belonged to, so the target is whole before it is read."""
    recovered: list[RecoveredApply] = []
    if not request.dry_run:
        layout = StoreLayout(Path(request.config.store))
        recovered = await trio.to_thread.run_sync(recover_interrupted_applies, layout)
    prepared = await trio.to_thread.run_sync(
        prepare_run,
        request.config,
        request.resume_run,
        request.resume_campaign,
        request.rerun_from,
    )
    if request.dry_run:
        return RunOutcome(prepared.estimate)
    started = request.started if request.started is not None else time.time()
    prepared.run = prepared.run.model_copy(update={"session_started": started})
    await trio.to_thread.run_sync(prepared.persist)
    bus = ProgressBus(prepared.run_dir / "events.jsonl", prepared.run.run_id)
    for undone in recovered:
        bus.publish(WarningEvent(run_id=prepared.run.run_id, message=_recovery_note(undone)))
    if on_bus is not None:
        on_bus(bus)
    journal = RunJournal(prepared.run_dir / "journal.jsonl")
    try:
        stop = interrupt if interrupt is not None else trio.Event()
        context = _RunContext(
            prepared, bus, journal, stop, started, backends or Backends(), _undone(recovered)
        )
        if runtime is not None:
            report = await _run_in(runtime, context)
        else:
            async with open_runtime() as own:
                report = await _run_in(own, context)
    except BaseException:
        with trio.CancelScope(shield=True):  # cancelled at once: the journal is the checkpoint
            await trio.to_thread.run_sync(_save_interrupted, prepared, started)
        raise
    finally:
        journal.close()
        bus.close()
    return RunOutcome(prepared.estimate, report, prepared.run_dir)


def _save_interrupted(prepared: Prepared, started: float) -> None:
    """Record a run cancelled at once as ``interrupted`` (resumable), unless its report was
    already written: then run.json and campaign.json already agree on how it ended."""
    if load_run(prepared.layout, prepared.run.run_id).status == "running":
        save_run(prepared.layout, _session_ended(prepared.run, "interrupted", started))


def _recovery_note(undone: RecoveredApply) -> str:
    return f"run {undone.run_id}: {undone.outcome.message}"[:256]


def _undone(recovered: list[RecoveredApply]) -> str:
    """The report's note on the publishes this start undid (empty when none)."""
    if not recovered:
        return ""
    return f"(an interrupted apply was undone: run {', '.join(u.run_id for u in recovered)})"


@dataclass
class _RunContext:
    prepared: Prepared
    bus: ProgressBus
    journal: RunJournal
    interrupt: trio.Event
    started: float
    backends: Backends
    note: str = ""  # for the report's message: what this start recovered


async def _run_in(runtime: Runtime, ctx: _RunContext) -> Report:
    """The run as one supervised subtree of ``runtime``, removed (every tree killed) on exit."""
    prepared, bus = ctx.prepared, ctx.bus
    config, run = prepared.config, prepared.run
    name = f"run-{run.run_id}"
    async with open_sandbox(prepared.layout.sandbox, store=prepared.store) as host:
        deadline = left = None
        if config.wall_clock_budget is not None:  # the whole campaign's: earlier sessions count
            used = prepared.campaign.elapsed_seconds + run.elapsed_seconds
            left = config.wall_clock_budget - used - (time.time() - ctx.started)
            deadline = trio.current_time() + left
        _announce(prepared, bus, host, left)
        await runtime.start_supervisor(
            SupervisorSpec(name=name, strategy="one_for_all", children=[])
        )
        try:
            result, ledger = await _campaign(runtime, host, ctx, name, deadline)
        finally:
            with trio.CancelScope(shield=True):
                await runtime.root.stop_child(name)
        applied = await _apply(prepared, host, result)
        return await _finish(ctx, result, ledger, applied, host)


def _announce(
    prepared: Prepared, bus: ProgressBus, host: SandboxHost, wall_left: float | None
) -> None:
    config, run = prepared.config, prepared.run
    bus.publish(
        RunStarted(
            run_id=run.run_id,
            campaign_id=run.campaign_id,
            cycle=run.cycle,
            iterations=config.iterations,
            population=config.population,
            replay_lanes=config.replay_concurrency,
            judge_lanes=config.judge_concurrency,
            resumed=not prepared.resume.empty,
            isolation=",".join(host.mechanisms),
            wall_clock_budget=config.wall_clock_budget,
            wall_clock_left=wall_left,
        )
    )
    shared = prepared.estimate.model_dump(include=set(EstimateEvent.model_fields))
    bus.publish(EstimateEvent(run_id=run.run_id, **shared))


async def _campaign(
    runtime: Runtime, host: SandboxHost, ctx: _RunContext, name: str, deadline: float | None
) -> tuple[CampaignResult, LedgerSnapshot]:
    prepared = ctx.prepared
    config, run = prepared.config, prepared.run
    pipeline_config = _pipeline_config(prepared, ctx, f"{name}.measure")
    async with open_pipeline(
        runtime, host, prepared.store, prepared.dataset, pipeline_config, under=name
    ) as pipeline:
        result = CampaignResult()
        board = StopBoard()
        optimizers = await _start_optimizers(runtime, host, ctx, board, name)
        setup = CampaignSetup(
            config=config,
            run_id=run.run_id,
            cycle=run.cycle,
            store=prepared.store,
            host=host,
            pipeline=pipeline,
            optimizers=optimizers,
            optimizer_board=board,
            budget=runtime.lookup(f"{name}.measure.budget"),
            journal=ctx.journal,
            bus=ctx.bus,
            gates=prepared.gates,
            seed_ref=run.seed_ref,
            parent_ref=run.parent_ref,
            stalled=prepared.campaign.stalled,
            rejected=list(prepared.campaign.rejected),
            seen=prepared.campaign.seen,
            resume=prepared.resume,
            has_test=prepared.test_cases > 0,
            optimizer_allowed=not prepared.rejudge,
            interrupt=ctx.interrupt,
        )
        campaign = await runtime.supervisor(name).start_child(
            ActorSpec(name=f"{name}.campaign", actor=Campaign, args=(setup, result))
        )
        await campaign.ask(RunCampaign(deadline=deadline), timeout=365 * 86_400.0)  # type: ignore[union-attr]
        ledger = await runtime.lookup(f"{name}.measure.budget").ask(LedgerQuery(), timeout=30)
        board.cancel_all()
    return result, ledger


def _pipeline_config(prepared: Prepared, ctx: _RunContext, name: str) -> PipelineConfig:
    config, journal, bus = prepared.config, ctx.journal, ctx.bus
    return PipelineConfig(
        replay=config.replay,
        judge=config.judge,
        replay_concurrency=config.replay_concurrency,
        judge_concurrency=config.judge_concurrency,
        replay_timeout=config.replay_timeout,
        judge_timeout=config.judge_timeout,
        kill_grace=config.kill_grace,
        judge_failure_retries=config.judge_failure_retries,
        ceilings=prepared.ceilings,
        seed=config.seed,
        min_cases=config.gate.min_cases,
        journal=journal,
        restored=prepared.resume.units,
        restored_replays=prepared.resume.replays,
        on_progress=bus.publish,
        rejudge=prepared.rejudge,
        replays_allowed=not prepared.rejudge,
        isolation=config.isolation,
        pass_env=config.pass_env,
        cluster=config.cluster,
        replay_backend=ctx.backends.replay,
        judge_backend=ctx.backends.judge,
        name=name,
    )


async def _start_optimizers(
    runtime: Runtime, host: SandboxHost, ctx: _RunContext, board: StopBoard, name: str
) -> list[ActorRef]:
    config = ctx.prepared.config
    template = CommandTemplate.parse(
        config.optimizer, role="optimizer", allowed=OPTIMIZER_PLACEHOLDERS
    )
    settings = OptimizerSettings(
        template=template,
        kill_grace=config.kill_grace,
        pass_env=config.pass_env,
        backend=ctx.backends.optimizer,
    )
    count = config.optimizer_concurrency
    spec = SupervisorSpec(
        name=f"{name}.optimizers",
        children=[
            ActorSpec(
                name=f"{name}.optimizer-{i}",
                actor=OptimizerLane,
                args=(host, ctx.prepared.store, settings, board),
                shutdown_grace=0.5,
            )
            for i in range(count)
        ],
        max_restarts=count * 3,
        within_seconds=5,
    )
    await runtime.supervisor(name).start_child(spec)
    return [runtime.lookup(f"{name}.optimizer-{i}") for i in range(count)]


async def _apply(
    prepared: Prepared, host: SandboxHost, result: CampaignResult
) -> ApplyRecord | None:
    best = result.best_ref
    if best is None or best.digest == prepared.run.seed_ref.digest:
        return None
    policy = prepared.config.apply
    if result.stop not in ("finished", "exhausted") and policy == "auto_verified":
        policy = "verified_only"  # an unfinished run never touches the target
    check = (
        CommandTemplate.parse(
            prepared.config.check, role="check", allowed=frozenset({"candidate", "workspace"})
        )
        if prepared.config.check
        else None
    )
    with trio.CancelScope(shield=True):
        outcome = await apply_candidate(
            policy=policy,
            store=prepared.store,
            host=host,
            target=Path(prepared.config.target),
            parent_ref=_target_now(prepared),
            candidate_ref=best,
            run_dir=prepared.run_dir,
            check=check,
            kill_grace=prepared.config.kill_grace,
        )
    return ApplyRecord(
        policy=outcome.policy,
        status=outcome.status,
        message=outcome.message,
        proposal_dir=outcome.proposal_dir,
        diff_ref=outcome.diff_ref,
        backup_ref=outcome.backup_ref,
    )


def _target_now(prepared: Prepared) -> ArtifactRef:
    """What the target holds if nobody touched it: what this run already published before a
    crash, else what an earlier cycle published (``applied_ref``), else the seed."""
    path = prepared.run_dir / JOURNAL_NAME
    if path.exists():
        journal = ApplyJournal.model_validate(read_json(path))
        if journal.state == "committed":
            return journal.candidate_ref
    return prepared.campaign.applied_ref or prepared.run.seed_ref


def _campaign_status(prepared: Prepared, result: CampaignResult) -> str:
    config = prepared.config
    if result.stop == "interrupted":
        return "active"
    if result.stop == "failed":  # fix what failed, then a new run of the campaign
        return "paused"
    if result.stop == "budget_limited":  # a spent ceiling ends the campaign; a deadline pauses it
        return "paused" if result.wall_clock_hit else "budget_limited"
    if result.stop == "exhausted":
        return "exhausted"
    cycles = max(config.max_improvement_cycles, prepared.campaign.max_cycles)
    return "complete" if prepared.run.cycle + 1 >= cycles else "paused"


async def _finish(
    ctx: _RunContext,
    result: CampaignResult,
    ledger: object,
    applied: ApplyRecord | None,
    host: SandboxHost,
) -> Report:
    assert isinstance(ledger, LedgerSnapshot)
    prepared, bus, started = ctx.prepared, ctx.bus, ctx.started
    run = prepared.run
    status = {"finished": "finished", "exhausted": "finished"}.get(result.stop, result.stop)
    campaign_status = _campaign_status(prepared, result)
    previous = prepared.campaign.spent
    campaign_spent = Usage(
        **{
            d: (previous.get(d) or 0.0) + (ledger.spent.get(d) or 0.0)
            for d in ("tokens", "cost_usd", "wall_seconds")
        }  # type: ignore[arg-type]
    )
    best = result.best_ref or run.seed_ref
    book = result.book
    report = Report(
        run_id=run.run_id,
        campaign_id=run.campaign_id,
        cycle=run.cycle,
        status=status,
        campaign_status=campaign_status,
        message=_message(result, bus, run.run_id, ctx.note),
        started=started,
        finished=time.time(),
        wall_seconds=time.time() - started,
        resumed=prepared.resumed,
        isolation=",".join(host.mechanisms),
        config=prepared.config,
        estimate=prepared.estimate,
        seed=run.seed_ref,
        selected=None if best.digest == run.seed_ref.digest else best,
        best=best,
        apply=applied,
        scores=result.scores,
        test=result.test,
        iterations=tuple(book.iterations),
        measurements=tuple(book.measurements),
        funnel=tuple(slot.record() for slot in book.funnel),
        decisions=tuple(book.decisions),
        lineage=tuple(book.lineage),
        failures=tuple(book.failures),
        artifacts=_artifacts(run.seed_ref, best, applied),
        budget=BudgetRecord(
            ceilings=ledger.ceilings,
            spent=ledger.spent,
            campaign_spent=campaign_spent,
            spent_by_stage=dict(ledger.spent_by_stage),
            overruns=len(ledger.overruns),
        ),
    )
    await trio.to_thread.run_sync(
        _write_report, prepared, report, result, campaign_status, campaign_spent
    )
    bus.publish(
        RunFinished(
            run_id=run.run_id,
            status=status,
            campaign_status=campaign_status,
            best=best.digest,
            baseline_val=result.scores.baseline_val.mean if result.scores.baseline_val else None,
            best_val=result.scores.best_val.mean if result.scores.best_val else None,
            report=str(prepared.run_dir / "report.json")[-256:],
        )
    )
    return report


def _message(result: CampaignResult, bus: ProgressBus, run_id: str, recovered: str) -> str:
    """The run's message, with what the start recovered; a re-judge whose stored run went
    another way says so (and warns)."""
    parts = [result.message] if result.message else []
    diverged = [m.measurement_id for m in result.book.measurements if m.status == "diverged"]
    if diverged:
        note = (
            f"the stored run diverged from this re-judge at {', '.join(diverged[:4])}: units "
            "it replayed on other trees were not used, and a re-judge replays nothing"
        )
        bus.publish(WarningEvent(run_id=run_id, message=note[:256]))
        parts.append(note)
    message = "; ".join(parts)
    return f"{message} {recovered}".strip()[:2048]


def _write_report(
    prepared: Prepared, report: Report, result: CampaignResult, campaign_status: str, spent: Usage
) -> None:
    """Report first, then the run's status, then the campaign: a crash in between leaves a
    run that a resume finishes again."""
    write_json_atomic(prepared.run_dir / "report.json", report)
    write_bytes_atomic(prepared.run_dir / "report.md", render_markdown(report).encode())
    run = _session_ended(prepared.run, report.status, report.started)
    save_run(prepared.layout, run)
    state: CampaignState = prepared.campaign
    if report.status == "interrupted":  # a resume replays this cycle: carry nothing over twice
        save_campaign(prepared.layout, state.model_copy(update={"status": campaign_status}))
        return
    finished_cycle = report.status == "finished"
    best_val = result.scores.best_val.mean if result.scores.best_val else state.best_val
    save_campaign(
        prepared.layout,
        state.model_copy(
            update={
                "status": campaign_status,
                "cycles": state.cycles + (1 if finished_cycle else 0),
                "best_ref": result.best_ref or state.best_ref,
                "best_val": best_val,
                "applied_ref": _applied(report) or state.applied_ref,
                "stalled": result.stalled,
                "spent": spent,
                "elapsed_seconds": state.elapsed_seconds + run.elapsed_seconds,
                "rejected": tuple(result.rejected),
                "seen": tuple(result.seen[-SEEN_KEPT:]),
            }
        ),
    )


def _session_ended(run: RunRecord, status: str, started: float) -> RunRecord:
    """``run`` with this session over: its status, and its wall added to the run's."""
    elapsed = run.elapsed_seconds + max(0.0, time.time() - started)
    return run.model_copy(update={"status": status, "elapsed_seconds": elapsed})


def _applied(report: Report) -> ArtifactRef | None:
    """The tree this run published into the target, if its apply succeeded."""
    applied = report.apply
    return report.best if applied is not None and applied.status == "applied" else None


def _artifacts(seed: ArtifactRef, best: ArtifactRef, applied: ApplyRecord | None) -> dict:
    """The trees and files a reader of the report may want to fetch from the store."""
    found = {"seed_tree": seed, "best_tree": best}
    if applied is not None and applied.diff_ref is not None:
        found["best_diff"] = applied.diff_ref
    if applied is not None and applied.backup_ref is not None:
        found["target_backup"] = applied.backup_ref
    return found


__all__ = ["EXIT_FOR_STATUS", "RunOutcome", "RunRequest", "load_run", "run_campaign"]
