"""Continuing a campaign (``--resume-campaign``): the checks that it may go on."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from evolane.campaign._advice import NEW_CAMPAIGN
from evolane.campaign._report import FunnelRecord, Report
from evolane.campaign._resume import read_resume_state
from evolane.campaign._runs import (
    TERMINAL_CAMPAIGN,
    CampaignState,
    RunRecord,
    StoreLayout,
    load_campaign,
    load_run,
    newest_run,
)
from evolane.campaign._splits import SplitPlan
from evolane.campaign._types import slot_id, slot_of
from evolane.inputs import InputError
from evolane.messages import ProposalRecord, ReplayRecord, UnitRecord
from evolane.store import read_json


def _clipped(value: object, keep: int = 80) -> str:
    """A value for a one-line message: its repr, cut to ``keep`` characters."""
    text = repr(value)
    return text if len(text) <= keep else text[: keep - 3] + "..."


ADDED_TO_IDENTITY = frozenset({"error_control", "confidence", "feedback_split"})
"""Identity keys newer than some stored campaigns: compared only where stored."""
IDENTITY_DEFAULTS = {"test_budget": "campaign"}
"""Identity keys newer than some stored campaigns, with what such a campaign ran with."""


def check_same_splits(layout: StoreLayout, campaign_id: str, plan: SplitPlan) -> None:
    """Refuse (`InputError`) a next cycle whose optimizer would be fed another split, or train
    carved otherwise, than the campaign's newest run's: the same ``--feedback-split`` may feed
    val where a carve was refused (too few val cases for the gate) and train once the gate
    changed, and a cycle fed val fitted the cases a train cycle then holds out as honest."""
    earlier = newest_run(layout, campaign_id)
    before = None if earlier is None else earlier.splits
    if before is None:  # a run from before honest splits, or none: nothing to compare
        return
    if (before.feedback, before.carved_ids) == (plan.feedback, plan.carved_ids):
        return
    raise InputError(
        f"--resume-campaign {campaign_id}: the splits changed ({before.sentence()} -> "
        f"{plan.sentence()}): a cycle fed val fits the cases a train cycle holds out, and a "
        f"carve must hold out the same cases every cycle; {NEW_CAMPAIGN}"
    )


def continuable_campaign(
    layout: StoreLayout, campaign_id: str, identity: dict[str, str | None]
) -> CampaignState:
    """The campaign ``campaign_id`` if it may run its next cycle with ``identity``;
    `InputError` otherwise (no such campaign, it ended, its identity changed, a run is
    unfinished)."""
    try:
        campaign = load_campaign(layout, campaign_id)
    except FileNotFoundError:
        raise InputError(f"--resume-campaign {campaign_id}: no such campaign") from None
    if campaign.status in TERMINAL_CAMPAIGN:
        raise InputError(
            f"--resume-campaign {campaign_id}: the campaign is {campaign.status} and cannot resume"
        )
    for key, value in identity.items():
        if key in ADDED_TO_IDENTITY and key not in campaign.identity:
            continue  # a campaign from before the key was kept ran with whatever it had
        stored = campaign.identity.get(key, IDENTITY_DEFAULTS.get(key))
        if stored != value:
            raise InputError(
                f"--resume-campaign {campaign_id}: the {key.replace('_digest', '')} changed "
                f"({_clipped(stored)} -> {_clipped(value)}): {NEW_CAMPAIGN}"
            )
    check_budgets(layout, campaign, f"--resume-campaign {campaign_id}")
    unfinished = _unfinished_run(layout, campaign)
    if unfinished is not None:
        run_id, status = unfinished
        raise InputError(
            f"--resume-campaign {campaign_id}: its run {run_id} is unfinished ({status}); "
            f"continue it with --resume {run_id}"
        )
    return campaign


def check_budgets(layout: StoreLayout, campaign: CampaignState, flag: str) -> None:
    """Refuse a campaign whose stored error budgets do not hold together (a recorded accept
    its p-value does not earn, a level the procedure never gives): `InputError` naming
    ``flag`` and the file."""
    for budget in (campaign.online, campaign.confirmations):
        if budget is None:
            continue
        try:
            budget.control()
        except ValueError as error:
            where = layout.campaign_file(campaign.campaign_id)
            raise InputError(
                f"{flag}: {where}: {error} (changed or damaged: run evolane fsck)"
            ) from None


def _unfinished_run(layout: StoreLayout, campaign: CampaignState) -> tuple[str, str] | None:
    """The newest of the campaign's runs that is still running or was interrupted: a new
    cycle would start from the same parent, and resuming that run later would overwrite it."""
    for run_id in reversed(campaign.runs):
        try:
            status = load_run(layout, run_id).status
        except FileNotFoundError:
            continue
        if status in ("running", "interrupted"):
            return run_id, status
    return None


def earlier_results(
    layout: StoreLayout, campaign: CampaignState, run: RunRecord
) -> tuple[dict[bytes, UnitRecord | ReplayRecord], dict[tuple[str, str], ProposalRecord]]:
    """The succeeded units, by reuse key, of the campaign's runs that ended (their spend is
    in the campaign's books) in ``run``'s cycle, and their replays the stop left unjudged;
    and their proposals by slot and parent digest: a wall-clock stop leaves the cycle to
    run again, and its next run reuses what the stopped one measured (judges what it
    replayed, takes what it proposed) instead of paying for it again. Only the same cycle:
    a later cycle measures its parent afresh. A run whose records cannot be read gives
    nothing (reuse only saves work). A succeeded unit wins over a replay of its key."""
    found: dict[bytes, UnitRecord | ReplayRecord] = {}
    proposals: dict[tuple[str, str], ProposalRecord] = {}
    for earlier in _ended_runs_of_cycle(layout, campaign, run):
        with contextlib.suppress(OSError, ValueError):  # an InputError is a ValueError
            journal = layout.run_dir(earlier.run_id) / "journal.jsonl"
            state = read_resume_state(journal)
            for key, record in state.keyed.items():
                held = found.get(key)
                if held is None or (isinstance(held, ReplayRecord) and record.type == "unit"):
                    found[key] = record
            for slot, proposal in state.proposals.items():
                if proposal.parent is not None:
                    proposals.setdefault((slot, proposal.parent), proposal)
    return found, proposals


HOST_FAILED_RUNS = 3
"""How many runs of a campaign may end failed on the host's failure in a measurement of the
same proposal (its slot and tree) before the next run drops that proposal as indecisive:
else a host that keeps failing on it (or a candidate that breaks the host) has every
``--resume-campaign`` measure it again, for ever."""


DROPPED_ON_HOST = "dropped unmeasured"
"""How the reason of a proposal dropped for `HOST_FAILED_RUNS` begins (`dropped_on_host`)."""


def dropped_on_host(report: Report) -> list[FunnelRecord]:
    """The slots of ``report`` whose proposal was dropped, unmeasured, because its
    measurement stopped on the host's failure in `HOST_FAILED_RUNS` earlier runs."""
    return [
        row
        for row in report.funnel
        if row.decision == "indecisive" and row.reason.startswith(DROPPED_ON_HOST)
    ]


def host_failed_runs(
    layout: StoreLayout, campaign: CampaignState, run: RunRecord
) -> dict[tuple[str, str], tuple[str, ...]]:
    """The campaign's runs of ``run``'s cycle that ended failed because a measurement of a
    candidate stopped on the host's failure (``shared_failure``: a replay that could not
    start, a lost cluster), by the candidate's slot id and tree digest, oldest first. Read
    from their reports: a report that cannot be read counts for nothing."""
    failed: dict[tuple[str, str], tuple[str, ...]] = {}
    for earlier in _ended_runs_of_cycle(layout, campaign, run):
        if earlier.status != "failed":
            continue
        with contextlib.suppress(OSError, ValueError):
            report = read_json(layout.run_dir(earlier.run_id) / "report.json")
            for key in _host_failed_slots(report):
                failed[key] = (*failed.get(key, ()), earlier.run_id)
    return failed


def _host_failed_slots(report: Any) -> set[tuple[str, str]]:
    """The (slot id, tree digest) of the candidates a run's ``report`` (``report.json`` as
    read) has a measurement of that stopped on the host's failure."""
    if not isinstance(report, dict):
        return set()
    digests = {
        row.get("slot_id"): row.get("digest")
        for row in report.get("funnel") or ()
        if isinstance(row, dict)
    }
    found = set()
    for measurement in report.get("measurements") or ():
        if not isinstance(measurement, dict) or measurement.get("status") != "shared_failure":
            continue
        where = slot_of(str(measurement.get("measurement_id")))
        digest = digests.get(slot_id(*where)) if where is not None else None
        if where is not None and isinstance(digest, str) and digest:
            found.add((slot_id(*where), digest))
    return found


def _ended_runs_of_cycle(
    layout: StoreLayout, campaign: CampaignState, run: RunRecord
) -> Iterator[RunRecord]:
    """The campaign's runs other than ``run`` in ``run``'s cycle whose end reached the
    campaign's books (their report was written), oldest first; one whose run.json cannot
    be read is left out."""
    for run_id in campaign.runs:
        if run_id == run.run_id:
            continue
        try:
            earlier = load_run(layout, run_id)
        except (OSError, ValueError):  # an InputError is a ValueError
            continue
        if earlier.cycle == run.cycle and earlier.summary is not None:
            yield earlier
