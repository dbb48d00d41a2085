"""The end of a run: apply the best tree by the apply policy, then build and write the
report, the run's status and the campaign's state (in that order, so a crash in between
leaves a run that a resume finishes again)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import trio

from evolane.campaign._apply import JOURNAL_NAME, apply_candidate, journal_state
from evolane.campaign._case_rows import case_rows
from evolane.campaign._confirm import error_control, publish_blocked, tested_before
from evolane.campaign._containment import alone_share, containment
from evolane.campaign._held_out import record_confirmation, record_online, with_reuse
from evolane.campaign._markdown import render_markdown
from evolane.campaign._online import resolved_mode
from evolane.campaign._prepare import Prepared
from evolane.campaign._report import ApplyRecord, BudgetRecord, Report
from evolane.campaign._runs import (
    SEEN_KEPT,
    CampaignState,
    ReportSummary,
    RunRecord,
    end_run,
    load_run,
    save_run,
)
from evolane.campaign._test_budget import settle_split
from evolane.campaign._trajectories import trajectory_summary
from evolane.campaign._types import CycleOutcome
from evolane.inputs import CommandTemplate
from evolane.measure import ROLES, LedgerSnapshot, ProgressBus, describe_limits
from evolane.messages import ArtifactRef, RunFinished, Usage, WarningEvent
from evolane.sandbox import SandboxHost, trees_own_process_limit
from evolane.store import StoreError, refused_write, write_bytes_atomic, write_json_atomic
from evolane.views import write_report_html


@dataclass(frozen=True)
class Session:
    """This session of a run: what was prepared, where its events go, when it began, and
    what its start recovered (for the report's message)."""

    prepared: Prepared
    bus: ProgressBus
    started: float
    note: str = ""
    clock: float | None = None
    """The monotonic clock's reading at ``started`` (wall time): the session's length is
    counted on it, so a wall clock stepped during the run (NTP, a resumed VM) neither
    spends nor gives back wall-clock budget (found by review). None: ``started`` read now."""

    def seconds(self) -> float:
        """How long this session has run, on the monotonic clock."""
        clock = monotonic_at(self.started) if self.clock is None else self.clock
        return max(0.0, time.monotonic() - clock)


def monotonic_at(started: float) -> float:
    """The monotonic clock's reading at the wall time ``started`` (a moment just past)."""
    return time.monotonic() - max(0.0, time.time() - started)


async def apply_unless_stopped(
    prepared: Prepared, host: SandboxHost, outcome: CycleOutcome, interrupt: trio.Event
) -> tuple[CycleOutcome, ApplyRecord | None]:
    """`apply_best`, which the run's graceful stop (a first Ctrl-C, SIGTERM, an embedding's
    ``stop()``) cuts short like a cancel: the post-apply check's tree is killed and the
    publish undone, and the run ends ``interrupted`` (a ``--resume`` publishes). Found by
    review: the stop waited out the whole check (up to its timeout), then published, exit 0.
    A publish already committed when the stop came stands."""
    if outcome.stop not in ("finished", "exhausted"):  # stopped before: nothing is published
        return outcome, await apply_best(prepared, host, outcome)
    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as scope:
            nursery.start_soon(_cancel_on, interrupt, scope)
            applied = await apply_best(prepared, host, outcome)
        nursery.cancel_scope.cancel()
    if not scope.cancelled_caught:
        return outcome, applied
    why = "stopped before the best was published; --resume publishes it"
    message = "; ".join(part for part in (outcome.message, why) if part)
    stopped = outcome.model_copy(update={"stop": "interrupted", "message": message})
    journal = prepared.run_dir / JOURNAL_NAME
    if not journal.exists() or journal_state(journal)[0] != "rolled_back":
        return stopped, None
    undone = ApplyRecord(
        policy=prepared.config.apply,
        status="rolled_back",
        message="the stop undid the publish: the target is as it was",
    )
    return stopped, undone


async def _cancel_on(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def apply_best(
    prepared: Prepared, host: SandboxHost, outcome: CycleOutcome
) -> ApplyRecord | None:
    """Apply the cycle's best tree by the run's policy (None when it is the seed)."""
    best = outcome.best_ref
    if best is None or best.digest == prepared.run.seed_ref.digest:
        return None
    config = prepared.config
    policy = config.apply
    if outcome.stop not in ("finished", "exhausted") and policy == "auto_verified":
        policy = "verified_only"  # an unfinished run never touches the target
    confirmation = outcome.report.confirmation
    mode = resolved_mode(config.error_control, prepared.test_cases)
    earlier = tested_before(prepared.campaign.confirmations, best)
    never = (
        mode == "confirm"
        and confirmation is None
        and not (earlier and earlier.decision == "accept")
    )
    unconfirmed = publish_blocked(confirmation) or never  # a verdict of an earlier cycle stands
    blocked = unconfirmed and policy != "proposal"
    if blocked:  # an unconfirmed best (or one the run stopped before confirming) is only
        policy = "proposal"  # proposed, for a person to read
    check = None
    if config.check:
        allowed = frozenset({"candidate", "workspace"})
        check = CommandTemplate.parse(config.check, role="check", allowed=allowed)
    # Not shielded: `apply_candidate` shields its own steps, and a cancel (Ctrl-C twice, a
    # host's deadline) during the post-apply check kills the check and undoes the publish
    # (it waited out the whole check, up to its 120 s timeout, found by review).
    applied = await apply_candidate(
        policy=policy,
        store=prepared.store,
        host=host,
        target=Path(config.target),
        parent_ref=_target_now(prepared),
        candidate_ref=best,
        run_dir=prepared.run_dir,
        check=check,
        kill_grace=config.commands.kill_grace,
        limits=alone_share(config).commands.sandbox_limits(),
        isolation=config.commands.isolation,
        view=config.run_commands.view("check", check),
        protected=config.guarded,
        pass_env=config.commands.passed("check"),
    )
    if blocked:
        why = (
            confirmation.sentence
            if confirmation is not None
            else "the run stopped before the best was confirmed on the test split: not published"
        )
        return ApplyRecord(
            policy=config.apply,
            status="unconfirmed",
            message=f"{why}; proposal in {applied.proposal_dir}"[:2048],
            proposal_dir=applied.proposal_dir,
            diff_ref=applied.diff_ref,
        )
    return ApplyRecord(
        policy=applied.policy,
        status=applied.status,
        message=applied.message,
        proposal_dir=applied.proposal_dir,
        diff_ref=applied.diff_ref,
        backup_ref=applied.backup_ref,
    )


def _target_now(prepared: Prepared) -> ArtifactRef:
    """What the target holds if nobody touched it: what this run already published before a
    crash, else what an earlier cycle published (``applied_ref``), else the seed."""
    path = prepared.run_dir / JOURNAL_NAME
    if path.exists():
        state, candidate = journal_state(path)
        if state == "committed":
            return candidate
    return prepared.campaign.applied_ref or prepared.run.seed_ref


def _campaign_status(prepared: Prepared, outcome: CycleOutcome) -> str:
    if outcome.stop == "interrupted":
        return "active"
    if outcome.stop == "failed":  # fix what failed, then a new run of the campaign
        return "paused"
    if outcome.stop == "budget_limited":  # a spent ceiling ends the campaign; a deadline pauses it
        return "paused" if outcome.wall_clock_hit else "budget_limited"
    if outcome.stop == "exhausted":
        return "exhausted"
    cycles = max(prepared.config.max_improvement_cycles, prepared.campaign.max_cycles)
    return "complete" if prepared.run.cycle + 1 >= cycles else "paused"


async def finish(
    session: Session,
    outcome: CycleOutcome,
    ledger: LedgerSnapshot,
    applied: ApplyRecord | None,
    host: SandboxHost,
) -> Report:
    """Build the report, write it with the run's and the campaign's records, and say so."""
    prepared, bus, started = session.prepared, session.bus, session.started
    run = prepared.run
    status = {"finished": "finished", "exhausted": "finished"}.get(outcome.stop, outcome.stop)
    campaign_status = _campaign_status(prepared, outcome)
    previous = prepared.campaign.spent
    campaign_spent = Usage(
        **{
            d: (previous.get(d) or 0.0) + (ledger.spent.get(d) or 0.0)
            for d in ("tokens", "cost_usd", "wall_seconds")
        }  # type: ignore[arg-type]
    )
    best = outcome.best_ref or run.seed_ref
    contained = containment(prepared.config)
    seconds = session.seconds()
    report = Report(
        run_id=run.run_id,
        campaign_id=run.campaign_id,
        cycle=run.cycle,
        status=status,
        campaign_status=campaign_status,
        message=_message(outcome, bus, run.run_id, session.note),
        started=started,
        finished=time.time(),
        wall_seconds=seconds,
        run_wall_seconds=run.elapsed_seconds + seconds,
        resumed=prepared.resumed,
        isolation=f"{contained.description}; {', '.join(host.mechanisms)}",
        limits=describe_limits(
            prepared.config.commands,
            host.cgroups.mechanisms,
            trees_own_process_limit(contained.level),
        ),
        config=prepared.config,
        estimate=prepared.estimate,
        splits=prepared.splits,
        seed=run.seed_ref,
        selected=None if best.digest == run.seed_ref.digest else best,
        best=best,
        apply=applied,
        error_control=_error_control(prepared, outcome),
        artifacts=_artifacts(run.seed_ref, best, applied),
        trajectories=trajectory_summary(prepared.config),
        budget=BudgetRecord(
            ceilings=ledger.ceilings,
            spent=ledger.spent,
            campaign_spent=campaign_spent,
            spent_by_stage=dict(ledger.spent_by_stage),
            spent_by_role=ledger.by_role(),
            cached={k: v for k, v in ledger.cached_by_stage.items() if k in ROLES},
            overruns=ledger.overruns_total,
            campaign_wall_seconds=prepared.campaign.elapsed_seconds + run.elapsed_seconds + seconds,
        ),
        **dict(outcome.report),
    )
    unrecorded = await trio.to_thread.run_sync(
        _write_report, prepared, report, outcome, campaign_status, campaign_spent
    )
    if unrecorded is not None:
        bus.publish(WarningEvent(run_id=run.run_id, message=unrecorded[:256]))
    scores = report.scores
    bus.publish(
        RunFinished(
            run_id=run.run_id,
            status=status,
            campaign_status=campaign_status,
            best=best.digest,
            baseline_val=scores.baseline_val.mean if scores.baseline_val else None,
            best_val=scores.best_val.mean if scores.best_val else None,
            report=str(prepared.run_dir / "report.json")[-256:],
            verdict=_verdict(report)[:256],
        )
    )
    await _write_page(prepared, bus, report)  # after run_finished: it plots the whole stream
    return report


_CONFIRMED = {
    "confirmed": "confirmed on the test split",
    "unconfirmed": "not confirmed on the test split",
    "indecisive": "indecisive on the test split",
}


def _verdict(report: Report) -> str:
    """What the run's end says of its best beyond its val scores (found by review: a watched
    run's last frame read "best ... val 0.333 -> 0.583" of a best the test split did not
    confirm and the run did not publish)."""
    parts = []
    if report.confirmation is not None:
        parts.append(_CONFIRMED.get(report.confirmation.decision, report.confirmation.decision))
    if report.apply is not None:
        parts.append(f"apply {report.apply.policy}: {report.apply.status}")
    return "; ".join(parts)


async def _write_page(prepared: Prepared, bus: ProgressBus, report: Report) -> None:
    """Draw report.html from what was just written; a page that cannot be drawn is a
    warning, never a failed run (``evolane report RUN_ID --format html`` draws it again)."""
    try:
        fields = report.model_dump(mode="json")
        await trio.to_thread.run_sync(
            write_report_html, prepared.run_dir, prepared.layout.blobs(), lambda _: None, fields
        )
    except Exception as error:
        why = f"report.html was not written: {type(error).__name__}: {error}"
        bus.publish(WarningEvent(run_id=prepared.run.run_id, message=why[:256]))


def _message(outcome: CycleOutcome, bus: ProgressBus, run_id: str, recovered: str) -> str:
    """The run's message, with what the start recovered; a re-judge whose stored run went
    another way says so (and warns)."""
    parts = [outcome.message] if outcome.message else []
    diverged = [m.measurement_id for m in outcome.report.measurements if m.status == "diverged"]
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
    prepared: Prepared, report: Report, outcome: CycleOutcome, campaign_status: str, spent: Usage
) -> str | None:
    """Report first, then the run's end with the campaign state it leaves (`end_run`): a
    crash before ``run.json`` leaves a run that a resume finishes again, one after it a
    campaign that reads the staged state. ``run.json`` carries the report's summary (what
    ``evolane runs`` lists), so it is never newer than the report it summarises. Returns
    the warning when the test split's ledger was not written (`record_confirmation`)."""
    confirmation, best, unrecorded = report.confirmation, report.best, None
    if confirmation is not None and not tested_before(prepared.campaign.confirmations, best):
        unrecorded = record_confirmation(
            prepared.layout.root, prepared.dataset, prepared.run, confirmation, best.digest
        )
    if report.online is not None:
        record_online(prepared.layout.root, prepared.dataset, prepared.run, report.online)
    path = prepared.run_dir / "report.json"
    write_json_atomic(path, report)
    listed = {"scores": report.scores.model_dump(mode="json")}
    listed |= {"wall_seconds": report.wall_seconds, "run_wall_seconds": report.run_wall_seconds}
    summary = ReportSummary.of(listed, path.stat().st_size)  # the run holds the report's folder
    markdown = render_markdown(report, case_rows(report, prepared.store))
    write_bytes_atomic(prepared.run_dir / "report.md", markdown.encode())
    run = session_ended(prepared.run, report.status, report.wall_seconds)
    run = run.model_copy(update={"summary": summary})
    state = _next_state(prepared.campaign, run, report, outcome, campaign_status, spent)
    end_run(prepared.layout, run, state)
    # after the campaign's state: a share given back is never one its next run still uses
    dumped = report.model_dump(mode="json")
    settle_split(prepared.layout.root, prepared.dataset, prepared.config, dumped, state)
    return unrecorded


def _error_control(prepared: Prepared, outcome: CycleOutcome) -> str:
    """The report's error control in words, with a reused test split's line."""
    words = error_control(
        prepared.config,
        prepared.test_cases,
        outcome.report.online,
        prepared.splits.val_cases,  # after a carve: the cases the gate judged
        val_fed=prepared.splits.feedback == "val",
        split_alpha=prepared.split.alpha if prepared.split is not None else None,
    )
    return with_reuse(words, prepared.estimate.preflight)


def _next_state(
    state: CampaignState,
    run: RunRecord,
    report: Report,
    outcome: CycleOutcome,
    campaign_status: str,
    spent: Usage,
) -> CampaignState:
    """The campaign state the end of ``run`` (this session over) leaves."""
    if report.status == "interrupted":  # a resume replays this cycle: carry nothing over twice
        return state.model_copy(update={"status": campaign_status})
    finished_cycle = report.status == "finished"
    scores = report.scores
    best_val = scores.best_val.mean if scores.best_val else state.best_val
    return state.model_copy(
        update={
            "status": campaign_status,
            "cycles": state.cycles + (1 if finished_cycle else 0),
            "best_ref": outcome.best_ref or state.best_ref,
            "best_val": best_val,
            "applied_ref": _applied(report) or state.applied_ref,
            "stalled": outcome.stalled,
            "spent": spent,
            "elapsed_seconds": state.elapsed_seconds + run.elapsed_seconds,
            "rejected": outcome.rejected,
            "seen": outcome.seen[-SEEN_KEPT:],
            "online": report.online or state.online,  # the budget spent, never reset
            "confirmations": report.confirmations or state.confirmations,
        }
    )


def session_ended(run: RunRecord, status: str, seconds: float) -> RunRecord:
    """``run`` with this session over: its status, and its ``seconds`` added to the run's."""
    elapsed = run.elapsed_seconds + max(0.0, seconds)
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


def save_ended(prepared: Prepared, clock: float, failure: BaseException | None) -> str:
    """Record a run cancelled at once as ``interrupted`` (resumable), and one whose store
    refused a write before its report was written too (found by review: marked ``failed``
    with no report, its units were neither resumable nor reused by ``--resume-campaign``,
    but paid again, and their spend was in no book); a damaged store's as ``failed`` (as
    far as the store still takes writes). A run whose report was written is left as it
    ended: run.json and campaign.json already agree. Returns the status it has now."""
    status = "running"
    try:
        status = load_run(prepared.layout, prepared.run.run_id).status
        if status == "running":
            resumable = failure is None or refused_write(failure)
            status = "interrupted" if resumable else "failed"
            seconds = time.monotonic() - clock  # since the session began
            save_run(prepared.layout, session_ended(prepared.run, status, seconds))
    except (OSError, StoreError, ValueError):
        if failure is None:  # a failed store may refuse this too: its error is already raised
            raise
    return "interrupted" if status == "running" else status  # unsaved: a kill's state
