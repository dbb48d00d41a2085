"""The evolve service's error budget for a target: its online jobs share one alpha.

Each online job runs a new campaign, and the online jobs of one target share one durable
budget alpha = 1 - confidence: the job holding share k confirms its best on the held-out
test split at level alpha * s(k) (its campaign's ``error_budget``), s(k) = 1 / (k (k + 1)),
so that P(the service ever publishes an edit with no true gain to the target) <= alpha. The
arithmetic, and why a job that never reaches a confirmation may give its share back, are
`campaign._shares` (`ShareBook`), which ``--test-budget store`` shares.

A job takes the smallest share no other job holds when it first starts, before its
campaign sees any of its data (`reserve_share`); it keeps it across a crash and a resume
(its run's stored config holds its level). When it ends (`settle_share`), its share is spent
if it reached the test split with a best (`reached_test`), else given back.

``shadow`` jobs never publish and take no share. The file is written atomically under a lock
(``evolve/budget/<key>.lock``): the service and ``evolane drain`` share it, and a share is
reserved in it (journal) before the job records it in ``job.json`` (state), so a crash in
between finds the share by the job's id. A job started before this budget existed keeps the
level its run was stored with and holds no share.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pydantic import ValidationError

from evolane.campaign import BudgetShare, ShareBook, reached_test, share
from evolane.inputs import InputError, first_problem
from evolane.messages import Text
from evolane.store import locked, read_json, write_json_atomic

__all__ = [
    "BudgetDamaged",
    "BudgetShare",
    "ServiceBudget",
    "budget_file",
    "reached_test",
    "reserve_share",
    "settle_share",
    "share",
]


class ServiceBudget(ShareBook):
    """A target's error budget (IO-free): its ``target``, ``alpha`` and the shares held or
    spent (`ShareBook`)."""

    target: Text


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
