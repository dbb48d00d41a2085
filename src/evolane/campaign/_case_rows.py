"""The per-case rows of report.md: each val and test case of the final measurements with
the seed's and the best's score and the change against the gate's ``pass_score``, read from
the measurements' unit records (with the judge's reason for a case the best still fails).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from evolane.campaign._prompt import _failure_code, _judge_reason
from evolane.campaign._report import Report
from evolane.store import BlobStore, StoreError
from evolane.views import CaseRuns, case_runs

Change = Literal["fixed", "broken", "same", "unjudged"]
"""``unjudged``: an arm has no score for the case (its runs failed on infrastructure), so
it is neither fixed nor broken (as the decision's counts leave it out)."""


@dataclass(frozen=True)
class CaseRow:
    """One case of the final measurements: the seed's and the best's scores and the change."""

    split: str
    case: str
    seed: float | None  # the mean score over the seed's scored runs (None: none scored)
    best: float | None
    change: Change  # against the gate's pass_score: fixed, broken, the same or unjudged
    passing: bool  # whether the best passes it (`views.mean_passes` of its scored runs)
    reason: str = ""  # the judge's reason (else a failure code) for a case the best fails


def case_rows(report: Report, blobs: BlobStore) -> tuple[CaseRow, ...]:
    """The per-case rows of the report's ``final_val`` and ``final_test`` measurements; a
    measurement whose unit records cannot be read gives none."""
    threshold = report.config.gate.pass_score
    rows: list[CaseRow] = []
    for measurement in report.measurements:
        if measurement.purpose not in ("final_val", "final_test"):
            continue
        try:
            units = orjson.loads(blobs.read_bytes(measurement.units_ref))
        except (StoreError, OSError, ValueError):
            continue
        arms: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for unit in units if isinstance(units, list) else []:
            if isinstance(unit, dict) and unit.get("arm") in ("baseline", "candidate"):
                case = arms.setdefault(str(unit.get("case")), {"baseline": [], "candidate": []})
                case[unit["arm"]].append(unit)
        for case_id, runs in arms.items():
            row = _case_row(measurement.split, case_id, runs, blobs, threshold)
            if row is not None:
                rows.append(row)
    return tuple(rows)


def _case_row(
    split: str,
    case_id: str,
    runs: dict[str, list[dict[str, Any]]],
    blobs: BlobStore,
    threshold: float,
) -> CaseRow | None:
    seed = case_runs(runs["baseline"], threshold)
    best = case_runs(runs["candidate"] or runs["baseline"], threshold)
    if seed is None and best is None:
        return None  # it never ran (not_run, blocked)
    seed_passes, best_passes = _passes(seed), _passes(best)
    change: Change = "same"
    if seed is None or best is None or not seed.scored or not best.scored:
        change = "unjudged"  # nothing to compare on one arm (the decision counts it alike)
    elif best_passes and not seed_passes:
        change = "fixed"
    elif seed_passes and not best_passes:
        change = "broken"
    return CaseRow(
        split=split,
        case=case_id,
        seed=_mean(seed),
        best=_mean(best),
        change=change,
        passing=best_passes,
        reason="" if best_passes else _reason(best, blobs),
    )


def _passes(runs: CaseRuns | None) -> bool:
    return runs is not None and runs.passes


def _mean(runs: CaseRuns | None) -> float | None:
    return runs.mean if runs is not None and runs.scored else None


def _reason(runs: CaseRuns | None, blobs: BlobStore) -> str:
    """Why the best fails a case: its judge's reason, else the failure code of a run."""
    if runs is None:
        return "not run"
    if runs.failing:
        unit = runs.failing[0][1]
        found = _judge_reason(blobs, unit.get("judge")) or _failure_code(unit)
        return found or "the judge gave no reason"
    return _failure_code(runs.infra[0], or_status=True) if runs.infra else ""


def case_counts(rows: tuple[CaseRow, ...] | list[CaseRow], split: str) -> dict[str, int]:
    """How many cases of ``split`` the best fixed, broke, and left passing or failing."""
    mine = [row for row in rows if row.split == split]
    return {
        "fixed": sum(row.change == "fixed" for row in mine),
        "broken": sum(row.change == "broken" for row in mine),
        "same_passing": sum(row.change == "same" and row.passing for row in mine),
        "same_failing": sum(row.change == "same" and not row.passing for row in mine),
        "unjudged": sum(row.change == "unjudged" for row in mine),
    }
