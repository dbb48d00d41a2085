"""``--test-budget store``: the campaigns of a store that confirm on one test split share
its error budget alpha (README "Confirm before publish").

Each campaign bounds its own chance of publishing an edit with no true gain at alpha; a new
campaign on the same test cases confirms at a fresh alpha, so over N of them the chance
grows to N alpha (`campaign._held_out` records and warns of it). With ``--test-budget
store`` a campaign instead takes a share of the split's budget in its ledger
(``STORE/test-splits/<key>.json``, ``budget``): share k confirms at level alpha * s(k),
s(k) = 1 / (k (k + 1)), the arithmetic and the grace of the evolve service's budget
(`campaign._shares`), so over every ``store`` campaign on these test cases in this store a
no-gain publish has probability at most alpha.

The share is peeked while the run is prepared (the estimate and the preflight say the level
it would confirm at), reserved under the ledger's lock before ``run.json`` is written
(`reserve_split`: durable before it is used, keyed by the campaign, so a ``--resume`` reads
its level from ``run.json`` and a ``--resume-campaign`` gets the share it holds), spent
once a run of the campaign reached a confirmation, and given back when the campaign ends
(complete, exhausted, a spent ceiling) without ever reaching one (`settle_split`). A
campaign paused, interrupted or killed keeps its share: it may go on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from evolane.campaign._config import CampaignConfig
from evolane.campaign._held_out import (
    LOOK_MEANS,
    LOOKS,
    REUSED,
    ConfirmLedger,
    ConfirmUse,
    held_out_digest,
    ledger_file,
    name_campaigns,
    read_uses,
    reuse_note,
    spent_levels,
)
from evolane.campaign._online import campaign_alpha, resolved_mode
from evolane.campaign._runs import TERMINAL_CAMPAIGN, CampaignState
from evolane.campaign._shares import BudgetShare, ShareBook, reached_test
from evolane.inputs import Dataset, InputError
from evolane.store import locked, write_json_atomic

BUDGET_NOTE = "test budget"


@dataclass(frozen=True)
class SplitShare:
    """A campaign's share of its test split's budget: the ``share`` (peeked or held), the
    budget's ``alpha``, the split's ``digest`` and ``cases``, the shares others hold or
    spent, the confirmations on the split by campaigns holding no share and every
    uncontrolled look (``outside``), the campaign's own alpha (``own``: 1 - confidence) and
    the level it was given before (``preset``: an evolve job's share of its target's
    budget)."""

    share: BudgetShare
    alpha: float
    digest: str
    cases: int
    others: int
    outside: tuple[ConfirmUse, ...]
    own: float = 1.0
    preset: float | None = None

    @property
    def level(self) -> float:
        """The level the campaign confirms at: its share's (or the preset, when lower)."""
        if self.preset is None:
            return self.share.level
        return min(self.preset, self.share.level)


def split_digest(config: CampaignConfig, dataset: Dataset) -> str | None:
    """The digest of ``dataset``'s test split when ``config`` shares its budget (``store``,
    confirming on a test split), else None."""
    if config.test_budget != "store":
        return None
    if resolved_mode(config.error_control, dataset.split_counts["test"]) != "confirm":
        return None
    return held_out_digest(dataset)


def _own_alpha(config: CampaignConfig) -> float:
    return campaign_alpha(config.model_copy(update={"error_budget": None}))


def _found(ledger: ConfirmLedger, book: ShareBook, held: BudgetShare, cases: int) -> SplitShare:
    holders = {item.job_id for item in book.shares}
    outside = tuple(u for u in ledger.uses if u.campaign_id not in holders or not u.confirms)
    others = sum(item.job_id != held.job_id for item in book.shares)
    return SplitShare(held, book.alpha, ledger.digest, cases, others, outside)


def peek_split(
    root: Path, dataset: Dataset, campaign_id: str, config: CampaignConfig
) -> SplitShare | None:
    """The share ``campaign_id`` holds on ``dataset``'s test split, else the one it would
    take now (nothing is written); None when ``config`` shares no budget. `InputError` when
    the ledger cannot be read."""
    digest = split_digest(config, dataset)
    if digest is None:
        return None
    ledger = read_uses(root, digest)
    if ledger is None:
        raise _damaged(root, digest)
    own = _own_alpha(config)
    book = ledger.budget or ShareBook(alpha=own)
    _, held = book.reserve(campaign_id, own)
    found = _found(ledger, book, held, dataset.split_counts["test"])
    return replace(found, own=own, preset=config.error_budget)


def _damaged(root: Path, digest: str) -> InputError:
    return InputError(
        f"--test-budget store: the test split's ledger {ledger_file(root, digest)} cannot be "
        "read; mend it (it holds the shares of the error budget) or use --test-budget campaign"
    )


def with_level(config: CampaignConfig, split: SplitShare | None) -> CampaignConfig:
    """``config`` confirming at ``split``'s level (as it is without one)."""
    if split is None:
        return config
    return config.model_copy(update={"error_budget": split.level})


def reserve_split(root: Path, split: SplitShare, campaign_id: str) -> SplitShare:
    """Reserve ``campaign_id``'s share of the budget ``split`` peeked (the share it holds,
    if any), durable under the ledger's lock when it returns; the share as reserved (a
    campaign that started meanwhile may have taken the peeked one). Blocking."""
    path = ledger_file(root, split.digest)
    with locked(path):
        ledger = read_uses(root, split.digest)
        if ledger is None:
            raise _damaged(root, split.digest)
        book = ledger.budget or ShareBook(alpha=split.own)
        updated, held = book.reserve(campaign_id, split.own)
        if updated is not book:
            ledger = ledger.model_copy(update={"budget": updated, "cases": split.cases})
            write_json_atomic(path, ledger)
        found = _found(ledger, updated, held, split.cases)
    return replace(found, own=split.own, preset=split.preset)


def settle_split(
    root: Path,
    dataset: Dataset,
    config: CampaignConfig,
    report: Mapping[str, Any],
    state: CampaignState,
) -> None:
    """Settle the campaign's share after a run ended with ``report``, leaving the campaign
    ``state``: spent once a run of it reached a confirmation (this one, or an earlier one
    by the campaign's stored confirmations, or the ledger's record of one that began);
    given back when the campaign ended without reaching one; else kept. A damaged ledger
    is left alone (the share stays held: the budget only grows safer). Blocking."""
    digest = split_digest(config, dataset)
    if digest is None:
        return
    budget = state.confirmations
    spent = reached_test(report) or (budget is not None and bool(budget.tests))
    if not spent and state.status not in TERMINAL_CAMPAIGN:
        return
    path = ledger_file(root, digest)
    with locked(path):
        ledger = read_uses(root, digest)
        if ledger is None or ledger.budget is None:
            return
        # a confirmation that began (a killed run's) spent the share all the same; an
        # uncontrolled look (its seed scored as its best) has no level: it spends none
        mine = (use for use in ledger.uses if use.campaign_id == state.campaign_id)
        spent = spent or any(use.confirms for use in mine)
        updated = ledger.budget.settle(state.campaign_id, spent)
        if updated is not ledger.budget:
            write_json_atomic(path, ledger.model_copy(update={"budget": updated}))


def split_notes(
    root: Path,
    dataset: Dataset,
    campaign_id: str,
    config: CampaignConfig,
    split: SplitShare | None,
) -> tuple[str, ...]:
    """The preflight lines on the test split: with a share, its level and the budget over
    every ``store`` campaign on these cases (and the confirmations outside it, the
    uncontrolled looks); without one, the reused-split line (`reuse_note`)."""
    if split is None:
        note = reuse_note(root, dataset, campaign_id, config)
        return (note,) if note else ()
    level = campaign_alpha(config)  # the share's level (a resume's: as its run stored it)
    cycles = max(1, config.max_improvement_cycles)
    spread = f" (over its {cycles} cycles)" if cycles > 1 else ""
    lines = [
        f"{BUDGET_NOTE}: share {split.share.index} of these {split.cases} test cases' error "
        f"budget {split.alpha:.2g} in this store ({split.others} other share(s) held or "
        f"spent): this campaign confirms at level {level:.2g}{spread}; over all store "
        f"campaigns on them a no-gain publish is at most {split.alpha:.2g}"
    ]
    earlier = [use for use in split.outside if use.campaign_id != campaign_id]
    if earlier:
        lines.append(_outside(split.alpha, earlier))
    return tuple(lines)


def _outside(alpha: float, earlier: list[ConfirmUse]) -> str:
    """The line on the confirmations outside a budget of ``alpha`` and the uncontrolled
    looks, ``earlier`` on the split: the bound over all campaigns, what the looks mean."""
    campaigns = list(dict.fromkeys(use.campaign_id for use in earlier))
    tests = [use for use in earlier if use.confirms]
    bound = min(1.0, alpha + spent_levels(tests))
    ran = (
        f"{len(tests)} earlier confirmation(s) on these cases by campaigns without "
        "--test-budget store"
    )
    if len(tests) == len(earlier):
        return name_campaigns(
            lambda named: (
                f"{REUSED} outside the budget: {ran} ({named}): over all campaigns on them up "
                f"to {bound:.2g}"
            ),
            campaigns,
        )
    looks = f"{len(earlier) - len(tests)} {LOOKS}"
    looked = f"{ran} (all up to {bound:.2g}) and {looks}" if tests else looks
    return name_campaigns(
        lambda named: f"{REUSED} outside the budget: {looked} ({named}): {LOOK_MEANS}", campaigns
    )
