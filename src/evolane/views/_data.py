"""The report page's data: every candidate, the lineage, the per-case results, the series.

Pure: built from ``report.json`` (as a dict), the unit records of its measurements and the
`History` the view's reducer folded from ``events.jsonl``. Nothing here reads a file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from evolane.stats import case_mean_ci
from evolane.views._cases import arm_scores, case_runs
from evolane.views._history import History

GATED_OUT = "gated_out"
"""The outcome of a candidate that never reached the paired gate."""
UNIT_ARMS = ("baseline", "candidate")


@dataclass(frozen=True)
class Candidate:
    """One candidate slot: where it came from, how far it went, what the gate said."""

    cycle: int
    iteration: int
    slot: int
    digest: str
    parent: str
    terminal: str
    outcome: str  # accept / reject / indecisive / gated_out
    reason: str
    measurement_id: str = ""
    mean_delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n: int = 0
    se: float | None = None
    purpose: str = ""  # paired, or screening when the candidate went no further


@dataclass(frozen=True)
class ScorePoint:
    """The best tree's val score after an iteration (``iteration`` -1: the seed)."""

    iteration: int
    mean: float
    low: float
    high: float
    digest: str


@dataclass(frozen=True)
class CaseChange:
    """One case before (the parent) and after (an accepted candidate)."""

    case: str
    before: float | None
    after: float | None


@dataclass
class PageData:
    """Everything the report page draws."""

    report: dict[str, Any]
    history: History
    candidates: list[Candidate] = field(default_factory=list)
    best_path: list[ScorePoint] = field(default_factory=list)
    heatmap: dict[str, dict[str, str]] = field(default_factory=dict)  # case: column: kind
    heat_scores: dict[str, dict[str, float]] = field(default_factory=dict)
    columns: list[str] = field(default_factory=list)
    changes: dict[str, list[CaseChange]] = field(default_factory=dict)  # by accepted id
    diff: str = ""
    diff_cut: bool = False
    notes: list[str] = field(default_factory=list)


def _measurements(report: dict[str, Any]) -> dict[tuple[int, int, int], dict[str, Any]]:
    """The gate's measurement of each (cycle, iteration, slot): the paired one, or the
    screening one of a candidate that went no further (``--fast-verified``)."""
    found: dict[tuple[int, int, int], dict[str, Any]] = {}
    for m in report.get("measurements") or []:
        if m.get("purpose") in ("paired", "screening") and m.get("slot") is not None:
            key = (int(m.get("cycle") or 0), int(m["iteration"]), int(m["slot"]))
            if m["purpose"] == "paired" or key not in found:
                found[key] = m
    return found


def _figure(m: dict[str, Any] | None, name: str) -> float | None:
    """A measurement's figure when it compared any pair (None otherwise)."""
    return m.get(name) if m and m.get("n") else None


def candidates_of(report: dict[str, Any]) -> list[Candidate]:
    """Every candidate slot of the report, in (cycle, iteration, slot) order."""
    parents = {
        (int(i.get("cycle") or 0), int(i["iteration"])): str(i.get("parent") or "")
        for i in report.get("iterations") or []
    }
    measured = _measurements(report)
    out: list[Candidate] = []
    for entry in report.get("funnel") or []:
        key = (int(entry.get("cycle") or 0), int(entry["iteration"]), int(entry["slot"]))
        m = measured.get(key)
        decision = str(entry.get("decision") or "")
        outcome = decision if decision in ("accept", "reject", "indecisive") else GATED_OUT
        out.append(
            Candidate(
                cycle=key[0],
                iteration=key[1],
                slot=key[2],
                digest=str(entry.get("digest") or ""),
                parent=parents.get(key[:2], ""),
                terminal=str(entry.get("terminal") or ""),
                outcome=outcome,
                reason=str(entry.get("reason") or ""),
                measurement_id=str(m.get("measurement_id") or "") if m else "",
                mean_delta=_figure(m, "mean_delta"),
                ci_low=_figure(m, "ci_low"),
                ci_high=_figure(m, "ci_high"),
                n=int(m.get("n") or 0) if m else 0,
                se=_figure(m, "se"),
                purpose=str(m.get("purpose") or "") if m else "",
            )
        )
    return sorted(out, key=lambda c: (c.cycle, c.iteration, c.slot))


def _score(units: list[dict[str, Any]], arm: str, confidence: float) -> tuple[float, ...] | None:
    return case_mean_ci(arm_scores(units, arm), confidence=confidence, seed=0)


def _start_point(
    report: dict[str, Any], units: dict[str, list[dict[str, Any]]], confidence: float
) -> ScorePoint | None:
    """The tree the run started from, with its val score: the campaign's seed (its score in
    report.json), or in a later cycle the best it started from (scored from the units of
    its first val measurement, the parent arm)."""
    iterations = report.get("iterations") or []
    seed = str((report.get("seed") or {}).get("digest") or "")
    start = str(iterations[0].get("parent") or "") if iterations else seed
    scored = (report.get("scores") or {}).get("baseline_val")
    if start == seed and scored:
        return ScorePoint(-1, scored["mean"], scored["ci_low"], scored["ci_high"], seed)
    first = (
        (int(iterations[0].get("cycle") or 0), int(iterations[0]["iteration"]))
        if iterations
        else None
    )
    for m in report.get("measurements") or []:
        if (
            first
            and m.get("split") == "val"
            and (int(m.get("cycle") or 0), m.get("iteration")) == first
        ):
            found = _score(units.get(str(m.get("measurement_id")), []), "baseline", confidence)
            if found is not None:
                return ScorePoint(-1, found[0], found[1], found[2], start)
    return None


def best_path(
    report: dict[str, Any], candidates: list[Candidate], units: dict[str, list[dict[str, Any]]]
) -> list[ScorePoint]:
    """The best tree's val score with its CI: the tree the run started from, then after
    each iteration (the selected candidate's own arm of its paired measurement), as far as
    unit records are known."""
    confidence = float(((report.get("config") or {}).get("gate") or {}).get("confidence", 0.95))
    by_slot = {(c.cycle, c.iteration, c.slot): c for c in candidates}
    start = _start_point(report, units, confidence)
    points = [start] if start is not None else []
    for it in report.get("iterations") or []:
        cycle, iteration = int(it.get("cycle") or 0), int(it["iteration"])
        slot = it.get("accepted_slot")
        chosen = by_slot.get((cycle, iteration, int(slot))) if slot is not None else None
        found = None
        if chosen is not None:
            found = _score(units.get(chosen.measurement_id, []), "candidate", confidence)
        if found is not None and chosen is not None:
            points.append(ScorePoint(iteration, found[0], found[1], found[2], chosen.digest))
        elif points:
            last = points[-1]
            points.append(ScorePoint(iteration, last.mean, last.low, last.high, last.digest))
    return _as_final(points, report)


def _as_final(points: list[ScorePoint], report: dict[str, Any]) -> list[ScorePoint]:
    """``points`` with the run's best tree at report.json's ``scores.best_val``: its paired
    arm read only the cases before an early stop, while the page promises report.json's
    figure (found by review: 0.610 over 25 cases beside best_val 0.596 over all 26)."""
    best = str((report.get("best") or {}).get("digest") or "")
    final = (report.get("scores") or {}).get("best_val")
    if not best or not final:
        return points
    low, high = final["ci_low"], final["ci_high"]
    return [
        ScorePoint(p.iteration, final["mean"], low, high, p.digest) if p.digest == best else p
        for p in points
    ]


def case_changes(units: list[dict[str, Any]]) -> list[CaseChange]:
    """Each case's mean score on the baseline and the candidate arm of one measurement."""
    before, after = arm_scores(units, "baseline"), arm_scores(units, "candidate")
    cases = sorted(set(before) | set(after))

    def mean(values: list[float] | None) -> float | None:
        return sum(values) / len(values) if values else None

    return [CaseChange(c, mean(before.get(c)), mean(after.get(c))) for c in cases]


def heat_cells(
    report: dict[str, Any], units: dict[str, list[dict[str, Any]]]
) -> tuple[list[str], dict[str, dict[str, str]], dict[str, dict[str, float]]]:
    """Cases x iterations: each iteration's parent on each val case (its baseline-arm
    runs), then the final best; a cell is solid / always_failing / flaky / infra_errored."""
    threshold = float(((report.get("config") or {}).get("gate") or {}).get("pass_score", 1.0))
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    columns: list[str] = []
    for m in report.get("measurements") or []:
        if m.get("split") != "val" or m.get("purpose") not in ("paired", "baseline", "final_val"):
            continue
        final = m.get("purpose") == "final_val"
        column = "final" if final else f"i{m.get('iteration')}"
        arm = "candidate" if final and m.get("n") else "baseline"
        if column not in columns:
            columns.append(column)
        seen = runs.setdefault(column, {})
        for unit in units.get(str(m.get("measurement_id")), []):
            if unit.get("arm") == arm:
                seen.setdefault(str(unit.get("case")), []).append(unit)
    kinds: dict[str, dict[str, str]] = {}
    means: dict[str, dict[str, float]] = {}
    for column, by_case in runs.items():
        for case, case_units in by_case.items():
            unique = list({str(u.get("unit")): u for u in case_units}.values())
            found = case_runs(unique, threshold)
            if found is not None:
                kinds.setdefault(case, {})[column] = found.category
                means.setdefault(case, {})[column] = found.mean
    return columns, kinds, means
