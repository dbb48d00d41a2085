"""Shares of one error budget alpha, spent by campaigns that may never know how many follow
(IO-free): the evolve service's online jobs of one target (`embed._budget`) and the
campaigns of a store on one test split (``--test-budget store``, `campaign._test_budget`).

A campaign bounds the chance that it publishes an edit with no true gain by its alpha
(DESIGN §6). Over J campaigns at alpha = 0.05 each, the chance that one of them publishes
one grows towards 1 - 0.95^J (0.79 at J = 30). So they share one durable budget alpha: the
holder of share k confirms its best on the held-out test split at level alpha * s(k) (its
campaign's ``error_budget``, spread over its cycles as usual), with

    s(k) = 1 / (k (k + 1)),   sum over k >= 1 of s(k) = 1  (telescoping),

hence P(any of them ever publishes an edit with no true gain) <= alpha, by the union bound
over shares, under any dependence between them (shared cases, one's edit being the next
one's seed). Why this sequence: it gives the first confirmation half of the budget (level
0.025 at alpha 0.05: a pass/fail test split confirms with 6 full gains and none worse), and
tails off as 1/k^2 (share 10 gets 0.00045, 12 full gains). ``6 / (pi^2 k^2)`` gives share 1
more (0.030) but every later share less (0.61/k^2 against 1/k^2); a horizon (alpha / H each)
would need the number of campaigns in advance, which nobody has.

The grace that keeps later holders from starving: only a holder that reaches a confirmation
spends its share. A holder takes the smallest share nobody holds when it first starts,
before its campaign sees any of its data (`ShareBook.reserve`), and keeps it across a crash
and a resume. When it ends (`ShareBook.settle`), its share is spent if it reached the test
split with a best, else given back, and the next one gets it. This is sound because
reaching a confirmation is decided before the test split is measured: the campaign confirms
only when its iterations ended (finished or exhausted, not a budget stop) with a best other
than the seed, both chosen on train and val alone (`campaign._actor`: the test split is
measured last, in ``_finalize``, after val). Every index is then spent by at most one
holder, whose p-value is valid given that it reached the test split, so P(a no-gain publish
under share k) <= alpha * s(k) (`reached_test`: a run that measured its best on val in
``_finalize`` counts as reaching it, whatever came after; one with no report, too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from evolane.messages import Name, Record

_MANY = 1_000_000
_TOLERANCE = 1e-9


def share(index: int) -> float:
    """s(k) = 1 / (k (k + 1)): the fraction of alpha share ``index`` gets; the shares of
    all indices sum to 1."""
    if index < 1:
        raise ValueError(f"a share index is >= 1, got {index}")
    return 1.0 / (index * (index + 1))


class BudgetShare(Record):
    """One holder's share of a budget: its index, the level it confirms at, and whether it
    is still held (``reserved``: its holder has not ended) or ``spent``. ``job_id`` names
    the holder: an evolve job, or a campaign in a test split's ledger."""

    index: int = Field(ge=1)
    job_id: Name
    level: float = Field(gt=0.0, lt=1.0)
    state: Literal["reserved", "spent"] = "reserved"


class ShareBook(Record):
    """An error budget (IO-free): ``alpha`` and the shares held or spent."""

    alpha: float = Field(gt=0.0, lt=1.0)
    shares: tuple[BudgetShare, ...] = Field(default=(), max_length=_MANY)
    released: int = Field(default=0, ge=0)
    """Shares given back by holders that reached no confirmation."""

    @model_validator(mode="after")
    def _within(self) -> Self:
        indices = [held.index for held in self.shares]
        if len(set(indices)) != len(indices):
            raise ValueError("a share index is held twice")
        for held in self.shares:
            if held.level > self.alpha * share(held.index) * (1 + _TOLERANCE):
                raise ValueError(f"share {held.index} has a level above alpha * s(k)")
        return self

    def held_by(self, job_id: str) -> BudgetShare | None:
        """The share ``job_id`` holds or spent, if any."""
        return next((held for held in self.shares if held.job_id == job_id), None)

    @property
    def left(self) -> float:
        """The budget nobody holds or spent: alpha minus their levels (> 0 always)."""
        return max(0.0, self.alpha - sum(held.level for held in self.shares))

    @property
    def spent(self) -> float:
        """The levels of the shares spent on confirmations."""
        return sum(held.level for held in self.shares if held.state == "spent")

    def reserve(self, job_id: str, alpha: float) -> tuple[Self, BudgetShare]:
        """The budget with a share for ``job_id`` (the one it holds already, if any: a
        resumed holder keeps its index), the smallest index nobody holds or spent, at level
        min(alpha, the budget's) * s(k); and that share."""
        held = self.held_by(job_id)
        if held is not None:
            return self, held
        taken = {item.index for item in self.shares}
        index = next(k for k in range(1, len(taken) + 2) if k not in taken)
        level = min(alpha, self.alpha) * share(index)
        new = BudgetShare(index=index, job_id=job_id, level=level)
        return self.model_copy(update={"shares": (*self.shares, new)}), new

    def settle(self, job_id: str, spent: bool) -> Self:
        """The budget once ``job_id`` ended: its share spent (it reached a confirmation)
        or given back (it did not); a holder with no share, or one already spent, changes
        nothing (a spent share is never given back)."""
        held = self.held_by(job_id)
        if held is None or held.state == "spent":
            return self
        if spent:
            done = held.model_copy(update={"state": "spent"})
            shares = tuple(done if item is held else item for item in self.shares)
            return self.model_copy(update={"shares": shares})
        shares = tuple(item for item in self.shares if item is not held)
        return self.model_copy(update={"shares": shares, "released": self.released + 1})


def reached_test(report: Mapping[str, Any] | None) -> bool:
    """Whether a run reached the confirmation of a best on the test split, from its
    ``report.json`` (None: no report, counted as reached). Reached: a confirmation was
    recorded, or the run chose a best other than the seed and measured it on val in its
    final stage (after which the test split is measured). Not reached: the best is the seed
    or the run stopped before its final stage, both decided without the test split."""
    if report is None:
        return True
    if report.get("confirmation") is not None:
        return True
    confirmations = report.get("confirmations") or {}
    if confirmations.get("tests"):
        return True
    if report.get("selected") is None:
        return False
    final = {"final_val", "final_test"}
    return any(item.get("purpose") in final for item in report.get("measurements") or ())
