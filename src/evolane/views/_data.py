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
    """The paired (val) measurement of each (cycle, iteration, slot)."""
    found: dict[tuple[int, int, int], dict[str, Any]] = {}
    for m in report.get("measurements") or []:
        if m.get("purpose") == "paired" and m.get("slot") is not None:
            found[(int(m.get("cycle") or 0), int(m["iteration"]), int(m["slot"]))] = m
    return found


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
                mean_delta=m.get("mean_delta") if m and m.get("n") else None,
                ci_low=m.get("ci_low") if m and m.get("n") else None,
                ci_high=m.get("ci_high") if m and m.get("n") else None,
                n=int(m.get("n") or 0) if m else 0,
            )
        )
    return sorted(out, key=lambda c: (c.cycle, c.iteration, c.slot))


def _score(units: list[dict[str, Any]], arm: str, confidence: float) -> tuple[float, ...] | None:
    return case_mean_ci(arm_scores(units, arm), confidence=confidence, seed=0)


def best_path(
    report: dict[str, Any], candidates: list[Candidate], units: dict[str, list[dict[str, Any]]]
) -> list[ScorePoint]:
    """The best tree's val score with its CI: the seed, then after each iteration (an
    accepted candidate's own arm of its paired measurement), as far as units are known."""
    confidence = float(((report.get("config") or {}).get("gate") or {}).get("confidence", 0.95))
    scores = report.get("scores") or {}
    seed = scores.get("baseline_val")
    points: list[ScorePoint] = []
    seed_digest = str((report.get("seed") or {}).get("digest") or "")
    if seed:
        points.append(ScorePoint(-1, seed["mean"], seed["ci_low"], seed["ci_high"], seed_digest))
    accepted = {(c.cycle, c.iteration): c for c in candidates if c.outcome == "accept"}
    for it in report.get("iterations") or []:
        key = (int(it.get("cycle") or 0), int(it["iteration"]))
        chosen = accepted.get(key)
        found = (
            _score(units.get(chosen.measurement_id, []), "candidate", confidence)
            if chosen
            else None
        )
        if found is not None and chosen is not None:
            mean, low, high, _ = found
            points.append(ScorePoint(key[1], mean, low, high, chosen.digest))
        elif points:
            last = points[-1]
            points.append(ScorePoint(key[1], last.mean, last.low, last.high, last.digest))
    return points


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
