"""The evolve service's error budget for a target: its online jobs share one alpha.

Each online job runs a new campaign, and a campaign bounds the chance that it publishes an
edit with no true gain by its alpha (DESIGN §6). Over J jobs at alpha = 0.05 each, the
chance that the service ever publishes one would grow towards 1 - 0.95^J (0.79 at J = 30).
So the online jobs of one target share one durable budget alpha = 1 - confidence: the job
holding share k confirms its best on the held-out test split at level alpha * s(k) (its
campaign's ``error_budget``, spread over its cycles as usual), with

    s(k) = 1 / (k (k + 1)),   sum over k >= 1 of s(k) = 1  (telescoping),

hence P(the service ever publishes an edit with no true gain to the target) <= alpha, by the
union bound over shares, under any dependence between jobs (shared cases, one job's edit
being the next one's seed). Why this sequence: it gives the first confirmation half of the
budget (level 0.025 at alpha 0.05: a pass/fail test split confirms with 6 full gains and none
worse), and tails off as 1/k^2 (share 10 gets 0.00045, 12 full gains). ``6 / (pi^2 k^2)``
gives share 1 more (0.030) but every later share less (0.61/k^2 against 1/k^2); a horizon
(alpha / H each) would need a service's number of jobs in advance, which it does not have.

The grace that keeps later jobs from starving: only a job that reaches a confirmation spends
its share. A job takes the smallest share no other job holds when it first starts, before its
campaign sees any of its data (`reserve`); it keeps it across a crash and a resume (its run's
stored config holds its level). When it ends (`settle`), its share is spent if it reached
the test split with a best, else given back, and the next job gets it. This is sound because
reaching a confirmation is decided before the test split is measured: the campaign confirms
only when its iterations ended (finished or exhausted, not a budget stop) with a best other
than the seed, both chosen on train and val alone (`campaign._actor`: the test split is
measured last, in ``_finalize``, after val). Every index is then spent by at most one job, and
that job's p-value is valid given that it reached the test split, so P(a no-gain publish
under share k) <= alpha * s(k) (`reached_test`: a run that measured its best on val in
``_finalize`` counts as reaching it, whatever came after; one with no report, too).

``shadow`` jobs never publish and take no share. The file is written atomically under a lock
(``evolve/budget/<key>.lock``): the service and ``evolane drain`` share it, and a share is
reserved in it (journal) before the job records it in ``job.json`` (state), so a crash in
between finds the share by the job's id. A job started before this budget existed keeps the
level its run was stored with and holds no share.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from evolane.inputs import InputError, first_problem
from evolane.messages import Name, Record, Text
from evolane.store import locked, read_json, write_json_atomic

_MANY = 1_000_000
_TOLERANCE = 1e-9


def share(index: int) -> float:
    """s(k) = 1 / (k (k + 1)): the fraction of alpha share ``index`` gets; the shares of
    all indices sum to 1."""
    if index < 1:
        raise ValueError(f"a share index is >= 1, got {index}")
    return 1.0 / (index * (index + 1))


class BudgetShare(Record):
    """One job's share of a target's budget: its index, the level it confirms at, and
    whether it is still held (``reserved``: the job has not ended) or ``spent``."""

    index: int = Field(ge=1)
    job_id: Name
    level: float = Field(gt=0.0, lt=1.0)
    state: Literal["reserved", "spent"] = "reserved"


class ServiceBudget(Record):
    """A target's error budget (IO-free): ``alpha`` and the shares held or spent."""

    target: Text
    alpha: float = Field(gt=0.0, lt=1.0)
    shares: tuple[BudgetShare, ...] = Field(default=(), max_length=_MANY)
    released: int = Field(default=0, ge=0)
    """Shares given back by jobs that reached no confirmation."""

    @model_validator(mode="after")
    def _within(self) -> ServiceBudget:
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
        """The budget no job holds or spent: alpha minus their levels (> 0 always)."""
        return max(0.0, self.alpha - sum(held.level for held in self.shares))

    @property
    def spent(self) -> float:
        """The levels of the shares spent on confirmations."""
        return sum(held.level for held in self.shares if held.state == "spent")

    def reserve(self, job_id: str, alpha: float) -> tuple[ServiceBudget, BudgetShare]:
        """The budget with a share for ``job_id`` (the one it holds already, if any: a
        resumed job keeps its index), the smallest index nobody holds or spent, at level
        min(alpha, the budget's) * s(k); and that share."""
        held = self.held_by(job_id)
        if held is not None:
            return self, held
        taken = {item.index for item in self.shares}
        index = next(k for k in range(1, len(taken) + 2) if k not in taken)
        level = min(alpha, self.alpha) * share(index)
        new = BudgetShare(index=index, job_id=job_id, level=level)
        return self.model_copy(update={"shares": (*self.shares, new)}), new

    def settle(self, job_id: str, spent: bool) -> ServiceBudget:
        """The budget once ``job_id`` ended: its share spent (it reached a confirmation)
        or given back (it did not); a job with no share, or one already spent, changes
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
    """Whether a job's run reached the confirmation of a best on the test split, from its
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


class BudgetDamaged(InputError):
    """The target's budget file cannot be read as one: the job waits (it never runs
    without its share) until the file is mended."""


def budget_file(root: Path, target: str) -> Path:
    """The budget file of ``target`` (its real path, hashed) in the store ``root``."""
    key = hashlib.sha256(os.path.realpath(target).encode()).hexdigest()[:24]
    return root / "evolve" / "budget" / f"{key}.json"


def _read(path: Path, target: str, alpha: float) -> ServiceBudget:
    if not path.exists():
        return ServiceBudget(target=os.path.realpath(target), alpha=alpha)
    try:
        return ServiceBudget.model_validate(read_json(path))
    except ValidationError as error:
        raise BudgetDamaged(f"{path}: not a valid error budget ({first_problem(error)})") from None
    except ValueError as error:
        raise BudgetDamaged(f"{path}: cannot read the error budget ({error})") from None


def reserve_share(root: Path, target: str, job_id: str, alpha: float) -> tuple[BudgetShare, float]:
    """Reserve ``job_id``'s share of ``target``'s budget in the store ``root`` (durable
    before it returns); the share and the budget left. Blocking."""
    path = budget_file(root, target)
    with locked(path):
        budget = _read(path, target, alpha)
        updated, held = budget.reserve(job_id, alpha)
        if updated is not budget:
            write_json_atomic(path, updated)
        return held, updated.left


def settle_share(root: Path, target: str, job_id: str, spent: bool) -> float | None:
    """Spend or give back ``job_id``'s share (`ServiceBudget.settle`); the budget left
    (None when the target has no budget file). Blocking."""
    path = budget_file(root, target)
    if not path.exists():
        return None
    with locked(path):
        budget = _read(path, target, 0.5)
        updated = budget.settle(job_id, spent)
        if updated is not budget:
            write_json_atomic(path, updated)
        return updated.left
