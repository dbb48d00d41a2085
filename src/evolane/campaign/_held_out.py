"""The store's ledger of confirmations on each test split (README "Confirm before publish").

A campaign bounds its own chance of publishing an edit with no true gain at alpha: its
cycles share that bound (`campaign._confirm`). A *new* campaign on the same cases (the next
one from a published winner, or a rerun after an unconfirmed best) confirms its best on the
same test split at a fresh alpha, so over N such confirmations the chance that one of them
confirmed an edit with no true gain grows to at most N alpha (the union bound, under any
dependence), about 1 - 0.95^N for independent ones (0.40 at 10, 0.64 at 20). A user who
reruns until a best is confirmed gets one in the end.

A run that scores the test split without confirming (``--error-control none`` or
``online``, a best that is the seed, a re-judge of such a run) is an *uncontrolled look*:
recorded alike, with no level (it adds nothing to the union bound), because its scores were
seen: a tree picked after seeing them is not confirmed by these cases at any level.

Nothing here changes a decision. Each confirmation is recorded against the digest of the
test split's cases (`held_out_digest`) in ``STORE/test-splits/<key>.json`` (written
atomically under a lock: runs of one store may end at once), once per campaign and tree (a
resume records nothing twice): as its test measurement begins (`SplitLooks`: a look spends
its level, verdict or not), then with its verdict. A new run's preflight says how often the
split confirmed before and the union bound over those confirmations and this campaign's
(`reuse_note`). The online campaigns that decided on a val split are kept alike.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, ValidationError

from evolane.campaign._config import CampaignConfig
from evolane.campaign._confirm import ConfirmationRecord, tree_slot
from evolane.campaign._online import OnlineBudget, campaign_alpha, resolved_mode
from evolane.campaign._runs import RunRecord
from evolane.campaign._shares import ShareBook
from evolane.inputs import Dataset
from evolane.messages import Name, Record
from evolane.store import locked, read_json, write_json_atomic

_MANY = 1_000_000
LEDGER_FOLDER = "test-splits"
REUSED = "test split reused"
VAL_REUSED = "val split reused"
ONLINE_USE = "online"
"""The ``tree`` of a val split's ledger entry: a campaign's online budget, not one tree."""
LOOKS = "uncontrolled look(s)"
"""Runs that scored a test split without confirming (`SplitLooks.seen`)."""
LOOK_MEANS = "scores seen at no level: a tree picked on them is not confirmed by them"
"""What an uncontrolled look means for a campaign that confirms on the same cases."""
LINE_ROOM = 256
"""A preflight line's room (`messages.EstimateEvent.preflight`): a longer one is cut."""


class ConfirmUse(Record):
    """One confirmation on a test split: the campaign, run and tree (``tree-<hex32>``) it
    tested, its level and p-value, and whether it confirmed. ``finished`` False: its test
    measurement began and no verdict was recorded yet (a run killed or stopped during it:
    the look at the split spent its level all the same; p-value 1, not confirmed). ``level``
    None: an uncontrolled look, the split scored with no confirmation (p-value 1, not
    confirmed; an older evolane recorded no looks: its entries all have a level)."""

    campaign_id: Name
    run_id: Name
    tree: Name
    level: float | None = Field(ge=0.0, le=1.0)
    p_value: float = Field(ge=0.0, le=1.0)
    confirmed: bool
    finished: bool = True

    @property
    def confirms(self) -> bool:
        """Whether this is a confirmation (it has a level), not an uncontrolled look."""
        return self.level is not None


class ConfirmLedger(Record):
    """A test split's ledger: its digest, its case count, every confirmation and uncontrolled
    look on it, and the error budget its ``--test-budget store`` campaigns share
    (`campaign._test_budget`; None until the first of them)."""

    digest: Name
    cases: int = Field(ge=0)
    uses: tuple[ConfirmUse, ...] = Field(default=(), max_length=_MANY)
    budget: ShareBook | None = None


def held_out_digest(dataset: Dataset) -> str | None:
    """``sha256:<hex>`` of the test split's cases (ids, inputs, answers, metadata, in file
    order), whatever else the dataset holds; None without test cases."""
    rows = list(dataset.split_rows("test"))
    if not rows:
        return None
    return "sha256:" + hashlib.sha256(b"\n".join(rows)).hexdigest()


def val_digest(dataset: Dataset) -> str:
    """``sha256:<hex>`` of the val split's cases, apart from any test split's digest: the
    key of the ledger of the online campaigns that decided on them."""
    rows = b"\n".join(dataset.split_rows("val"))
    return "sha256:" + hashlib.sha256(b"val split\n" + rows).hexdigest()


def ledger_file(root: Path, digest: str) -> Path:
    """The ledger of the test split ``digest`` in the store ``root``."""
    return root / LEDGER_FOLDER / f"{digest.rsplit(':', 1)[-1][:32]}.json"


def read_uses(root: Path, digest: str) -> ConfirmLedger | None:
    """The ledger of ``digest`` (an empty one when none was written); None when its file
    cannot be read as one (advice only: the run goes on, the note says so)."""
    path = ledger_file(root, digest)
    try:
        return ConfirmLedger.model_validate(read_json(path))
    except FileNotFoundError:
        return ConfirmLedger(digest=digest, cases=0)
    except (ValidationError, ValueError, OSError):
        return None


def record_use(root: Path, digest: str, cases: int, use: ConfirmUse) -> None:
    """Add ``use`` to the ledger of ``digest`` (durable when it returns); a use of the same
    campaign and tree already there is kept as it is, unless it is unfinished and ``use``
    its verdict. A damaged ledger is left alone. Blocking."""
    path = ledger_file(root, digest)
    with locked(path):
        ledger = read_uses(root, digest)
        if ledger is None:
            return
        same = [_same(old, use) for old in ledger.uses]
        if any(same):
            at = same.index(True)
            if ledger.uses[at].finished or not use.finished:
                return
            uses = (*ledger.uses[:at], use, *ledger.uses[at + 1 :])
        else:
            uses = (*ledger.uses, use)
        write_json_atomic(path, ledger.model_copy(update={"cases": cases, "uses": uses}))


def _same(old: ConfirmUse, use: ConfirmUse) -> bool:
    """Whether ``old`` and ``use`` are one look: the same campaign, tree and kind."""
    return (old.campaign_id, old.tree, old.confirms) == (use.campaign_id, use.tree, use.confirms)


def reuse_note(
    root: Path, dataset: Dataset, campaign_id: str, config: CampaignConfig
) -> str | None:
    """The preflight line for a campaign that confirms on ``dataset``'s test split: how
    many confirmations other campaigns of the store ran on the same cases, and the union
    bound over them and this campaign's alpha, and how many uncontrolled looks saw them;
    None when there were none (or it does not confirm)."""
    digest = held_out_digest(dataset)
    if digest is None or resolved_mode(config.error_control, 1) != "confirm":
        return None
    alpha = campaign_alpha(config)
    ledger = read_uses(root, digest)
    if ledger is None:
        return f"test split: its ledger {ledger_file(root, digest)} cannot be read"
    earlier = [use for use in ledger.uses if use.campaign_id != campaign_id]
    if not earlier:
        return None
    campaigns = list(dict.fromkeys(use.campaign_id for use in earlier))
    tests = [use for use in earlier if use.confirms]
    confirmed = sum(use.confirmed for use in tests)
    cut = sum(not use.finished for use in tests)
    short = f", {cut} cut short" if cut else ""  # killed or stopped mid-test
    bound = min(1.0, spent_levels(tests) + alpha)
    cases = ledger.cases or "same"
    if len(tests) == len(earlier):
        return name_campaigns(
            lambda named: (
                f"{REUSED}: these {cases} test cases ran {len(tests)} "
                f"confirmation(s) ({confirmed} confirmed{short}; {named}); each bounds "
                f"only its own no-gain publish at {alpha:.2g}, all of them up to {bound:.2g}; "
                "add fresh test cases, or share one bound with --test-budget store"
            ),
            campaigns,
        )
    ran = f"ran {len(tests)} confirmation(s) ({confirmed} confirmed{short}; all up to {bound:.2g})"
    return name_campaigns(
        lambda named: (
            f"{REUSED}: these {cases} test cases {f'{ran} and' if tests else 'had'} "
            f"{len(earlier) - len(tests)} {LOOKS} ({named}): {LOOK_MEANS}; add fresh test cases"
        ),
        campaigns,
    )


def spent_levels(uses: Sequence[ConfirmUse]) -> float:
    """The levels ``uses`` spent: their confirmations' (an uncontrolled look has none)."""
    return sum(use.level for use in uses if use.level is not None)


def online_reuse_note(
    root: Path, dataset: Dataset, campaign_id: str, config: CampaignConfig
) -> str | None:
    """The preflight line for an ``online`` campaign whose val cases other online campaigns
    of the store decided on: each spent its own alpha on them, so over all of them the
    chance that one accepted an edit with no true gain is up to the sum (found by review:
    a new campaign on the same val cases got a fresh alpha and nothing said so, where a
    reused test split is warned of). None when there were none (or it is not online)."""
    if resolved_mode(config.error_control, dataset.split_counts["test"]) != "online":
        return None
    digest = val_digest(dataset)
    ledger = read_uses(root, digest)
    if ledger is None:
        return f"val split: its ledger {ledger_file(root, digest)} cannot be read"
    earlier = list(
        dict.fromkeys(use.campaign_id for use in ledger.uses if use.campaign_id != campaign_id)
    )
    if not earlier:
        return None
    alpha = campaign_alpha(config)
    levels = {use.campaign_id: use.level or 0.0 for use in ledger.uses}  # all have one
    bound = min(1.0, alpha + sum(levels[campaign] for campaign in earlier))
    cut = {use.campaign_id for use in ledger.uses if not use.finished} & set(earlier)
    short = f", {len(cut)} cut short" if cut else ""
    return name_campaigns(
        lambda named: (
            f"{VAL_REUSED}: these {ledger.cases} val cases decided {len(earlier)} earlier "
            f"online campaign(s) ({named}{short}); each bounds only its own no-gain accept at "
            f"{alpha:.2g}: over all of them up to {bound:.2g}; add fresh val cases, or go on "
            "with --resume-campaign"
        ),
        earlier,
    )


def name_campaigns(line: Callable[[str], str], campaigns: Sequence[str]) -> str:
    """``line`` naming the newest of ``campaigns`` (two, else one, else a count), whichever
    first fits a preflight line: the line was cut at `LINE_ROOM`, and with it the advice at
    its end (``--test-budget store``; found by review: one campaign id was enough)."""
    text = ""
    for shown in (2, 1, 0):
        more = len(campaigns) - shown
        named = ", ".join(campaigns[len(campaigns) - shown :] if shown else ())
        if more > 0:
            named = f"{named} (+{more})" if shown else f"{more} campaign(s)"
        text = line(named)
        if len(text) <= LINE_ROOM:
            break
    return text


def record_online(root: Path, dataset: Dataset, run: RunRecord, budget: OnlineBudget) -> None:
    """Record that ``run``'s campaign spent its online ``budget`` on ``dataset``'s val
    cases (once per campaign: its cycles share one budget), when it tested a candidate.
    Blocking; a ledger that cannot be written is left as it is (advice only)."""
    if not budget.tests:
        return
    tested = [test.p_value for test in budget.tests if test.p_value is not None]
    use = ConfirmUse(
        campaign_id=run.campaign_id,
        run_id=run.run_id,
        tree=ONLINE_USE,
        level=budget.alpha,
        p_value=min(tested, default=1.0),
        confirmed=budget.accepted > 0,
    )
    _recorded_val(root, dataset, use)


def with_reuse(words: str, preflight: tuple[str, ...]) -> str:
    """The report's error-control ``words`` qualified by the preflight's reused-split line,
    when there was one: the bound they state is this campaign's only."""
    reused = next((line for line in preflight if line.startswith((REUSED, VAL_REUSED))), None)
    if reused is None:
        return words
    return f"{words}; but {reused}"[:2048]


@dataclass(frozen=True)
class SplitLooks:
    """Records in the store ``root``'s ledgers that ``run`` began to look at a held-out
    split of ``dataset``, before the first replay of the look: a look spends its level
    whether or not a verdict follows (found by review: a run killed during its test
    measurement left no trace, so a user who saw it going badly and started over confirmed
    on the same cases at a fresh alpha, unwarned). Its verdict replaces the entry
    (`record_use`). Blocking."""

    root: Path
    dataset: Dataset
    run: RunRecord

    def test(self, best: str, level: float) -> str | None:
        """The confirmation of the tree ``best`` (a digest) at ``level`` begins; the warning
        when the ledger could not be written, as `record_confirmation`."""
        return _recorded(self.root, self.dataset, self._begun(tree_slot(best), level))

    def seen(self, best: str, finished: bool) -> str | None:
        """The tree ``best`` (a digest) is scored on the test split with no confirmation (an
        uncontrolled look: no level), beginning or ``finished``; the warning as `test`."""
        look = self._begun(tree_slot(best), None).model_copy(update={"finished": finished})
        return _recorded(self.root, self.dataset, look)

    def val(self, alpha: float) -> None:
        """The campaign's online budget ``alpha`` begins to be spent on the val cases (its
        first candidate's measurement); advice only, as `record_online`."""
        _recorded_val(self.root, self.dataset, self._begun(ONLINE_USE, alpha))

    def _begun(self, tree: str, level: float | None) -> ConfirmUse:
        """The entry of a look at ``level`` (None: uncontrolled) that has no verdict yet."""
        return ConfirmUse(
            campaign_id=self.run.campaign_id,
            run_id=self.run.run_id,
            tree=tree,
            level=level,
            p_value=1.0,
            confirmed=False,
            finished=False,
        )


def _recorded_val(root: Path, dataset: Dataset, use: ConfirmUse) -> None:
    """``use`` in the ledger of ``dataset``'s val split (advice only: a ledger that cannot be
    written is left as it is)."""
    with contextlib.suppress(OSError):
        record_use(root, val_digest(dataset), dataset.split_counts["val"], use)


def _recorded(root: Path, dataset: Dataset, use: ConfirmUse) -> str | None:
    digest = held_out_digest(dataset)
    if digest is None:
        return None
    try:
        record_use(root, digest, dataset.split_counts["test"], use)
    except OSError as error:
        path = ledger_file(root, digest)
        return f"the test split's ledger {path} was not written: {error.strerror or error}"
    return None


def record_confirmation(
    root: Path, dataset: Dataset, run: RunRecord, confirmation: ConfirmationRecord, best: str
) -> str | None:
    """Record ``run``'s confirmation of the tree ``best`` (a digest) on ``dataset``'s test
    split in the store ``root`` (`record_use`); the warning when its ledger could not be
    written (advice only: the run goes on; found by review, a ledger folder that could not
    be made failed the run before its report). Blocking."""
    use = ConfirmUse(
        campaign_id=run.campaign_id,
        run_id=run.run_id,
        tree=tree_slot(best),
        level=confirmation.level,
        p_value=confirmation.p_value,
        confirmed=confirmation.decision == "confirmed",
    )
    return _recorded(root, dataset, use)
