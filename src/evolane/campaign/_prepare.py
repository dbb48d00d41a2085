"""Checking a request at the door and laying out its run, before anything runs.

Every refusal is an `InputError` with one line naming the input; nothing is written until
every check has passed (then ``run.json`` and ``campaign.json``, atomically).
"""

from __future__ import annotations

import contextlib
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from evolane.campaign import _continue
from evolane.campaign._advice import after_failure, still_running
from evolane.campaign._alive import last_written
from evolane.campaign._config import CampaignConfig
from evolane.campaign._containment import containment, share_host_pids, user_process_line
from evolane.campaign._continue import check_budgets, continuable_campaign, earlier_results
from evolane.campaign._copies import mask_for_run
from evolane.campaign._estimate import (
    Estimate,
    UnitHistory,
    estimate_run,
    repetitions_for,
)
from evolane.campaign._gates import VALIDATOR_PLACEHOLDERS, GateSettings
from evolane.campaign._held_out import online_reuse_note
from evolane.campaign._history import unit_history
from evolane.campaign._layout import StoreLayout, check_id, new_id, run_is_live
from evolane.campaign._leaks import check_target_holds_no_cases
from evolane.campaign._models import (
    check_models,
    check_plugins,
    check_recorded_plugins,
    with_recorded_plugins,
)
from evolane.campaign._online import OnlineBudget
from evolane.campaign._preflight import cluster_counts, preflight
from evolane.campaign._resume import ResumeState, read_resume_state
from evolane.campaign._runs import (
    CampaignState,
    RunRecord,
    last_run_plugins,
    load_campaign,
    load_run,
    record_problem,
    save_campaign,
    save_run,
)
from evolane.campaign._splits import SplitPlan, legacy_plan, plan_splits, split_ids
from evolane.campaign._target import check_store_placement, link_version, store_root, target_tree
from evolane.campaign._test_budget import SplitShare, peek_split, split_notes, with_level
from evolane.campaign._trajectories import trajectory_note, with_trajectory_cases
from evolane.inputs import (
    CommandTemplate,
    Dataset,
    InputError,
    case_clusters,
    load_dataset,
    require_split,
)
from evolane.measure import MeasureContext, lane_settings, optimizer_settings
from evolane.messages import MAX_PREFLIGHT_LINES, Usage
from evolane.store import BlobStore, describe_mode

_NO_ROOM = 1e-9  # a ceiling already spent: a zero would read as "no ceiling"


@dataclass
class Prepared:
    """A checked request: inputs loaded, the run and campaign records ready to persist."""

    config: CampaignConfig
    layout: StoreLayout
    store: BlobStore
    dataset: Dataset
    run: RunRecord
    campaign: CampaignState
    resume: ResumeState
    resumed: int
    estimate: Estimate
    gates: GateSettings
    test_cases: int
    ceilings: Usage
    splits: SplitPlan
    rejudge: bool = False  # --from-run --rerun-evaluator: judge stored replays, run nothing else
    split: SplitShare | None = None  # --test-budget store: its share of the test split's budget

    @property
    def run_dir(self) -> Path:
        return self.layout.run_dir(self.run.run_id)

    def persist(self) -> None:
        """Write ``campaign.json``, then ``run.json`` (the run is now resumable). ``run.json``
        is the commit point and names the campaign, so the campaign's record is durable
        first: a kill between the two leaves a campaign listing a run with no record (skipped
        where its runs are read), never a run whose campaign is missing (found by crash-point
        enumeration: ``--resume`` of such a run was an internal error, exit 1)."""
        if self.run.run_id not in self.campaign.runs:
            self.campaign = self.campaign.model_copy(
                update={"runs": (*self.campaign.runs, self.run.run_id), "status": "active"}
            )
        save_campaign(self.layout, self.campaign)
        save_run(self.layout, self.run)


def check_templates(config: CampaignConfig) -> GateSettings:
    """Parse every command template and the gate settings, and check what the commands
    may reach (`campaign._containment`); `InputError` on the first bad one."""
    containment(config)
    check_models(config)
    check_plugins(config)
    lane_settings(config.measure, config.run_commands, MeasureContext())
    optimizer_settings(config.propose.optimizer, config.run_commands)
    validator = None
    if config.validator:
        validator = CommandTemplate.parse(
            config.validator, role="validator", allowed=VALIDATOR_PLACEHOLDERS
        )
    if config.check:
        CommandTemplate.parse(config.check, role="check", allowed=VALIDATOR_PLACEHOLDERS)
    try:
        return GateSettings(
            protected=config.guarded,
            required_files=tuple(config.required_files),
            max_growth_bytes=config.max_growth_bytes,
            validator=validator,
            commands=config.run_commands,
        )
    except ValueError as error:
        raise InputError(f"--protected/--required-file: {error}") from None


def prepare_run(
    config: CampaignConfig,
    resume_run: str | None = None,
    resume_campaign: str | None = None,
    rerun_from: str | None = None,
) -> Prepared:
    """Check the request and build the records of its run. No run or campaign record is
    written here; what goes into the store is content-addressed (the target's snapshot,
    cases derived from trajectories), so a dry run or an estimate leaves no run behind."""
    layout = StoreLayout(store_root(Path(config.store)))  # a file there: InputError, not OSError
    resume, resumed, split = ResumeState(), 0, None
    if rerun_from is not None:
        return _rerun(layout, config, rerun_from)
    if resume_run is not None:
        record, campaign = _resumable_run(layout, resume_run)
        config = record.config.model_copy(update={"store": config.store})  # not its old place
        check_recorded_plugins(config, f"--resume {resume_run}")
        resume = read_resume_state(layout.run_dir(resume_run) / "journal.jsonl")
        resumed = record.resumed + 1
    else:
        config = with_trajectory_cases(config)  # the run's cases, fixed in the store
    gates = check_templates(config)
    dataset = _dataset(config, continued=resume_run is not None or resume_campaign is not None)
    if resume_run is not None:
        if dataset.digest != record.dataset_digest:
            raise InputError(f"--dataset {config.dataset}: changed since run {resume_run} began")
        record = record.model_copy(
            update={
                "splits": record.splits or legacy_plan(split_ids(dataset)),
                "resumed": resumed,
                "status": "running",
                "summary": None,  # this session's report will replace the last one
                "elapsed_seconds": record.elapsed_seconds + _died_session(layout, record),
            }
        )
        split = peek_split(layout.root, dataset, record.campaign_id, config)  # its stored level
    else:
        config = with_recorded_plugins(config)  # frozen into run.json: a resume needs them
        if resume_campaign is not None:  # the next cycle runs its plugins as the last did
            last = last_run_plugins(layout, resume_campaign)
            check_recorded_plugins(config, f"--resume-campaign {resume_campaign}", recorded=last)
        seed = _carve_seed(layout, config, resume_campaign)
        clusters = case_clusters(dataset)  # a carve moves whole clusters
        plan = plan_splits(
            config, split_ids(dataset), seed=seed, rows=dataset.rows(), clusters=clusters
        )
        _refuse_hopeless(config, plan, dataset, _stored_budget(layout, resume_campaign))
        record, campaign = _new_run(layout, layout.blobs(), config, dataset, resume_campaign)
        if resume_campaign is not None:
            _continue.check_same_splits(layout, resume_campaign, plan)
        split = peek_split(layout.root, dataset, campaign.campaign_id, config)
        config = with_level(config, split)  # reserved before run.json is written (`_run`)
        record = record.model_copy(
            update={"splits": plan, "config": with_level(record.config, split)}
        )
        if campaign.splits is None and plan.carved:  # the campaign's later cycles carve alike
            campaign = campaign.model_copy(update={"splits": plan})
    resume.earlier, resume.earlier_proposals = earlier_results(layout, campaign, record)
    resume.host_failed = _continue.host_failed_runs(layout, campaign, record)
    if resume_campaign is not None:  # a --resume with none left ends budget_limited at once
        _check_wall_left(config, campaign.elapsed_seconds)
    return _prepared(
        layout,
        config,
        gates,
        dataset,
        record,
        campaign,
        resume=resume,
        resumed=resumed,
        spent=campaign.spent,
        history=unit_history(layout, config),
        split=split,
    )


def _carve_seed(layout: StoreLayout, config: CampaignConfig, campaign_id: str | None) -> int:
    """The seed a carve uses: the campaign's earlier carve's, so that every cycle of a
    campaign holds out the same val cases, else the run's seed."""
    if campaign_id is not None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            earlier = load_campaign(layout, campaign_id).splits
            if earlier is not None and earlier.carve_seed is not None:
                return earlier.carve_seed
    return config.seed


def _refuse_hopeless(
    config: CampaignConfig, plan: SplitPlan, dataset: Dataset, online: OnlineBudget | None = None
) -> None:
    """Refuse, before anything is written, a configuration that can never accept on
    ``dataset`` split by ``plan`` (under the campaign's stored online budget, if any)."""
    clusters = cluster_counts(dataset, plan.splits(split_ids(dataset)))
    val, reps = plan.val_cases, repetitions_for(config, plan.val_cases)
    checked = preflight(config, val, plan.test_cases, reps, online, clusters=clusters)
    if checked.refusal is not None:
        raise InputError(f"--dataset {config.dataset}: {checked.refusal}")


def _stored_budget(layout: StoreLayout, campaign_id: str | None) -> OnlineBudget | None:
    """The online error budget a continued campaign has spent so far (None: none yet)."""
    if campaign_id is None:
        return None
    try:
        return load_campaign(layout, campaign_id).online
    except FileNotFoundError:  # refused with its own message when the campaign is loaded
        return None


def _prepared(
    layout: StoreLayout,
    config: CampaignConfig,
    gates: GateSettings,
    dataset: Dataset,
    run: RunRecord,
    campaign: CampaignState,
    *,
    resume: ResumeState,
    resumed: int,
    spent: Usage,
    history: UnitHistory | None,
    rejudge: bool = False,
    split: SplitShare | None = None,
) -> Prepared:
    """The checked request (held-out copies masked, each command tree's share of the host's
    pid room taken), its estimate, the ceilings left."""
    config, shared = share_host_pids(config, dataset)
    user_line = user_process_line(config, dataset)
    config, gates, copies = mask_for_run(config, gates, dataset, run.splits)
    test_cases = dataset.split_counts["test"]
    plan = run.splits or legacy_plan(split_ids(dataset))
    train = plan.train_cases if plan.feedback == "train" else 0
    used = {"wall_seconds": campaign.elapsed_seconds, "cached": False}
    return Prepared(
        config=config,
        layout=layout,
        store=layout.blobs(),
        dataset=dataset,
        run=run,
        campaign=campaign,
        resume=resume,
        resumed=resumed,
        estimate=_with_splits(
            estimate_run(
                config,
                plan.val_cases,
                test_cases,
                history,
                train_cases=train,
                budgets=(campaign.online, campaign.confirmations),
                used=spent.model_copy(update=used),
                clusters=cluster_counts(dataset, plan.splits(split_ids(dataset))),
            ),
            plan,
            *copies,
            shared,
            user_line,
            trajectory_note(config),
            *split_notes(layout.root, dataset, campaign.campaign_id, config, split),
            online_reuse_note(layout.root, dataset, campaign.campaign_id, config),
        ),
        gates=gates,
        test_cases=test_cases,
        ceilings=_remaining(config, spent),
        splits=plan,
        rejudge=rejudge,
        split=split,
    )


def _with_splits(estimate: Estimate, plan: SplitPlan, *extra: str | None) -> Estimate:
    """``estimate`` saying which split feeds the optimizer (and warning when it is val), and
    its ``extra`` notes (the trajectory group, a reused test split)."""
    notes = tuple(note[:256] for note in (*extra, plan.note, plan.repeats) if note)
    preflight = (*estimate.preflight, *notes)[:MAX_PREFLIGHT_LINES]
    return estimate.model_copy(update={"splits": plan.sentence()[:256], "preflight": preflight})


def _rerun(layout: StoreLayout, config: CampaignConfig, run_id: str) -> Prepared:
    """A new run that judges the stored replays of ``run_id`` again with ``config``'s judge
    and model settings (rubric, endpoints, prices); it only reports, never writing to the target."""
    try:
        old = load_run(layout, run_id)
    except FileNotFoundError:
        raise InputError(f"--from-run {run_id}: no such run in {layout.root}") from None
    config = old.config.model_copy(
        update={
            "judge": config.measure.judge,
            "models": config.models,  # the new judge's rubric, endpoint and prices
            "max_tokens": config.max_tokens,  # and its ceilings
            "max_cost_usd": config.max_cost_usd,
            "store": config.store,
            "campaign_id": None,
            "apply": "proposal",
        }
    )
    check_recorded_plugins(config, f"--from-run {run_id}", roles=("judge",))  # all it runs
    config = with_recorded_plugins(config)
    gates = check_templates(config)
    dataset = _dataset(config, continued=True)
    if dataset.digest != old.dataset_digest:
        raise InputError(f"--dataset {config.dataset}: changed since run {run_id}")
    resume = _stored_replays(layout, run_id)
    campaign = CampaignState(
        campaign_id=new_id("c-"),
        identity={**config.identity(), "dataset_digest": dataset.digest, "from_run": run_id},
        seed_ref=old.seed_ref,
        best_ref=old.parent_ref,
        cycles=old.cycle,
    )
    plan = old.splits or legacy_plan(split_ids(dataset))  # the splits it was judged on
    record = _run_record(config, campaign, dataset).model_copy(update={"splits": plan})
    return _prepared(
        layout,
        config,
        gates,
        dataset,
        record,
        campaign,
        resume=resume,
        resumed=0,
        spent=Usage(),
        history=None,
        rejudge=True,
    )


def _stored_replays(layout: StoreLayout, run_id: str) -> ResumeState:
    """What ``run_id``'s journal holds to judge again; `InputError` when it holds nothing:
    found by hostile review, a journal missing, empty or torn whole made ``--from-run`` a new
    campaign and a run that ended ``failed`` (exit 1) judging nothing."""
    journal = layout.run_dir(run_id) / "journal.jsonl"
    state = read_resume_state(journal)
    if state.units or state.replays:
        return state
    why = "is missing" if not journal.exists() else "holds no record"
    if state.torn:
        why = "holds only a torn line"
    raise InputError(
        f"--from-run {run_id}: {journal} {why}: no stored replay to judge again; "
        f"run `evolane fsck --store {layout.root}`"
    )


def _dataset(config: CampaignConfig, continued: bool = False) -> Dataset:
    """The run's dataset; ``continued``: earlier work goes on on it, a cluster of two
    splits included (refused only for new work since 2026-12-06)."""
    target = Path(config.target)
    if link_version(target) is None and not target.exists():  # a bad link says why
        raise InputError(f"--target {config.target}: no such file or directory")
    check_store_placement(Path(config.store), target)
    try:
        mode = Path(config.dataset).stat().st_mode
    except OSError:
        raise InputError(f"--dataset {config.dataset}: no such file") from None
    if not stat.S_ISREG(mode):
        raise InputError(f"--dataset {config.dataset}: {describe_mode(mode)}, not a regular file")
    dataset = load_dataset(config.dataset, clusters_may_span=continued)
    require_split(dataset, "val")
    return dataset


def _resumable_run(layout: StoreLayout, run_id: str) -> tuple[RunRecord, CampaignState]:
    try:
        check_id(run_id, "run")
    except InputError as error:
        raise InputError(f"--resume {error}") from None
    try:
        record = load_run(layout, run_id)
    except FileNotFoundError:
        raise InputError(f"--resume {run_id}: no such run in {layout.root}") from None
    except (OSError, ValueError) as error:  # damaged: one line, never an internal error
        raise InputError(
            f"--resume {run_id}: cannot read {layout.run_dir(run_id) / 'run.json'}: "
            f"{record_problem(error)}; run `evolane fsck --store {layout.root}`"
        ) from None
    if record.status in ("finished", "budget_limited"):
        raise InputError(f"--resume {run_id}: the run already ended ({record.status})")
    if record.status == "failed":
        raise InputError(f"--resume {run_id}: {after_failure(record.campaign_id)}")
    if run_is_live(layout, run_id):
        raise InputError(f"--resume {run_id}: {still_running(record.config.target, run_id)}")
    campaign = load_campaign(layout, record.campaign_id)
    check_budgets(layout, campaign, f"--resume {run_id}")
    return record, campaign


def _new_run(
    layout: StoreLayout,
    store: BlobStore,
    config: CampaignConfig,
    dataset: Dataset,
    campaign_id: str | None,
) -> tuple[RunRecord, CampaignState]:
    identity = {**config.identity(), "dataset_digest": dataset.digest}
    if campaign_id is not None:
        campaign = continuable_campaign(layout, campaign_id, identity)
    else:
        if config.campaign_id is not None:  # it names the campaign's folder
            check_id(config.campaign_id, "campaign")
        check_target_holds_no_cases(Path(config.target), dataset)
        seed = target_tree(store, Path(config.target))
        campaign = CampaignState(
            campaign_id=config.campaign_id or new_id("c-"),
            identity=identity,
            seed_ref=seed,
            best_ref=seed,
            max_cycles=config.max_improvement_cycles,
        )
    return _run_record(config, campaign, dataset), campaign


def _run_record(config: CampaignConfig, campaign: CampaignState, dataset: Dataset) -> RunRecord:
    """The record of a new run: the campaign's next cycle, from its best tree."""
    return RunRecord(
        run_id=new_id("r-"),
        campaign_id=campaign.campaign_id,
        cycle=campaign.cycles,
        created=time.time(),
        config=config.model_copy(update={"campaign_id": campaign.campaign_id}),
        dataset_digest=dataset.digest,
        seed_ref=campaign.seed_ref,
        parent_ref=campaign.best_ref,
    )


def _died_session(layout: StoreLayout, record: RunRecord) -> float:
    """The wall of a session that ended without saying so (SIGKILL, power loss): from its start
    to the last moment its run folder was written (events and journal as units end, its
    heartbeat every second however silent its commands: `evolane.campaign._alive`)."""
    if record.status != "running" or record.session_started is None:
        return 0.0  # the session ended in order and counted itself
    last = last_written(layout.run_dir(record.run_id), record.session_started)
    return max(0.0, last - record.session_started)


def _check_wall_left(config: CampaignConfig, used: float) -> None:
    """The wall-clock budget counts the whole campaign: refuse to start with none of it left."""
    budget = config.wall_clock_budget
    if budget is not None and used >= budget:
        raise InputError(
            f"--wall-clock-budget {budget:g}: the campaign has used {used:.1f} s of it already; "
            "give a larger budget to go on"
        )


def _remaining(config: CampaignConfig, spent: Usage) -> Usage:
    """The ceilings left for this cycle after what earlier cycles spent."""

    def left(ceiling: float | None, used: float | None) -> float | None:
        return None if ceiling is None else max(_NO_ROOM, ceiling - (used or 0.0))

    return Usage(
        tokens=left(config.max_tokens, spent.tokens),
        cost_usd=left(config.max_cost_usd, spent.cost_usd),
    )
